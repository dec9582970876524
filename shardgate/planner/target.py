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

from shardgate.errors import InvalidArgument
from shardgate.keys import parse_key_range

_RANGE = re.compile(r"^([A-Za-z0-9_]+)\[([0-9A-Fa-f]*-[0-9A-Fa-f]*)\]$")
_SHARD = re.compile(r"^([A-Za-z0-9_]+):([0-9A-Fa-f]*-?[0-9A-Fa-f]*)$")


@dataclass(frozen=True)
class Target:
    """A keyspace and the shard name or key range the statement goes to."""

    keyspace: str
    destination: str
    key_range: bool


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
