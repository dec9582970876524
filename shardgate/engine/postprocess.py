"""Gate-side post-processing of scatter results: aggregate, filter, sort, limit, project.

Each primitive takes the rows of its ``input`` and works on *slots*: the
columns of the row it receives. The planner rewrites the shard query so the
shards return what these need (partial aggregates, hidden sort columns) and
maps every HAVING / ORDER BY / select-list expression to slots, so nothing
here parses SQL.

Aggregation is decomposable: each shard returns one row per group with
partial aggregates (COUNT, SUM, MIN, MAX, and SUM+COUNT for AVG); the gate
combines them per group. COUNT/SUM(DISTINCT x) make the shards group by x as
well (by every such x), and the gate counts or sums the distinct x per group. Memory is
bounded by the number of groups, not rows.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cmp_to_key
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive, order_compare, semantics_of
from shardgate.engine.sortkeys import sort_rows
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.evaluate import Evaluator
from shardgate.evalengine.sqlsem import EXACT, INT64_MAX, INT64_MIN, Semantics, shown
from shardgate.evalengine.values import Value
from shardgate.result import Result, Row
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.dialects.base import SQLDialect
from shardgate.sql.dialects.render import avg_magnitude, avg_partial


class AggOp(enum.Enum):
    COUNT = "count"  # sum of partial counts (COUNT(*) and COUNT(x))
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    AVG = "avg"  # partials: SUM in ``column``, COUNT in ``column2``
    COUNT_DISTINCT = "count_distinct"
    SUM_DISTINCT = "sum_distinct"


@dataclass(frozen=True)
class AggSpec:
    """One aggregate: the operation and the input column(s) holding its partials."""

    op: AggOp
    column: int
    column2: int | None = None
    name: str = ""


class _Acc:
    __slots__ = ("distinct", "magnitude", "n", "value")

    def __init__(self) -> None:
        self.value: Any = None
        self.n: Any = 0
        self.distinct: dict[Any, Any] = {}
        #: AVG on SQLite: the sum of the integers' absolute values (a double)
        self.magnitude = 0.0


def _add(a: Any, b: Any) -> Any:
    """Add two partial SUMs or COUNTs (numbers; NULL adds nothing)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, float) or isinstance(b, float):
        return float(a) + float(b)
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return EXACT.add(Decimal(a), Decimal(b))
    return a + b


def _dialect(sem: Semantics) -> SQLDialect:
    """The object of the dialect whose values ``sem`` computes as."""
    return sql_dialect(Dialect(sem.dialect))


#: below this sum of absolute values every running sum of integers is exact in a double
_EXACT_DOUBLE_SUMS = 2.0**53 * (1 - 1e-14)  # (SQLite prints the sum to 15 digits)


def _avg(total: Any, count: Any, sem: Semantics, magnitude: float = 0.0) -> Any:
    """AVG as the shards' database computes it, from the combined SUM and COUNT.

    Floating point inputs: a double. MariaDB/MySQL and PostgreSQL: the exact
    sum divided as a decimal (:meth:`Semantics.decimal_divide`: MariaDB's
    DECIMAL at the sum's scale + ``div_precision_increment``, PostgreSQL's
    numeric at ``select_div_scale``). SQLite (before 3.43) adds the values
    as doubles in the order it reads the rows, then divides: while the
    integers' absolute values (``magnitude``) sum below 2^53 every running
    sum is exact whatever the order, and the gate's answer is SQLite's; past
    it the answer depends on an order the gate cannot know, so it refuses.
    """
    if total is None or not count:
        return None
    doubles = _dialect(sem).double_sums
    if doubles and isinstance(total, int) and magnitude >= _EXACT_DOUBLE_SUMS:
        raise Unsupported(
            "AVG over these integers cannot be computed across SQLite shards: SQLite sums "
            "them as doubles in the order it reads the rows, and past 2^53 the rounding "
            "depends on that order; use SUM(x) and COUNT(x) instead"
        )
    if isinstance(total, float) or doubles:
        return float(total) / int(count)
    return sem.decimal_divide(Decimal(total), Decimal(int(count)))


def _checked_sum(total: Any, sem: Semantics) -> Any:
    """A combined SUM: past BIGINT on SQLite, its SUM would have failed too."""
    if _dialect(sem).sum_overflow_fails and isinstance(total, int) and \
            not INT64_MIN <= total <= INT64_MAX:
        raise InvalidArgument("integer overflow in SUM")
    return total


def _sum_distinct(values: Sequence[Any], sem: Semantics) -> Any:
    """SUM(DISTINCT x) of the distinct values: strings count as numbers (a double)."""
    total: Any = None
    as_double = False
    for v in values:
        if isinstance(v, str | bytes):
            as_double = True
        total = _add(total, sem.number(v))
    if total is not None and (as_double or (
            _dialect(sem).double_sums and not isinstance(total, int))):
        return float(total)
    total = _checked_sum(total, sem)
    if _dialect(sem).sum_overflow_fails and isinstance(total, int):
        _refuse_order_dependent_overflow(values)
    return total


def _refuse_order_dependent_overflow(values: Sequence[Any]) -> None:
    """SQLite's integer SUM fails when a running total leaves BIGINT, so a total
    that fits may still fail depending on the order it reads the rows in: in
    some order it does when the positive (or the negative) values alone do not fit.
    The gate cannot know the database's row order, so it refuses."""
    ints = [v for v in values if isinstance(v, int)]
    if sum(v for v in ints if v > 0) > INT64_MAX or sum(v for v in ints if v < 0) < INT64_MIN:
        raise Unsupported(
            "SUM(DISTINCT ...) over these values overflows BIGINT on SQLite or not depending "
            "on the order the database reads its rows in, which the gate cannot know"
        )


@dataclass(frozen=True)
class Aggregate(Primitive):
    """Combine per-shard partial aggregates by group key.

    Output rows: the group key columns, then one column per aggregate.
    ``scalar`` (no GROUP BY): exactly one output row, even for no input.
    """

    input: Primitive
    group_keys: tuple[int, ...]
    aggregates: tuple[AggSpec, ...]
    scalar: bool = False
    #: the keyspace whose database's arithmetic AVG follows
    keyspace: str = field(kw_only=True)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        sem = semantics_of(vc, self.keyspace)
        # Group by the collation's keys; each group shows its first row's values.
        groups: dict[tuple[Any, ...], tuple[tuple[Any, ...], list[_Acc]]] = {}
        keys = self.group_keys
        for row in res.rows:
            values = tuple(row[i] for i in keys)
            key = tuple(sem.key(v) for v in values)
            found = groups.get(key)
            if found is None:
                found = groups[key] = (values, [_Acc() for _ in self.aggregates])
            for spec, acc in zip(self.aggregates, found[1], strict=True):
                _accumulate(spec, acc, row, sem)
        if not groups and self.scalar:
            groups[()] = ((), [_Acc() for _ in self.aggregates])
        rows = [
            values + tuple(self._final(s, a, sem)
                           for s, a in zip(self.aggregates, accs, strict=True))
            for values, accs in groups.values()
        ]
        fields = [res.fields[i] if i < len(res.fields) else "" for i in keys]
        fields += [s.name for s in self.aggregates]
        return Result(fields=fields, rows=rows)

    @staticmethod
    def _final(spec: AggSpec, acc: _Acc, sem: Semantics) -> Any:
        match spec.op:
            case AggOp.COUNT:
                return int(acc.n)
            case AggOp.SUM:
                return _checked_sum(acc.value, sem)
            case AggOp.AVG:
                return _avg(acc.value, acc.n, sem, acc.magnitude)
            case AggOp.COUNT_DISTINCT:
                return len(acc.distinct)
            case AggOp.SUM_DISTINCT:
                return _sum_distinct(list(acc.distinct.values()), sem)
        return acc.value

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "Aggregate",
            "Variant": "Scalar" if self.scalar else "Hash",
            "GroupBy": list(self.group_keys),
            "Aggregates": [
                f"{s.op.value}({s.column}" + (f",{s.column2}" if s.column2 is not None else "")
                + f") AS {s.name}"
                for s in self.aggregates
            ],
            "Inputs": [self.input.describe()],
        }


def _accumulate(spec: AggSpec, acc: _Acc, row: Row, sem: Semantics) -> None:
    """Fold one partial row into an aggregate's accumulator."""
    v = row[spec.column]
    match spec.op:
        case AggOp.COUNT:
            acc.n = _add(acc.n, v or 0)
        case AggOp.SUM:
            acc.value = _add(acc.value, v)
        case AggOp.MIN:
            if v is not None and (acc.value is None or sem.compare(v, acc.value) < 0):
                acc.value = v
        case AggOp.MAX:
            if v is not None and (acc.value is None or sem.compare(v, acc.value) > 0):
                acc.value = v
        case AggOp.AVG:
            assert spec.column2 is not None
            acc.value = _add(acc.value, avg_partial(v))
            acc.magnitude += avg_magnitude(v)
            acc.n = _add(acc.n, row[spec.column2] or 0)
        case AggOp.COUNT_DISTINCT | AggOp.SUM_DISTINCT:
            if v is not None:
                acc.distinct.setdefault(sem.key(v), v)


@dataclass(frozen=True)
class Filter(Primitive):
    """Keep the rows where ``predicate`` is true (HAVING at the gate)."""

    input: Primitive
    predicate: Evaluator
    text: str
    #: the keyspace whose database's semantics the predicate follows
    keyspace: str = field(kw_only=True)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        sem = semantics_of(vc, self.keyspace)
        res.rows = [r for r in res.rows if sem.truth(self.predicate(r, sem)) is True]
        return res

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Filter", "Predicate": self.text,
                "Inputs": [self.input.describe()]}


@dataclass(frozen=True)
class SortKey:
    key: Evaluator
    descending: bool
    nulls_first: bool
    text: str


@dataclass(frozen=True)
class MemorySort(Primitive):
    """Sort all rows at the gate (NULLs first ascending, as MySQL)."""

    input: Primitive
    keys: tuple[SortKey, ...]
    #: the keyspace whose database's collation and comparisons the sort follows
    keyspace: str = field(kw_only=True)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        sem = semantics_of(vc, self.keyspace)
        ordered = sort_rows(res.rows, [(_value_of(k, sem), k.descending, k.nulls_first)
                                       for k in self.keys], sem)
        if ordered is None:  # a term of mixed kinds: compared pairwise
            res.rows.sort(key=cmp_to_key(_row_comparator(self.keys, sem)))
        else:
            res.rows = ordered
        return res

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Sort",
                "OrderBy": ", ".join(f"{k.text} {'DESC' if k.descending else 'ASC'}"
                                     for k in self.keys),
                "Inputs": [self.input.describe()]}


def _value_of(key: SortKey, sem: Semantics) -> Callable[[Row], Any]:
    return lambda row: key.key(row, sem)


def _row_comparator(keys: Sequence[SortKey], sem: Semantics) -> Callable[[Row, Row], int]:
    def cmp(a: Row, b: Row) -> int:
        for k in keys:
            c = order_compare(k.key(a, sem), k.key(b, sem), k.descending, k.nulls_first, sem)
            if c:
                return c
        return 0

    return cmp


@dataclass(frozen=True)
class Limit(Primitive):
    """Keep ``limit`` rows after skipping ``offset``."""

    input: Primitive
    limit: Value | None
    offset: Value | None = None

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        from shardgate.engine.primitive import int_of

        res = await self.input.execute(vc, bind_vars)
        off = int_of(self.offset, bind_vars, "OFFSET")
        if self.limit is None:
            res.rows = res.rows[off:]
        else:
            res.rows = res.rows[off : off + int_of(self.limit, bind_vars, "LIMIT")]
        return res

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"OperatorType": "Limit",
                               "Count": self.limit.describe() if self.limit else None}
        if self.offset is not None:
            out["Offset"] = self.offset.describe()
        out["Inputs"] = [self.input.describe()]
        return out


@dataclass(frozen=True)
class Projection(Primitive):
    """Output the listed slots under the given names (drops hidden columns)."""

    input: Primitive
    columns: tuple[Evaluator, ...]
    names: tuple[str, ...]
    texts: tuple[str, ...] = ()
    #: the keyspace whose database's semantics the expressions follow
    keyspace: str = field(kw_only=True)
    #: the names on MySQL/MariaDB, where they differ (a string constant's value)
    mysql_names: tuple[str, ...] = ()

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        cols = self.columns
        sem = semantics_of(vc, self.keyspace)
        if _dialect(sem).mysql_results:
            # a quotient (AVG, /) leaves at its declared scale (sqlsem.Quotient)
            return Result(fields=list(self.mysql_names or self.names),
                          rows=[tuple(shown(f(r, sem)) for f in cols) for r in res.rows],
                          rows_affected=res.rows_affected)
        return Result(fields=list(self.names),
                      rows=[tuple(f(r, sem) for f in cols) for r in res.rows],
                      rows_affected=res.rows_affected)

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Projection", "Columns": list(self.texts or self.names),
                "Inputs": [self.input.describe()]}


def slot(i: int) -> Evaluator:
    """An evaluator reading column ``i``."""
    return lambda row, sem: row[i]
