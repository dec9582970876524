"""``spark.read.format("shardgate")``: a sharded table, one partition per key-range split.

The life of a read:

1. Driver, ``schema()``: unless the user gave a schema, the result types of
   the query on the first shard (:func:`shardgate.backends.bulk.copy`).
2. Driver, ``pushFilters()``: simple comparisons of a column with a literal
   become SQL terms appended to every split's WHERE. Comparisons of integers,
   decimals, booleans and dates are left to the database alone; comparisons of
   strings, floats and timestamps are pushed *and* given back to Spark, because
   collations, NaN and time zones may differ between the database and Spark.
3. Driver, ``partitions()``: :meth:`Gate.split_query` cuts the query into
   ``splits`` key ranges inside the shards (default: one per shard); each split
   is planned by the gate (no I/O) into the shard SQL, which carries the
   primary vindex columns (hidden ones if not selected).
4. Executor, ``read()``: path ``direct`` (default) runs the shard SQL on the
   split's shard database (Arrow batches from ADBC for PostgreSQL and SQLite,
   tuples for MariaDB) and keeps the rows whose keyspace id, computed for the
   whole batch at once (:mod:`shardgate.spark.ksids`), lies in the split's key
   range. Path ``gate`` sends the split's gate SQL (``... AND keyrange(...)``)
   through an in-process gate opened from the topology and closed afterwards.
   Either way a row that a shard holds but does not own (left over from
   resharding) is dropped there, so every row is read exactly once.

A narrower user schema selects only its columns (there is no column pruning in
the Python Data Source API).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)
from pyspark.sql.types import StructType

from shardgate.auth.identity import TRUSTED
from shardgate.backends.bulk import copy as bulk
from shardgate.engine.plan import Plan
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.keys import KeyRange
from shardgate.spark import types as sgtypes
from shardgate.spark._worker import settle
from shardgate.spark.ksids import KsidMapper, VindexSpec
from shardgate.spark.options import ReadOptions, SourceOptions
from shardgate.sql.dialects import Dialect

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlglot import exp

    from shardgate.engine.route import Route
    from shardgate.gate import Gate
    from shardgate.spark.writer import ShardgateWriter
    from shardgate.topo import Topology

# The planner, the gate and sqlglot are imported where the driver needs them: a
# task reading its split directly imports only the backends' bulk module and the
# vindexes (a Python worker starts faster).
GATE_DIALECT = "mysql"

#: The placeholder a split's shard SQL (it has no parameters) is rendered with: "?"
#: leaves a literal ``%`` alone, "%s" doubles it (MariaDB's splits have always been
#: rendered so).
_READ_PLACEHOLDER = {Dialect.SQLITE: "?", Dialect.POSTGRES: "?", Dialect.MYSQL: "%s"}


def base_select(read: ReadOptions, columns: Sequence[str] | None) -> str:
    """The gate SQL to split: the user's query, or the table's (selected) columns."""
    from sqlglot import exp

    if read.query is not None:
        return read.query
    assert read.table is not None
    cols = ", ".join(exp.column(c, quoted=True).sql(dialect=GATE_DIALECT) for c in columns) \
        if columns else "*"
    return f"SELECT {cols} FROM {exp.to_identifier(read.table, quoted=True).sql(GATE_DIALECT)}"


def _open_gate(topology: Topology) -> Gate:
    from shardgate.gate import Gate
    from shardgate.gate.limits import GateLimits
    from shardgate.result import ResultLimits

    # A split is read whole by design (the task's own gate): no result limits.
    return Gate.open(topology, pool_size=1,
                     limits=GateLimits(result_limits=ResultLimits(max_rows=0, max_bytes=0)))


def _plan_split(gate: Gate, sql: str, keyspace: str) -> Route:
    from shardgate.engine.route import Route

    planned = gate.plan(sql, keyspace)
    if not isinstance(planned, Plan) or not isinstance(planned.instructions, Route):
        raise Unsupported("the Spark reader takes a single-table SELECT")
    return planned.instructions


@dataclass(frozen=True)
class _Plan:
    """What a split's task needs: where, what SQL, which rows to keep."""

    gate_sql: str
    shard: str
    url: str
    dialect: Dialect
    shard_sql: str
    start: bytes
    end: bytes
    vindex: VindexSpec | None  # None: read through the gate
    hidden: int


class SplitPartition(InputPartition):
    """One split: a key range inside one shard."""

    def __init__(self, index: int, plan: _Plan) -> None:
        super().__init__(index)
        self.plan = plan


def plan_splits(
    opts: SourceOptions, read: ReadOptions, columns: Sequence[str] | None,
    terms: Sequence[str] = (), *, first_only: bool = False,
) -> list[_Plan]:
    """Split the read and plan each split's shard SQL (driver side, no I/O).

    ``first_only``: plan the first split only (enough for the result's schema).
    """
    from sqlglot import exp

    from shardgate.sql.parse import parse

    topo = opts.topo()
    gate = _open_gate(topo)
    try:
        sql = base_select(read, columns)
        n = read.splits or len(topo.keyspace(opts.keyspace).shards)
        plans = []
        splits = gate.split_query(sql, n, opts.keyspace)
        for split in splits[:1] if first_only else splits:
            stmt = parse(split.sql)
            assert isinstance(stmt, exp.Select)
            for term in terms:
                stmt = stmt.where(term, dialect=GATE_DIALECT, append=True)
            gate_sql = stmt.sql(dialect=GATE_DIALECT)
            route = _plan_split(gate, gate_sql, opts.keyspace)
            shard = topo.keyspace(split.keyspace).shard(split.shard)
            dialect = gate.tablets[(split.keyspace, split.shard)].dialect
            rendered = route.query.for_dialect(dialect, _READ_PLACEHOLDER[dialect])
            if rendered.params:
                raise InvalidArgument("the Spark reader's query cannot have bind variables")
            spec: VindexSpec | None = None
            if route.key_range is not None and route.ksid_vindex is not None:
                try:
                    spec = VindexSpec.of(route.ksid_vindex, route.ksid_columns)
                except Unsupported:
                    spec = None  # a lookup primary vindex: the gate filters
            elif route.key_range is None:  # unsharded keyspace: the one shard, no filter
                spec = None
            plans.append(_Plan(
                gate_sql=gate_sql, shard=split.shard, url=shard.url, dialect=dialect,
                shard_sql=rendered.sql, start=split.key_range.start, end=split.key_range.end,
                vindex=spec, hidden=route.hidden,
            ))
        return plans
    finally:
        asyncio.run(gate.close())


def _literal(value: Any) -> exp.Expression | None:
    from sqlglot import exp

    if value is None:
        return None
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float | decimal.Decimal):
        return exp.Literal.number(str(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, datetime.datetime):
        return exp.Literal.string(value.isoformat(sep=" "))
    if isinstance(value, datetime.date):
        return exp.Literal.string(value.isoformat())
    return None


def _exact(value: Any) -> bool:
    """True when the database compares ``value`` exactly as Spark does."""
    return isinstance(value, bool | int | decimal.Decimal) or (
        isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)
    )


def filter_term(
    f: Filter, columns: set[str], byte_order: set[str] | None = None
) -> tuple[str, bool] | None:
    """A Spark filter as a gate SQL term, and whether it is exact; None if not pushable.

    ``byte_order``: the (lowercased) columns the shards compare byte-wise (None:
    all). A string comparison with another column is pushed only where the
    database's answer is a superset of Spark's (``=`` and ``IN``: equal bytes
    are equal under every collation); ranges and ``<>`` are left to Spark.
    """
    from sqlglot import exp

    if isinstance(f, Not) and isinstance(f.child, EqualTo):
        if _collated(f.child, byte_order):
            return None
        inner = filter_term(f.child, columns, byte_order)
        if inner is None:
            return None
        return f"NOT ({inner[0]})", inner[1]
    attr = getattr(f, "attribute", None)
    if not isinstance(attr, tuple) or len(attr) != 1 or attr[0].lower() not in columns:
        return None
    col = exp.column(attr[0], quoted=True)
    if isinstance(f, IsNull):
        return col.is_(exp.null()).sql(GATE_DIALECT), True
    if isinstance(f, IsNotNull):
        return exp.not_(col.is_(exp.null())).sql(GATE_DIALECT), True
    if isinstance(f, In):
        lits = [_literal(v) for v in f.value]
        if not lits or any(lit is None for lit in lits):
            return None
        term = exp.In(this=col, expressions=lits)
        return term.sql(GATE_DIALECT), all(_exact(v) for v in f.value)
    ops: dict[type, type[exp.Expression]] = {
        EqualTo: exp.EQ, GreaterThan: exp.GT, GreaterThanOrEqual: exp.GTE,
        LessThan: exp.LT, LessThanOrEqual: exp.LTE,
    }
    op = ops.get(type(f))
    if op is None:
        return None
    if op is not exp.EQ and _collated(f, byte_order):
        return None
    value = getattr(f, "value", None)
    lit = _literal(value)
    if lit is None:
        return None
    return op(this=col, expression=lit).sql(GATE_DIALECT), _exact(value)


def _collated(f: Filter, byte_order: set[str] | None) -> bool:
    """True for a comparison of a string with a column the shards compare by a collation."""
    attr = getattr(f, "attribute", None)
    return (byte_order is not None and isinstance(getattr(f, "value", None), str)
            and isinstance(attr, tuple) and attr[0].lower() not in byte_order)


class ShardgateDataSource(DataSource):
    """The batch source and sink ``shardgate`` (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "shardgate"

    def schema(self) -> StructType:
        settle()
        opts = SourceOptions.parse(self.options)
        read = ReadOptions.parse(self.options)
        plan = plan_splits(opts, read, None, first_only=True)[0]
        with bulk.ShardReader(plan.url) as r:
            arrow = r.result_schema(plan.shard_sql, table=read.table)
        return sgtypes.to_spark(sgtypes.canonical_schema(
            sgtypes.drop_last(arrow, plan.hidden), numeric_as=read.numeric_as))

    def reader(self, schema: StructType) -> DataSourceReader:
        settle()
        return ShardgateReader(SourceOptions.parse(self.options),
                               ReadOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> ShardgateWriter:
        from shardgate.spark.writer import ShardgateWriter

        settle()
        return ShardgateWriter(self.options, schema, overwrite)


class ShardgateReader(DataSourceReader):
    """Plans splits in the driver, reads one split per task."""

    def __init__(self, opts: SourceOptions, read: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.read_opts = read
        self.schema = schema
        self.terms: list[str] = []

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        columns = {f.name.lower() for f in self.schema.fields}
        byte_order = self._byte_order()
        for f in filters:
            term = filter_term(f, columns, byte_order)
            if term is None:
                yield f
                continue
            self.terms.append(term[0])
            if not term[1]:
                yield f  # pushed, and checked again by Spark

    def _byte_order(self) -> set[str]:
        """Columns every shard compares byte-wise (a query: none, it may rename them)."""
        if self.read_opts.table is None:
            return set()
        shards = self.opts.topo().keyspace(self.opts.keyspace).shards
        out: set[str] | None = None
        for shard in shards:  # shards may differ in collation: the columns binary on all
            cols = bulk.byte_order_columns(shard.url, self.read_opts.table)
            out = cols if out is None else out & cols
        return out or set()

    def partitions(self) -> Sequence[InputPartition]:
        columns = [f.name for f in self.schema.fields] if self.read_opts.table else None
        plans = plan_splits(self.opts, self.read_opts, columns, self.terms)
        return [SplitPartition(i, p) for i, p in enumerate(plans)]

    def read(
        self, partition: InputPartition
    ) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SplitPartition)
        settle()
        plan = partition.plan
        if self.read_opts.path == "gate" or (plan.vindex is None and plan.start + plan.end):
            return self._through_gate(plan)
        if bulk.supports_arrow(plan.url):
            return self._arrow(plan)
        return self._tuples(plan)

    def _arrow(self, plan: _Plan) -> Iterator[pa.RecordBatch]:
        target = sgtypes.to_arrow(self.schema)
        mapper = KsidMapper(plan.vindex) if plan.vindex is not None else None
        kr = KeyRange(plan.start, plan.end)
        with bulk.ShardReader(plan.url) as r:
            for batch in r.arrow_batches(plan.shard_sql, self.read_opts.batch_rows):
                if mapper is not None:
                    keep = mapper.in_range(batch, kr)
                    if not keep.all():  # stray rows are rare: no copy without them
                        batch = batch.filter(keep)
                if batch.num_rows:
                    yield sgtypes.conform(batch, target)

    def _tuples(self, plan: _Plan) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        target = sgtypes.to_arrow(self.schema)
        mapper = KsidMapper(plan.vindex) if plan.vindex is not None else None
        kr = KeyRange(plan.start, plan.end)
        with bulk.ShardReader(plan.url) as r:
            for fields, rows in r.row_batches(plan.shard_sql, self.read_opts.batch_rows):
                if mapper is not None:
                    idx = [i for i, f in enumerate(fields)
                           if f.lower() in {c.lower() for c in mapper.spec.columns}]
                    keys = pa.table({fields[i]: [r[i] for r in rows] for i in idx})
                    mask = mapper.in_range(keys, kr)
                    rows = [row for row, keep in zip(rows, mask.tolist(), strict=True) if keep]
                if rows:
                    yield sgtypes.python_row_batch(fields, rows, target)

    def _through_gate(self, plan: _Plan) -> Iterator[pa.RecordBatch]:
        async def run() -> tuple[list[str], list[tuple[Any, ...]]]:
            gate = _open_gate(self.opts.topo())
            try:
                session = gate.session(self.opts.keyspace, identity=TRUSTED)
                result = await gate.execute(session, plan.gate_sql)
                return list(result.fields), [tuple(r) for r in result.rows]
            finally:
                await gate.close()

        fields, rows = asyncio.run(run())
        if rows:
            yield sgtypes.python_row_batch(fields, rows, sgtypes.to_arrow(self.schema))
