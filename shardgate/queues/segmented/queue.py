"""Segmented job store: a queue storage mode without in-place updates or deletes.

A queue declared with ``"storage": "segmented"`` keeps its jobs, on each shard,
in numbered dataset tables (``<queue>_jobs_<n>``, capped by rows and bytes)
and every change of a job's state as a new row of ``<queue>_job_status_<n>``;
datasets whose jobs are all done are dropped whole, leading ones that are
mostly done are merged when that lowers their count (RudderStack's jobsdb
design). Nothing is ever updated in place but the small catalog, so the
tables neither bloat nor need vacuum. The tables and their states:
:mod:`~shardgate.queues.segmented.ddl`; the SQL and the producers' group
commit: :mod:`~shardgate.queues.segmented.store`; the per-shard consumer
(ordering, retries, circuit breaker, compaction, invariants):
:mod:`~shardgate.queues.segmented.consumer`. This module is the keyspace-wide
front: routing by key, producers, workers' receive/ack, inspection.

Declaring one (the VSchema, like a queue table)::

    "events": {"type": "queue",
               "column_vindexes": [{"column": "user_id", "name": "hash"}],
               "queue": {"storage": "segmented", "max_attempts": 5}}

Using it::

    q = SegmentedQueue.from_gate(gate, "app", "events")
    await q.open()                       # tables on every shard, consumers start
    await q.store(user_id, json_text)    # returns once committed (group commit)
    async for jobs in q.receive():       # workers
        ...
        await q.ack(jobs)                # or q.fail(jobs, "reason")

Keys are routed through the table's primary vindex (a functional,
single-column one), so a key's jobs live on one shard, in order. The options
are :class:`~shardgate.queues.options.QueueOptions`: ``ack_wait``,
``min_backoff``/``max_backoff``, ``max_attempts``, ``max_in_flight``,
``batch_size`` (jobs per batch to a worker), ``cache_size`` (pending jobs in
memory per shard), ``hot_key_threshold``/``hot_key_cooldown``,
``dataset_max_rows``/``dataset_max_bytes``, ``merge_max_rows``.

Two ways to consume, one per shard at a time thanks to the queue's database
lock on each shard: :meth:`SegmentedQueue.open` runs consumers in the
process that opens the queue (a worker process with in-process tablets), or
the tablets run them (:mod:`~shardgate.queues.segmented.served`) and
receivers use ``Gate.queue_receive`` / ``queue_ack`` or gRPC, like a queue
table. ``CREATE QUEUE ... WITH (storage = segmented)`` creates one through
the gate; ``Gate.queue_enqueue`` stores jobs without this class.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from shardgate.backends import Backend
from shardgate.errors import FailedPrecondition, InvalidArgument, NotFound
from shardgate.keys import ShardMap
from shardgate.ports import GateView
from shardgate.queues import metrics
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.consumer import (
    DEFAULT_COMPACTION_INTERVAL_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_READ_BATCH,
    SegmentedJob,
    ShardConsumer,
)
from shardgate.queues.segmented.ddl import CLOSED, OPEN, READY, TERMINAL
from shardgate.queues.segmented.store import (
    DEFAULT_WRITE_BATCH,
    SegmentedStore,
    ShardProducer,
)
from shardgate.vindexes import SingleColumn, Vindex
from shardgate.vschema import TableType

#: The gate, whatever its tablet clients (only in-process ones serve ``from_gate``).
AnyGate = GateView[object]

__all__ = ["SegmentedJob", "SegmentedQueue", "segmented_queues_of"]


def segmented_queues_of(gate: AnyGate, keyspace: str) -> dict[str, QueueOptions]:
    """The segmented queues of ``keyspace`` per the VSchema, with their options."""
    ks = gate.vschema.keyspace(keyspace)
    return {
        t.name.lower(): QueueOptions.from_mapping(t.options, path=f"{keyspace}.tables.{t.name}")
        for t in ks.tables.values()
        if t.type == TableType.QUEUE and str(t.options.get("storage", "")).lower() == "segmented"
    }


class SegmentedQueue:
    """One segmented queue across the shards of a keyspace (see the module docstring).

    Invariants: a key's jobs go to the one shard its vindex maps it to; at
    most one write per shard is in progress from this object
    (:class:`ShardProducer`); :meth:`receive` hands out only jobs that this
    process's consumers picked, and an ack or failure goes to the shard the
    job names.
    """

    def __init__(
        self,
        *,
        keyspace: str,
        queue: str,
        backends: Mapping[str, Backend],
        options: QueueOptions,
        vindex: Vindex | None = None,
        shard_map: ShardMap | None = None,
        write_batch: int = DEFAULT_WRITE_BATCH,
        read_batch: int = DEFAULT_READ_BATCH,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        compaction_interval: float = DEFAULT_COMPACTION_INTERVAL_S,
    ) -> None:
        if not backends:
            raise InvalidArgument(f"segmented queue {queue}: no shards")
        if len(backends) > 1 and (vindex is None or shard_map is None):
            raise InvalidArgument(f"segmented queue {queue}: several shards need a vindex")
        if vindex is not None and (not isinstance(vindex, SingleColumn) or vindex.needs_cursor):
            raise InvalidArgument(
                f"segmented queue {queue}: vindex {vindex.name!r} must be functional and "
                "single-column (hash, xxhash, numeric, binary_md5, ...)")
        self.keyspace = keyspace
        self.queue = queue.lower()
        self.options = options
        self.backends = dict(backends)
        self.vindex = vindex
        self.shard_map = shard_map
        self._avail = asyncio.Event()
        self.stores = {
            shard: SegmentedStore.for_backend(queue, be, max_rows=options.dataset_max_rows,
                                              max_bytes=options.dataset_max_bytes)
            for shard, be in self.backends.items()
        }
        self.producers = {
            shard: ShardProducer(self.stores[shard], be, write_batch=write_batch,
                                 on_stored=self._stored_callback(shard))
            for shard, be in self.backends.items()
        }
        self.consumers: dict[str, ShardConsumer] = {
            shard: ShardConsumer(
                keyspace=keyspace, shard=shard, store=self.stores[shard], backend=be,
                options=options, read_batch=read_batch, poll_interval=poll_interval,
                compaction_interval=compaction_interval, on_runnable=self._avail.set)
            for shard, be in self.backends.items()
        }
        self._order = list(self.backends)
        self._next = 0

    @classmethod
    def from_gate(cls, gate: AnyGate, keyspace: str, queue: str, **kwargs: Any) -> SegmentedQueue:
        """The queue ``queue`` of ``keyspace`` as the gate's VSchema declares it, on the
        gate's in-process tablets' databases."""
        ks = gate.vschema.keyspace(keyspace)
        table = ks.tables.get(queue.lower()) or ks.tables.get(queue)
        opts = segmented_queues_of(gate, keyspace).get(queue.lower())
        if table is None or opts is None:
            raise NotFound(
                f"{keyspace}.{queue} is not a segmented queue: declare it in the VSchema as "
                '{"type": "queue", "queue": {"storage": "segmented"}, "column_vindexes": [...]}')
        topo = gate.topology.keyspace(keyspace)
        backends: dict[str, Backend] = {}
        for shard in topo.shards:
            tablet = getattr(gate.tablets[(keyspace, shard.name)], "tablet", None)
            if tablet is None:
                raise FailedPrecondition(
                    f"segmented queue {keyspace}.{queue}: shard {shard.name} is a remote tablet; "
                    "open the queue in a process with in-process tablets (--cluster)")
            backends[shard.name] = tablet.backend
        vindex = table.primary.vindex if table.primary is not None else None
        if ks.sharded and vindex is None:
            raise InvalidArgument(f"segmented queue {keyspace}.{queue}: add a column vindex")
        return cls(keyspace=keyspace, queue=queue, backends=backends, options=opts,
                   vindex=vindex if ks.sharded else None,
                   shard_map=topo.shard_map if ks.sharded else None, **kwargs)

    def _stored_callback(self, shard: str) -> Callable[[], None]:
        def stored() -> None:  # wake this process's consumer of the shard at once
            self.consumers[shard].wake()

        return stored

    # -- lifecycle --------------------------------------------------------------------

    async def ensure(self) -> None:
        """Create the queue's tables on every shard (idempotent), with a spare dataset."""
        for shard, be in self.backends.items():
            conn = await be.acquire()
            try:
                await self.stores[shard].ensure(conn)
                await self.stores[shard].add_spare(conn)
            finally:
                await be.release(conn)

    async def open(self, *, consume: bool = True, wait: float | None = 10.0) -> SegmentedQueue:
        """:meth:`ensure`, then start this process's consumers (they take each shard's
        lease; with ``wait``, wait that long for them to be ready, else stop them and raise
        ``UNAVAILABLE``: a tablet serving the keyspace holds the queue's lock)."""
        await self.ensure()
        if consume:
            for c in self.consumers.values():
                c.start()
            if wait:
                try:
                    await asyncio.gather(*(c.wait_ready(wait) for c in self.consumers.values()))
                except BaseException:
                    await self.close()
                    raise
        return self

    async def close(self) -> None:
        """Stop the consumers (pending status rows are written first)."""
        await asyncio.gather(*(c.close() for c in self.consumers.values()))

    async def __aenter__(self) -> SegmentedQueue:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- producers --------------------------------------------------------------------

    def shard_for(self, key: Any) -> str:
        """The shard holding ``key``'s jobs."""
        if self.vindex is None or self.shard_map is None or len(self._order) == 1:
            return self._order[0]
        assert isinstance(self.vindex, SingleColumn)
        ksids = self.vindex.map([key])[0]
        if len(ksids) != 1:
            raise InvalidArgument(f"segmented queue {self.queue}: key {key!r} maps to "
                                  f"{len(ksids)} keyspace ids; it needs exactly one")
        return self.shard_map.find(ksids[0])

    async def store(self, key: Any, payload: str | None) -> tuple[str, int]:
        """Store one job; return ``(shard, job_id)`` once it is committed."""
        shard = self.shard_for(key)
        ids = await self.producers[shard].store([(str(key), payload)])
        metrics.SEG_STORED.labels(self.keyspace, shard, self.queue).inc()
        return shard, ids[0]

    async def store_many(self, jobs: Sequence[tuple[Any, str | None]]) -> list[tuple[str, int]]:
        """Store jobs (``(key, payload)``); return their ``(shard, job_id)`` in order, once
        every shard's write committed (shards are written in parallel)."""
        by_shard: dict[str, list[int]] = {}
        for i, (key, _) in enumerate(jobs):
            by_shard.setdefault(self.shard_for(key), []).append(i)
        out: list[tuple[str, int]] = [("", 0)] * len(jobs)

        async def one(shard: str, idx: list[int]) -> None:
            ids = await self.producers[shard].store(
                [(str(jobs[i][0]), jobs[i][1]) for i in idx])
            for i, job_id in zip(idx, ids, strict=True):
                out[i] = (shard, job_id)
            metrics.SEG_STORED.labels(self.keyspace, shard, self.queue).inc(len(ids))

        await asyncio.gather(*(one(s, idx) for s, idx in by_shard.items()))
        return out

    # -- workers ----------------------------------------------------------------------

    async def take(self, max_jobs: int | None = None) -> list[SegmentedJob]:
        """The next batch of runnable jobs from any shard (waits for one). Each is
        ``executing`` (committed) when returned."""
        n = max_jobs or self.options.batch_size
        while True:
            for _ in range(len(self._order)):
                shard = self._order[self._next % len(self._order)]
                self._next += 1
                consumer = self.consumers[shard]
                picked = consumer.pick(n)
                if picked:
                    return await consumer.started(picked)
            self._avail.clear()
            # re-check once after clearing: a job may have become runnable meanwhile
            if any(c.has_runnable() for c in self.consumers.values()):
                await asyncio.sleep(0)
                continue
            await self._avail.wait()

    async def receive(self, max_jobs: int | None = None) -> AsyncIterator[list[SegmentedJob]]:
        """Batches of jobs forever (see :meth:`take`); ack or fail every job."""
        while True:
            yield await self.take(max_jobs)

    async def ack(self, jobs: Sequence[SegmentedJob]) -> int:
        """Mark jobs succeeded; returns once committed. Jobs already done are ignored."""
        total = 0
        for shard, ids in _by_shard(jobs).items():
            total += await self._consumer(shard).ack(ids)
        return total

    async def fail(self, jobs: Sequence[SegmentedJob], reason: str) -> int:
        """Record a failed attempt of each job (retried after a backoff, its key held
        back meanwhile, or aborted after ``max_attempts``)."""
        total = 0
        for shard, ids in _by_shard(jobs).items():
            total += await self._consumer(shard).fail(ids, reason)
        return total

    def _consumer(self, shard: str) -> ShardConsumer:
        try:
            return self.consumers[shard]
        except KeyError:
            raise NotFound(f"segmented queue {self.queue}: no shard {shard!r}") from None

    # -- operations -------------------------------------------------------------------

    async def request(self, shard: str, job_id: int, action: str,
                      reason: str | None = None) -> None:
        """Ask the shard's consumer (in whichever process holds it) to ``retry`` or
        ``abort`` a job; applied within its compaction interval."""
        be = self.backends.get(shard)
        if be is None:
            raise NotFound(f"segmented queue {self.queue}: no shard {shard!r}")
        conn = await be.acquire()
        try:
            await self.stores[shard].add_action(conn, job_id, action, reason)
        finally:
            await be.release(conn)

    async def inspect(self, *, keys: int = 10) -> list[dict[str, Any]]:
        """Per shard, from the database alone: datasets (state, rows, bytes on disk),
        jobs per current state, pending jobs of the busiest keys, keys blocked by a
        failed job; plus the figures of this process's consumer if it runs one."""
        out = []
        for shard, be in self.backends.items():
            store = self.stores[shard]
            conn = await be.acquire()
            try:
                live = [d for d in await store.datasets(conn) if d.state in (READY, OPEN, CLOSED)]
                sizes = await store.table_bytes(conn, [d.n for d in live])
                view = store.names.view
                states = await conn.execute(
                    f"SELECT state, COUNT(*) FROM {view} GROUP BY state")
                done = ", ".join(f"'{s}'" for s in TERMINAL)
                per_key = await conn.execute(
                    f"SELECT job_key, COUNT(*) FROM {view} WHERE state NOT IN ({done}) "
                    f"GROUP BY job_key ORDER BY COUNT(*) DESC, job_key LIMIT {int(keys)}")
                blocked = await conn.execute(
                    f"SELECT job_key, MIN(job_id) FROM {view} WHERE state = 'failed' "
                    f"GROUP BY job_key ORDER BY job_key LIMIT {int(keys)}")
            finally:
                await be.release(conn)
            entry: dict[str, Any] = {
                "shard": shard,
                "datasets": [{"n": d.n, "state": d.state, "rows": d.job_rows,
                              "written_bytes": d.job_bytes, "table_bytes": sizes.get(d.n, 0),
                              "job_ids": [d.first_id, d.next_id]} for d in live],
                "jobs_by_state": {str(r[0]): int(r[1]) for r in states.rows},
                "pending_per_key": {str(r[0]): int(r[1]) for r in per_key.rows},
                "blocked_keys": {str(r[0]): int(r[1]) for r in blocked.rows},
            }
            consumer = self.consumers[shard]
            if consumer.leader:
                entry["consumer"] = consumer.stats()
            out.append(entry)
        return out


def _by_shard(jobs: Sequence[SegmentedJob]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for j in jobs:
        out.setdefault(j.shard, []).append(j.job_id)
    return out

