"""``df.write.format("shardgate").mode("append")``: rows to the shards that own them.

Exactly once, by staging (chosen over an idempotent upsert because it also
works for tables whose rows have no natural key and makes a job's rows
appear only when the job succeeds):

1. Driver, when the write starts: one staging table per shard,
   ``_sg_stage_<job>`` (the target's columns plus ``_sg_task``), created empty
   from the target (``CREATE TABLE ... AS SELECT ... WHERE 1 = 0``; UNLOGGED on
   PostgreSQL, so logical decoding never sees it; ``_sg_`` tables are not
   captured on SQLite either).
2. Each task (``write``): computes every row's keyspace id with the table's
   primary vindex for a whole Arrow batch at once, groups rows by owning shard
   and appends them, ``batch_rows`` at a time, to that shard's staging table,
   tagged with the task attempt's id. It returns the attempt id.
3. Driver, ``commit``: on each shard, in one transaction, copies the rows of the
   *successful* attempts into the table (``INSERT ... SELECT ... WHERE _sg_task
   IN (...)``), then drops the staging table. Rows of failed or retried
   attempts are never copied, so a retried task adds nothing.
   ``abort`` drops the staging tables.

With ``ignore_duplicates=true`` the copy skips rows whose key already exists
(``ON CONFLICT DO NOTHING`` / ``INSERT OR IGNORE`` / ``INSERT IGNORE``), so
re-running a whole job that already committed adds nothing either.

Shards commit independently (concurrently), as the gate's ``best_effort``
transactions do: if one fails, the error names the shards that committed.
Tables with owned lookup vindexes are refused (their lookup rows would have
to be written through the gate); so are tables whose rows would need
sequence values the DataFrame does not carry.

**Bulk enqueue.** When ``table`` is a queue table (``type: "queue"`` in the
VSchema), the same staging path inserts *events*: the DataFrame carries the
queue's own columns and, optionally, ``id`` (default: the table's random
64-bit id), ``time_scheduled`` (nanoseconds since the epoch; default: the
commit time) and ``priority``. The fire state (``state``, ``epoch``,
``time_next``, ``time_acked``) belongs to the queue managers and is refused;
the commit copy leaves it to the table's defaults (``to_be_fired``, epoch 0,
``time_next`` 0). A retried task adds no event (its staged rows are never
copied); with ``ignore_duplicates=true`` and explicit ids, neither does a
re-run job. The copy transaction also records a queue signal
(:mod:`shardgate.queues.signals`), committed with the events, so the shard's
queue leader wakes its manager within one signal poll of the commit, as fast
as for events inserted through the gate.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from shardgate.backends.bulk import arrow
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.urls import parse_url
from shardgate.errors import (
    AlreadyExists,
    Internal,
    InvalidArgument,
    ShardgateError,
    Unsupported,
)
from shardgate.keys import KeyRange
from shardgate.queues import signals
from shardgate.spark import types as sgtypes
from shardgate.spark._worker import settle
from shardgate.spark.ksids import KsidMapper, ShardIndex, VindexSpec, group_by_shard
from shardgate.spark.options import SourceOptions, WriteOptions
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.vschema import TableType

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
TASK_COLUMN = "_sg_task"
STAGE_PREFIX = "_sg_stage_"


@dataclass(frozen=True)
class _Shard:
    name: str
    url: str
    kind: str
    start: bytes
    end: bytes

    @property
    def dialect(self) -> Dialect:
        """The shard database's dialect (from its URL kind)."""
        return Dialect.of(self.kind)


@dataclass
class StagedRows(WriterCommitMessage):
    """What one successful task attempt staged: its id and rows per shard."""

    task: str
    rows: dict[str, int] = field(default_factory=dict)


#: Mandatory queue columns a bulk enqueue may set; the others are the managers' fire state.
EVENT_INPUT_COLUMNS = ("id", "time_scheduled", "priority")


def check_event_columns(queue: str, columns: set[str]) -> None:
    """Refuse a DataFrame that would set a queue event's fire state."""
    from shardgate.queues.events import MANDATORY_COLUMNS

    state = sorted(c for c in columns if c in MANDATORY_COLUMNS and c not in EVENT_INPUT_COLUMNS)
    if state:
        raise InvalidArgument(
            f"the DataFrame sets {state} of queue {queue}: new events start as to_be_fired "
            f"and their fire state belongs to the queue managers; drop those columns "
            f"(events may carry {list(EVENT_INPUT_COLUMNS)} and the queue's own columns)"
        )


def _staged_type(f: pa.Field, data: pa.Table) -> pa.Field:
    """The type a batch's column is sent as to a PostgreSQL staging column ``f``.

    An unbounded NUMERIC column reads as text but takes Arrow decimals as they are
    (COPY converts decimal128 to numeric exactly; text it cannot convert).
    """
    import pyarrow as pa

    if (f.metadata or {}).get(arrow.SG_TYPE) == b"numeric":
        i = data.schema.get_field_index(f.name)
        if i >= 0 and pa.types.is_decimal(data.schema.field(i).type):
            return f.with_type(data.schema.field(i).type)
    return f


class ShardgateWriter(DataSourceArrowWriter):
    """Stages rows per task in the executors, commits them in the driver."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise Unsupported("the shardgate sink only appends: use .mode('append')")
        opts = SourceOptions.parse(options)
        self.write_opts = WriteOptions.parse(options)
        topo = opts.topo()
        ks = topo.build_vschema().keyspace(opts.keyspace)
        table = ks.tables.get(self.write_opts.table)
        if table is None:
            raise InvalidArgument(
                f"table {self.write_opts.table!r} is not in the VSchema of keyspace "
                f"{opts.keyspace!r}; tables: {sorted(ks.tables)}"
            )
        self.table = table.name
        self.columns = [f.name for f in schema.fields]
        lowered = {c.lower() for c in self.columns}
        #: a bulk enqueue: the commit also signals the queue's leader
        self.queue = table.type == TableType.QUEUE
        #: events may carry their own (older) times: the leader's scan starts at 0
        self.explicit_times = "time_scheduled" in lowered
        if self.queue:
            check_event_columns(table.qualified, lowered)
        self.spec: VindexSpec | None = None
        if ks.sharded:
            primary = table.primary
            if primary is None:
                raise InvalidArgument(f"table {table.qualified} has no primary vindex")
            if table.owned_vindexes:
                raise Unsupported(
                    f"table {table.qualified} owns lookup vindexes "
                    f"({[cv.name for cv in table.owned_vindexes]}): write it through the gate"
                )
            missing = [c for c in primary.columns if c.lower() not in lowered]
            if missing:
                raise InvalidArgument(
                    f"the DataFrame lacks the primary vindex columns {missing} of "
                    f"{table.qualified}: every row needs them to find its shard"
                )
            self.spec = VindexSpec.of(primary.vindex, primary.columns)
        auto = table.auto_increment
        if auto is not None and auto.column.lower() not in lowered:
            raise Unsupported(
                f"the DataFrame lacks column {auto.column!r} of {table.qualified}, which "
                f"takes values from sequence {auto.sequence}: add the values to the rows"
            )
        self.shards = [
            _Shard(s.name, s.url, parse_url(s.url).kind, s.key_range.start, s.key_range.end)
            for s in topo.keyspace(opts.keyspace).shards
        ]
        self.stage = STAGE_PREFIX + secrets.token_hex(6)
        # PostgreSQL columns the DataFrame gives as strings in the reader's form (unbounded
        # NUMERIC with numeric_as='string', TIME): staged as text and cast by the commit's
        # copy, as COPY from Arrow has no text -> numeric/time conversion.
        self.text_casts: dict[str, str] = {}
        pg_first = next((s for s in self.shards if s.kind == "postgresql"), None)
        if pg_first is not None:
            import pyarrow as pa
            from pyspark.sql.types import StringType

            strings = {f.name.lower() for f in schema.fields
                       if isinstance(f.dataType, StringType)}
            for f in bulk.table_schema(pg_first.url, self.table):
                if f.name.lower() not in strings:
                    continue
                if (f.metadata or {}).get(arrow.SG_TYPE) == b"numeric":
                    self.text_casts[f.name] = "numeric"
                elif pa.types.is_time(f.type):
                    self.text_casts[f.name] = "time"
        self._create_stages()
        # PostgreSQL shards: the Arrow types of the staged columns, which batches are
        # cast to (binary COPY wants exact types: INT is int32, DOUBLE float64). SQLite
        # and MariaDB take Python values and convert them themselves.
        pg = [s for s in self.shards if s.kind == "postgresql"]
        self.arrow_schemas: dict[str, pa.Schema] = dict(zip(
            [s.name for s in pg],
            self._each(lambda s: bulk.table_schema(s.url, self.stage), pg), strict=True))

    # -- driver ---------------------------------------------------------------

    def _q(self, kind: str, name: str) -> str:
        return bulk.quote_ident(kind, name)

    def _create_stages(self) -> None:
        def create(s: _Shard) -> None:
            cols = ", ".join(self._q(s.kind, c) for c in self.columns)
            unlogged = "UNLOGGED " if s.kind == "postgresql" else ""
            stage = self._q(s.kind, self.stage)
            bulk.run(s.url, [
                f"CREATE {unlogged}TABLE {stage} AS SELECT {cols} "
                f"FROM {self._q(s.kind, self.table)} WHERE 1 = 0",
                f"ALTER TABLE {stage} ADD COLUMN {self._q(s.kind, TASK_COLUMN)} VARCHAR(64)",
                *(f"ALTER TABLE {stage} ALTER COLUMN {self._q(s.kind, c)} TYPE text"
                  for c in sorted(self.text_casts) if s.kind == "postgresql"),
            ], transaction=s.kind != "mysql")
            if self.queue:
                with contextlib.suppress(AlreadyExists):  # two jobs creating it at once
                    bulk.run(s.url, [signals.ddl()], transaction=False)

        try:
            self._each(create)
        except ShardgateError:
            self._drop_stages()
            raise

    def _each(self, fn: Callable[[_Shard], T], shards: list[_Shard] | None = None) -> list[T]:
        todo = self.shards if shards is None else shards
        if not todo:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
            return list(pool.map(fn, todo))

    def _drop_stages(self) -> None:
        def drop(s: _Shard) -> None:
            with contextlib.suppress(ShardgateError):  # best effort; the name says what it is
                bulk.run(s.url, [f"DROP TABLE IF EXISTS {self._q(s.kind, self.stage)}"],
                         transaction=False)

        self._each(drop)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [m for m in messages if isinstance(m, StagedRows)]
        tasks = sorted({m.task for m in staged})
        committed: list[str] = []
        # The events' time_scheduled default to their insert time, after this.
        since = 0 if self.explicit_times else time.time_ns()

        def copy(s: _Shard) -> None:
            if not any(m.rows.get(s.name) for m in staged):
                return
            cols = ", ".join(self._q(s.kind, c) for c in self.columns)
            picks = ", ".join(
                f"{self._q(s.kind, c)}::{self.text_casts[c]}" if s.kind == "postgresql"
                and c in self.text_casts else self._q(s.kind, c) for c in self.columns)
            task_list = ", ".join(f"'{t}'" for t in tasks)
            insert, tail = "INSERT INTO", ""
            if self.write_opts.ignore_duplicates:
                insert, tail = sql_dialect(s.dialect).insert_ignore()
            statements = [
                f"{insert} {self._q(s.kind, self.table)} ({cols}) SELECT {picks} FROM "
                f"{self._q(s.kind, self.stage)} WHERE {self._q(s.kind, TASK_COLUMN)} "
                f"IN ({task_list}){tail}"
            ]
            if self.queue:  # last: its row lock is held only until the commit
                statements.append(signals.signal_sql(s.dialect, self.table, since))
            bulk.run(s.url, statements)
            committed.append(s.name)

        # Shards commit independently and concurrently (as best_effort transactions):
        # a failure leaves the others as they end, and the error says which committed.
        failures: list[ShardgateError] = []

        def attempt(s: _Shard) -> None:
            try:
                copy(s)
            except ShardgateError as exc:
                failures.append(exc)

        try:
            self._each(attempt)
        finally:
            self._drop_stages()
        if failures:
            exc = failures[0]
            raise type(exc)(
                f"{exc.message}; shards committed: {sorted(committed) or 'none'}"
            ) from exc

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._drop_stages()

    # -- executors ------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        import pyarrow as pa
        from pyspark import TaskContext

        settle()
        ctx = TaskContext.get()
        task = f"{ctx.taskAttemptId()}" if ctx is not None else secrets.token_hex(8)
        mapper = KsidMapper(self.spec) if self.spec is not None else None
        index = ShardIndex([(s.name, KeyRange(s.start, s.end)) for s in self.shards])
        by_name = {s.name: s for s in self.shards}
        pending: dict[str, list[pa.Table]] = {}
        counts: dict[str, int] = {}
        sizes: dict[str, int] = {}

        def flush(name: str) -> None:
            parts = pending.pop(name, [])
            if not parts:
                return
            data = pa.concat_tables(parts)
            target = self.arrow_schemas.get(name)
            if target is not None:
                data = sgtypes.conform(data, pa.schema([
                    _staged_type(f, data) for f in target if f.name != TASK_COLUMN]))
            data = data.append_column(TASK_COLUMN, pa.array([task] * data.num_rows, pa.string()))
            bulk.ingest(by_name[name].url, self.stage, data)
            counts[name] = counts.get(name, 0) + data.num_rows
            sizes[name] = 0

        for batch in iterator:
            if batch.num_rows == 0:
                continue
            groups: Mapping[str, pa.Table]
            if mapper is None:
                groups = {self.shards[0].name: pa.Table.from_batches([batch])}
            else:
                groups = group_by_shard(batch, mapper, index)
            for name, part in groups.items():
                pending.setdefault(name, []).append(part)
                sizes[name] = sizes.get(name, 0) + part.num_rows
                if sizes[name] >= self.write_opts.batch_rows:
                    flush(name)
        for name in list(pending):
            flush(name)
        if not counts and ctx is None:
            raise Internal("write() ran outside a Spark task")
        return StagedRows(task=task, rows=counts)
