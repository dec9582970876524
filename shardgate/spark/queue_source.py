"""``spark.readStream.format("shardgate_queue")``: Spark as a queue receiver.

Each micro-batch is a set of events *received* from the queue (fired to this
source by the shards' queue managers, as to any receiver); they are acked
only once Spark has committed the batch. A batch that fails is never acked:
its events stay ``fired`` in the queue table and fire again after their
``ack_wait``, and a later batch (of this query restarted, or of any other
receiver) delivers them. **At least once**, never acked before the commit.

Where each step runs:

* **Driver** (the long-lived Python process Spark keeps for the stream's
  offsets): a receiver, started on first use, runs in a private event-loop
  thread: an in-process gate on the cluster's topology (its tablets take the
  shards' queue leases like any tablet: only the lease holder fires), or a
  running gate over gRPC (option ``gate``). Received events wait in a
  bounded buffer.
* ``latestOffset(start, limit)``: first acks every batch up to ``start``
  (Spark asks for the next offset only after the previous batch committed)
  without waiting for that write: it runs on the receiver's loop while the
  next batch is planned and processed (a failed ack write is raised by the
  next call; ``commit`` and ``stop`` wait for the writes in flight), then
  takes up to ``maxEventsPerTrigger`` buffered events (waiting up to
  ``waitMs`` for the first), stashes them under a new batch number and
  returns ``{"seq": n, "events": {shard: "id,id,..."}}``; no events: ``start``
  (no batch).
* ``partitions(start, end)``: the stashed events of batch ``end["seq"]``,
  shipped inside the partitions (the executors never talk to the queue). A
  batch Spark re-plans after a restart (it is in the offset log but not in
  the stash) is rebuilt from the ids in its offset, read back from the queue
  table (events acked meanwhile are left out).
* ``commit(end)``: acks the stashed batches up to ``end["seq"]`` and the ids
  in ``end`` (Spark calls it for the last batch of a run only at the next
  start: those ids are in the offset, so that ack still happens).

Invariants: an event is acked only after a ``latestOffset``/``commit`` call
that follows the commit of the batch holding it; a stashed event is in
exactly one batch (copies fired again while their batch runs are dropped);
``stop()`` ends the subscription, and whatever it did not ack fires again
after ``ack_wait``. With ``availableNow``, only events scheduled before the
run started are admitted, and the run ends at the first trigger that finds
none buffered while the shards hold none unacked outside its batches (it
does not wait ``waitMs`` for events that cannot come).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from shardgate.aio import cancel_and_wait
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.urls import parse_url
from shardgate.errors import InvalidArgument, ShardgateError
from shardgate.queues.events import (
    ACKED,
    FIRED,
    MANDATORY_COLUMNS,
    TO_BE_FIRED,
    QueueBatch,
    QueueEvent,
)
from shardgate.spark.options import QueueSourceOptions, SourceOptions
from shardgate.vschema import TableType

if TYPE_CHECKING:
    from shardgate.client.sync import LoopThread
    from shardgate.gate import Gate
    from shardgate.gate.fleet import TabletFleet

#: The columns every ``shardgate_queue`` row starts with; the queue's own columns follow.
EVENT_FIELDS = [
    StructField("shard", StringType(), False),
    StructField("id", LongType(), False),
    StructField("epoch", IntegerType(), False),
    StructField("time_scheduled", LongType(), False),
    StructField("priority", IntegerType(), False),
]
#: Events a receiver buffers at most (beyond it, it stops taking batches from the gate).
BUFFER_EVENTS = 20_000
#: Seconds an ``availableNow`` trigger waits for unfired backlog to be fired to it.
AVAILABLE_NOW_PATIENCE_S = 60.0
_NS = 1_000_000_000


def queue_schema(opts: SourceOptions, queue: str) -> StructType:
    """The rows' schema: the event fields, then the queue table's own columns."""
    topo = opts.topo()
    ks = topo.build_vschema().keyspace(opts.keyspace)
    table = ks.tables.get(queue)
    if table is None or table.type != TableType.QUEUE:
        raise InvalidArgument(
            f"{opts.keyspace}.{queue} is not a queue table of the VSchema; queues: "
            f"{sorted(t.name for t in ks.tables.values() if t.type == TableType.QUEUE)}"
        )
    shard = topo.keyspace(opts.keyspace).shards[0]
    from shardgate.spark import types as sgtypes  # the planner's only: workers skip pyarrow

    arrow = bulk.table_schema(shard.url, table.name)
    user = [f for f in sgtypes.to_spark(arrow).fields if f.name.lower() not in MANDATORY_COLUMNS]
    return StructType(EVENT_FIELDS + user)


class _Source(Protocol):
    """How the receiver talks to a gate: in-process or gRPC."""

    def receive(self) -> AsyncIterator[QueueBatch]: ...

    async def ack(self, shard: str, ids: list[int]) -> None: ...

    async def close(self) -> None: ...


class _LocalGate:
    def __init__(self, opts: SourceOptions, queue: str) -> None:
        from shardgate.gate import Gate

        self.gate = Gate.open(opts.topo(), pool_size=2)
        self.keyspace = opts.keyspace
        self.queue = queue

    def receive(self) -> AsyncIterator[QueueBatch]:
        return self.gate.queue_receive(self.keyspace, self.queue)

    async def ack(self, shard: str, ids: list[int]) -> None:
        await self.gate.queue_ack(self.keyspace, self.queue, shard, ids)

    async def close(self) -> None:
        await self.gate.close()


class _FleetGate(_LocalGate):
    """A gate of the driver with no tablet of its own, reaching the tablet processes
    of the topo store at option ``topo`` (production mode): an in-process gate's
    tablets would wait for the shard leases the tablet processes hold."""

    def __init__(self, gate: Gate, fleet: TabletFleet, keyspace: str, queue: str) -> None:
        self.gate, self.fleet = gate, fleet
        self.keyspace = keyspace
        self.queue = queue

    @classmethod
    async def open(cls, url: str, keyspace: str, queue: str) -> _FleetGate:
        from shardgate.api.grpc.remote_gate import open_remote_gate
        from shardgate.topo.local import open_topo

        topo = await open_topo(url=url)
        try:
            gate, fleet = await open_remote_gate(topo, owns_topo=True)
        except BaseException:
            await topo.close()
            raise
        return cls(gate, fleet, keyspace, queue)

    async def close(self) -> None:
        await self.gate.close()
        await self.fleet.close()


class _RemoteGate:
    def __init__(self, target: str, keyspace: str, queue: str) -> None:
        from shardgate.api.grpc.client import GateClient

        self.client = GateClient(target, keyspace=keyspace)
        self.keyspace = keyspace
        self.queue = queue

    def receive(self) -> AsyncIterator[QueueBatch]:
        return self.client.receive(self.queue, keyspace=self.keyspace)

    async def ack(self, shard: str, ids: list[int]) -> None:
        events = [QueueEvent(id=i, shard=shard, epoch=0, time_scheduled=0, priority=0)
                  for i in ids]
        await self.client.ack(events, queue=self.queue, keyspace=self.keyspace)

    async def close(self) -> None:
        await self.client.close()


class _Receiver:
    """A subscription running on a private loop thread, filling a bounded buffer.

    ``buffer`` and ``error`` are guarded by ``cond``; the pump task is the
    only writer of ``buffer`` appends, callers of :meth:`take` the only readers.
    ``acks`` are the ack writes in flight (only the driver thread touches it).
    """

    def __init__(self, opts: SourceOptions, qopts: QueueSourceOptions) -> None:
        from shardgate.client.sync import LoopThread

        self.cond = threading.Condition()
        self.buffer: collections.deque[QueueEvent] = collections.deque()
        self.fields: list[str] | None = None
        self.error: BaseException | None = None
        self.acks: list[concurrent.futures.Future[None]] = []
        self.loop: LoopThread = LoopThread("shardgate-spark-queue")
        try:
            self.source: _Source = self.loop.run(self._open(opts, qopts))
            self.task = self.loop.run(self._start())
        except BaseException:
            self.loop.close()
            raise

    async def _open(self, opts: SourceOptions, qopts: QueueSourceOptions) -> _Source:
        if qopts.gate is not None:
            return _RemoteGate(qopts.gate, opts.keyspace, qopts.queue)
        if opts.topo_url is not None:
            return await _FleetGate.open(opts.topo_url, opts.keyspace, qopts.queue)
        return _LocalGate(opts, qopts.queue)

    async def _start(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            stream = self.source.receive()
            try:
                async for batch in stream:
                    with self.cond:
                        if self.fields is None:
                            self.fields = list(batch.fields)
                        self.buffer.extend(batch.events)
                        self.cond.notify_all()
                    while len(self.buffer) >= BUFFER_EVENTS:
                        await asyncio.sleep(0.05)
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def take(self, n: int, wait_s: float, admit: Any) -> list[QueueEvent]:
        """Up to ``n`` buffered events that ``admit(event)``; waits ``wait_s`` for the first."""
        deadline = time.monotonic() + wait_s
        self.reap()
        with self.cond:
            while True:
                if self.error is not None:
                    err = self.error
                    raise err if isinstance(err, ShardgateError) else ShardgateError(
                        f"the queue receiver failed: {err!r}")
                if any(admit(e) for e in self.buffer):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self.cond.wait(remaining)
            out: list[QueueEvent] = []
            keep: collections.deque[QueueEvent] = collections.deque()
            while self.buffer:
                e = self.buffer.popleft()
                if len(out) < n and admit(e):
                    out.append(e)
                else:
                    keep.append(e)
            self.buffer = keep
            return out

    def forget(self, acked: set[tuple[str, int]]) -> None:
        """Drop buffered copies of events that were just acked."""
        with self.cond:
            self.buffer = collections.deque(
                e for e in self.buffer if (e.shard, e.id) not in acked)

    def ack(self, by_shard: dict[str, list[int]], *, wait: bool) -> None:
        """Write the acks on the loop; with ``wait``, return once they and every
        earlier ack write committed, else at once (see :meth:`reap`)."""
        async def run() -> None:
            await asyncio.gather(*(self.source.ack(s, ids) for s, ids in by_shard.items() if ids))

        self.reap()
        if by_shard:
            self.acks.append(asyncio.run_coroutine_threadsafe(run(), self.loop.loop))
        if wait:
            pending, self.acks = self.acks, []
            for fut in pending:
                _ack_result(fut, None)

    def reap(self) -> None:
        """Forget the ack writes that finished; raise the first that failed."""
        pending = []
        for fut in self.acks:
            if fut.done():
                _ack_result(fut, 0)
            else:
                pending.append(fut)
        self.acks = pending

    def close(self) -> None:
        for fut in self.acks:  # unacked events would fire again after ack_wait: wait
            with contextlib.suppress(Exception):
                fut.result(30)
        self.acks = []

        async def shut() -> None:
            await cancel_and_wait([self.task], swallow=(Exception,))
            await self.source.close()

        try:
            self.loop.run(shut(), timeout=30)
        finally:
            self.loop.close()


def _ack_result(fut: concurrent.futures.Future[None], timeout: float | None) -> None:
    try:
        fut.result(timeout)
    except ShardgateError:
        raise
    except Exception as exc:
        raise ShardgateError(f"acking a committed batch failed: {exc!r}") from exc


class QueueEventsPartition(InputPartition):
    """Events of one micro-batch, as rows, shipped to the task that emits them."""

    def __init__(self, index: int, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(index)
        self.rows = rows


@dataclass
class _Batch:
    events: list[QueueEvent]
    fields: list[str]


class ShardgateQueueDataSource(DataSource):
    """The streaming source ``shardgate_queue`` (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "shardgate_queue"

    def schema(self) -> StructType:
        return queue_schema(SourceOptions.parse(self.options),
                            QueueSourceOptions.parse(self.options).queue)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QueueStreamReader(SourceOptions.parse(self.options),
                                 QueueSourceOptions.parse(self.options), schema)


def _ids_text(events: Sequence[QueueEvent]) -> dict[str, str]:
    by_shard: dict[str, list[int]] = {}
    for e in events:
        by_shard.setdefault(e.shard, []).append(e.id)
    return {s: ",".join(str(i) for i in ids) for s, ids in sorted(by_shard.items())}


def _ids_of(offset: dict[str, Any]) -> dict[str, list[int]]:
    events = offset.get("events") or {}
    return {s: [int(i) for i in str(text).split(",") if i] for s, text in events.items()}


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Receives in the driver, ships events in partitions, acks on commit.

    Driver state (the receiver is created on first use, so the object stays
    picklable for the executors, which only call :meth:`read`):
    ``_stash`` maps batch numbers to their events until acked; ``_held`` is
    the set of ``(shard, id)`` of stashed events; ``_acked_seq`` the last
    batch whose acks were written; ``_cutoff_ns`` the ``availableNow`` horizon.
    """

    def __init__(self, opts: SourceOptions, qopts: QueueSourceOptions,
                 schema: StructType) -> None:
        self.opts = opts
        self.qopts = qopts
        self.columns = [f.name for f in schema.fields]
        self._receiver: _Receiver | None = None
        self._stash: dict[int, _Batch] = {}
        self._held: set[tuple[str, int]] = set()
        self._cutoff_ns: int | None = None
        self._acked_seq = -1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_receiver"] = None
        state["_stash"] = {}
        state["_held"] = set()
        return state

    # -- driver -----------------------------------------------------------------

    def _rx(self) -> _Receiver:
        if self._receiver is None:
            self._receiver = _Receiver(self.opts, self.qopts)
        return self._receiver

    def initialOffset(self) -> dict[str, Any]:
        self._rx()
        return {"seq": 0, "events": {}}

    def prepareForTriggerAvailableNow(self) -> None:
        self._cutoff_ns = time.time_ns()
        self._rx()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.qopts.max_events)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark asks for the next offset only once the batch ending at ``start`` committed.
        self._ack_upto(start)
        if isinstance(limit, ReadMaxRows):
            n = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            n = BUFFER_EVENTS
        else:
            n = self.qopts.max_events
        cutoff = self._cutoff_ns
        held = self._held

        def admit(e: QueueEvent) -> bool:
            if (e.shard, e.id) in held:
                return False  # fired again while its batch runs: one copy is enough
            return cutoff is None or e.time_scheduled <= cutoff

        rx = self._rx()
        # availableNow does not wait for events it can tell are not coming: with none
        # buffered, it asks the shards whether any of its backlog is left.
        events = rx.take(max(1, n), 0.0 if cutoff is not None else self.qopts.wait_s, admit)
        if not events and cutoff is not None:
            # availableNow ends only once the backlog it must read has been fired to us;
            # the acks written so far must have committed, or their events look unacked.
            rx.ack({}, wait=True)
            deadline = time.monotonic() + AVAILABLE_NOW_PATIENCE_S
            while not events and time.monotonic() < deadline and self._unfired(cutoff):
                events = rx.take(max(1, n), self.qopts.wait_s, admit)
        if not events:
            return start
        seq = int(start.get("seq", 0)) + 1
        self._stash[seq] = _Batch(events, list(rx.fields or []))
        held.update((e.shard, e.id) for e in events)
        return {"seq": seq, "events": _ids_text(events)}

    def _unfired(self, cutoff_ns: int) -> bool:
        """Whether any shard still holds an unacked event scheduled at or before ``cutoff_ns``
        that is not this run's: to be fired, or fired to a receiver that is gone (a failed
        earlier run's) and due again after ``ack_wait``."""
        for shard in self.opts.topo().keyspace(self.opts.keyspace).shards:
            kind = parse_url(shard.url).kind
            q = bulk.quote_ident(kind, self.qopts.queue)
            mine = [i for (s, i) in self._held if s == shard.name]
            held = f" AND id NOT IN ({', '.join(map(str, mine))})" if mine else ""
            found = bulk.query(shard.url, f"SELECT 1 FROM {q} WHERE state IN ('{TO_BE_FIRED}', "
                                          f"'{FIRED}') AND time_scheduled <= {int(cutoff_ns)}"
                                          f"{held} LIMIT 1")
            if found:
                return True
        return False

    def _ack_upto(self, end: dict[str, Any], *, wait: bool = False) -> None:
        seq = int(end.get("seq", 0))
        by_shard: dict[str, set[int]] = {}
        if seq > self._acked_seq:  # the ids in ``end``: once (idle triggers repeat ``start``)
            for s, ids in _ids_of(end).items():
                by_shard.setdefault(s, set()).update(ids)
        done = [k for k in self._stash if k <= seq]
        for k in done:
            for e in self._stash[k].events:
                by_shard.setdefault(e.shard, set()).add(e.id)
        if not any(by_shard.values()):
            self._acked_seq = max(self._acked_seq, seq)
            if wait and self._receiver is not None:
                self._receiver.ack({}, wait=True)
            return
        acks = {s: sorted(ids) for s, ids in by_shard.items()}
        rx = self._rx()
        rx.ack(acks, wait=wait)
        self._acked_seq = max(self._acked_seq, seq)
        acked = {(s, i) for s, ids in acks.items() for i in ids}
        rx.forget(acked)
        for k in done:
            del self._stash[k]
        self._held -= acked

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        seq = int(end.get("seq", 0))
        if seq <= int(start.get("seq", 0)):
            return []
        batch = self._stash.get(seq)
        if batch is not None:
            rows = self._rows(batch)
        else:
            rows = self._reload(_ids_of(end))
            # Copies fired again to this run's receiver must not join a later batch.
            self._held.update((str(r[0]), int(r[1])) for r in rows)
        k = max(1, min(self.qopts.partitions, len(rows)))
        return [QueueEventsPartition(i, rows[i::k]) for i in range(k)] if rows else []

    def _rows(self, batch: _Batch) -> list[tuple[Any, ...]]:
        pick = self._positions(batch.fields)
        return [
            (e.shard, e.id, e.epoch, e.time_scheduled, e.priority,
             *(e.values[i] if i is not None else None for i in pick))
            for e in batch.events
        ]

    def _positions(self, fields: Sequence[str]) -> list[int | None]:
        lowered = [f.lower() for f in fields]
        out: list[int | None] = []
        for c in self.columns[len(EVENT_FIELDS):]:
            out.append(lowered.index(c.lower()) if c.lower() in lowered else None)
        return out

    def _reload(self, ids: dict[str, list[int]]) -> list[tuple[Any, ...]]:
        """A batch planned before a restart: its events, read back by id (acked ones left out)."""
        shards = {s.name: s.url for s in self.opts.topo().keyspace(self.opts.keyspace).shards}
        user = self.columns[len(EVENT_FIELDS):]
        rows: list[tuple[Any, ...]] = []
        for shard, id_list in sorted(ids.items()):
            url = shards.get(shard)
            if url is None or not id_list:
                continue
            kind = parse_url(url).kind
            cols = ", ".join(bulk.quote_ident(kind, c)
                             for c in ["id", "epoch", "time_scheduled", "priority", *user])
            q = bulk.quote_ident(kind, self.qopts.queue)
            for r in bulk.query(url, f"SELECT {cols} FROM {q} WHERE id IN "
                                f"({', '.join(str(int(i)) for i in id_list)}) "
                                f"AND state <> '{ACKED}' ORDER BY id"):
                rows.append((shard, *r))
        return rows

    def commit(self, end: dict[str, Any]) -> None:
        self._ack_upto(end, wait=True)

    def stop(self) -> None:
        rx, self._receiver = self._receiver, None
        if rx is not None:
            rx.close()

    # -- executors ----------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, QueueEventsPartition)
        return iter(partition.rows)
