"""Joins and subqueries the gate runs itself, when the shards cannot.

* :class:`NestedLoopJoin`: runs the left side, then the right side once per
  batch of distinct left join keys (``right.col IN (:__sg_join)``, so the
  right side routes by vindex when the join column is one), and matches rows
  by key in a hash table. INNER and LEFT joins; NULL keys never match.
  Output rows are the left row followed by the right row.
* :class:`PulloutSubquery`: runs an uncorrelated ``IN (SELECT ...)`` subquery
  first and binds its values as a list for the outer query (an empty result
  binds ``[NULL]``, which ``IN`` never matches; where IN's value matters, a
  flag tells the outer query the subquery was empty). On MariaDB such an IN
  is refused when the subquery returns a NULL: there ``x IN (SELECT col ...)``
  is FALSE, not NULL, for an ``x`` outside the range of ``col``'s type
  (``4611686018427387904 IN (SELECT int_col ...)``, while the same IN over
  constants is NULL), which the gate cannot tell from the values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive, dialect_of, semantics_of
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.result import Result, Row
from shardgate.sql.labels import label, with_values

JOIN_BATCH = 500


def refuse_null_in_subquery(vc: ExecCursor, keyspaces: Sequence[str]) -> None:
    """Refuse an ``x IN (SELECT ...)`` whose value matters (under NOT, OR, in the select
    list) and whose subquery returned NULL, where a keyspace's database answers FALSE
    for values outside the subquery column's range (MariaDB): the gate cannot know it."""
    if any(dialect_of(vc, k).in_subquery_range_false for k in keyspaces):
        raise Unsupported(
            "x IN (SELECT ...) under NOT, OR or in the select list cannot be answered "
            "across MariaDB shards when the subquery returns NULL: MariaDB answers FALSE, "
            "not NULL, for values outside the range of the subquery column's type, which "
            "the gate cannot know; exclude the NULLs (WHERE col IS NOT NULL)"
        )


@dataclass(frozen=True)
class NestedLoopJoin(Primitive):
    """Join two inputs at the gate on equal keys."""

    left: Primitive
    right: Primitive
    left_keys: tuple[int, ...]
    right_keys: tuple[int, ...]
    join_var: str
    right_width: int
    outer: bool = False
    batch: int = JOIN_BATCH
    #: the keyspace whose collation decides which keys are equal ('a' = 'A ' on MariaDB)
    keyspace: str = field(kw_only=True)
    #: whether ``right`` filters by ``join_var``; if not (a derived table evaluated
    #: at the gate), it runs once and its rows are matched by key here
    right_filtered: bool = field(default=True, kw_only=True)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        left = await self.left.execute(vc, bind_vars)
        sem = semantics_of(vc, self.keyspace)
        keys: dict[tuple[Any, ...], None] = {}
        for row in left.rows:
            k = tuple(row[i] for i in self.left_keys)
            if None not in k:
                keys.setdefault(k)
        matches: dict[tuple[Any, ...], list[Row]] = {}
        right_fields: list[str] = []
        if not self.left_keys and left.rows:  # a cross join: every right row, once
            res = await self.right.execute(vc, bind_vars)
            right_fields = res.fields
            matches[()] = list(res.rows)
        if self.left_keys and not self.right_filtered and keys:
            res = await self.right.execute(vc, bind_vars)
            right_fields = res.fields
            for row in res.rows:
                k = tuple(sem.key(row[i]) for i in self.right_keys)
                matches.setdefault(k, []).append(row)
            keys = {}
        firsts = list(dict.fromkeys(k[0] for k in keys)) if self.left_keys else []
        for start in range(0, len(firsts), self.batch):
            chunk = firsts[start : start + self.batch]
            res = await self.right.execute(vc, {**bind_vars, self.join_var: chunk})
            right_fields = right_fields or res.fields
            for row in res.rows:
                k = tuple(sem.key(row[i]) for i in self.right_keys)
                matches.setdefault(k, []).append(row)
        pad = (None,) * self.right_width
        rows: list[Row] = []
        for row in left.rows:
            k = tuple(sem.key(row[i]) for i in self.left_keys)
            found = matches.get(k) if None not in k else None
            if found:
                rows.extend(row + r for r in found)
            elif self.outer:
                rows.append(row + pad)
        return Result(fields=left.fields + (right_fields or [""] * self.right_width), rows=rows)

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "Join",
            "Variant": "LeftJoin" if self.outer else "Join",
            "JoinVars": {self.join_var: list(self.left_keys)},
            "RightKeys": list(self.right_keys),
            "Inputs": [self.left.describe(), self.right.describe()],
        }


@dataclass(frozen=True)
class PulloutSubquery(Primitive):
    """Run ``subquery`` first; bind its first column's values to ``var`` for ``outer``."""

    subquery: Primitive
    outer: Primitive
    var: str
    #: set to 1 when the subquery returned rows, 0 when it returned none; the
    #: values then keep a NULL the subquery returned (IN's value matters)
    has_values: str | None = None
    #: the keyspaces of the outer query (where IN is evaluated)
    keyspaces: tuple[str, ...] = ()
    #: result columns (position, text as written) named with their bind variables' values
    labels: tuple[tuple[int, exp.Expr], ...] = ()

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.subquery.execute(vc, bind_vars)
        if res.rows and len(res.rows[0]) != 1:
            raise InvalidArgument("a subquery used with IN must select exactly one column")
        keep_null = self.has_values is not None
        values = list(dict.fromkeys(r[0] for r in res.rows if keep_null or r[0] is not None))
        if keep_null and None in values:
            refuse_null_in_subquery(vc, self.keyspaces)
        bound = {**bind_vars, self.var: values or [None]}
        if self.has_values is not None:
            bound[self.has_values] = 1 if values else 0
        res = await self.outer.execute(vc, bound)
        if not self.labels:
            return res
        fields = list(res.fields)
        for i, item in self.labels:
            if i < len(fields):
                fields[i] = label(with_values(item, bind_vars))
        return replace(res, fields=fields)

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "UncorrelatedSubquery",
            "PulloutVars": [self.var] + ([self.has_values] if self.has_values else []),
            "Inputs": [self.subquery.describe(), self.outer.describe()],
        }
