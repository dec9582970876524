"""``spark.readStream.format("shardgate_changes")``: a keyspace's change stream in Spark.

Every committed row change of the keyspace's shards, one row per change,
read from each shard database's own log through the public
:class:`~shardgate.backends.changes.ChangeLog` API (SQLite change table,
PostgreSQL ``pgoutput``, MariaDB binlog).

**Offsets.** An offset is a JSON object ``{key: position}`` (the backend's
own log position: SQLite sequence, PostgreSQL commit ``end_lsn``, MariaDB
GTID; see :mod:`shardgate.event_token`), keys sorted. A key names one shard
database: its shard's name, or ``<name>@<generation>`` for a reshard's
target (:mod:`shardgate.spark.changes_hop`). A micro-batch ``(start, end]``
holds, for every key, exactly the transactions committed after
``start[key]`` up to and including ``end[key]``, whole.

**Across a reshard** the offsets hop with the write switch's journal (the
gate stream's, :mod:`shardgate.streams.hop`): a source is read to its final
position, then the targets meeting it join at their journal positions and
are read from the next batch on; ``complete`` keeps the journal in the
keyspace's history, so a checkpoint from before the switch still hops.

The life of a micro-batch:

1. Driver, ``latestOffset(start, limit)``: reloads the cluster file (the shard
   list is refreshed every batch: a new shard joins the offset at its oldest
   position, or its current one with ``newShards=latest``, and is read from
   the next batch on), takes each shard's current log position (capped by the
   ``availableNow`` target, recorded by ``prepareForTriggerAvailableNow``) and
   reads ahead to the last whole transaction before it, so that an offset
   only moves when a shard has new transactions and an idle stream runs no
   batches (skipped without a row limit on SQLite, whose sequence only moves
   with transactions, and in an ``availableNow`` run, which ends at its
   target anyway). With a row limit (``maxEventsPerTrigger`` /
   ``ReadMaxRows``) it merges the shards' transactions by commit time and
   admits whole transactions until the limit is reached (at least one, so a
   huge transaction still passes).
2. Driver, ``partitions(start, end)``: one range per shard whose position
   moved, carrying its URL and both positions; one partition per range, or
   with option ``partitions`` the ranges dealt round-robin (in key order)
   into at most that many (a function of the two offsets and the options
   alone: a batch re-planned after a restart is the same batch).
3. Executor, ``read``: opens each range's log at ``start`` (a partition's
   ranges concurrently), emits the row changes of every transaction up to
   ``end`` and stops there (at the transaction at ``end``, at the first one
   after it, or at a heartbeat past it); each shard's rows in log order.
   Reading the same range again gives the same rows, so a retried task or a
   replayed batch after a failure changes nothing.

Invariants: offsets never move backwards; per shard, batches tile the log
without gap or overlap (the end of one is the start of the next), so with a
checkpoint the query delivers each committed change exactly once to a sink
that commits with the batch. Changes purged from a log before they are read
fail the task with ``OUT_OF_RANGE``, never a silent skip.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import json
import json.encoder
import math
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from shardgate.aio import wait_for
from shardgate.backends import open_backend
from shardgate.backends.changes import ChangeLog, Heartbeat, Transaction
from shardgate.backends.changes.open import capture_exists, open_change_log
from shardgate.backends.urls import redacted
from shardgate.errors import Code, InvalidArgument, NotFound, ShardgateError, Unavailable
from shardgate.event_token import EventToken, position_key
from shardgate.keys import ShardId
from shardgate.spark import types as sgtypes
from shardgate.spark._worker import settle
from shardgate.spark.changes_hop import Db, Join, View
from shardgate.spark.options import ChangesOptions, SourceOptions, start_timestamp
from shardgate.streams.hop import MARK_MARGIN_S

if TYPE_CHECKING:
    import pyarrow as pa

#: The rows of ``shardgate_changes``: one per row change.
SCHEMA = StructType([
    StructField("keyspace", StringType(), False),
    StructField("shard", StringType(), False),
    StructField("table", StringType(), False),
    StructField("op", StringType(), False),          # insert / update / delete / truncate
    StructField("pk", StringType(), True),           # JSON array of the primary key values
    StructField("before", StringType(), True),       # JSON object, None for inserts
    StructField("after", StringType(), True),        # JSON object, None for deletes
    StructField("token", StringType(), False),       # serialized EventToken of the commit
    StructField("position", StringType(), False),    # the commit's log position
    StructField("ordinal", IntegerType(), False),    # the change's index in its transaction
    StructField("commit_ts", TimestampType(), False),
])
#: the column of typed rows (``images=struct``) naming values that could not be converted
ERROR_COLUMN = "error"


def typed_schema(image: StructType) -> StructType:
    """The rows of ``shardgate_changes`` with ``images=struct``: ``before``/``after`` typed.

    ``image``: the table's columns as the one type mapping gives them. A value
    the mapping cannot convert exactly is NULL in its image and the row's
    ``error`` says which and why (the stream goes on).
    """
    fields = []
    for f in SCHEMA.fields:
        if f.name in ("before", "after"):
            fields.append(StructField(f.name, image, True))
        else:
            fields.append(f)
    fields.append(StructField(ERROR_COLUMN, StringType(), True))
    return StructType(fields)

#: Rows per Arrow batch a task emits.
BATCH_ROWS = 8192
#: Heartbeat interval asked of the logs: how soon an idle read notices it reached its end.
_HEARTBEAT_S = 0.2


def to_json(value: Any) -> str | None:
    """A row image or key as JSON: decimals as strings, bytes as base64, times as ISO 8601."""
    if value is None:
        return None
    return _encode(value)


def _json_default(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    return str(v)


_ENCODER = json.JSONEncoder(default=_json_default, separators=(",", ":"))


def _one_shot_encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode``, without its per-call set-up: the C encoder it builds on every
    call (with its circular-reference check: images and keys are flat), built once.
    The same text, at half the cost per row image."""
    make: Callable[..., Any] | None = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the pure-Python encoder
        return _ENCODER.encode
    c_encode = make(None, _json_default, json.encoder.encode_basestring_ascii, None, ":", ",",
                    False, False, True)
    join = "".join

    def encode(value: Any) -> str:
        return join(c_encode(value, 0))

    return encode


_encode = _one_shot_encoder()


def _key(position: str) -> tuple[int, ...]:
    return position_key(position)


async def read_range(
    log: ChangeLog, start: str, end: str, *, idle_timeout: float
) -> AsyncIterator[Transaction]:
    """The transactions of ``log`` after ``start`` up to and including ``end``, then stop.

    Stops at the transaction at ``end``, before the first one after it, or at
    a heartbeat whose position reached ``end``. Raises ``UNAVAILABLE`` when the
    log yields nothing for ``idle_timeout`` seconds before reaching ``end``.
    """
    end_key = _key(end)
    if _key(start) >= end_key:
        return
    items = log.read(start, heartbeat_s=_HEARTBEAT_S)
    try:
        while True:
            try:
                item = await wait_for(anext(items), idle_timeout)
            except TimeoutError:
                raise Unavailable(
                    f"the change log of {log.shard} did not reach position {end} within "
                    f"{idle_timeout:.0f}s; the task will be retried"
                ) from None
            except StopAsyncIteration:
                raise Unavailable(
                    f"the change log of {log.shard} ended before position {end}"
                ) from None
            if isinstance(item, Transaction):
                key = _key(item.token.position)
                if key > end_key:
                    return
                yield item
                if key == end_key:
                    return
            elif isinstance(item, Heartbeat) and item.position is not None \
                    and _key(item.position) >= end_key:
                return
    finally:
        await items.aclose()  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _Summary:
    """One transaction as admission control sees it."""

    timestamp: float
    position: str
    rows: int


@dataclass(frozen=True)
class _Ahead:
    """A shard's log as read ahead by the driver: every transaction in ``(base, scanned]``
    is in ``txs`` (only the last one when no row limit applies)."""

    base: str
    scanned: str
    txs: list[_Summary]


@dataclass(frozen=True)
class ShardRange:
    """One shard's part of a micro-batch: its log between two positions."""

    shard: str
    url: str
    start: str
    end: str


class ShardChangesPartition(InputPartition):
    """A task's part of a micro-batch: one or more shards' log ranges (read concurrently)."""

    def __init__(self, index: int, ranges: Sequence[ShardRange]) -> None:
        super().__init__(index)
        self.ranges = list(ranges)


class ShardgateChangesDataSource(DataSource):
    """The streaming source ``shardgate_changes`` (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "shardgate_changes"

    def schema(self) -> StructType:
        changes = ChangesOptions.parse(self.options)
        if changes.images == "json":
            return SCHEMA
        import pyarrow as pa

        from shardgate.backends.bulk import copy as bulk

        opts = SourceOptions.parse(self.options)
        shard = opts.topo().keyspace(opts.keyspace).shards[0]
        raw = bulk.table_schema(shard.url, changes.tables[0])
        arrow = sgtypes.canonical_schema(raw, numeric_as=changes.numeric_as)
        # Nullable: a delete has no after image, an insert no before image.
        return typed_schema(sgtypes.to_spark(
            pa.schema([f.with_nullable(True) for f in arrow])))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ChangesStreamReader(SourceOptions.parse(self.options),
                                   ChangesOptions.parse(self.options), schema)


class ChangesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans per-shard log ranges in the driver; reads them in the executors.

    State kept between calls (driver only): ``_target``, the per-shard end of
    an ``availableNow`` run, and ``_ahead``, what was read ahead per shard (a
    cache: the log is read once per batch in the driver, however many
    triggers the row limit spreads it over). Offsets and partitions depend on
    the offsets alone.
    """

    def __init__(self, opts: SourceOptions, changes: ChangesOptions, schema: StructType) -> None:
        want = SCHEMA.fieldNames() + ([ERROR_COLUMN] if changes.images == "struct" else [])
        if [f.name for f in schema.fields] != want:
            raise InvalidArgument(
                f"shardgate_changes has the fixed columns {want}; "
                "select columns after load() instead"
            )
        self.schema = schema
        self.opts = opts
        self.changes = changes
        self._target: dict[str, str] | None = None
        self._ahead: dict[str, _Ahead] = {}
        #: switches' sources whose logs were found to hold what is still to read
        self._checked: set[str] = set()

    # -- driver -----------------------------------------------------------------

    def _view(self) -> View:
        """The keyspace's databases and write switches per the cluster file (or topo
        store) now (refreshed every batch)."""
        try:
            topo = self.opts.current()
        except (OSError, NotFound):
            topo = self.opts.topo()  # the file is gone: keep the topology the query began with
        return View(topo.keyspace(self.opts.keyspace))

    def _shards(self) -> list[Db]:
        """The keyspace's serving shards now."""
        return self._view().serving

    def _run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    async def _each(self, shards: Sequence[Db], fn: Any) -> list[Any]:
        async def one(s: Db) -> Any:
            log = open_change_log(s.url, str(ShardId(self.opts.keyspace, s.name)))
            try:
                return await fn(s, log)
            finally:
                await log.close()

        return list(await asyncio.gather(*(one(s) for s in shards)))

    def initialOffset(self) -> dict[str, str]:
        shards = self._shards()
        starting = self.changes.starting

        async def start(s: Db, log: ChangeLog) -> str:
            await log.prepare()
            return await self._start_position(s, log, starting)

        positions = self._run(self._each(shards, start))
        return dict(sorted(zip([s.key for s in shards], positions, strict=True)))

    async def _start_position(self, s: Db, log: ChangeLog, starting: str) -> str:
        low = starting.lower()
        if low == "latest":
            return await log.current_position()
        if low == "earliest":
            return await log.oldest_position()
        if starting.startswith("{"):
            try:
                given = json.loads(starting)
            except ValueError as exc:
                raise InvalidArgument(f"option 'starting': bad JSON: {exc}") from None
            if not isinstance(given, dict):
                raise InvalidArgument("option 'starting': expected a JSON object")
            value = given.get(s.name)
            if value is None:
                return await log.oldest_position()
            text = str(value)
            if text.startswith("et1."):
                token = EventToken.parse(text)
                if ShardId.parse(token.shard).shard != s.name:
                    raise InvalidArgument(
                        f"option 'starting': the token for shard {s.name} is of {token.shard}")
                text = token.position
            position_key(text)  # validates
            return text
        return await self._at_time(log, start_timestamp(starting))

    async def _at_time(self, log: ChangeLog, ts: float) -> str:
        """The position before the first transaction committed at or after ``ts`` (a scan)."""
        position = await log.oldest_position()
        end = await log.current_position()
        async for tx in read_range(log, position, end, idle_timeout=self.changes.read_timeout):
            if tx.token.timestamp >= ts:
                return position
            position = tx.token.position
        return end

    def prepareForTriggerAvailableNow(self) -> None:
        shards = self._shards()

        async def current(s: Db, log: ChangeLog) -> str:
            return await log.current_position()

        self._target = dict(zip([s.key for s in shards],
                                self._run(self._each(shards, current)), strict=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        if self.changes.max_events > 0:
            return ReadMaxRows(self.changes.max_events)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else 0
        return dict(sorted(self._run(self._latest(dict(start), cap)).items()))

    async def _latest(self, start: dict[str, str], cap: int) -> dict[str, str]:
        view = self._view()
        out = dict(start)
        began = self.opts.topo().keyspace(self.opts.keyspace)
        serving = {d.key for d in view.serving}
        # read: the serving shards and the switches' sources (to their final positions);
        # a shard removed from the cluster file by hand keeps its position (as before),
        # and so does a pending one that is no switch's source (a target after a
        # reverse-traffic: the forward stream replays the sources' changes onto it)
        known: list[Db] = []
        for k in start:
            d = view.by_key.get(k)
            if d is None and "@" in k:
                view.db(k, began)  # a reshard's target nobody knows any more: refused
            if d is not None and (d.key in serving or d.final is not None):
                known.append(d)

        async def summaries(s: Db, log: ChangeLog) -> list[_Summary]:
            begin = start[s.key]
            if s.drained(begin):
                return []
            if s.final is not None:
                await self._check_source(s, log, begin)
            end = await log.current_position()
            if s.final is not None and _key(s.final) < _key(end):
                end = s.final  # a switch's source: read to its final position only
            if self._target is not None:
                target = self._target.setdefault(s.key, end)
                if _key(target) < _key(end):
                    end = target
            if _key(end) <= _key(begin):
                return []
            if not cap and (s.kind == "sqlite" or self._target is not None):
                # No need to read ahead: the SQLite sequence only moves with transactions,
                # and an availableNow run ends at its target anyway (at most one empty batch).
                return [_Summary(0.0, end, 0)]
            # What earlier calls read ahead and did not admit is still valid: read on from it.
            txs: list[_Summary] = []
            scanned = begin
            ahead = self._ahead.get(s.key)
            if ahead is not None and _key(ahead.base) <= _key(begin) <= _key(ahead.scanned):
                txs = [t for t in ahead.txs
                       if _key(begin) < _key(t.position) <= _key(end)]
                scanned = ahead.scanned if _key(ahead.scanned) <= _key(end) else end
            rows = sum(t.rows for t in txs)
            if (not cap or rows < cap) and _key(end) > _key(scanned):
                reached = end
                async for tx in read_range(log, scanned, end,
                                           idle_timeout=self.changes.read_timeout):
                    t = _Summary(tx.token.timestamp, tx.token.position, self._count(tx))
                    if not cap:
                        txs[-1:] = [t]  # only the last one matters
                        continue
                    txs.append(t)
                    rows += t.rows
                    if rows >= cap:
                        reached = t.position
                        break
                scanned = reached
            self._ahead[s.key] = _Ahead(begin, scanned, txs)
            if s.final is not None and _key(scanned) >= _key(s.final):
                # read to the final position: the offset may reach it (and the hop happen)
                return [*txs, _Summary(txs[-1].timestamp if txs else 0.0, s.final, 0)]
            return txs

        per_shard = await self._each(known, summaries)
        if not cap:
            for s, got in zip(known, per_shard, strict=True):
                if got:
                    out[s.key] = got[-1].position
        else:
            merged = sorted(
                ((t.timestamp, i, j, s.key, t) for i, (s, got) in enumerate(
                    zip(known, per_shard, strict=True)) for j, t in enumerate(got)),
                key=lambda e: (e[0], e[1], e[2]),
            )
            admitted = 0
            for _ts, _i, _j, key, t in merged:
                if admitted and admitted + t.rows > cap:
                    break
                out[key] = t.position
                admitted += t.rows

        # across write switches: targets join once their sources are read to the end
        joins, waiting = view.hop(start, out)
        by_key = {j.db.key: j for j in joins}

        async def at_journal(db: Db, log: ChangeLog) -> str:
            return await self._joined(by_key[db.key], log)

        for j, pos in zip(joins, await self._each([j.db for j in joins], at_journal),
                          strict=True):
            out[j.db.key] = pos  # read from the next batch on
            if self._target is not None:
                self._target.setdefault(j.db.key, pos)
        # shards that joined otherwise (a cluster file edited by hand): at ``newShards``
        fresh = [s for s in view.serving if s.key not in out and s.key not in waiting]

        async def joined(s: Db, log: ChangeLog) -> str:
            await log.prepare()
            return await self._start_position(s, log, self.changes.new_shards)

        for s, pos in zip(fresh, await self._each(fresh, joined), strict=True):
            out[s.key] = pos  # read from the next batch on
            if self._target is not None:
                self._target.setdefault(s.key, pos)
        return out

    async def _joined(self, join: Join, log: ChangeLog) -> str:
        """Where a switch's target joins the offset: its journal position, else (a journal
        without one: an older one, a MariaDB target) before its first commit at or after
        the switch less :data:`~shardgate.streams.hop.MARK_MARGIN_S` (changes committed
        within that margin may repeat a source's, see docs/spark.md)."""
        if join.position is not None:
            return join.position
        return await self._at_time(log, join.since - MARK_MARGIN_S)

    async def _check_source(self, s: Db, log: ChangeLog, begin: str) -> None:
        """A switch's source still to be read: its log must hold ``(begin, final]``
        (``complete`` drops the capture the workflow set up itself; retention purges)."""
        if s.key in self._checked:
            return
        captured = True  # MariaDB: the binlog needs no capture (its purge shows below)
        if s.kind != "mysql":
            backend = open_backend(s.url, pool_size=1)
            try:
                captured = await capture_exists(backend)
            finally:
                await backend.close()
        assert s.final is not None
        if not captured or _key(await log.current_position()) < _key(s.final) or \
                _key(await log.oldest_position()) > _key(begin):
            raise ShardgateError(
                f"the change log of shard {self.opts.keyspace}/{s.name} (a reshard's source, "
                f"{redacted(s.url)}) no longer holds its changes after position {begin} up to "
                f"its final position {s.final}: its change capture was dropped or purged "
                "(`reshard complete` drops the capture the workflow set up itself). Those "
                "changes cannot be streamed: restart the query with a new checkpoint "
                "(and a batch read of the tables)",
                code=Code.OUT_OF_RANGE,
            )
        self._checked.add(s.key)

    def _count(self, tx: Transaction) -> int:
        tables = self.changes.tables
        if not tables:
            return len(tx.changes)
        return sum(1 for c in tx.changes if _table_name(c.table) in tables)

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        view = self._view()
        began = self.opts.topo().keyspace(self.opts.keyspace)
        ranges: list[ShardRange] = []
        for key in sorted(end):
            begin = start.get(key)
            if begin is None or _key(end[key]) <= _key(begin):
                continue
            db = view.db(key, began)
            ranges.append(ShardRange(db.name, db.url, begin, end[key]))
        k = min(self.changes.partitions or len(ranges), len(ranges))
        return [ShardChangesPartition(i, ranges[i::k]) for i in range(k)]

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release: the logs are retained by their own retention."""

    # -- executors ----------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ShardChangesPartition)
        settle()
        return self._read(partition)

    def _read(self, p: ShardChangesPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows as Arrow batches of at least ``BATCH_ROWS`` rows (whole
        transactions), built column by column: per transaction, each column is extended
        in one pass over its changes (the shard, the commit's token, position and time
        repeated), and Arrow converts each column list at once (much cheaper than Spark
        converting tuples row by row). The partition's shards are read concurrently, each
        by its own task on this generator's event loop (their transactions interleave in
        the batches; each shard's stay in log order)."""
        import pyarrow as pa

        arrow = sgtypes.to_arrow(self.schema)
        typed = self.changes.images == "struct"
        keyspace = self.opts.keyspace
        tables = self.changes.tables
        shard_c: list[str] = []
        table_c: list[str] = []
        op_c: list[str] = []
        pk_c: list[str] = []
        before_c: list[Any] = []
        after_c: list[Any] = []
        token_c: list[str] = []
        pos_c: list[str] = []
        ord_c: list[int] = []
        ts_c: list[int] = []  # microseconds since the epoch
        cols: list[list[Any]] = [shard_c, table_c, op_c, pk_c, before_c, after_c, token_c,
                                 pos_c, ord_c, ts_c]
        fields = list(arrow)[1:1 + len(cols)]
        ts_type = fields[-1].type

        def batch() -> pa.RecordBatch:
            n = len(table_c)
            errors: list[str | None] = [None] * n
            arrays = [pa.array([keyspace] * n, pa.string())]
            for c, f in zip(cols, fields, strict=True):
                if typed and f.name in ("before", "after"):
                    arrays.append(_images(c, f, errors))
                elif c is ts_c:
                    arrays.append(pa.array(c, pa.int64()).view(ts_type))
                else:
                    arrays.append(pa.array(c, f.type))
            if typed:
                arrays.append(pa.array(errors, pa.string()))
            out = pa.RecordBatch.from_arrays(arrays, schema=arrow)
            for c in cols:
                c.clear()
            return out

        encode = _encode

        def images(values: Iterator[dict[str, Any] | None]) -> list[Any]:
            if typed:
                return list(values)
            return [None if v is None else encode(v) for v in values]

        loop = asyncio.new_event_loop()
        #: (shard, transaction), or (shard, None) when its range is read, or an error
        got: asyncio.Queue[tuple[str, Transaction | None] | BaseException] = asyncio.Queue(
            maxsize=4 * len(p.ranges))

        async def pump(r: ShardRange) -> None:
            log = open_change_log(r.url, str(ShardId(keyspace, r.shard)))
            try:
                txs = read_range(log, r.start, r.end, idle_timeout=self.changes.read_timeout)
                try:
                    async for tx in txs:
                        await got.put((r.shard, tx))
                finally:
                    await txs.aclose()  # type: ignore[attr-defined]
                await got.put((r.shard, None))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # handed to the consumer, raised there
                await got.put(exc)
            finally:
                await log.close()

        pumps = [loop.create_task(pump(r)) for r in p.ranges]
        try:
            running = len(pumps)
            while running:
                item = loop.run_until_complete(got.get())
                if isinstance(item, BaseException):
                    raise item
                shard, tx = item
                if tx is None:
                    running -= 1
                    continue
                changes = tx.changes
                if tables:
                    picked = [(i, c) for i, c in enumerate(changes)
                              if _table_name(c.table) in tables]
                    changes = [c for _i, c in picked]
                    ord_c.extend(i for i, _c in picked)
                else:
                    ord_c.extend(range(len(changes)))
                n = len(changes)
                if not n:
                    continue
                shard_c.extend([shard] * n)
                table_c.extend([c.table for c in changes])
                op_c.extend([c.op for c in changes])
                pk_c.extend([encode(c.pk) for c in changes])
                before_c.extend(images(c.before for c in changes))
                after_c.extend(images(c.after for c in changes))
                token_c.extend([tx.token.serialize()] * n)
                pos_c.extend([tx.token.position] * n)
                ts_c.extend([_micros(tx.token.timestamp)] * n)
                if len(table_c) >= BATCH_ROWS:
                    yield batch()
            if table_c:
                yield batch()
        finally:
            try:
                for t in pumps:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*pumps, return_exceptions=True))
            finally:
                loop.close()


def _micros(timestamp: float) -> int:
    """A commit time (seconds since the epoch) in whole microseconds, rounded as
    ``datetime.fromtimestamp`` rounds it (the fraction, half to even)."""
    frac, whole = math.modf(timestamp)
    return int(whole) * 1_000_000 + round(frac * 1e6)


def _images(images: list[dict[str, Any] | None], f: pa.Field, errors: list[str | None]
            ) -> pa.Array:
    """Row images (dicts) as one struct column of ``f``'s type, converted field by field
    by the one type mapping; a value it cannot convert is NULL, its reason in ``errors``."""
    import pyarrow as pa

    struct = f.type
    present = [img is not None for img in images]
    children = []
    for child in struct:
        lowered = child.name.lower()
        values: list[Any] = []
        for img in images:
            if img is None:
                values.append(None)
                continue
            v = img.get(child.name)
            if v is None and child.name not in img:
                v = next((x for k, x in img.items() if k.lower() == lowered), None)
            values.append(v)
        arr, bad = sgtypes.column(values, child)
        for i, why in bad.items():
            errors[i] = f"{f.name}: {why}" if errors[i] is None else errors[i]
        children.append(arr)
    mask = pa.array([not x for x in present], pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(struct), mask=mask)


def _table_name(table: str) -> str:
    return table.rsplit(".", 1)[-1].lower()
