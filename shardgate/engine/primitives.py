"""The primitives a plan is made of, and how each executes.

A plan is a small tree of frozen dataclasses (Vitess's engine primitives):

* :class:`Route` sends one query to the shards its opcode selects and merges
  what comes back (concatenation, or a k-way merge on ORDER BY, then LIMIT).
* :class:`Insert` computes each row's keyspace id from the primary vindex,
  fills auto-increment columns from a sequence, creates owned lookup rows and
  sends each shard only its rows, in one multi-row statement per shard.
* :class:`DDL` runs on every shard of a keyspace.

Planning (``shardgate.planner``) is pure and builds these; execution is the
only place with I/O, and it goes through :class:`ExecCursor`, which the gate
implements (and unit tests fake). ``describe()`` gives the plan as JSON in the
shape of Vitess's planbuilder test data, used by EXPLAIN and the golden files.
"""

from __future__ import annotations

import enum
import functools
import heapq
import operator
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cmp_to_key
from typing import Any, Protocol

from sqlglot import exp

from shardgate.engine.insert_ignore import insert_ignoring
from shardgate.engine.sortkeys import sort_rows
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.coerce import NO_MATCH, SCATTER, Kind, convert_row, stored_value
from shardgate.evalengine.sqlsem import INT64_MAX, Semantics, semantics
from shardgate.evalengine.values import BindVar, Literal, SQLExpr, Value, resolve
from shardgate.keys import KeyRange, ShardMap, parse_key_range
from shardgate.result import Result, Row
from shardgate.sql.dialects import Dialect
from shardgate.sql.dialects.render import ShardSQL, render
from shardgate.vindexes import (
    KeyspaceId,
    Lookup,
    MultiColumn,
    Reversible,
    SingleColumn,
    VCursor,
    Vindex,
)
from shardgate.vindexes.lookup import LookupBase

#: the largest LIMIT a shard is sent: BIGINT's maximum (SQLite and PostgreSQL)
MAX_LIMIT = INT64_MAX


class Opcode(enum.Enum):
    """How a Route picks its shards (Vitess's route opcodes)."""

    UNSHARDED = "Unsharded"
    EQUAL_UNIQUE = "EqualUnique"
    EQUAL = "Equal"
    IN = "IN"
    #: a tuple IN naming a vindex column: each tuple's value routes like an equality
    MULTI_EQUAL = "MultiEqual"
    SCATTER = "Scatter"
    NONE = "None"
    REFERENCE = "Reference"
    BY_DESTINATION = "ByDestination"

    @property
    def rank(self) -> int:
        """Lower is better: used to choose among candidate routes."""
        return _RANK[self]


_RANK = {
    Opcode.NONE: 0,
    Opcode.UNSHARDED: 1,
    Opcode.REFERENCE: 1,
    Opcode.BY_DESTINATION: 1,
    Opcode.EQUAL_UNIQUE: 2,
    Opcode.EQUAL: 3,
    Opcode.IN: 4,
    Opcode.MULTI_EQUAL: 4,
    Opcode.SCATTER: 5,
}


class ExecCursor(Protocol):
    """What execution needs from the gate."""

    def shard_map(self, keyspace: str) -> ShardMap: ...

    def lookup_cursor(self) -> VCursor: ...

    def dialect(self, keyspace: str) -> str:
        """The SQL dialect of the keyspace's shards (its first shard's)."""
        ...

    def collation(self, keyspace: str) -> str | None:
        """The collation of the keyspace's strings; None: the dialect's default."""
        ...

    async def execute_shards(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
        *,
        write: bool,
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Result]:
        """Run ``query`` on each shard (in the session's transaction if any).

        ``shard_vars[shard]``, when given, is merged over ``bind_vars`` for
        that shard (IN lists split per shard).
        """
        ...

    def stream_shards(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> AsyncIterator[tuple[str, list[str], list[Row]]]:
        """Yield ``(shard, fields, rows)`` batches from each shard."""
        ...

    async def next_sequence_values(self, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive values of ``sequence``; return the first."""
        ...

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        """The kind of each (lowercase) column of ``table``; empty when unknown."""
        ...


class ShardQuery:
    """A query to send to shards: the gate AST plus its per-dialect renderings.

    Renderings are memoised per (dialect, placeholder); the AST is never mutated.
    ``build`` lets a primitive make the SQL from the bind variables (inserts).
    """

    __slots__ = ("_rendered", "tree")

    def __init__(self, tree: exp.Expr) -> None:
        self.tree = tree
        self._rendered: dict[tuple[str, str], ShardSQL] = {}

    def for_dialect(self, dialect: str, placeholder: str) -> ShardSQL:
        key = (dialect, placeholder)
        found = self._rendered.get(key)
        if found is None:
            found = self._rendered[key] = render(self.tree, Dialect(dialect), placeholder)
        return found

    @property
    def gate_sql(self) -> str:
        return self.tree.sql(dialect="mysql")

    def __repr__(self) -> str:
        return f"ShardQuery({self.gate_sql!r})"


class Primitive:
    """Base of all primitives."""

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        raise NotImplementedError

    async def stream(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> AsyncIterator[Result]:
        """Stream results; by default, one chunk with everything."""
        yield await self.execute(vc, bind_vars)

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class OrderKey:
    """One ORDER BY term of a scatter merge: a result column by name."""

    column: str
    descending: bool = False
    #: NULLs first in the output (MySQL: first when ascending, last when descending)
    nulls_first: bool = True
    #: the result column's position, when the planner knows it (no SELECT *)
    index: int | None = None


async def vindex_map(
    vc: ExecCursor, vindex: Vindex, values: Sequence[Any]
) -> list[list[KeyspaceId]]:
    if isinstance(vindex, Lookup):
        return await vindex.map(vc.lookup_cursor(), values)
    if isinstance(vindex, SingleColumn):
        return vindex.map(values)
    if isinstance(vindex, MultiColumn):
        return vindex.map_multi([v if isinstance(v, tuple | list) else (v,) for v in values])
    raise InvalidArgument(f"vindex {vindex.name!r} cannot map values")


async def _map_distinct(
    vc: ExecCursor, vindex: Vindex, values: Sequence[Any]
) -> list[list[KeyspaceId]]:
    """:func:`vindex_map` of ``values``, each distinct value mapped once (rows of one
    insert often share their sharding value). Values are told apart by type as well,
    so ``1`` and ``True`` or ``1.0`` are never taken for one another."""
    try:
        keys = [tuple((type(x), x) for x in v) if isinstance(v, tuple) else (type(v), v)
                for v in values]
        distinct: dict[Any, Any] = {}  # key -> its first value, as given
        for k, v in zip(keys, values, strict=True):
            distinct.setdefault(k, v)
    except TypeError:  # an unhashable value: map them as they are
        return await vindex_map(vc, vindex, values)
    if len(distinct) == len(values):
        return await vindex_map(vc, vindex, values)
    mapped = await vindex_map(vc, vindex, list(distinct.values()))
    of = dict(zip(distinct, mapped, strict=True))
    return [of[k] for k in keys]


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
        """Whether this route is a point read: it reaches at most one shard and its
        result is that shard's as is (``Unsharded``, or ``EqualUnique`` on one value
        of a single-column, non-lookup vindex; no key range, split IN list, merged
        LIMIT or hidden columns). :meth:`point_shard` routes such a route without the
        general :meth:`targets` (the gate's point path); worked out once per plan."""
        if (self.write or self.key_range is not None or self.in_var is not None
                or self.upper_limit_var is not None or self.hidden):
            return False
        if self.opcode is Opcode.UNSHARDED:
            return True
        return (self.opcode is Opcode.EQUAL_UNIQUE and len(self.values) == 1
                and not isinstance(self.values[0], tuple)
                and isinstance(self.vindex, SingleColumn) and not isinstance(self.vindex, Lookup))

    async def point_shard(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> str | None:
        """The one shard a :attr:`point` route reads, as :meth:`targets` would find it.

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
        upper = _int_of(self.limit, bind_vars, "LIMIT") + _int_of(self.offset, bind_vars, "OFFSET")
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
            off = _int_of(self.offset, bind_vars, "OFFSET")
            rows = rows[off : off + _int_of(self.limit, bind_vars, "LIMIT")]
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


def _int_of(v: Value | None, bind_vars: Mapping[str, Any], what: str) -> int:
    if v is None:
        return 0
    n = resolve(v, bind_vars)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidArgument(f"{what} must be a non-negative integer, got {n!r}")
    return n


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


def order_compare(a: Any, b: Any, descending: bool, nulls_first: bool, sem: Semantics) -> int:
    """Compare two sort-key values; ``nulls_first`` places NULLs first in the output."""
    if a is None or b is None:
        if a is None and b is None:
            return 0
        return (-1 if a is None else 1) * (1 if nulls_first else -1)
    c = sem.compare(a, b)
    return -c if descending else c


def semantics_of(vc: ExecCursor, keyspace: str) -> Semantics:
    """How the keyspace's database compares, sorts and computes values."""
    if not keyspace:
        return semantics("mysql")
    return semantics(vc.dialect(keyspace), vc.collation(keyspace))


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


@dataclass(frozen=True)
class OwnedLookup:
    """An owned lookup vindex an Insert must create rows for."""

    columns: tuple[str, ...]
    vindex: Lookup


@dataclass(frozen=True)
class Insert(Primitive):
    """Insert rows, each routed by its primary vindex (or to the one unsharded shard).

    Invariants: every row's primary vindex value maps to exactly one keyspace
    id, else the whole statement is refused before anything is written; owned
    lookup rows are created before the owner rows (so a unique-lookup duplicate
    aborts the insert first); each shard receives only its own rows.
    """

    keyspace: str
    sharded: bool
    table: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Value, ...], ...]
    primary_columns: tuple[str, ...] = ()
    primary_vindex: Vindex | None = None
    owned_lookups: tuple[OwnedLookup, ...] = ()
    #: other column vindexes (not owned, not primary): a given value must map to
    #: the row's keyspace id; a missing one is generated when the vindex is reversible
    secondary: tuple[tuple[tuple[str, ...], Vindex], ...] = ()
    auto_increment: tuple[str, str] | None = None  # (column, sequence)
    ignore: bool = False
    #: reference table of a sharded keyspace: every shard gets every row
    broadcast: bool = False
    #: ``ON DUPLICATE KEY UPDATE col = expr, ...`` (never a vindex column)
    on_duplicate: tuple[tuple[str, SQLExpr], ...] = ()
    #: table and column names quoted in the statement (`select`): quoted for the shards too
    quoted: frozenset[str] = frozenset()

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        columns = list(self.columns)
        rows: list[list[Value]] = [list(r) for r in self.rows]
        insert_id: int | None = None
        if self.auto_increment is not None:
            insert_id = await self._fill_sequence(vc, columns, rows, bind_vars)
        smap = vc.shard_map(self.keyspace)
        if self.broadcast:
            per_shard = dict.fromkeys(smap.names, rows)
        elif not self.sharded:
            per_shard = {smap.names[0]: rows}
        else:
            await self._store_vindex_values(vc, columns, rows, bind_vars)
            ksids = await self._keyspace_ids(vc, columns, rows, bind_vars)
            for cols, vindex in self.secondary:
                await self._verify_or_generate(vc, cols, vindex, columns, rows, ksids, bind_vars)
            if self.ignore and self.owned_lookups:
                inserted = await self._insert_ignoring(vc, columns, rows, ksids, bind_vars)
                return Result(rows_affected=inserted, insert_id=insert_id)
            for lookup in self.owned_lookups:
                await self._create_lookup(vc, lookup, columns, rows, ksids, bind_vars)
            per_shard = {}
            for row, ksid in zip(rows, ksids, strict=True):
                per_shard.setdefault(smap.find(ksid), []).append(row)
        shards = [n for n in smap.names if n in per_shard]
        query = _InsertQuery(self, columns, per_shard)
        results = await vc.execute_shards(self.keyspace, shards, query, bind_vars, write=True)
        affected = sum(r.rows_affected for r in results)
        if insert_id is None and not self.sharded:
            # an unsharded keyspace's one database numbered the row (its AUTO_INCREMENT);
            # a sharded table's only ids are its sequence's: each shard's own count means
            # nothing (SQLite reports a rowid for every table)
            insert_id = next((r.insert_id for r in results if r.insert_id), None)
        return Result(rows_affected=affected, insert_id=insert_id)

    async def _fill_sequence(
        self,
        vc: ExecCursor,
        columns: list[str],
        rows: list[list[Value]],
        bind_vars: Mapping[str, Any],
    ) -> int | None:
        assert self.auto_increment is not None
        col, seq = self.auto_increment
        if col not in columns:
            columns.append(col)
            for r in rows:
                r.append(Literal(None))
        i = columns.index(col)
        missing = [r for r in rows if resolve_or_none(r[i], bind_vars) is None]
        if not missing:
            return None
        first = await vc.next_sequence_values(seq, len(missing))
        for n, r in enumerate(missing):
            r[i] = Literal(first + n)
        return first

    async def _store_vindex_values(
        self,
        vc: ExecCursor,
        columns: list[str],
        rows: list[list[Value]],
        bind_vars: Mapping[str, Any],
    ) -> None:
        """Replace each vindex column's value by what the column will store.

        Vindexes then map, lookups record and the shard receives one same value
        (``'03'`` into a BIGINT column is 3 everywhere); what the backends would
        convert differently or lossily is refused (:mod:`shardgate.evalengine.coerce`).
        """
        vindex_columns = {*self.primary_columns}
        for lookup in self.owned_lookups:
            vindex_columns.update(lookup.columns)
        for cols, _vindex in self.secondary:
            vindex_columns.update(cols)
        present = [(i, c) for i, c in enumerate(columns) if c in vindex_columns]
        if not present:
            return
        kinds = await vc.column_kinds(self.keyspace, self.table)
        if not any(c in kinds for _, c in present):
            return
        dialect = vc.dialect(self.keyspace)
        # One bind variable in many rows (VALUES (:u, ...), (:u, ...)) is converted once.
        by_var: dict[tuple[int, str], Literal] = {}
        for row in rows:
            for i, c in present:
                node = row[i]
                if isinstance(node, SQLExpr):
                    continue
                known = by_var.get((i, node.name)) if isinstance(node, BindVar) else None
                if known is None:
                    known = Literal(stored_value(resolve(node, bind_vars), kinds.get(c),
                                                 dialect, write=True, column=c))
                    if isinstance(node, BindVar):
                        by_var[(i, node.name)] = known
                row[i] = known

    async def _keyspace_ids(
        self,
        vc: ExecCursor,
        columns: list[str],
        rows: list[list[Value]],
        bind_vars: Mapping[str, Any],
    ) -> list[KeyspaceId]:
        assert self.primary_vindex is not None
        try:
            idx = [columns.index(c) for c in self.primary_columns]
        except ValueError:
            raise InvalidArgument(
                f"insert into {self.table} must give the primary vindex column(s) "
                f"{list(self.primary_columns)}"
            ) from None
        values: list[Any] = []
        for r in rows:
            vals = tuple(resolve(r[i], bind_vars) for i in idx)
            if any(v is None for v in vals):
                raise InvalidArgument(
                    f"insert into {self.table}: primary vindex column(s) "
                    f"{list(self.primary_columns)} cannot be NULL"
                )
            values.append(vals if len(idx) > 1 else vals[0])
        mapped = await _map_distinct(vc, self.primary_vindex, values)
        ksids: list[KeyspaceId] = []
        for v, m in zip(values, mapped, strict=True):
            if len(m) != 1:
                raise InvalidArgument(
                    f"insert into {self.table}: value {v!r} of vindex "
                    f"{self.primary_vindex.name!r} does not map to one keyspace id"
                )
            ksids.append(m[0])
        return ksids

    async def _verify_or_generate(
        self,
        vc: ExecCursor,
        cols: tuple[str, ...],
        vindex: Vindex,
        columns: list[str],
        rows: list[list[Value]],
        ksids: list[KeyspaceId],
        bind_vars: Mapping[str, Any],
    ) -> None:
        """The V3 rules for a column vindex the table does not own."""
        if not all(c in columns for c in cols):
            if len(cols) == 1 and isinstance(vindex, Reversible):
                columns.append(cols[0])
                for row, value in zip(rows, vindex.reverse_map(ksids), strict=True):
                    row.append(Literal(value))
            return  # an absent non-reversible column is left to the database default
        idx = [columns.index(c) for c in cols]
        values = [tuple(resolve(r[i], bind_vars) for i in idx) for r in rows]
        if isinstance(vindex, Lookup):
            flat = [v if len(v) > 1 else v[0] for v in values]
            ok = await vindex.verify(vc.lookup_cursor(), flat, ksids)
        else:
            mapped = await vindex_map(vc, vindex, [v if len(v) > 1 else v[0] for v in values])
            ok = [k in m for k, m in zip(ksids, mapped, strict=True)]
        for v, good in zip(values, ok, strict=True):
            if not good:
                raise InvalidArgument(
                    f"insert into {self.table}: value {v if len(v) > 1 else v[0]!r} of "
                    f"{list(cols)} does not map to the row's keyspace id under vindex "
                    f"{vindex.name!r}"
                )

    async def _insert_ignoring(
        self,
        vc: ExecCursor,
        columns: list[str],
        rows: list[list[Value]],
        ksids: list[KeyspaceId],
        bind_vars: Mapping[str, Any],
    ) -> int:
        """INSERT IGNORE row by row, lookups kept exact (:mod:`shardgate.engine.insert_ignore`)."""
        lookups: list[LookupBase] = []
        positions: list[int] = []
        for lookup in self.owned_lookups:
            assert isinstance(lookup.vindex, LookupBase) and len(lookup.columns) == 1
            if lookup.columns[0] not in columns:
                raise InvalidArgument(
                    f"insert into {self.table} must give the column {lookup.columns[0]!r} "
                    f"of its owned lookup vindex {lookup.vindex.name!r}"
                )
            lookups.append(lookup.vindex)
            positions.append(columns.index(lookup.columns[0]))
        values = [[resolve(r[p], bind_vars) for p in positions] for r in rows]
        smap = vc.shard_map(self.keyspace)

        async def insert_row(i: int) -> int:
            shard = smap.find(ksids[i])
            query = _InsertQuery(self, columns, {shard: [rows[i]]})
            done = await vc.execute_shards(self.keyspace, [shard], query, bind_vars, write=True)
            return done[0].rows_affected

        return await insert_ignoring(vc.lookup_cursor(), lookups, values, ksids, insert_row)

    async def _create_lookup(
        self,
        vc: ExecCursor,
        lookup: OwnedLookup,
        columns: list[str],
        rows: list[list[Value]],
        ksids: list[KeyspaceId],
        bind_vars: Mapping[str, Any],
    ) -> None:
        try:
            idx = [columns.index(c) for c in lookup.columns]
        except ValueError:
            raise InvalidArgument(
                f"insert into {self.table} must give the column(s) {list(lookup.columns)} "
                f"of its owned lookup vindex {lookup.vindex.name!r}"
            ) from None
        values = [[resolve(r[i], bind_vars) for i in idx] for r in rows]
        await lookup.vindex.create(vc.lookup_cursor(), values, ksids, ignore_mode=self.ignore)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "OperatorType": "Insert",
            "Variant": "Reference" if self.broadcast else (
                "Sharded" if self.sharded else "Unsharded"),
            "Keyspace": {"Name": self.keyspace, "Sharded": self.sharded or self.broadcast},
            "Table": self.table,
            "Columns": list(self.columns),
            "Rows": len(self.rows),
        }
        if self.primary_vindex is not None:
            out["Vindex"] = self.primary_vindex.name
            out["VindexValues"] = [
                [r[self.columns.index(c)].describe() if c in self.columns else "<sequence>"
                 for c in self.primary_columns]
                for r in self.rows
            ]
        if self.owned_lookups:
            out["OwnedLookups"] = [lk.vindex.name for lk in self.owned_lookups]
        if self.secondary:
            out["VerifiedVindexes"] = [v.name for _cols, v in self.secondary]
        if self.auto_increment is not None:
            out["AutoIncrement"] = {"Column": self.auto_increment[0],
                                    "Sequence": self.auto_increment[1]}
        if self.ignore:
            out["Ignore"] = True
        if self.on_duplicate:
            out["OnDuplicate"] = [f"{c} = {e.describe()}" for c, e in self.on_duplicate]
        return out


def _destinations(smap: ShardMap, targets: tuple[str, ...]) -> list[str]:
    """Shard names for targets given as shard names or key ranges (``-`` is all)."""
    out: dict[str, None] = {}
    for t in targets:
        if t in smap.names:
            out.setdefault(t)
        else:
            out.update(dict.fromkeys(smap.shards_for_range(parse_key_range(t))))
    return [n for n in smap.names if n in out]


def resolve_or_none(v: Value, bind_vars: Mapping[str, Any]) -> Any:
    if isinstance(v, SQLExpr):
        return v  # an expression: not NULL as far as sequences go
    return resolve(v, bind_vars)


@functools.lru_cache(maxsize=4096)
def _insert_head(
    table: str, columns: tuple[str, ...], dialect: str, ignore: bool, quote: frozenset[str]
) -> str:
    """``INSERT INTO t (a, b) VALUES `` for ``dialect``, quoting the names in ``quote``."""

    def name(n: str) -> str:
        return exp.to_identifier(n, quoted=n in quote or None).sql(dialect=dialect)

    cols = ", ".join(name(c) for c in columns)
    quoted = name(table)
    verb = "INSERT INTO"
    if ignore:
        verb = {"sqlite": "INSERT OR IGNORE INTO", "mysql": "INSERT IGNORE INTO"}.get(dialect, verb)
    return f"{verb} {quoted} ({cols}) VALUES "


def on_duplicate_clause(assignments: tuple[tuple[str, SQLExpr], ...], dialect: str) -> str:
    """``ON DUPLICATE KEY UPDATE`` in the shard's dialect.

    SQLite's upsert without a conflict target, like MySQL's clause, fires on
    any unique constraint; ``VALUES(col)`` there is ``excluded.col``.
    PostgreSQL needs the conflicting constraint named, which the gate does not
    know, so it is refused there.
    """
    if dialect == "mysql":
        body = ", ".join(f"{exp.to_identifier(c).sql(dialect=dialect)} = {e.render(dialect)}"
                         for c, e in assignments)
        return f" ON DUPLICATE KEY UPDATE {body}"
    if dialect != "sqlite":
        raise Unsupported(
            f"INSERT ... ON DUPLICATE KEY UPDATE is not supported on {dialect} shards "
            "(it needs the conflicting key named): use INSERT ... ON CONFLICT on the shard"
        )

    def excluded(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and str(node.this).upper() == "VALUES" and \
                len(node.expressions) == 1:
            return exp.column(node.expressions[0].name, table="excluded")
        return node

    body = ", ".join(
        f"{exp.to_identifier(c).sql(dialect=dialect)} = "
        f"{e.expr.transform(excluded).sql(dialect=dialect)}"
        for c, e in assignments
    )
    return f" ON CONFLICT DO UPDATE SET {body}"


class _InsertQuery(ShardQuery):
    """The per-shard multi-row INSERT, built from the rows routed to that shard.

    It stands in for a ShardQuery: ``for_shard`` gives each shard its SQL and
    arguments.
    """

    __slots__ = ("columns", "insert", "per_shard")

    def __init__(
        self, insert: Insert, columns: list[str], per_shard: dict[str, list[list[Value]]]
    ) -> None:
        super().__init__(exp.Anonymous(this="insert"))
        self.insert = insert
        self.columns = columns
        self.per_shard = per_shard

    def for_shard(
        self, shard: str, dialect: str, placeholder: str, bind_vars: Mapping[str, Any]
    ) -> tuple[str, list[Any]]:
        def text(sql: str) -> str:  # a driver that formats %s reads a literal % as %%
            return sql.replace("%", "%%") if placeholder == "%s" else sql

        head = text(_insert_head(self.insert.table, tuple(self.columns), dialect,
                                 self.insert.ignore, self.insert.quoted))
        args: list[Any] = []
        tuples: list[str] = []
        for row in self.per_shard[shard]:
            parts = []
            for v in row:
                if isinstance(v, SQLExpr):
                    parts.append(text(v.render(dialect)))
                else:
                    args.append(resolve(v, bind_vars))
                    parts.append(placeholder)
            tuples.append("(" + ", ".join(parts) + ")")
        tail = " ON CONFLICT DO NOTHING" if self.insert.ignore and dialect == "postgres" else ""
        if self.insert.on_duplicate:
            tail = text(on_duplicate_clause(self.insert.on_duplicate, dialect))
        return head + ", ".join(tuples) + tail, args

    @property
    def gate_sql(self) -> str:
        return f"insert into {self.insert.table}"


@dataclass(frozen=True)
class DDL(Primitive):
    """A DDL statement run on every shard of a keyspace."""

    keyspace: str
    sharded: bool
    query: ShardQuery

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        smap = vc.shard_map(self.keyspace)
        # DDL is not transactional on MySQL: each shard applies it on its own.
        await vc.execute_shards(self.keyspace, smap.names, self.query, bind_vars, write=False)
        return Result()

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "DDL",
            "Keyspace": {"Name": self.keyspace, "Sharded": self.sharded},
            "Query": self.query.gate_sql,
        }


__all__ = [
    "DDL",
    "BindVar",
    "ExecCursor",
    "Insert",
    "Literal",
    "Opcode",
    "OrderKey",
    "OwnedLookup",
    "Primitive",
    "Route",
    "SQLExpr",
    "ShardQuery",
]
