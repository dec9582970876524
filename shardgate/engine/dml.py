"""UPDATE and DELETE that keep owned lookup vindexes consistent (the V3 design).

Both run inside a transaction (the session's, or an implicit one the gate
opens), in this order:

1. ``SELECT <primary vindex cols>, <owned lookup cols> FROM t WHERE ... FOR UPDATE``
   on the shards the statement reaches, locking the rows it will change;
2. for each row, its keyspace id from the primary vindex;
3. DELETE: remove each owned lookup's row ``values -> ksid``;
   UPDATE: for each owned lookup whose columns change, move its row from the
   old values to the new ones;
4. the statement itself, on the same shards.

A failure at any step fails the statement; the gate's savepoint (or the
implicit transaction's rollback) removes the lookup work already done, so a
lookup table never disagrees with its owner table after a statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.engine.primitive import Primitive, vindex_map
from shardgate.engine.route import Route
from shardgate.errors import Internal
from shardgate.evalengine.coerce import Kind, stored_value
from shardgate.evalengine.values import Value, resolve
from shardgate.result import Result
from shardgate.sql.statements import StatementType
from shardgate.vindexes import Lookup, Vindex


@dataclass(frozen=True)
class LookupChange:
    """One owned lookup vindex a DML statement must maintain."""

    vindex: Lookup
    #: positions of the lookup's columns in the owned-values select
    positions: tuple[int, ...]
    #: for UPDATE: new value per lookup column (None = unchanged)
    new_values: tuple[Value | None, ...] = ()
    #: the owner table's columns of the lookup, one per position
    columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class LookupDML(Primitive):
    """A DML route preceded by the lookup maintenance its owner table needs."""

    route: Route
    select: ShardQuery
    primary_vindex: Vindex
    primary_count: int
    changes: tuple[LookupChange, ...]
    #: StatementType.UPDATE or StatementType.DELETE
    verb: StatementType

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        shards = await self.route.shards(vc, bind_vars)
        if not shards:
            return Result()
        selected = await vc.execute_shards(
            self.route.keyspace, shards, self.select, bind_vars, write=True
        )
        rows = [row for r in selected for row in r.rows]
        if rows:
            keys = [row[: self.primary_count] for row in rows]
            values = [k if len(k) > 1 else k[0] for k in keys]
            mapped = await vindex_map(vc, self.primary_vindex, values)
            cursor = vc.lookup_cursor()
            new_values = await self._new_values(vc, bind_vars)
            for row, ksids in zip(rows, mapped, strict=True):
                if len(ksids) != 1:
                    raise Internal(
                        f"row {row[: self.primary_count]!r} has no single keyspace id "
                        f"under {self.primary_vindex.name!r}"
                    )
                ksid = ksids[0]
                for change, stored in zip(self.changes, new_values, strict=True):
                    old = [row[p] for p in change.positions]
                    if self.verb is StatementType.DELETE:
                        if change.vindex.ignore_nulls and any(v is None for v in old):
                            continue
                        await change.vindex.delete(cursor, [old], ksid)
                        continue
                    new = [o if nv is None else sv
                           for o, nv, sv in zip(old, change.new_values, stored, strict=True)]
                    if new != old:
                        await change.vindex.update(cursor, old, ksid, new)
        results = await vc.execute_shards(
            self.route.keyspace, shards, self.route.query, bind_vars, write=True
        )
        return Result(rows_affected=sum(r.rows_affected for r in results))

    async def _new_values(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> list[list[Any]]:
        """Each change's new values as the owner's columns will store them (UPDATE)."""
        if self.verb is StatementType.DELETE:
            return [[] for _ in self.changes]
        kinds: Mapping[str, Kind] = {}
        if self.route.table is not None:
            kinds = await vc.column_kinds(self.route.keyspace, self.route.table)
        dialect = vc.dialect(self.route.keyspace)
        out: list[list[Any]] = []
        for change in self.changes:
            out.append([
                None if nv is None else stored_value(
                    resolve(nv, bind_vars), kinds.get(col), dialect, write=True, column=col)
                for nv, col in zip(change.new_values, change.columns, strict=True)
            ])
        return out

    def describe(self) -> dict[str, Any]:
        out = self.route.describe()
        out["OperatorType"] = self.verb.value.capitalize()  # Vitess's "Update", "Delete"
        out["OwnedVindexQuery"] = self.select.gate_sql
        out["ChangedVindexes"] = [c.vindex.name for c in self.changes]
        return out
