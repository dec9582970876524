"""A segmented queue served by a tablet: its shard consumer, fed to streaming receivers.

The tablet's :class:`~shardgate.tablet.queue_service.QueueService` runs one
:class:`ServedSegmentedQueue` per segmented queue while it holds the shard
lease. It owns the shard's :class:`~shardgate.queues.segmented.consumer.ShardConsumer`
(which also takes the queue's own lock, so a worker process that opened the
queue with :meth:`SegmentedQueue.open` and a tablet never consume one shard at
the same time) and a dispatch task that hands the consumer's runnable jobs to
the least busy :class:`~shardgate.queues.receivers.Receiver`, the same receivers
the queue-table managers feed, so the gate, gRPC and the clients need nothing
new.

How a job becomes an event (:func:`event_of`): ``id`` is the job id,
``epoch`` the attempt (1 on the first delivery), ``time_scheduled`` the time
the job was stored (ns), ``priority`` 0, and the values are the job's
``(job_key, payload)`` (:data:`SEGMENTED_FIELDS`; the key as stored, text).
Acking an event writes the job's ``succeeded`` status row.

Invariants:

* A job is put in a receiver's queue only after its ``executing`` row
  committed (:meth:`ShardConsumer.started`), and is recorded in
  :attr:`ServedSegmentedQueue.holders` with the attempt it was handed out in.
* Every job handed out is, until acked, in exactly one receiver's in-flight
  set; a receiver that goes away gives back the jobs it still holds in the
  attempt it got them (ready again at once, first of their key), so per-key
  order holds across receivers; a job not acked within ``ack_wait`` fails and
  is retried by the consumer (at least once).
* Dispatch never exceeds what the consumer allows (``max_in_flight``, per-key
  order, the circuit breaker): it only takes what :meth:`ShardConsumer.pick`
  returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends import Backend
from shardgate.errors import ShardgateError, Unavailable
from shardgate.queues.events import QueueEvent
from shardgate.queues.options import QueueOptions
from shardgate.queues.receivers import Receiver
from shardgate.queues.segmented.consumer import SegmentedJob, ShardConsumer
from shardgate.queues.segmented.ddl import TERMINAL
from shardgate.queues.segmented.store import SegmentedStore

log = logging.getLogger(__name__)

#: The fields (user columns) a receiver of a segmented queue gets, in order.
SEGMENTED_FIELDS = ("job_key", "payload")
#: Seconds the dispatcher sleeps at most without a wake-up (a safety net).
DISPATCH_IDLE_S = 0.5
#: Seconds the dispatcher pauses after the consumer refused to hand out (restarting).
DISPATCH_RETRY_S = 0.1


def event_of(job: SegmentedJob) -> QueueEvent:
    """The receiver's view of a handed-out job (see the module docstring)."""
    return QueueEvent(id=job.job_id, shard=job.shard, epoch=job.attempt,
                      time_scheduled=job.created, priority=0, values=(job.key, job.payload))


class ServedSegmentedQueue:
    """One segmented queue on one shard, consumed by a tablet for its receivers."""

    def __init__(
        self,
        *,
        keyspace: str,
        shard: str,
        queue: str,
        backend: Backend,
        options: QueueOptions,
        receivers: Callable[[], Sequence[Receiver]],
        **consumer_kwargs: Any,
    ) -> None:
        self.queue = queue.lower()
        self.options = options
        self.backend = backend
        self.store = SegmentedStore.for_backend(
            self.queue, backend, max_rows=options.dataset_max_rows,
            max_bytes=options.dataset_max_bytes, marker=options.to_comment())
        self.consumer = ShardConsumer(
            keyspace=keyspace, shard=shard, store=self.store, backend=backend,
            options=options, on_runnable=self.wake, **consumer_kwargs)
        self._receivers = receivers
        #: job id -> (receiver, attempt) of every job handed out and not acked
        self.holders: dict[int, tuple[Receiver, int]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def leader(self) -> bool:
        """Whether the consumer holds the queue's lock on the shard now."""
        return self.consumer.leader

    def start(self) -> None:
        """Start the consumer (it takes the queue's lock) and the dispatcher."""
        self.consumer.start()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatch())

    async def close(self) -> None:
        """Stop dispatching; stop the consumer (status rows asked for are written)."""
        task, self._task = self._task, None
        await cancel_and_wait([task])
        await self.consumer.close()
        for rcv, _ in self.holders.values():
            rcv.in_flight.clear()
        self.holders = {}

    def wake(self) -> None:
        """Something may be sendable: runnable jobs, or a receiver with room."""
        self._wake.set()

    # -- dispatch ---------------------------------------------------------------------

    async def _dispatch(self) -> None:
        while True:
            self._wake.clear()
            try:
                sent = await self._send_one()
            except ShardgateError as exc:  # the consumer is starting over; it re-reads
                log.info("segmented queue %s on %s: %s", self.queue, self.consumer.shard, exc)
                stopped = self.consumer.failure is not None  # for good: nothing to hand out
                await asyncio.sleep(DISPATCH_IDLE_S if stopped else DISPATCH_RETRY_S)
                continue
            if sent:
                await asyncio.sleep(0)  # let receivers and acks run between batches
                continue
            try:
                await wait_for(self._wake.wait(), DISPATCH_IDLE_S)
            except TimeoutError:
                self._forget_finished()

    def _forget_finished(self) -> None:
        """Drop holders of jobs the consumer no longer holds (aborted, or acked by another
        path), so :attr:`holders` stays as small as the jobs in flight."""
        gone = [jid for jid in self.holders if not self.consumer.holds(jid)]
        for jid in gone:
            rcv, _ = self.holders.pop(jid)
            rcv.in_flight.discard(jid)

    def _free(self) -> list[Receiver]:
        return [r for r in self._receivers() if not r.busy]

    async def _send_one(self) -> bool:
        """Hand one batch to the least busy receiver; False if nothing was sent."""
        free = self._free()
        if not free or not self.consumer.has_runnable():
            return False
        rcv = min(free, key=lambda r: (r.batches.qsize(), len(r.in_flight)))
        picked = self.consumer.pick(rcv.max_batch or self.options.batch_size)
        if not picked:
            return False
        jobs = await self.consumer.started(picked)
        if rcv.closed:  # it went away while the executing rows were written
            free = self._free()
            if not free:
                self.consumer.release([(j.job_id, j.attempt) for j in jobs])
                return False
            rcv = free[0]
        for j in jobs:
            rcv.in_flight.add(j.job_id)
            self.holders[j.job_id] = (rcv, j.attempt)
        rcv.batches.put_nowait([event_of(j) for j in jobs])
        return True

    def receiver_gone(self, rcv: Receiver) -> None:
        """Give back the jobs ``rcv`` still held (ready again at once)."""
        mine = [(jid, attempt) for jid, (r, attempt) in self.holders.items() if r is rcv]
        for jid, _ in mine:
            del self.holders[jid]
        rcv.in_flight.clear()
        if mine:
            self.consumer.release(mine)

    # -- acks and figures -------------------------------------------------------------

    async def ack(self, ids: Sequence[int]) -> int:
        """Write ``succeeded`` for the jobs ``ids``; returns how many were not done yet,
        once committed. Raises ``Unavailable`` while the consumer does not hold the
        queue's lock (the jobs are then handed out again after ``ack_wait``)."""
        self._check_leader()
        n = await self.consumer.ack(ids)
        self._forget(ids)
        return n

    def _check_leader(self) -> None:
        if not self.consumer.leader:
            raise Unavailable(
                f"segmented queue {self.queue} on {self.consumer.keyspace}/"
                f"{self.consumer.shard}: its consumer is not running here now (starting, or "
                "another process holds the queue's lock); the jobs will be handed out again")

    def _forget(self, ids: Sequence[int]) -> None:
        """The jobs ``ids`` left their receivers (acked or failed)."""
        for jid in ids:
            held = self.holders.pop(int(jid), None)
            if held is not None:
                held[0].in_flight.discard(int(jid))

    async def nack(self, ids: Sequence[int], reason: str, retry_at: int | None = None) -> int:
        """Record a failed attempt of the jobs ``ids`` (see :meth:`ShardConsumer.fail`);
        returns how many were executing, once committed. ``Unavailable`` as :meth:`ack`."""
        self._check_leader()
        n = await self.consumer.fail(ids, reason, retry_at=retry_at)
        self._forget(ids)
        return n

    async def stats(self) -> dict[str, Any]:
        """Jobs per state (the ``<q>_job_state`` view), the lag (age in seconds of the
        oldest job not finished and not executing) and the consumer's own figures."""
        return {**await database_stats(self.store, self.backend),
                **(self.consumer.stats() if self.consumer.leader else {})}


async def database_stats(store: SegmentedStore, backend: Backend) -> dict[str, Any]:
    """Figures of one segmented queue on one shard from its tables alone."""
    conn = await backend.acquire()
    try:
        res = await conn.execute(
            f"SELECT state, COUNT(*), MIN(at) FROM {store.names.view} GROUP BY state")
        datasets = await store.datasets(conn)
    finally:
        await backend.release(conn)
    depth = {str(r[0]): int(r[1]) for r in res.rows}
    waiting = [int(r[2]) for r in res.rows
               if r[2] is not None and str(r[0]) not in TERMINAL and str(r[0]) != "executing"]
    lag = max(0.0, (time.time_ns() - min(waiting)) / 1e9) if waiting else 0.0
    return {"storage": "segmented", "depth": depth, "lag_seconds": round(lag, 3),
            "datasets_live": len(datasets)}
