"""Insert: each row routed by its primary vindex, sequences filled, owned lookups
created, each shard sent its own rows in one multi-row statement."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.engine.insert_ignore import insert_ignoring
from shardgate.engine.primitive import Primitive, map_distinct, vindex_map
from shardgate.engine.upsert import upsert_rows
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.coerce import stored_value
from shardgate.evalengine.values import BindVar, Literal, SQLExpr, Value, resolve
from shardgate.result import Result
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.vindexes import KeyspaceId, Lookup, Reversible, Vindex
from shardgate.vindexes.lookup import LookupBase


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
    #: ``ON DUPLICATE KEY UPDATE col = expr, ...``: run by the shard, or row by row by
    #: the gate into an owner of lookup vindexes (:mod:`shardgate.engine.upsert`)
    on_duplicate: tuple[tuple[str, SQLExpr], ...] = ()
    #: table and column names quoted in the statement (`select`): quoted for the shards too
    quoted: frozenset[str] = frozenset()
    #: :meth:`duplicate_clause`'s renderings by dialect
    _clauses: dict[str, str] = field(default_factory=dict, init=False, compare=False,
                                     repr=False)

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
            if self.on_duplicate and self.owned_lookups:
                done = await self._upsert(vc, columns, rows, ksids, bind_vars)
                return Result(rows_affected=done, insert_id=insert_id)
            for lookup in self.owned_lookups:
                await self._create_lookup(vc, lookup, columns, rows, ksids, bind_vars)
            per_shard = {}
            for row, ksid in zip(rows, ksids, strict=True):
                per_shard.setdefault(smap.find(ksid), []).append(row)
        shards = [n for n in smap.names if n in per_shard]
        query = InsertQuery(self, columns, per_shard)
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
        mapped = await map_distinct(vc, self.primary_vindex, values)
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
            return await self._insert_one(vc, columns, smap.find(ksids[i]), rows[i], bind_vars)

        return await insert_ignoring(vc.lookup_cursor(), lookups, values, ksids, insert_row)

    async def _upsert(
        self,
        vc: ExecCursor,
        columns: list[str],
        rows: list[list[Value]],
        ksids: list[KeyspaceId],
        bind_vars: Mapping[str, Any],
    ) -> int:
        """ON DUPLICATE KEY UPDATE row by row, lookups kept exact
        (:mod:`shardgate.engine.upsert`)."""
        plain = dataclasses.replace(self, on_duplicate=())

        async def insert_row(shard: str, row: list[Value]) -> int:
            return await plain._insert_one(vc, columns, shard, row, bind_vars)

        return await upsert_rows(vc, self, columns, rows, ksids, bind_vars, insert_row)

    async def _insert_one(self, vc: ExecCursor, columns: list[str], shard: str,
                          row: list[Value], bind_vars: Mapping[str, Any]) -> int:
        """``row`` into ``shard`` as this plan's INSERT; the rows it affected."""
        query = InsertQuery(self, columns, {shard: [row]})
        done = await vc.execute_shards(self.keyspace, [shard], query, bind_vars, write=True)
        return done[0].rows_affected

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

    def duplicate_clause(self, dialect: str) -> str:
        """:attr:`on_duplicate` as the clause ending the INSERT on ``dialect``'s shards,
        rendered once per plan and dialect (:func:`on_duplicate_clause`)."""
        clause = self._clauses.get(dialect)
        if clause is None:
            clause = self._clauses[dialect] = on_duplicate_clause(self.on_duplicate, dialect)
        return clause


def resolve_or_none(v: Value, bind_vars: Mapping[str, Any]) -> Any:
    """``v``'s value (an SQL expression stands for itself: not NULL to a sequence)."""
    if isinstance(v, SQLExpr):
        return v  # an expression: not NULL as far as sequences go
    return resolve(v, bind_vars)


@functools.lru_cache(maxsize=4096)
def _insert_parts(
    table: str, columns: tuple[str, ...], dialect: str, ignore: bool, quote: frozenset[str]
) -> tuple[str, str]:
    """``INSERT INTO t (a, b) VALUES `` for ``dialect``, quoting the names in ``quote``,
    and what follows the rows (INSERT IGNORE's ``ON CONFLICT DO NOTHING`` on PostgreSQL)."""

    def name(n: str) -> str:
        return exp.to_identifier(n, quoted=n in quote or None).sql(dialect=dialect)

    cols = ", ".join(name(c) for c in columns)
    quoted = name(table)
    verb, tail = sql_dialect(Dialect(dialect)).insert_ignore() if ignore else ("INSERT INTO", "")
    return f"{verb} {quoted} ({cols}) VALUES ", tail


def on_duplicate_clause(assignments: tuple[tuple[str, SQLExpr], ...], dialect: str) -> str:
    """``ON DUPLICATE KEY UPDATE`` in the shard's dialect
    (:meth:`~shardgate.sql.dialects.base.SQLDialect.on_duplicate_key_update`); refused
    where the dialect needs the conflicting key named, which the gate does not know."""
    clause = sql_dialect(Dialect(dialect)).on_duplicate_key_update(
        [(c, e.expr) for c, e in assignments])
    if clause is None:
        raise Unsupported(
            f"INSERT ... ON DUPLICATE KEY UPDATE is not supported on {dialect} shards "
            "(it needs the conflicting key named): use INSERT ... ON CONFLICT on the shard"
        )
    return clause


class InsertQuery(ShardQuery):
    """The per-shard multi-row INSERT, built from the rows routed to that shard.

    It stands in for a ShardQuery: ``for_shard`` gives each shard its SQL and
    arguments.
    """

    __slots__ = ("columns", "insert", "per_shard")

    def __init__(
        self, insert: Insert, columns: list[str], per_shard: dict[str, list[list[Value]]]
    ) -> None:
        super().__init__(exp.Anonymous(this="insert"))
        self._target = ("insert", insert.table)
        self.insert = insert
        self.columns = columns
        self.per_shard = per_shard

    def for_shard(
        self, shard: str, dialect: str, placeholder: str, bind_vars: Mapping[str, Any]
    ) -> tuple[str, list[Any]]:
        def text(sql: str) -> str:  # a driver that formats %s reads a literal % as %%
            return sql.replace("%", "%%") if placeholder == "%s" else sql

        head, tail = _insert_parts(self.insert.table, tuple(self.columns), dialect,
                                   self.insert.ignore, self.insert.quoted)
        head = text(head)
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
        if self.insert.on_duplicate:
            tail = text(self.insert.duplicate_clause(dialect))
        return head + ", ".join(tuples) + tail, args

    @property
    def gate_sql(self) -> str:
        return f"insert into {self.insert.table}"
