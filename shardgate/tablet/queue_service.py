"""A tablet's queues: the lease, one engine per queue, receivers and acks.

Each queue is served by the engine of its ``storage``: a queue table by a
:class:`~shardgate.queues.table.manager.QueueManager`, a segmented queue by a
:class:`~shardgate.queues.segmented.served.ServedSegmentedQueue` (the shard's
segmented consumer plus a dispatcher). Both feed the same
:class:`~shardgate.queues.table.manager.Receiver` objects, so receiving, acking and
stats look the same to the gate whatever the storage.

Invariants:

* Managers and segmented consumers run only while this tablet holds the shard
  lease; they are all stopped (their windows and pending jobs dropped) before
  the lease is released, and a manager whose write failed drops the lease, so
  every manager restarts from the table under a freshly checked lease. A
  segmented consumer also holds its queue's own lock and restarts by itself
  from its tables after a database error.
* Receivers subscribe to the service, not to a manager: they stay connected
  across lease changes (a standby's receivers get events once it takes over).
* Acks of a queue table work without the lease (an ack is an idempotent
  conditional UPDATE); with it, they go through the manager so its window
  forgets the event. Acks of a segmented queue need its running consumer
  (``Unavailable`` otherwise: the job is handed out again after ``ack_wait``).
* The tablet calls :meth:`QueueService.committed` after every commit (or
  autocommit statement) that wrote a queue table: that wake-up, not polling
  or NOTIFY, is how a manager learns of new events its own tablet wrote.
  Commits the leader does not run (the Spark writer's copy, bulk loads, a
  gate in another process) leave a signal row (:mod:`shardgate.queues.signals`)
  in the same transaction, or right after their commit; the leader polls the
  signal table every ``signal_poll_s`` and wakes the managers named there.
  A tablet that is not the leader sends that signal itself after each commit
  that wrote a queue table (coalesced: one signal write at a time per queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, NamedTuple

from shardgate.aio import cancel_and_wait
from shardgate.backends.base import Backend, LeaseHandle
from shardgate.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    ShardgateError,
    Unavailable,
    Unsupported,
)
from shardgate.queues import metrics, signals
from shardgate.queues.ddl import comment_of, detect_sql
from shardgate.queues.events import ACKED, FAILED, QueueBatch
from shardgate.queues.options import QueueOptions, parse_comment
from shardgate.queues.receivers import Receiver
from shardgate.queues.segmented.served import (
    SEGMENTED_FIELDS,
    ServedSegmentedQueue,
    database_stats,
)
from shardgate.queues.segmented.store import SegmentedStore, ShardProducer
from shardgate.queues.table.manager import QueueManager, Writer, retry_conflicts
from shardgate.queues.table.store import QueueStore
from shardgate.sql.classify import WriteTarget, write_target
from shardgate.tablet.lease import ShardLease

log = logging.getLogger(__name__)

#: A segmented queue ``q`` carries its comment marker on its catalog ``q_datasets``.
SEGMENTED_CATALOG_SUFFIX = "_datasets"
#: Seconds between two reads of the signal table by the leader (0: no polling).
DEFAULT_SIGNAL_POLL_S = 0.02
#: Seconds the signal watcher (and a non-leader's signal sender) waits after a database error.
SIGNAL_RETRY_S = 1.0



class QueueWrite(NamedTuple):
    """A statement writing a queue table: which, how, and when it started (ns)."""

    queue: str
    kind: str
    since_ns: int


class QueueService:
    """The queues of one tablet (see the module docstring)."""

    def __init__(self, keyspace: str, shard: str, backend: Backend, *,
                 lease_retry: float = 0.5, lease_check: float = 1.0) -> None:
        self.keyspace = keyspace
        self.shard = shard
        #: the shard's database (the tablet's backend)
        self.backend = backend
        self.options: dict[str, QueueOptions] = {}
        self.receivers: dict[str, list[Receiver]] = {}
        self.managers: dict[str, QueueManager] = {}
        #: segmented queues being consumed here (while the lease is held)
        self.segmented: dict[str, ServedSegmentedQueue] = {}
        #: keyword arguments for the segmented consumers (tests shorten intervals)
        self.segmented_kwargs: dict[str, Any] = {}
        self._producers: dict[str, ShardProducer] = {}
        self._writer: Writer | None = None
        self._lease: ShardLease | None = None
        self._lease_retry = lease_retry
        self._lease_check = lease_check
        self._detected = False
        self._watch: asyncio.Task[None] | None = None
        #: queues whose dispatch an operator paused (until resumed or the tablet restarts)
        self.paused: set[str] = set()
        #: seconds between the leader's reads of the signal table (0: off)
        self.signal_poll_s = DEFAULT_SIGNAL_POLL_S
        self._signals: asyncio.Task[None] | None = None
        #: queues with a signal to send (non-leader), and the sender task
        self._outbox: dict[str, int] = {}
        self._sender: asyncio.Task[None] | None = None

    @property
    def lease_name(self) -> str:
        return f"shardgate/{self.keyspace}/{self.shard}/queues"

    @property
    def leader(self) -> bool:
        return self._lease is not None and self._lease.held

    def configure(self, queues: Mapping[str, QueueOptions | Mapping[str, Any]]) -> None:
        """Declare queue tables (from the VSchema); managers start for new ones."""
        for name, opts in queues.items():
            if not isinstance(opts, QueueOptions):
                opts = QueueOptions.from_mapping(opts, path=f"queue {name}")
            key = name.lower()
            if self.options.get(key) != opts:
                self.options[key] = opts
                if self._writer is not None and not self._running(key):
                    asyncio.get_running_loop().create_task(self._start_manager(key))

    async def forget(self, queue: str) -> None:
        """Stop serving ``queue`` (DROP QUEUE): its manager or consumer stops, its
        receivers' streams end, and it is no longer declared here."""
        key = queue.lower()
        self.options.pop(key, None)
        manager = self.managers.pop(key, None)
        if manager is not None:
            await manager.stop()
        served = self.segmented.pop(key, None)
        if served is not None:
            await served.close()
        for r in self.receivers.pop(key, []):
            r.end()

    def _running(self, key: str) -> bool:
        return key in self.managers or key in self.segmented

    def is_segmented(self, queue: str) -> bool:
        """Whether ``queue`` is a declared segmented queue of this tablet."""
        opts = self.options.get(queue.lower())
        return opts is not None and opts.storage == "segmented"

    def start(self) -> None:
        """Start competing for the lease (idempotent; needs a running loop)."""
        if self._lease is None:
            self._lease = ShardLease(
                self.backend, self.lease_name, on_acquired=self._acquired,
                on_lost=self._lost, retry_interval=self._lease_retry,
                check_interval=self._lease_check)
            self._lease.start()

    async def detect(self) -> list[str]:
        """Find queues from their comment markers (a queue table's own, a segmented
        queue's on its catalog); configure them. Returns their names."""
        dialect = self.backend.dialect
        res = await self.backend.execute(detect_sql(dialect))
        found: dict[str, QueueOptions] = {}
        for name, text in res.rows:
            opts = parse_comment(comment_of(dialect, str(text or "")))
            if opts is None:
                continue
            table = str(name).lower()
            if opts.storage == "segmented":  # the marker is on the queue's catalog table
                if not table.endswith(SEGMENTED_CATALOG_SUFFIX):
                    continue
                table = table[: -len(SEGMENTED_CATALOG_SUFFIX)]
            found[table] = opts
        self._detected = True
        self.configure(found)
        return sorted(found)

    async def _known(self, queue: str) -> str:
        key = queue.lower()
        if key not in self.options:
            await self.detect()
        if key not in self.options:
            raise NotFound(
                f"{queue!r} is not a queue table on {self.keyspace}/{self.shard}: "
                "create it with CREATE QUEUE or declare it as type queue in the VSchema"
            )
        return key

    # -- the lease ---------------------------------------------------------------------

    async def _acquired(self, handle: LeaseHandle) -> None:
        self._writer = Writer(handle.conn)
        if not self._detected:
            with contextlib.suppress(ShardgateError):
                await self.detect()
        for name in list(self.options):
            await self._start_manager(name, takeover=True)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_failures())
        if self.signal_poll_s > 0 and (self._signals is None or self._signals.done()):
            self._signals = asyncio.get_running_loop().create_task(self._watch_signals())

    async def _start_manager(self, name: str, *, takeover: bool = False) -> None:
        if self._writer is None or self._running(name) or name in self.paused:
            return
        if self.is_segmented(name):
            served = ServedSegmentedQueue(
                keyspace=self.keyspace, shard=self.shard, queue=name,
                backend=self.backend, options=self.options[name],
                receivers=lambda n=name: self.receivers.get(n, []),  # type: ignore[misc]
                **self.segmented_kwargs)
            self.segmented[name] = served
            served.start()
            for r in self.receivers.get(name, []):
                r.waker = served.wake
            return
        store = QueueStore(name, self.backend.dialect, self.backend.placeholder)
        manager = QueueManager(
            keyspace=self.keyspace, shard=self.shard, store=store,
            options=self.options[name], reader=self.backend, writer=self._writer,
            receivers=lambda n=name: self.receivers.get(n, []),  # type: ignore[misc]
        )
        self.managers[name] = manager
        try:
            await manager.start(takeover=takeover)
        except ShardgateError as exc:
            log.warning("queue %s on %s/%s cannot start: %s", name, self.keyspace,
                        self.shard, exc)
            self.managers.pop(name, None)
            return
        for r in self.receivers.get(name, []):
            r.waker = manager.wake

    async def _watch_failures(self) -> None:
        while self._writer is not None:
            waits = [asyncio.ensure_future(m.stopped.wait()) for m in self.managers.values()]
            if not waits:
                await asyncio.sleep(0.2)
                continue
            try:
                await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if any(m.failure is not None for m in self.managers.values()) and self._lease:
                self._lease.drop()
                return

    async def _lost(self) -> None:
        self._writer = None
        signals, self._signals = self._signals, None
        await cancel_and_wait([signals])
        managers, self.managers = self.managers, {}
        for m in managers.values():
            await m.stop()
        segmented, self.segmented = self.segmented, {}
        for sq in segmented.values():
            await sq.close()
        for rs in self.receivers.values():
            for r in rs:
                r.in_flight.clear()
                r.waker = None

    # -- the tablet's hooks ------------------------------------------------------------

    def touched(self, sql: str, target: WriteTarget | None = None) -> QueueWrite | None:
        """The queue write ``sql`` makes (stamped now, before it runs), else None;
        ``sql``'s head is read only when the gate sent no ``target`` (issue 33)."""
        if not self.options:
            return None
        if target is None:
            target = write_target(sql)
            if target is None:
                return None
        verb, table = target
        if not verb:  # NOT_A_WRITE
            return None
        name = table.lower()
        if name not in self.options or self.is_segmented(name):
            return None
        kind = "insert" if verb in ("insert", "replace") else "update"
        return QueueWrite(name, kind, time.time_ns())

    def committed(self, touched: Sequence[QueueWrite]) -> None:
        """The transaction holding ``touched`` committed: wake their managers.

        Each manager's next new-event scan reaches back to the earliest write's
        stamp, so an event inserted early in a long transaction (its
        ``time_scheduled`` is its insert time) is found at once on commit.
        """
        for w in touched:
            m = self.managers.get(w.queue)
            if m is not None:
                m.notify(w.kind, since_ns=w.since_ns)
            elif w.kind == "insert" and not self.leader:
                self._send_signal(w.queue, w.since_ns)

    # -- signals (see shardgate.queues.signals) -----------------------------------------

    def _send_signal(self, queue: str, since_ns: int) -> None:
        """Tell the leader (in another process) that events of ``queue`` committed."""
        self._outbox[queue] = min(since_ns, self._outbox.get(queue, since_ns))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_signals())

    async def _send_signals(self) -> None:
        """Send what the outbox holds, then wait one poll interval (the leader reads no
        faster) while later commits' signals gather, and again until it stays empty."""
        while self._outbox:
            batch, self._outbox = self._outbox, {}
            failed = False
            for queue, since in batch.items():
                try:
                    await self._signal(queue, since)
                except ShardgateError as exc:  # sent again after SIGNAL_RETRY_S
                    log.info("queue %s on %s/%s: signal not sent (retrying): %s", queue,
                             self.keyspace, self.shard, exc)
                    self._outbox[queue] = min(since, self._outbox.get(queue, since))
                    failed = True
            await asyncio.sleep(SIGNAL_RETRY_S if failed else self.signal_poll_s)

    async def _signal(self, queue: str, since_ns: int) -> None:
        text = signals.signal_sql(self.backend.dialect, queue, since_ns)
        try:
            await self.backend.execute(text)
        except NotFound:  # the first signal of this database: create the table
            with contextlib.suppress(AlreadyExists):
                await self.backend.execute(signals.ddl())
            await self.backend.execute(text)

    async def _watch_signals(self) -> None:
        """The leader's poll of the signal table (see the module docstring)."""
        seen: dict[str, int] | None = None
        ready = False
        while True:
            try:
                if not ready:
                    with contextlib.suppress(AlreadyExists):
                        await self.backend.execute(signals.ddl())
                    ready = True
                res = await self.backend.execute(signals.read_sql())
            except ShardgateError as exc:
                log.info("queue signals on %s/%s: %s", self.keyspace, self.shard, exc)
                await asyncio.sleep(SIGNAL_RETRY_S)
                continue
            rows = {str(q): (int(seq), int(since)) for q, seq, since in res.rows}
            for queue, (seq, since) in rows.items():
                # First read: a signal not yet consumed (it may have been written between
                # this leader's start and now) wakes; later reads: a moved seq wakes.
                if (since >= signals.NONE_PENDING if seen is None
                        else seen.get(queue) == seq):
                    continue
                self._woken_by_signal(queue, since)
                with contextlib.suppress(ShardgateError):
                    await self.backend.execute(signals.consumed_sql(self.backend.placeholder),
                                               [queue, seq])
            seen = {q: seq for q, (seq, _) in rows.items()}
            await asyncio.sleep(self.signal_poll_s)

    def _woken_by_signal(self, queue: str, since_ns: int) -> None:
        m = self.managers.get(queue)
        if m is not None:
            m.notify("insert", since_ns=None if since_ns >= signals.NONE_PENDING else since_ns)
        sq = self.segmented.get(queue)
        if sq is not None:
            sq.consumer.wake()

    # -- receivers and acks ------------------------------------------------------------

    async def subscribe(self, queue: str, max_batch: int = 0) -> tuple[Receiver, list[str]]:
        """A new receiver of ``queue`` and the queue's user columns."""
        name = await self._known(queue)
        self.start()
        rcv = Receiver(max_batch)
        self.receivers.setdefault(name, []).append(rcv)
        if self.is_segmented(name):
            sq = self.segmented.get(name)
            if sq is not None:
                rcv.waker = sq.wake
                sq.wake()
            self._gauge(name)
            return rcv, list(SEGMENTED_FIELDS)
        m = self.managers.get(name)
        if m is not None:
            rcv.waker = m.wake
            m.wake()
            fields = list(m.store.user_columns)
        else:
            store = QueueStore(name, self.backend.dialect, self.backend.placeholder)
            conn = await self.backend.acquire()
            try:
                fields = await store.load_columns(conn)
            finally:
                await self.backend.release(conn)
        self._gauge(name)
        return rcv, fields

    def unsubscribe(self, queue: str, rcv: Receiver) -> None:
        name = queue.lower()
        rs = self.receivers.get(name, [])
        if rcv in rs:
            rs.remove(rcv)
        rcv.end()
        sq = self.segmented.get(name)
        if sq is not None:
            sq.receiver_gone(rcv)
        m = self.managers.get(name)
        if m is not None:
            m.receiver_gone(rcv)
        self._gauge(name)

    def _gauge(self, name: str) -> None:
        receivers = len(self.receivers.get(name, []))
        metrics.RECEIVERS.labels(self.keyspace, self.shard, name).set(receivers)

    async def ack(self, queue: str, ids: Sequence[int]) -> int:
        name = await self._known(queue)
        if self.is_segmented(name):
            return await self._served(name).ack(ids) if ids else 0
        m = self.managers.get(name)
        if m is not None and not m.stopped.is_set():
            return await m.ack(ids)
        store = QueueStore(name, self.backend.dialect, self.backend.placeholder)
        # no manager here (yet): the ack is written as the manager writes it, again
        # after a lock conflict (an idempotent conditional UPDATE)
        return await retry_conflicts(lambda: store.ack_via(self.backend, ids))

    async def nack(self, queue: str, ids: Sequence[int], reason: str,
                   retry_at: int | None = None) -> int:
        """Record a failed attempt of jobs ``ids`` of segmented ``queue`` (retried after
        the backoff or at ``retry_at`` ns, aborted once out of attempts)."""
        name = await self._known(queue)
        if not self.is_segmented(name):
            raise Unsupported(
                f"{queue!r} on {self.keyspace}/{self.shard} is a queue table: its events "
                "fire again after ack_wait when not acked; nack is for segmented queues")
        return await self._served(name).nack(ids, reason, retry_at) if ids else 0

    def _served(self, name: str) -> ServedSegmentedQueue:
        """The segmented queue ``name`` this tablet consumes now, else ``UNAVAILABLE``."""
        sq = self.segmented.get(name)
        if sq is None:
            raise Unavailable(
                f"segmented queue {name} on {self.keyspace}/{self.shard}: "
                "this tablet does not consume it now (no shard lease); the jobs will be "
                "handed out again after ack_wait")
        return sq

    async def stats(self, queue: str) -> dict[str, Any]:
        name = await self._known(queue)
        if self.is_segmented(name):
            return await self._segmented_stats(name)
        store = QueueStore(name, self.backend.dialect, self.backend.placeholder)
        conn = await self.backend.acquire()
        try:
            out = await store.stats(conn)
        finally:
            await self.backend.release(conn)
        for state, n in out["depth"].items():
            metrics.DEPTH.labels(self.keyspace, self.shard, name, state).set(n)
        metrics.LAG.labels(self.keyspace, self.shard, name).set(out["lag_seconds"])
        out["shard"] = self.shard
        out["leader"] = self.leader
        out["paused"] = name in self.paused
        m = self.managers.get(name)
        out.update(m.memory_stats() if m is not None else {"receivers": len(
            self.receivers.get(name, []))})
        return out

    async def admin(self, queue: str, action: str, ids: Sequence[int] = ()) -> int:
        """An operator's action on a queue table of this shard; returns events changed.

        ``retry`` (failed events ``ids`` fire again now), ``requeue_failed``
        (every failed event), ``purge_acked`` / ``purge_failed`` (delete them
        now), ``pause`` (stop dispatching: the manager stops, receivers stay;
        fired events keep their ack deadline) and ``resume``.
        """
        name = await self._known(queue)
        if self.is_segmented(name) and action not in ("pause", "resume"):
            raise InvalidArgument(
                f"{action!r} is for queue tables; segmented queue {queue!r} retries and "
                "aborts jobs by id (shardgate queue segments retry|abort)")
        if action == "pause":
            self.paused.add(name)
            m = self.managers.pop(name, None)
            if m is not None:
                await m.stop()
            sq = self.segmented.pop(name, None)
            if sq is not None:
                await sq.close()
            return 0
        if action == "resume":
            self.paused.discard(name)
            await self._start_manager(name)
            return 0
        store = QueueStore(name, self.backend.dialect, self.backend.placeholder)
        since = time.time_ns()
        conn = await self.backend.acquire()
        try:
            if action == "retry":
                changed = await store.retry_failed(conn, ids)
            elif action == "requeue_failed":
                changed = await store.requeue_failed(conn)
            elif action in ("purge_acked", "purge_failed"):
                changed = await store.delete_state(conn, ACKED if action == "purge_acked"
                                                   else FAILED)
            else:
                raise InvalidArgument(
                    f"unknown queue action {action!r}; use retry, requeue_failed, "
                    "purge_acked, purge_failed, pause or resume")
        finally:
            await self.backend.release(conn)
        m = self.managers.get(name)
        if m is not None and changed:  # re-queued events are new ones, scheduled from `since`
            m.notify("insert", since_ns=since)
        return changed

    async def enqueue(self, queue: str, jobs: Sequence[tuple[str, str | None]]) -> list[int]:
        """Store ``(key, payload)`` jobs of segmented ``queue`` on this shard (group commit,
        as :meth:`SegmentedQueue.store_many`); return their ids once committed. The
        shard's consumer, if it runs here, is woken at once. Works without the lease."""
        name = await self._known(queue)
        if not self.is_segmented(name):
            raise InvalidArgument(
                f"{queue!r} on {self.keyspace}/{self.shard} is a queue table: "
                "enqueue with INSERT INTO it")
        producer = self._producers.get(name)
        if producer is None:
            opts = self.options[name]
            store = SegmentedStore.for_backend(name, self.backend,
                                               max_rows=opts.dataset_max_rows,
                                               max_bytes=opts.dataset_max_bytes)

            def stored(n: str = name) -> None:
                sq = self.segmented.get(n)
                if sq is not None:
                    sq.consumer.wake()

            producer = self._producers[name] = ShardProducer(store, self.backend,
                                                             on_stored=stored)
        ids = await producer.store(jobs)
        metrics.SEG_STORED.labels(self.keyspace, self.shard, name).inc(len(ids))
        return ids

    async def _segmented_stats(self, name: str) -> dict[str, Any]:
        sq = self.segmented.get(name)
        if sq is not None:
            out = await sq.stats()
        else:
            opts = self.options[name]
            store = SegmentedStore.for_backend(name, self.backend, max_rows=opts.dataset_max_rows,
                                               max_bytes=opts.dataset_max_bytes)
            out = await database_stats(store, self.backend)
        for state, n in out["depth"].items():
            metrics.DEPTH.labels(self.keyspace, self.shard, name, state).set(n)
        metrics.LAG.labels(self.keyspace, self.shard, name).set(out["lag_seconds"])
        out["shard"] = self.shard
        out["leader"] = self.leader and sq is not None and sq.leader
        out["receivers"] = len(self.receivers.get(name, []))
        return out

    async def close(self) -> None:
        for rs in self.receivers.values():
            for r in rs:
                r.end()
        self.receivers = {}
        if self._lease is not None:
            await self._lease.close()
            self._lease = None
        watch, self._watch = self._watch, None
        sender, self._sender = self._sender, None
        await cancel_and_wait([watch, sender])
        await self._lost()


async def receive_batches(
    service: QueueService, queue: str, max_batch: int = 0
) -> AsyncIterator[QueueBatch]:
    """A receiver's stream: first the fields (no events), then batches, until closed.

    Leaving the iteration unsubscribes; the receiver's unacked events go back
    to the window at once (nothing is lost).
    """
    rcv, fields = await service.subscribe(queue, max_batch)
    try:
        yield QueueBatch(service.keyspace, queue, list(fields), [])
        while True:
            events = await rcv.get()
            if events is None:
                return
            yield QueueBatch(service.keyspace, queue, [], events)
    finally:
        service.unsubscribe(queue, rcv)
