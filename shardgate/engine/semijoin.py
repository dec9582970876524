"""Correlated subqueries the gate answers itself (Vitess's SemiJoin and correlated
subquery operators).

:class:`CorrelatedSubquery` appends to every row of its outer input the value a
correlated subquery has for that row: ``EXISTS`` (1/0, a boolean on
PostgreSQL), ``x IN (SELECT ...)`` (SQL's three-valued answer) or a scalar
subquery's value. The planner then filters (a semi-join or, under ``NOT``, an
anti-join), sorts and projects over those rows at the gate.

Two ways to run the subquery:

* **keyed** (the correlation is ``inner.col = outer.col`` equalities only): the
  subquery runs once per batch of distinct outer keys, ``inner.col IN
  (:var)``, returning the key columns (then, for IN, the compared value); its
  rows are matched to the outer rows by key at the gate, equal as the
  keyspace's collation holds them (as the database's ``=`` did on the shard).
  An outer key with a NULL matches nothing (``NULL = x`` is never true).
* **per row** (any other correlation): the outer columns the subquery names
  are bind variables; it runs once per distinct tuple of their values.

Invariants: the output is the outer rows, in their order, each extended by
exactly one value; the subquery's plan is never run with an empty key list.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.join import JOIN_BATCH, refuse_null_in_subquery
from shardgate.engine.primitive import Primitive, semantics_of
from shardgate.engine.pullout import single_value
from shardgate.errors import InvalidArgument
from shardgate.evalengine.evaluate import Evaluator
from shardgate.evalengine.sqlsem import Semantics
from shardgate.result import Result, Row


class SubqueryKind(Enum):
    """What a correlated subquery's value is."""

    EXISTS = "Exists"
    IN = "In"
    VALUE = "Value"


@dataclass(frozen=True)
class CorrelatedSubquery(Primitive):
    """Each ``outer`` row followed by its correlated subquery's value."""

    outer: Primitive
    inner: Primitive
    kind: SubqueryKind
    #: positions in the outer rows of the correlation values (keys, or bound values)
    outer_columns: tuple[int, ...]
    #: keyed: positions of the keys in the inner rows (``inner_keys[i]`` matches
    #: ``outer_columns[i]``); empty for the per-row mode
    inner_keys: tuple[int, ...]
    #: keyed: the list variable of the first key; per row: one variable per outer column
    bind_names: tuple[str, ...]
    #: the keyspace whose database's semantics compare keys and IN's values
    keyspace: str = field(kw_only=True)
    #: IN: the left operand, evaluated over the outer row
    needle: Evaluator | None = field(default=None, kw_only=True)
    #: IN: the position of the compared value in the inner rows
    value_column: int = field(default=0, kw_only=True)
    #: IN: whether NULL and FALSE differ where the IN stands (not a WHERE conjunct)
    value_matters: bool = field(default=True, kw_only=True)
    #: the keyspaces the outer query reads (MariaDB's IN quirk, see below)
    keyspaces: tuple[str, ...] = field(default=(), kw_only=True)
    batch: int = field(default=JOIN_BATCH, kw_only=True)

    @property
    def keyed(self) -> bool:
        return bool(self.inner_keys)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.outer.execute(vc, bind_vars)
        sem = semantics_of(vc, self.keyspace)
        if self.keyed:
            found = await self._keyed(vc, bind_vars, res.rows, sem)
        else:
            found = await self._per_row(vc, bind_vars, res.rows)
        rows = [(*row, self._value(row, inner, sem, vc))
                for row, inner in zip(res.rows, found, strict=True)]
        return Result(fields=[*res.fields, ""], rows=rows)

    async def _keyed(self, vc: ExecCursor, bind_vars: Mapping[str, Any],
                     outer_rows: Sequence[Row], sem: Semantics) -> list[list[Row]]:
        firsts: dict[Hashable, Any] = {}
        for row in outer_rows:
            values = [row[i] for i in self.outer_columns]
            if None not in values:
                firsts.setdefault(sem.key(values[0]), values[0])
        matches: dict[tuple[Hashable, ...], list[Row]] = {}
        values = list(firsts.values())
        for start in range(0, len(values), self.batch):
            chunk = values[start:start + self.batch]
            got = await self.inner.execute(vc, {**bind_vars, self.bind_names[0]: chunk})
            for r in got.rows:
                matches.setdefault(tuple(sem.key(r[i]) for i in self.inner_keys), []).append(r)
        out: list[list[Row]] = []
        for row in outer_rows:
            values = [row[i] for i in self.outer_columns]
            out.append([] if None in values
                       else matches.get(tuple(sem.key(v) for v in values), []))
        return out

    async def _per_row(self, vc: ExecCursor, bind_vars: Mapping[str, Any],
                       outer_rows: Sequence[Row]) -> list[list[Row]]:
        cache: dict[tuple[Hashable, ...], list[Row]] = {}
        out: list[list[Row]] = []
        for row in outer_rows:
            values = tuple(row[i] for i in self.outer_columns)
            key = tuple((type(v).__name__, v) for v in values)  # 1 and '1' bind apart
            if key not in cache:
                bound = dict(zip(self.bind_names, values, strict=True))
                got = await self.inner.execute(vc, {**bind_vars, **bound})
                if self.kind is SubqueryKind.VALUE:
                    cache[key] = [(single_value(got),)]
                else:
                    if self.kind is SubqueryKind.IN and any(len(r) != 1 for r in got.rows):
                        raise InvalidArgument("a subquery used with IN must select exactly "
                                              "one column")
                    cache[key] = list(got.rows)
            out.append(cache[key])
        return out

    def _value(self, row: Row, inner: list[Row], sem: Semantics, vc: ExecCursor) -> Any:
        if self.kind is SubqueryKind.EXISTS:
            return sem.boolean(bool(inner))
        if self.kind is SubqueryKind.VALUE:
            return inner[0][0] if inner else None
        assert self.needle is not None
        if not inner:
            return sem.boolean(False)
        needle = self.needle(row, sem)
        found: bool | None = False
        for r in inner:
            eq = sem.equal(needle, r[self.value_column])
            if eq:
                return sem.boolean(True)
            if eq is None:
                found = None
        if found is None and needle is not None and self.value_matters:
            refuse_null_in_subquery(vc, self.keyspaces)
        return sem.boolean(found)

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "SemiJoin" if self.kind is not SubqueryKind.VALUE
            else "CorrelatedSubquery",
            "Variant": self.kind.value + ("Keyed" if self.keyed else "PerRow"),
            "JoinVars": {name: [i] for name, i in zip(self.bind_names, self.outer_columns,
                                                       strict=False)},
            "Inputs": [self.outer.describe(), self.inner.describe()],
        }
