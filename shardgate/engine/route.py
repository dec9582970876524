"""Route: one query sent to the shards its opcode selects, the results merged
(concatenated, or a k-way merge on ORDER BY, then LIMIT)."""

from __future__ import annotations

import functools
import heapq
import operator
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cmp_to_key
from typing import Any

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.engine.primitive import (
    Opcode,
    OrderKey,
    Primitive,
    int_of,
    order_compare,
    semantics_of,
    vindex_map,
)
from shardgate.engine.sortkeys import sort_rows
from shardgate.errors import InvalidArgument
from shardgate.evalengine.coerce import NO_MATCH, SCATTER, convert_row, stored_value
from shardgate.evalengine.sqlsem import INT64_MAX, Semantics
from shardgate.evalengine.values import BindVar, Value, resolve
from shardgate.keys import KeyRange, ShardMap, parse_key_range
from shardgate.result import Result, Row
from shardgate.vindexes import KeyspaceId, Lookup, MultiColumn, SingleColumn, Vindex

#: the largest LIMIT a shard is sent: BIGINT's maximum (SQLite and PostgreSQL)
MAX_LIMIT = INT64_MAX


def _single_values(values: Sequence[Value | tuple[Value, ...]], resolved: Sequence[Any]) -> None:
    """Refuse a list bound where an equality needs one value (it would match nothing)."""
    for value, got in zip(values, resolved, strict=True):
        pairs = zip(value, got, strict=True) if isinstance(value, tuple) else ((value, got),)
        for v, x in pairs:
            if isinstance(x, list | tuple):
                name = v.describe() if isinstance(v, BindVar) else "a value"
                raise InvalidArgument(
                    f"bind variable {name} is a list, but it is compared with '=': "
                    "bind one value, or use IN (:list)"
                )


@dataclass(frozen=True)
class Route(Primitive):
    """Send one query to the shards selected by ``opcode`` and merge the results."""

    opcode: Opcode
    keyspace: str
    sharded: bool
    query: ShardQuery
    table: str | None = None
    vindex: Vindex | None = None
    values: tuple[Value | tuple[Value, ...], ...] = ()
    write: bool = False
    order_by: tuple[OrderKey, ...] = ()
    limit: Value | None = None
    offset: Value | None = None
    #: bind variable carrying LIMIT+OFFSET to each shard of a scatter
    upper_limit_var: str | None = None
    target_shards: tuple[str, ...] = ()
    #: IN route whose shard query reads its list from this bind variable:
    #: each shard gets only the values that map to it
    in_var: str | None = None
    #: ``keyrange(...)``: only shards intersecting it, only rows whose keyspace
    #: id (from the result columns ``ksid_columns``) falls in it
    key_range: KeyRange | None = None
    ksid_columns: tuple[str, ...] = ()
    ksid_vindex: Vindex | None = None
    #: trailing result columns the gate added (ksid or sort columns) to drop
    hidden: int = 0
    #: the columns of ``table`` that ``values`` are compared with (the vindex's):
    #: values are mapped as those columns would store them (shardgate.evalengine.coerce)
    columns: tuple[str, ...] = ()

    @functools.cached_property
    def point(self) -> bool:
        """Whether this route is a point read: a read of one value of a unique vindex
        (``EqualUnique``), so of at most one shard, whose result is that shard's as is
        (no key range, split IN list, merged LIMIT or hidden columns). The one
        definition: the MySQL listener runs a point read whole (not streamed), the
        gate's direct path (:attr:`direct`) takes the point reads it can route without
        I/O. Worked out once per plan."""
        return self.opcode is Opcode.EQUAL_UNIQUE and len(self.values) == 1 and self._as_is

    @functools.cached_property
    def direct(self) -> bool:
        """Whether the gate's direct path takes this route: a :attr:`point` read by one
        value of a single-column, non-lookup vindex, or a read of an unsharded keyspace
        (its result as is, too). :meth:`point_shard` finds its one shard without the
        general :meth:`targets`. Worked out once per plan."""
        if self.opcode is Opcode.UNSHARDED:
            return self._as_is
        return (self.point and not isinstance(self.values[0], tuple)
                and isinstance(self.vindex, SingleColumn) and not isinstance(self.vindex, Lookup))

    @property
    def _as_is(self) -> bool:
        """A read whose one shard's result is the answer as is."""
        return not (self.write or self.key_range is not None or self.in_var is not None
                    or self.upper_limit_var is not None or self.hidden)

    async def point_shard(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> str | None:
        """The one shard a :attr:`direct` route reads, as :meth:`targets` would find it.

        None when :meth:`execute` must decide: no shard can hold the row (NULL, a
        value the column cannot store), a text column compared with a number
        (every shard), or a list bound to the value (refused there).
        """
        smap = vc.shard_map(self.keyspace)
        if self.opcode is Opcode.UNSHARDED:
            return smap.find(b"")
        written = self.values[0]
        assert not isinstance(written, tuple)
        value = resolve(written, bind_vars)
        if isinstance(value, list | tuple):
            return None
        key = (await self._stored(vc, [value]))[0]
        if key is SCATTER or key is NO_MATCH:
            return None
        assert isinstance(self.vindex, SingleColumn)
        ksids = self.vindex.map([key])[0]
        if len(ksids) != 1:
            return None
        return smap.find(ksids[0])

    async def shards(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> list[str]:
        """Which shards this route must reach, in key order."""
        return (await self.targets(vc, bind_vars))[0]

    async def targets(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
        """The shards to reach, and per-shard bind variables for split IN lists."""
        shards, shard_vars = await self._targets(vc, bind_vars)
        if self.key_range is not None:
            inside = set(vc.shard_map(self.keyspace).shards_for_range(self.key_range))
            shards = [s for s in shards if s in inside]
        return shards, shard_vars

    async def _targets(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
        op = self.opcode
        smap = vc.shard_map(self.keyspace)
        if op is Opcode.UNSHARDED or (op is Opcode.REFERENCE and not self.write):
            return [smap.names[0]], None
        if op is Opcode.SCATTER or op is Opcode.REFERENCE:
            return list(smap.names), None
        if op is Opcode.NONE:
            return [], None
        if op is Opcode.BY_DESTINATION:
            return _destinations(smap, self.target_shards), None
        assert self.vindex is not None
        resolved = [
            tuple(resolve(v, bind_vars) for v in value)
            if isinstance(value, tuple)
            else resolve(value, bind_vars)
            for value in self.values
        ]
        if op is not Opcode.IN and op is not Opcode.MULTI_EQUAL:
            for x in resolved:
                if isinstance(x, list | tuple):  # (a multi-column value is a tuple)
                    _single_values(self.values, resolved)
                    break
        else:
            flat: list[Any] = []
            for v in resolved:
                if isinstance(v, list | tuple) and not isinstance(self.vindex, MultiColumn):
                    flat.extend(v)
                else:
                    flat.append(v)
            resolved = flat
        keys = await self._stored(vc, resolved)
        if any(k is SCATTER for k in keys):
            if self.write:
                raise InvalidArgument(
                    f"{self.table}.{', '.join(self.columns)} holds text, which MySQL compares "
                    "with a number as numbers ('05' = 5): several stored values match, so "
                    "this write cannot be routed; compare with a string"
                )
            if self.in_var is None:
                return list(smap.names), None
            return list(smap.names), {n: {self.in_var: resolved} for n in smap.names}
        live = [i for i, k in enumerate(keys) if k is not NO_MATCH]
        found = await vindex_map(vc, self.vindex, [keys[i] for i in live])
        mapped: list[list[KeyspaceId]] = [[] for _ in keys]
        for i, ksids in zip(live, found, strict=True):
            mapped[i] = ksids
        if self.in_var is None:
            names = {smap.find(ksid) for ksids in mapped for ksid in ksids}
            return [n for n in smap.names if n in names], None
        per_shard: dict[str, list[Any]] = {}
        for value, ksids in zip(resolved, mapped, strict=True):
            for shard in dict.fromkeys(smap.find(k) for k in ksids):
                per_shard.setdefault(shard, []).append(value)
        shards = [n for n in smap.names if n in per_shard]
        return shards, {n: {self.in_var: per_shard[n]} for n in shards}

    async def _stored(self, vc: ExecCursor, values: list[Any]) -> list[Any]:
        """Each value as the vindex column compares it: a value, NO_MATCH or SCATTER."""
        if not self.columns or self.table is None:
            return values
        kinds = await vc.column_kinds(self.keyspace, self.table)
        if not any(c in kinds for c in self.columns):
            return values
        dialect = vc.dialect(self.keyspace)
        out: list[Any] = []
        for v in values:
            if isinstance(v, tuple | list) and len(self.columns) > 1:
                row = convert_row(tuple(v), self.columns[: len(v)], kinds, dialect, write=False)
                out.append(SCATTER if SCATTER in row else NO_MATCH if NO_MATCH in row else row)
            else:
                col = self.columns[0]
                out.append(stored_value(v, kinds.get(col), dialect, write=False, column=col))
        return out

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        shards, shard_vars = await self.targets(vc, bind_vars)
        bind_vars = self._with_limit(bind_vars)
        if not shards:
            if self.write:
                return Result()
            # No shard can hold a row: one shard runs the query over no rows,
            # which gives the fields, and the one row an aggregate without
            # GROUP BY returns over an empty table (COUNT(*) = 0).
            smap = vc.shard_map(self.keyspace)
            field_query = ShardQuery(over_no_rows(self.query.tree))
            if self.in_var is not None:  # the split IN list: no value reached a shard
                bind_vars = {**bind_vars, self.in_var: [None]}
            results = await vc.execute_shards(
                self.keyspace, smap.names[:1], field_query, bind_vars, write=False
            )
            return self._merge(results[:1], bind_vars, semantics_of(vc, self.keyspace))
        results = await vc.execute_shards(
            self.keyspace, shards, self.query, bind_vars, write=self.write,
            shard_vars=shard_vars,
        )
        if self.key_range is not None:
            results = [await self._in_range(vc, r) for r in results]
        if len(results) == 1 and self.upper_limit_var is None and not self.hidden:
            return results[0]
        return self._merge(results, bind_vars, semantics_of(vc, self.keyspace))

    async def _in_range(self, vc: ExecCursor, res: Result) -> Result:
        """Keep the rows whose keyspace id lies in ``key_range``."""
        assert self.key_range is not None and self.ksid_vindex is not None
        if not res.rows:
            return res
        lowered = [f.lower() for f in res.fields]
        idx = [lowered.index(c.lower()) for c in self.ksid_columns]
        values = [tuple(r[i] for i in idx) if len(idx) > 1 else r[idx[0]] for r in res.rows]
        mapped = await vindex_map(vc, self.ksid_vindex, values)
        kr = self.key_range
        rows = [r for r, ks in zip(res.rows, mapped, strict=True) if ks and kr.contains(ks[0])]
        return Result(fields=res.fields, rows=rows)

    def _with_limit(self, bind_vars: Mapping[str, Any]) -> Mapping[str, Any]:
        if self.upper_limit_var is None:
            return bind_vars
        upper = int_of(self.limit, bind_vars, "LIMIT") + int_of(self.offset, bind_vars, "OFFSET")
        # LIMIT n + OFFSET m may pass the largest LIMIT every backend takes.
        return {**bind_vars, self.upper_limit_var: min(upper, MAX_LIMIT)}

    def _merge(self, results: list[Result], bind_vars: Mapping[str, Any],
               sem: Semantics) -> Result:
        fields = results[0].fields
        if self.write:
            return Result(
                fields=fields,
                rows_affected=sum(r.rows_affected for r in results),
                insert_id=next((r.insert_id for r in results if r.insert_id), None),
            )
        if self.order_by:
            rows: list[Row] = _merge_ordered(fields, [r.rows for r in results],
                                             self.order_by, sem)
        else:
            rows = [row for r in results for row in r.rows]
        if self.upper_limit_var is not None:
            off = int_of(self.offset, bind_vars, "OFFSET")
            rows = rows[off : off + int_of(self.limit, bind_vars, "LIMIT")]
        if self.hidden:
            keep = len(fields) - self.hidden
            fields = fields[:keep]
            rows = [r[:keep] for r in rows]
        return Result(fields=fields, rows=rows)

    async def stream(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> AsyncIterator[Result]:
        if (self.write or self.order_by or self.upper_limit_var is not None
                or self.key_range is not None):
            yield await self.execute(vc, bind_vars)
            return
        shards, shard_vars = await self.targets(vc, bind_vars)
        if not shards:
            yield await self.execute(vc, bind_vars)
            return
        sent_fields = False
        async for _shard, fields, rows in vc.stream_shards(
            self.keyspace, shards, self.query, bind_vars, shard_vars
        ):
            yield Result(fields=[] if sent_fields else fields, rows=rows)
            sent_fields = True
        if not sent_fields:  # no shard sent a row: the fields still come (over no rows)
            yield await self.execute(vc, bind_vars)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "OperatorType": "Route",
            "Variant": self.opcode.value,
            "Keyspace": {"Name": self.keyspace, "Sharded": self.sharded},
            "Query": self.query.gate_sql,
        }
        if self.table:
            out["Table"] = self.table
        if self.vindex is not None and self.opcode not in (Opcode.SCATTER, Opcode.UNSHARDED):
            out["Vindex"] = self.vindex.name
            out["Values"] = [_describe_value(v) for v in self.values]
        if self.target_shards:
            out["TargetShards"] = list(self.target_shards)
        if self.key_range is not None:
            out["KeyRange"] = self.key_range.name
            out["KeyspaceIdColumns"] = list(self.ksid_columns)
        if self.order_by:
            out["OrderBy"] = ", ".join(
                f"{k.column} {'DESC' if k.descending else 'ASC'}" for k in self.order_by
            )
        if self.upper_limit_var is not None:
            out["Limit"] = _describe_value(self.limit) if self.limit else None
            if self.offset is not None:
                out["Offset"] = _describe_value(self.offset)
        if self.write:
            out["DML"] = True
        return out


def _describe_value(v: Value | tuple[Value, ...] | None) -> Any:
    if v is None:
        return None
    if isinstance(v, tuple):
        return [x.describe() for x in v]
    return v.describe()



def over_no_rows(tree: exp.Expr) -> exp.Expr:
    """The same SELECT with ``WHERE 1 != 1 AND (its WHERE)``: the fields, and rows
    only for aggregates.

    GROUP BY, HAVING and LIMIT stay, so an aggregate without GROUP BY answers
    its one row over no rows, as one database would; the WHERE stays so the
    database rejects what it would reject (PostgreSQL: ``WHERE id - 3``).
    """
    t = tree.copy()
    if isinstance(t, exp.Select):
        never: exp.Expr = exp.NEQ(this=exp.Literal.number(1), expression=exp.Literal.number(1))
        where = t.args.get("where")
        if where is not None:
            never = exp.and_(never, exp.Paren(this=where.this))
        t.set("where", exp.Where(this=never))
    return t



def _order_indexes(fields: Sequence[str], order: Sequence[OrderKey]) -> list[tuple[int, OrderKey]]:
    """Each ORDER BY term with the position of its result column."""
    lowered = [f.lower() for f in fields]
    idx: list[tuple[int, OrderKey]] = []
    for k in order:
        if k.index is not None:
            idx.append((k.index, k))
            continue
        try:
            idx.append((lowered.index(k.column.lower()), k))
        except ValueError:
            raise InvalidArgument(
                f"ORDER BY {k.column} is not in the result columns {list(fields)}: "
                "select it so the gate can merge the shards' sorted results"
            ) from None
    return idx


def _merge_ordered(fields: Sequence[str], parts: Sequence[Sequence[Row]],
                   order: Sequence[OrderKey], sem: Semantics) -> list[Row]:
    """The shards' sorted rows in one order: sorted by keys computed once per value
    (:func:`~shardgate.engine.sortkeys.sort_rows`), else merged comparing pairwise."""
    idx = _order_indexes(fields, order)
    rows = [row for part in parts for row in part]
    ordered = sort_rows(rows, [(operator.itemgetter(i), k.descending, k.nulls_first)
                               for i, k in idx], sem)
    if ordered is not None:
        return ordered

    def cmp(r1: Row, r2: Row) -> int:
        for i, k in idx:
            c = order_compare(r1[i], r2[i], k.descending, k.nulls_first, sem)
            if c:
                return c
        return 0

    return list(heapq.merge(*parts, key=cmp_to_key(cmp)))



def _destinations(smap: ShardMap, targets: tuple[str, ...]) -> list[str]:
    """Shard names for targets given as shard names or key ranges (``-`` is all)."""
    out: dict[str, None] = {}
    for t in targets:
        if t in smap.names:
            out.setdefault(t)
        else:
            out.update(dict.fromkeys(smap.shards_for_range(parse_key_range(t))))
    return [n for n in smap.names if n in out]
