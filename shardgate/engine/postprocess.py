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
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from functools import cmp_to_key
from typing import Any

from shardgate.engine.evaluate import Evaluator
from shardgate.engine.primitives import ExecCursor, Primitive, order_compare
from shardgate.engine.values import Value
from shardgate.errors import InvalidArgument
from shardgate.result import Result, Row


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
    __slots__ = ("distinct", "n", "value")

    def __init__(self) -> None:
        self.value: Any = None
        self.n: Any = 0
        self.distinct: set[Any] = set()


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Decimal) != isinstance(b, Decimal):
        a, b = Decimal(str(a)), Decimal(str(b))
    return a + b


_EXACT = Context(prec=120)


def _avg(total: Any, count: Any, dialect: str) -> Any:
    """AVG as the shards' database computes it, from the combined SUM and COUNT.

    Floating point inputs, and SQLite: a double. MariaDB/MySQL: the exact
    quotient rounded half up to the input's scale plus ``div_precision_increment``
    (4). PostgreSQL: numeric division at the scale ``select_div_scale`` picks
    (at least 16 significant digits), rounded half away from zero.
    """
    if total is None or not count:
        return None
    if isinstance(total, float) or dialect == "sqlite":
        return float(total) / int(count)
    num, den = Decimal(total), Decimal(int(count))
    quotient = _EXACT.divide(num, den)
    in_scale = max(0, -int(num.as_tuple().exponent))
    scale = _pg_div_scale(num, den, in_scale) if dialect == "postgres" else min(in_scale + 4, 30)
    return quotient.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=_EXACT)


def _pg_weight(d: Decimal) -> tuple[int, int]:
    """PostgreSQL's numeric weight and first base-10000 digit of ``d``."""
    d = abs(d)
    if d == 0:
        return 0, 0
    weight = 0
    while d >= 10000:
        d /= 10000
        weight += 1
    while d < 1:
        d *= 10000
        weight -= 1
    return weight, int(d)


def _pg_div_scale(num: Decimal, den: Decimal, in_scale: int) -> int:
    """``select_div_scale`` of PostgreSQL's numeric.c."""
    w1, f1 = _pg_weight(num)
    w2, f2 = _pg_weight(den)
    qweight = w1 - w2
    if f1 <= f2:
        qweight -= 1
    return min(max(16 - qweight * 4, in_scale, 0), 1000)


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
    keyspace: str = ""

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        dialect = vc.dialect(self.keyspace) if self.keyspace else "mysql"
        groups: dict[tuple[Any, ...], list[_Acc]] = {}
        keys = self.group_keys
        for row in res.rows:
            key = tuple(row[i] for i in keys)
            accs = groups.get(key)
            if accs is None:
                accs = groups[key] = [_Acc() for _ in self.aggregates]
            for spec, acc in zip(self.aggregates, accs, strict=True):
                v = row[spec.column]
                match spec.op:
                    case AggOp.COUNT:
                        acc.n = _add(acc.n, v or 0)
                    case AggOp.SUM:
                        acc.value = _add(acc.value, v)
                    case AggOp.MIN:
                        if v is not None and (acc.value is None or v < acc.value):
                            acc.value = v
                    case AggOp.MAX:
                        if v is not None and (acc.value is None or v > acc.value):
                            acc.value = v
                    case AggOp.AVG:
                        assert spec.column2 is not None
                        acc.value = _add(acc.value, v)
                        acc.n = _add(acc.n, row[spec.column2] or 0)
                    case AggOp.COUNT_DISTINCT | AggOp.SUM_DISTINCT:
                        if v is not None:
                            acc.distinct.add(v)
        if not groups and self.scalar:
            groups[()] = [_Acc() for _ in self.aggregates]
        rows = [
            key + tuple(self._final(s, a, dialect)
                        for s, a in zip(self.aggregates, accs, strict=True))
            for key, accs in groups.items()
        ]
        fields = [res.fields[i] if i < len(res.fields) else "" for i in keys]
        fields += [s.name for s in self.aggregates]
        return Result(fields=fields, rows=rows)

    @staticmethod
    def _final(spec: AggSpec, acc: _Acc, dialect: str) -> Any:
        match spec.op:
            case AggOp.COUNT:
                return int(acc.n)
            case AggOp.AVG:
                return _avg(acc.value, acc.n, dialect)
            case AggOp.COUNT_DISTINCT:
                return len(acc.distinct)
            case AggOp.SUM_DISTINCT:
                total = None
                for v in acc.distinct:
                    total = _add(total, v)
                return total
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


@dataclass(frozen=True)
class Filter(Primitive):
    """Keep the rows where ``predicate`` is true (HAVING at the gate)."""

    input: Primitive
    predicate: Evaluator
    text: str

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        res.rows = [r for r in res.rows if self.predicate(r) is True]
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

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        res.rows.sort(key=cmp_to_key(_row_comparator(self.keys)))
        return res

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Sort",
                "OrderBy": ", ".join(f"{k.text} {'DESC' if k.descending else 'ASC'}"
                                     for k in self.keys),
                "Inputs": [self.input.describe()]}


def _row_comparator(keys: Sequence[SortKey]) -> Callable[[Row, Row], int]:
    def cmp(a: Row, b: Row) -> int:
        for k in keys:
            c = order_compare(k.key(a), k.key(b), k.descending, k.nulls_first)
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
        from shardgate.engine.primitives import _int_of

        res = await self.input.execute(vc, bind_vars)
        off = _int_of(self.offset, bind_vars, "OFFSET")
        if self.limit is None:
            res.rows = res.rows[off:]
        else:
            res.rows = res.rows[off : off + _int_of(self.limit, bind_vars, "LIMIT")]
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

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        res = await self.input.execute(vc, bind_vars)
        cols = self.columns
        return Result(fields=list(self.names),
                      rows=[tuple(f(r) for f in cols) for r in res.rows],
                      rows_affected=res.rows_affected)

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Projection", "Columns": list(self.texts or self.names),
                "Inputs": [self.input.describe()]}


def slot(i: int) -> Evaluator:
    """An evaluator reading column ``i``."""
    return lambda row: row[i]


def check_non_negative(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidArgument(f"{what} must be a non-negative integer, got {n!r}")
    return n
