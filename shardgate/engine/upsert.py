"""``INSERT ... ON DUPLICATE KEY UPDATE`` into an owner of lookup vindexes, row by row.

A duplicate turns the insert into an update of the row already there, so the
gate must know, per row, which happened: the lookup rows of an inserted row
are created, those of an updated row moved where the update changed a lookup
column, and nothing is created for a row that was not inserted. For each row,
in order, in the statement's transaction (the gate opens an implicit one, see
``gate/transactions.py``), on the row's shard (its primary vindex's):

1. ``SELECT * ... FOR UPDATE`` the row holding the row's values of each unique
   key of the table (the primary key first, as the shard's schema declares
   them; the first key that finds a row wins, as MySQL's duplicate check goes
   through the keys in that order). A key with a NULL or a column the insert
   does not give cannot conflict and is skipped.
2. None: the owned lookup rows are created, then the row inserted (a plain
   INSERT: a key the gate could not check still fails with a duplicate error).
3. One: ``UPDATE t SET <assignments> WHERE <that key> = <its values>``, with
   ``VALUES(c)`` the value the row proposed for ``c``; the row is read again
   (by the first unique key the assignments leave alone), and each owned
   lookup whose columns changed is moved from the old values to the new ones
   (``Lookup.update``). An update that changes the primary vindex columns
   would leave the row on the wrong shard: refused, and the statement undone.

Invariant: after the statement every owned lookup holds exactly the values of
the owner rows (none for rows not inserted). Rows reported: 1 per inserted
row, per updated row the database's own count for an upsert that updates
(:attr:`~shardgate.sql.dialects.base.SQLDialect.upsert_changed_rows`: 2 on
MariaDB when the row changed, else 1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.errors import Internal, InvalidArgument, Unsupported
from shardgate.evalengine.values import BindVar, SQLExpr, Value, resolve
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.vindexes import KeyspaceId, Lookup

_VAR = "__sg_up{}"


class OwnedColumns(Protocol):
    """An owned lookup vindex and its columns in the owner table."""

    @property
    def columns(self) -> tuple[str, ...]: ...

    @property
    def vindex(self) -> Lookup: ...


class Insert(Protocol):
    """What an upsert needs of its :class:`~shardgate.engine.insert.Insert`."""

    @property
    def keyspace(self) -> str: ...

    @property
    def table(self) -> str: ...

    @property
    def quoted(self) -> frozenset[str]: ...

    @property
    def primary_columns(self) -> tuple[str, ...]: ...

    @property
    def owned_lookups(self) -> Sequence[OwnedColumns]: ...

    @property
    def on_duplicate(self) -> tuple[tuple[str, SQLExpr], ...]: ...


#: inserts one row on a shard with a plain INSERT: the rows it reports
InsertRow = Callable[[str, list[Value]], Awaitable[int]]


class _Binds:
    """The gate's bind variables of one upsert's queries, over the statement's."""

    def __init__(self, bind_vars: Mapping[str, Any]) -> None:
        self.values: dict[str, Any] = dict(bind_vars)
        self.n = 0

    def add(self, value: Any) -> exp.Placeholder:
        name = _VAR.format(self.n)
        self.n += 1
        self.values[name] = value
        return exp.Placeholder(this=name)


def _table(insert: Insert) -> exp.Table:
    return exp.Table(this=exp.to_identifier(insert.table, quoted=insert.table in insert.quoted
                                            or None))


def _column(insert: Insert, name: str) -> exp.Column:
    return exp.column(name, quoted=name in insert.quoted or None)


def _where(insert: Insert, key: Sequence[str], values: Sequence[Any],
           binds: _Binds) -> exp.Expr:
    return exp.and_(*[exp.EQ(this=_column(insert, c), expression=binds.add(v))
                      for c, v in zip(key, values, strict=True)])


async def _select_row(
    vc: ExecCursor, insert: Insert, shard: str, key: Sequence[str], values: Sequence[Any],
    bind_vars: Mapping[str, Any],
) -> tuple[dict[str, Any], tuple[Any, ...]] | None:
    """The row (by lower-case column name, and as read) whose ``key`` has ``values``."""
    binds = _Binds(bind_vars)
    select = exp.Select(expressions=[exp.Star()], locks=[exp.Lock(update=True)]).from_(
        _table(insert))
    select.set("where", exp.Where(this=_where(insert, key, values, binds)))
    done = await vc.execute_shards(insert.keyspace, [shard], ShardQuery(select), binds.values,
                                   write=True)
    if not done[0].rows:
        return None
    row = tuple(done[0].rows[0])
    return {f.lower(): v for f, v in zip(done[0].fields, row, strict=True)}, row


async def upsert_rows(
    vc: ExecCursor,
    insert: Insert,
    columns: list[str],
    rows: list[list[Value]],
    ksids: list[KeyspaceId],
    bind_vars: Mapping[str, Any],
    insert_row: InsertRow,
) -> int:
    """Insert or update each row, owned lookups kept exact (see the module docstring);
    the rows reported."""
    keys = await vc.unique_keys(insert.keyspace, insert.table)
    keys = tuple(tuple(c.lower() for c in k) for k in keys)
    smap = vc.shard_map(insert.keyspace)
    changed_rows = sql_dialect(Dialect(vc.dialect(insert.keyspace))).upsert_changed_rows
    cursor = vc.lookup_cursor()
    affected = 0
    for row, ksid in zip(rows, ksids, strict=True):
        shard = smap.find(ksid)
        given = {c.lower(): v for c, v in zip(columns, row, strict=True)}
        found = None
        for key in keys:
            values = _key_values(insert, key, given, bind_vars)
            if values is not None:
                found = await _select_row(vc, insert, shard, key, values, bind_vars)
                if found is not None:
                    break
        if found is None:
            for lookup in insert.owned_lookups:
                if not all(c in given for c in lookup.columns):
                    raise InvalidArgument(
                        f"insert into {insert.table} must give the column(s) "
                        f"{list(lookup.columns)} of its owned lookup vindex "
                        f"{lookup.vindex.name!r}"
                    )
                new = [resolve(given[c], bind_vars) for c in lookup.columns]
                await lookup.vindex.create(cursor, [new], [ksid])
            affected += await insert_row(shard, row)
            continue
        before, _ = found
        after = await _update(vc, insert, shard, key, keys, before, given, bind_vars)
        for c in insert.primary_columns:
            if before.get(c) != after.get(c):
                raise InvalidArgument(
                    f"ON DUPLICATE KEY UPDATE of {insert.table}: the update changes its "
                    f"primary vindex column {c} ({before.get(c)!r} to {after.get(c)!r}), "
                    "which would leave the row on the wrong shard"
                )
        for lookup in insert.owned_lookups:
            old = [before.get(c) for c in lookup.columns]
            new = [after.get(c) for c in lookup.columns]
            if old != new:
                await lookup.vindex.update(cursor, old, ksid, new)
        affected += changed_rows if after != before else 1
    return affected


def _key_values(insert: Insert, key: Sequence[str], given: Mapping[str, Value],
                bind_vars: Mapping[str, Any]) -> list[Any] | None:
    """The row's values of ``key``, or None when the key cannot conflict (a NULL, a
    column the insert does not give)."""
    out = []
    for c in key:
        v = given.get(c)
        if v is None:
            return None
        if isinstance(v, SQLExpr):
            raise Unsupported(
                f"ON DUPLICATE KEY UPDATE into {insert.table}: the value of unique key "
                f"column {c} must be a constant (the gate looks up the row it would "
                "duplicate)"
            )
        value = resolve(v, bind_vars)
        if value is None:
            return None
        out.append(value)
    return out


async def _update(
    vc: ExecCursor, insert: Insert, shard: str, key: Sequence[str],
    keys: Sequence[Sequence[str]], before: Mapping[str, Any], given: Mapping[str, Value],
    bind_vars: Mapping[str, Any],
) -> dict[str, Any]:
    """Run the assignments on the row ``before`` (found by ``key``); the row after."""
    binds = _Binds(bind_vars)

    def proposed(node: exp.Expr) -> exp.Expr:
        if not (isinstance(node, exp.Anonymous) and str(node.this).upper() == "VALUES"
                and len(node.expressions) == 1):
            return node
        name = node.expressions[0].name.lower()
        value = given.get(name)
        if value is None:
            raise Unsupported(
                f"VALUES({name}) in ON DUPLICATE KEY UPDATE of {insert.table}: the INSERT "
                "does not give that column"
            )
        if isinstance(value, SQLExpr):
            return value.expr.copy()
        if isinstance(value, BindVar):
            return exp.Placeholder(this=value.name)
        return binds.add(resolve(value, bind_vars))

    sets = [exp.EQ(this=_column(insert, c), expression=e.expr.transform(proposed))
            for c, e in insert.on_duplicate]
    old_key = [before[c] for c in key]
    update = exp.Update(this=_table(insert), expressions=sets,
                        where=exp.Where(this=_where(insert, key, old_key, binds)))
    await vc.execute_shards(insert.keyspace, [shard], ShardQuery(update), binds.values,
                            write=True)
    known = _known_new_values(insert, given, bind_vars)
    assigned = {c.lower() for c, _ in insert.on_duplicate}
    stable = next((k for k in keys if all(c in known or c not in assigned for c in k)), None)
    if stable is None:
        raise Unsupported(
            f"ON DUPLICATE KEY UPDATE of {insert.table} computes a column of every unique "
            "key: the gate could not find the row again to keep its lookups"
        )
    found = await _select_row(vc, insert, shard, stable,
                              [known[c] if c in known else before[c] for c in stable],
                              bind_vars)
    if found is None:
        raise Internal(f"ON DUPLICATE KEY UPDATE of {insert.table}: the updated row is gone")
    return found[0]


def _known_new_values(insert: Insert, given: Mapping[str, Value],
                      bind_vars: Mapping[str, Any]) -> dict[str, Any]:
    """The assigned columns whose new value the gate knows: ``c = VALUES(c')`` of a
    constant, ``c = <constant>``."""
    out: dict[str, Any] = {}
    for c, e in insert.on_duplicate:
        node = e.expr
        if isinstance(node, exp.Anonymous) and str(node.this).upper() == "VALUES" and \
                len(node.expressions) == 1:
            value = given.get(node.expressions[0].name.lower())
            if value is not None and not isinstance(value, SQLExpr):
                out[c.lower()] = resolve(value, bind_vars)
        elif isinstance(node, exp.Literal) and node.is_string:
            out[c.lower()] = node.this
        elif isinstance(node, exp.Placeholder) and node.name:
            out[c.lower()] = bind_vars.get(node.name)
    return out
