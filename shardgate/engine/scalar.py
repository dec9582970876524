"""Subqueries used as values (``INSERT ... VALUES (5, (SELECT COUNT(*) FROM t))``).

A subquery in an INSERT's VALUES cannot run where the row goes: on one shard
it would see that shard's rows only, and an unsharded database does not hold
another keyspace's tables. The planner plans each such subquery as a SELECT of
its own (so a scatter aggregate is merged across shards) and
:class:`ScalarSubqueries` runs them first, in the statement's session and
transaction, binding each one's value for the insert. As in SQL: no row is
NULL; more than one row or more than one column is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.engine.pullout import single_value
from shardgate.result import Result


@dataclass(frozen=True)
class ScalarSubqueries(Primitive):
    """Bind ``var`` to the value of each ``(var, subquery)`` in turn, then run ``outer``."""

    subqueries: tuple[tuple[str, Primitive], ...]
    outer: Primitive

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        bound = dict(bind_vars)
        for var, sub in self.subqueries:
            bound[var] = single_value(await sub.execute(vc, bound))
        return await self.outer.execute(vc, bound)

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "UncorrelatedSubquery",
            "Variant": "PulloutValue",
            "PulloutVars": [var for var, _ in self.subqueries],
            "Inputs": [*(sub.describe() for _, sub in self.subqueries), self.outer.describe()],
        }
