"""Vitess's shard-target syntax: statements sent as written to chosen shards.

A target names a keyspace and where in it: ``user[-]`` (a key range: every
shard intersecting it, here all), ``user[-80]``, ``user[40-c0]``, or
``user:-80`` (one shard by name). It is given as the default keyspace (a
session target) or as a table's qualifier (``SELECT * FROM `user[-]`.t``).
The statement bypasses routing: each targeted shard runs it and the results
are concatenated, as Vitess does (no merging of aggregates or ORDER BY).
INSERT into a key range is refused (Vitess refuses it too: rows would not
be placed by their vindex).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from shardgate.engine.cursor import ShardQuery
from shardgate.engine.primitive import Opcode
from shardgate.engine.route import Route
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.keys import parse_key_range
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.vindexes import Lookup
from shardgate.vschema import VSchema

_RANGE = re.compile(r"^([A-Za-z0-9_]+)\[([0-9A-Fa-f]*-[0-9A-Fa-f]*)\]$")
_SHARD = re.compile(r"^([A-Za-z0-9_]+):([0-9A-Fa-f]*-?[0-9A-Fa-f]*)$")


@dataclass(frozen=True)
class Target:
    """A keyspace and the shard name or key range the statement goes to."""

    keyspace: str
    destination: str
    key_range: bool


def session_target(plan_key: str | None) -> Target | None:
    """The shard a targeted session's statements go to, from its plan key ``ks:shard``
    (:attr:`shardgate.gate.session.Session.plan_key`, made by :func:`session_key`);
    None for a plain keyspace (or none). A ``USE`` resolves every target form to one
    shard, so a session's target is never a key range."""
    if plan_key is None or ":" not in plan_key:
        return None
    keyspace, _, shard = plan_key.partition(":")
    return Target(keyspace, shard, False)


def session_key(keyspace: str | None, shard: str | None) -> str | None:
    """The plan key of a session using ``keyspace`` and targeting ``shard`` (if any):
    the plan cache's second key, read back by :func:`session_target`."""
    return keyspace if shard is None else f"{keyspace}:{shard}"


def session_keyspace(plan_key: str | None) -> str | None:
    """The keyspace of a session's plan key (``ks`` or ``ks:shard``), or None."""
    if plan_key is None:
        return None
    target = session_target(plan_key)
    return plan_key if target is None else target.keyspace


def parse_target(text: str | None) -> Target | None:
    """The target in ``ks[range]`` or ``ks:shard``, or None for a plain name."""
    if not text:
        return None
    m = _RANGE.match(text)
    if m is not None:
        parse_key_range(m.group(2))  # validates the hex bounds
        return Target(m.group(1), m.group(2), True)
    m = _SHARD.match(text)
    if m is not None and m.group(2):
        return Target(m.group(1), m.group(2), False)
    return None


def statement_target(stmt: exp.Expression) -> Target | None:
    """The one target named by the statement's table qualifiers, if any."""
    found: Target | None = None
    for table in stmt.find_all(exp.Table):
        target = parse_target(table.db)
        if target is None:
            continue
        if found is not None and target != found:
            raise InvalidArgument("a statement can name only one shard target")
        found = target
    return found


def without_target(stmt: exp.Expression, target: Target) -> exp.Expression:
    """The statement with the target qualifier dropped from its tables."""

    def fix(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table) and parse_target(node.db) == target:
            node = node.copy()
            node.set("db", None)
        return node

    out = stmt.transform(fix)
    assert isinstance(out, exp.Expression)
    return out


def check_targeted_write(stmt: exp.Expression, vschema: VSchema, ks_name: str) -> None:
    """A targeted write bypasses routing, so it must not need lookup maintenance.

    Refused: INSERT or DELETE on a table owning lookup vindexes, and UPDATE of
    a vindex column (the lookup rows or the row's placement would go stale).
    """
    node = stmt.this.this if isinstance(stmt.this, exp.Schema) else stmt.this
    if not isinstance(node, exp.Table):
        return
    table = vschema.find_table(node.name, ks_name, ks_name)
    vindex_columns = {c for cv in table.column_vindexes for c in cv.columns}
    changed: set[str] = set()
    if isinstance(stmt, exp.Update):
        changed = {a.this.name.lower() for a in stmt.expressions
                   if isinstance(a, exp.EQ) and isinstance(a.this, exp.Column)}
    owns = any(isinstance(cv.vindex, Lookup) for cv in table.owned_vindexes)
    if (owns and not isinstance(stmt, exp.Update)) or changed & vindex_columns:
        raise Unsupported(
            f"a shard-targeted {stmt.key.upper()} on {table.name} would bypass its vindexes "
            "(lookup rows or row placement): send it without a shard target"
        )


def targeted_route(stmt: exp.Expression, vschema: VSchema, target: Target) -> Route:
    """A statement sent as written to the shards of a ``ks[range]`` / ``ks:shard`` target."""
    ks = vschema.keyspace(target.keyspace)
    if isinstance(stmt, exp.Insert) and target.key_range:
        raise Unsupported(
            "INSERT is not supported when targeting a key range: target one shard "
            "(keyspace:shard) or let the gate route the rows"
        )
    write = isinstance(stmt, exp.Insert | exp.Update | exp.Delete)
    if write and ks.sharded:
        check_targeted_write(stmt, vschema, ks.name)
    tree = strip_qualifiers(without_target(stmt, target))
    return Route(Opcode.BY_DESTINATION, ks.name, ks.sharded, ShardQuery(tree), write=write,
                 target_shards=(target.destination,))
