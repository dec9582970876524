"""Uncorrelated scalar and EXISTS subqueries the gate runs first.

* :class:`PulloutValue`: ``x = (SELECT ...)``, or a subquery in the select
  list: the subquery runs once; its one value (NULL when it returns no row)
  is bound for the outer query. More than one row is an error, as in MySQL.
* :class:`PulloutExists`: ``EXISTS (SELECT ...)``: the subquery runs once and
  the outer query receives ``1`` or ``0`` (the planner rewrites the predicate
  to ``:var = 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.errors import InvalidArgument
from shardgate.result import Result


def single_value(res: Result) -> Any:
    """The value of a subquery used as a value: NULL for no row; more than one
    column (even over no rows, as every database refuses it) or row is an error."""
    if len(res.fields) > 1 or any(len(r) != 1 for r in res.rows):
        raise InvalidArgument("a subquery used as a value must select exactly one column")
    if len(res.rows) > 1:
        raise InvalidArgument(
            f"subquery returns more than 1 row: a subquery used as a value returned "
            f"{len(res.rows)} rows, it may return at most one"
        )
    return res.rows[0][0] if res.rows else None


@dataclass(frozen=True)
class _Pullout(Primitive):
    """Run ``subquery`` first, bind what it tells to ``var``, then run ``outer``."""

    subquery: Primitive
    outer: Primitive
    var: str

    #: Vitess's name of the variant, shown by EXPLAIN
    VARIANT: ClassVar[str] = ""

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "UncorrelatedSubquery",
            "Variant": self.VARIANT,
            "PulloutVars": [self.var],
            "Inputs": [self.subquery.describe(), self.outer.describe()],
        }


@dataclass(frozen=True)
class PulloutValue(_Pullout):
    """Run ``subquery`` first; bind its single value to ``var`` for ``outer``."""

    VARIANT: ClassVar[str] = "PulloutValue"

    #: result columns that are the subquery itself (a select-list item): the shard
    #: returns a bound parameter typed as it likes (a DATETIME as text on MariaDB),
    #: so the gate puts the subquery's own value, the same in every row, back
    columns: tuple[int, ...] = field(default=(), kw_only=True)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        value = single_value(await self.subquery.execute(vc, bind_vars))
        res = await self.outer.execute(vc, {**bind_vars, self.var: value})
        if self.columns and res.rows:
            width = len(res.rows[0])
            if all(i < width for i in self.columns):
                for n, row in enumerate(res.rows):
                    cells = list(row)
                    for i in self.columns:
                        cells[i] = value
                    res.rows[n] = tuple(cells)
        return res


@dataclass(frozen=True)
class PulloutExists(_Pullout):
    """Run ``subquery`` first; bind 1 to ``var`` if it returned a row, else 0."""

    VARIANT: ClassVar[str] = "PulloutExists"

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.subquery.execute(vc, bind_vars)
        return await self.outer.execute(vc, {**bind_vars, self.var: 1 if res.rows else 0})
