"""The queue manager: fires one queue table's events on one shard (Vitess's messageManager).

One manager runs per shard and queue table, only in the tablet holding the
shard's lease (:mod:`shardgate.tablet.lease`); its fire, fail, purge and
follow-up writes go through the lease's own connection (:class:`Writer`), so
losing the lease (the connection or lock file is gone) makes the next write
fail, and a failed write stops the manager at once
(:attr:`QueueManager.failure`). Acks, idempotent conditional UPDATEs valid
with or without the lease, go through pooled connections so they never wait
behind a fire write (through the lease's when the pool has none free: the
acking receiver may hold the last one in its own transaction).

Parts
-----
* **The window** (:class:`~shardgate.queues.table.window.Window`): the events
  due within the next ``window`` seconds, ordered by (due time, priority), and
  the scans below that fill it. It is a cache of the table: losing it loses
  nothing. Per-key ordering (invariant 5) is
  :class:`~shardgate.queues.table.ordering.KeyOrder`'s.
* **The run loop** (one task): scans, fires, sleeps until the next due time
  or a wake-up. Only this task fires and scans, so scans and fires never race.
* **Scans.** *New*: after the tablet committed a write to this table
  (:meth:`notify`, an in-process wake-up: no polling, no NOTIFY), one scan
  reads ``to_be_fired`` events from the *cursor* up to now + window, LIMIT the
  free room of the window, so it reads only rows it has not seen (the
  backlog held in the window is not read again). The cursor is on the
  database's clock (which stamps ``time_scheduled``): after a complete scan
  it moves to the scan's start time in that clock (our clock plus a lower
  bound of the offset, measured at each full scan, less
  :data:`CLOCK_MARGIN_NS`): an event stamped earlier belongs to a statement
  that started before the scan, and if its transaction committed after the
  scan, its wake-up says when its first write started (``since_ns``) and
  the next scan reaches back to that, however long ago (a long transaction's
  events carry their insert time, not their commit time). A wake-up without
  that start reaches back :data:`SCAN_SLACK_NS`. A scan that filled the
  window ("pending mode") leaves the cursor at the last row it took; the
  next scan, as soon as the window drains to half, continues from there.
  Wake-ups that arrive during a scan coalesce into one more scan. While the
  window still holds more due events than the last fire could take
  (``_backlogged``), a wake-up's scan waits until a fire leaves it short:
  the rows it would read fire after those anyway, and one scan per several
  fires reads them in larger, cheaper statements (the wake-up's reach-back is
  kept, so nothing a late commit wrote is skipped). *Full*:
  once per window (and at start), new events from the beginning up to now +
  window: the backstop for rows no wake-up announced (written around the
  tablet, or with an explicit ``time_scheduled`` in the past). *Collector*: every
  ``collector_interval``, fired-but-unacked events whose retry time falls in
  the window; retries due beyond the window are left to it, so the fast path
  stays on fresh events.
* **Firing.** Due events are taken from the window up to the free room of the
  limits (``max_in_flight``, the ``max_per_second`` token bucket, receivers'
  capacity: a batch per free slot of each receiver's hand-over queue, so one
  fire write can fill both slots of every receiver). The manager *first*
  writes ``state = 'fired'``, ``epoch + 1`` and
  the next retry time (``now + ack_wait + clamp(min_backoff * 2^epoch *
  jitter(±33%), min_backoff, max_backoff)``) by primary key, in one statement
  per batch, conditioned on the event not being acked; *then* it hands the
  events that statement changed to the least busy receiver. Events out of
  attempts (``max_attempts``) are written ``failed`` instead.
* **Acks** (:meth:`ack`) are gathered while one ack write is running and
  written together by primary key on a pooled connection; the caller returns
  once its ack is committed. An acked event leaves the window and in-flight
  table; one acked while a fire write including it runs is not put back in
  flight by that write (``_acked_while_firing``).
* **The purge** (its own task) deletes acked events older than
  ``retention``, 500 rows per statement.

Invariants
----------
1. An event is sent only after the write marking it fired (with its next
   retry time) committed; if that write fails, nothing of the batch is sent.
   A write that lost a lock conflict (``ABORTED``: a deadlock, a lock wait
   timeout, a SQLite shard locked by another writer; the database rolled it
   back) puts the batch back in the window, due :data:`CONFLICT_RETRY_S`
   later; any other failure stops the manager.
2. The fire write skips acked events, so an event whose ack committed is
   never fired again; a receiver's queue drops events acked or re-fired
   elsewhere before handing them out, so an ack committed before a batch is
   taken by its receiver also suppresses that delivery.
3. Every event is in at most one receiver's in-flight set; a receiver that
   goes away hands its in-flight events back to the window, due at once.
4. ``in_flight <= max_in_flight`` and fires per second ``<= max_per_second``
   (token bucket, burst of one batch).
5. Per-key ordering: at most one event per ordering key is in flight; the
   key's later events wait (in scan order) until it is acked or failed; a key
   with more than ``hot_key_threshold`` waiting events has ordering switched
   off for ``hot_key_cooldown`` (the circuit breaker).
6. The window never holds more than ``cache_size`` events.
7. A shard frozen by a reshard's write cut-over (its writes fail with
   :data:`~shardgate.topo.model.WRITES_FROZEN`) pauses the manager, it does
   not stop it: a refused fire write sends nothing (invariant 1) and puts its
   events back in the window, due :data:`FROZEN_RETRY_S` later; the purge
   skips its round; a refused ack fails only its callers (the gate holds and
   replays it, on the shards serving after the switch). So a source shard's
   manager stops dispatching at the freeze, quietly (one fire attempt per
   :data:`FROZEN_RETRY_S`), and resumes if the cut-over rolls back.
8. A lock conflict never stops the manager or ends a receiver: a conflicting
   fire write is retried (invariant 1), an ack write (an idempotent
   conditional UPDATE) is written again up to :data:`ACK_ATTEMPTS` times
   before its callers get the error, and the purge skips its round.
9. A manager started by a lease takeover (:meth:`QueueManager.start` with
   ``takeover``) first makes every fired, unacked event due now, in one write
   on the lease's connection: receivers subscribe to the lease holder, so the
   ones those events were handed to were the previous holder's and are gone
   (invariant 3 for a whole tablet); events still sitting in the dead
   holder's hand-over queues and gRPC buffers, never seen by any client, no
   longer wait out their ack wait. A client still working on such an event
   may get it again (at least once); an acked one never fires again
   (invariant 2).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends import Backend, Connection
from shardgate.errors import Code, ShardgateError, Unavailable
from shardgate.queues import metrics
from shardgate.queues.events import QueueEvent
from shardgate.queues.options import QueueOptions
from shardgate.queues.receivers import RECEIVER_QUEUE_DEPTH, Receiver
from shardgate.queues.table.ordering import KeyOrder
from shardgate.queues.table.store import (
    TIME_SCHEDULED,
    VALUES,
    QueueStore,
)
from shardgate.queues.table.window import Event, Window
from shardgate.topo.model import writes_frozen

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between fire attempts while the shard refuses writes (a reshard's freeze).
FROZEN_RETRY_S = 0.5
#: a fire write that lost a lock conflict is tried again this much later (invariant 8)
CONFLICT_RETRY_S = 0.05
#: ack writes tried per batch of acks before their callers get a lock conflict's error
ACK_ATTEMPTS = 20
#: Nanoseconds per second.
_NS = 1_000_000_000


class Writer:
    """The lease's connection, shared by a shard's managers one statement at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[Connection]:
        async with self.lock:
            yield self.conn


@dataclass
class _Counters:
    fired: int = 0
    acked: int = 0
    retries: int = 0
    failed: int = 0
    purged: int = 0
    window: collections.deque[tuple[float, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=64))


class QueueManager:
    """Fires the events of one queue table of one shard (see the module docstring)."""

    def __init__(
        self,
        *,
        keyspace: str,
        shard: str,
        store: QueueStore,
        options: QueueOptions,
        reader: Backend,
        writer: Writer,
        receivers: Callable[[], Sequence[Receiver]],
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.keyspace = keyspace
        self.shard = shard
        self.store = store
        self.options = options
        self.reader = reader
        self.writer = writer
        self._receivers = receivers
        self._clock = clock
        self._window = Window(store, options, reader, clock)
        self._in_flight: dict[int, Event] = {}
        self._wake = asyncio.Event()
        self._new_pending = True
        self._full_at = 0
        self._collect_at = 0
        #: the last fire took a full budget and left due events in the window: a
        #: wake-up's scan waits until the window runs short (see *Scans*)
        self._backlogged = False
        #: ids of the fire write in progress, and those of them acked meanwhile
        self._firing: set[int] = set()
        self._acked_while_firing: set[int] = set()
        self._tokens = float(options.batch_size)
        self._tokens_at = time.monotonic()
        self._order = KeyOrder(options, self._name, clock, self._window.push)
        self._ack_pending: set[int] = set()
        self._ack_waiters: list[asyncio.Future[None]] = []
        self._ack_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.counters = _Counters()
        #: set to the error that stopped the manager (a failed write)
        self.failure: BaseException | None = None
        #: whether the last fire write met a frozen shard (invariant 7)
        self.frozen = False
        self.stopped = asyncio.Event()
        self._labels = (keyspace, shard, store.table)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, *, takeover: bool = False) -> None:
        """Load the table's columns and start firing. ``takeover``: this tablet has just
        taken the shard lease; every event the previous holders fired and nobody acked
        becomes due now (invariant 9), so a receiver subscribing after a lease holder
        died is fed at once instead of after those events' ack wait."""
        if takeover:
            async with self.writer.use() as wconn:
                released = await self.store.release_fired(wconn, self._clock())
            if released:
                log.info("queue manager %s: %d events fired by the previous lease holder "
                         "are due again now", self._name, released)
        conn = await self.reader.acquire()
        try:
            await self.store.load_columns(conn)
            if self.options.ordering_key:
                self._window.key_idx = self.store.column_index(self.options.ordering_key)
                for key, eid in await self.store.fired_keys(conn, self.options.ordering_key):
                    self._order.owner.setdefault(key, eid)
            if self.options.group_key:
                self._window.group_idx = self.store.column_index(self.options.group_key)
        finally:
            await self.reader.release(conn)
        self._tasks = [
            asyncio.create_task(self._run(), name=f"queue {self._name}"),
            asyncio.create_task(self._purge_loop(), name=f"queue purge {self._name}"),
        ]

    @property
    def _name(self) -> str:
        return f"{self.keyspace}/{self.shard}/{self.store.table}"

    async def stop(self) -> None:
        self.stopped.set()
        tasks = self._tasks + ([self._ack_task] if self._ack_task else [])
        await cancel_and_wait(tasks, swallow=(Exception,))
        for w in self._ack_waiters:
            if not w.done():
                w.set_exception(Unavailable(f"queue manager {self._name} stopped; retry the ack"))
        self._ack_waiters = []
        for r in self._receivers():
            r.in_flight.clear()
        self._window.clear()
        self._in_flight.clear()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            log.warning("queue manager %s stops: %s", self._name, exc)
        self.stopped.set()

    # -- inputs ------------------------------------------------------------------------

    def notify(self, kind: str = "insert", since_ns: int | None = None) -> None:
        """The tablet committed a write to this table: look for new events soon.

        ``since_ns`` is when (our clock) the committed transaction's first write to
        the table started: the next new-event scan reaches back to it, however long
        ago the transaction began (its events' ``time_scheduled`` are at least that,
        on the database's clock). Without it, the scan reaches back
        :data:`SCAN_SLACK_NS` from now.
        """
        if kind == "insert":
            self._new_pending = True
            self._window.committed(since_ns)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def receiver_gone(self, receiver: Receiver) -> None:
        """Hand a departed receiver's in-flight events back to the window, due now."""
        now = self._clock()
        for eid in list(receiver.in_flight):
            ev = self._in_flight.pop(eid, None)
            if ev is None:
                continue
            ev.receiver = None
            ev.due = now
            self._window.push(ev)
        receiver.in_flight.clear()
        self._wake.set()

    async def ack(self, ids: Sequence[int]) -> int:
        """Ack ``ids``; returns once the ack write committed. Returns how many were known."""
        if self.stopped.is_set():
            raise Unavailable(f"queue manager {self._name} is stopped; retry the ack")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ack_pending.update(int(i) for i in ids)
        self._ack_waiters.append(fut)
        if self._ack_task is None or self._ack_task.done():
            self._ack_task = asyncio.create_task(self._flush_acks())
        await fut
        return len(ids)

    async def _flush_acks(self) -> None:
        while self._ack_pending:
            ids = list(self._ack_pending)
            waiters = self._ack_waiters
            self._ack_pending = set()
            self._ack_waiters = []
            try:
                await self._write_acks_retrying(ids)
            except BaseException as exc:
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc if isinstance(exc, ShardgateError) else
                                        Unavailable(f"ack failed on {self._name}: {exc}"))
                if isinstance(exc, ShardgateError):
                    # invariants 7 and 8: a freeze or a lock conflict fails the acks only
                    if not writes_frozen(exc) and not _conflict(exc):
                        self._fail(exc)
                    return
                raise
            if self._firing:  # that fire write must not put these back in flight
                self._acked_while_firing.update(i for i in ids if i in self._firing)
            groups: dict[Any, int] = {}
            for eid in ids:
                ev = self._in_flight.get(eid) or self._window.events.get(eid)
                if ev is not None and ev.group is not None:
                    groups.setdefault(ev.group, eid)
                self._forget(eid, acked=True)
            self.counters.acked += len(ids)
            metrics.ACKED.labels(*self._labels).inc(len(ids))
            for w in waiters:
                if not w.done():
                    w.set_result(None)
            if groups:
                await self._check_groups(groups)
            self._wake.set()

    async def _write_acks_retrying(self, ids: list[int]) -> None:
        """:meth:`_write_acks`, written again after a lock conflict (invariant 8)."""
        await retry_conflicts(lambda: self._write_acks(ids))

    async def _write_acks(self, ids: list[int]) -> None:
        """Write acks on a pooled connection, so they never wait for a fire write (an
        ack is an idempotent conditional UPDATE; see invariant 2); on the lease's
        connection, as fires, when the pool has none free at once (its borrowers may
        be waiting for this very ack, inside their transactions)."""
        if self.reader.can_lend_now():
            conn = await self.reader.acquire()
            try:
                for i in range(0, len(ids), 1000):
                    await self.store.ack(conn, ids[i : i + 1000])
            finally:
                await self.reader.release(conn)
            return
        async with self.writer.use() as conn:
            for i in range(0, len(ids), 1000):
                await self.store.ack(conn, ids[i : i + 1000])

    def _forget(self, eid: int, *, acked: bool) -> None:
        ev = self._in_flight.pop(eid, None) or self._window.events.get(eid)
        self._window.events.pop(eid, None)
        if ev is not None and ev.receiver is not None:
            ev.receiver.in_flight.discard(eid)
        if ev is None:
            # Not in memory (e.g. fired before a restart): it may still own its key.
            self._order.release_owned_by(eid)
            return
        if self._order.enabled and self._order.owner.get(ev.key) == eid:
            self._order.release(ev.key)

    # -- the run loop ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not self.stopped.is_set():
                self._wake.clear()
                now = self._clock()
                if now >= self._full_at:
                    self._new_pending = False
                    await self._window.scan(True, self._ack_pending)
                    self._full_at = now + int(self.options.window * _NS)
                elif self._new_pending and self._backlogged:
                    pass  # the window still holds due events to fire: fire first
                elif self._new_pending or (self._window.pending_mode and len(
                        self._window.events) < self.options.cache_size // 2):
                    self._new_pending = False
                    await self._window.scan(False, self._ack_pending)
                if now >= self._collect_at:
                    await self._window.collect(self._ack_pending)
                    self._collect_at = now + int(self.options.collector_interval * _NS)
                delay = await self._fire_due()
                metrics.CACHED.labels(*self._labels).set(len(self._window.events))
                metrics.IN_FLIGHT.labels(*self._labels).set(len(self._in_flight))
                metrics.BLOCKED_KEYS.labels(*self._labels).set(len(self._order.waiting))
                if (self._new_pending and not self._backlogged) or delay == 0:
                    await asyncio.sleep(0)
                    continue
                wait = min(delay, (self._full_at - self._clock()) / _NS,
                           (self._collect_at - self._clock()) / _NS)
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._wake.wait(), max(wait, 0.0005))
        except asyncio.CancelledError:
            raise
        except ShardgateError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug: stop, the service restarts from the table
            log.exception("queue manager %s crashed", self._name)
            self._fail(exc)

    def _room(self) -> int:
        opts = self.options
        room = 1 << 30
        if opts.max_in_flight:
            room = min(room, opts.max_in_flight - len(self._in_flight))
        if opts.max_per_second:
            t = time.monotonic()
            burst = max(1.0, min(float(opts.batch_size), opts.max_per_second))
            self._tokens = min(burst, self._tokens + (t - self._tokens_at) * opts.max_per_second)
            self._tokens_at = t
            room = min(room, int(self._tokens))
        return room

    async def _fire_due(self) -> float:
        """Fire what is due; return seconds until the next due event (inf: none)."""
        everyone = self._receivers()
        receivers = [r for r in everyone if not r.busy]
        if not everyone:
            self._backlogged = False  # nobody to fire to: wake-ups scan as they come
        if not receivers:
            return float("inf")  # a receiver taking a batch or subscribing wakes us
        room = self._room()
        now = self._clock()
        batch_size = self.options.batch_size
        budget = batch_size * sum(r.free_slots for r in receivers)
        taken: list[Event] = []
        new = 0
        while self._window.heap and len(taken) < budget:
            due, _prio, eid = self._window.heap[0]
            if due > now:
                break
            ev = self._window.events.get(eid)
            if ev is None or ev.due != due:
                heapq.heappop(self._window.heap)
                continue
            refire = eid in self._in_flight  # replaces itself: needs no room
            if not refire and new >= room:
                break
            heapq.heappop(self._window.heap)
            if self._order.blocked(ev):
                del self._window.events[eid]
                continue
            new += not refire
            self._order.takes(ev)  # later events of the key wait from now
            taken.append(ev)
        heap = self._window.heap
        self._backlogged = len(taken) >= budget and bool(heap) and heap[0][0] <= now
        if not taken:
            if room <= 0:
                return 0.005
            return (self._window.heap[0][0] - now) / _NS if self._window.heap else float("inf")
        await self._fire(taken, receivers, now)
        return FROZEN_RETRY_S if self.frozen else 0

    async def _fire(self, taken: list[Event], receivers: list[Receiver], now: int) -> None:
        opts = self.options
        dead = [e for e in taken if opts.max_attempts and e.epoch >= opts.max_attempts]
        live = [e for e in taken if not (opts.max_attempts and e.epoch >= opts.max_attempts)]
        by_epoch: dict[int, list[Event]] = {}
        for e in live:
            by_epoch.setdefault(e.epoch, []).append(e)
        fired: list[Event] = []
        self._firing = {e.id for e in live}
        try:
            async with self.writer.use() as conn:
                if dead:
                    await self.store.fail(conn, [e.id for e in dead])
                for epoch, evs in by_epoch.items():
                    time_next = now + int((opts.ack_wait + self._backoff(epoch)) * _NS)
                    changed = await self.store.fire(conn, [e.id for e in evs], time_next)
                    acked = self._acked_while_firing
                    for e in evs:
                        if e.id in acked:  # acked after this write: already forgotten
                            continue
                        if e.id in changed:
                            e.deadline = time_next
                            fired.append(e)
                        else:  # acked before this write
                            self._forget(e.id, acked=True)
        except ShardgateError as exc:
            # Invariant 1: nothing of this batch is sent.
            if writes_frozen(exc):  # invariant 7: pause, the events wait in the window
                self._frozen(taken, now)
                return
            if _conflict(exc):  # invariant 8: rolled back; the events wait a moment
                log.info("queue manager %s: fire write lost a lock conflict, retried: %s",
                         self._name, exc)
                self._put_back(taken, now + int(CONFLICT_RETRY_S * _NS))
                return
            self._fail(exc)
            raise
        finally:
            self._firing = set()
            self._acked_while_firing = set()
        if self.frozen:
            log.info("queue manager %s: the shard accepts writes again", self._name)
            self.frozen = False
        for e in dead:
            self._forget(e.id, acked=False)
        if dead:
            self.counters.failed += len(dead)
            metrics.FAILED.labels(*self._labels).inc(len(dead))
        if opts.max_per_second:
            self._tokens -= len(taken)
        if not fired:
            return
        horizon = now + int(opts.window * _NS)
        retries = 0
        for e in fired:
            e.epoch += 1
            if e.epoch > 1:
                retries += 1
            self._order.takes(e)
            if e.deadline <= horizon:
                e.due = e.deadline
                self._window.push(e)
            else:
                self._window.events.pop(e.id, None)
        # Receivers may have left during the write: theirs go back to the window.
        receivers = [r for r in receivers if not r.closed]
        if not receivers:
            for e in fired:
                e.due = now
                self._window.push(e)
            return
        # Least busy first (fewest events in flight), a batch per free slot of each.
        receivers.sort(key=lambda r: len(r.in_flight))
        slots = [r for depth in range(RECEIVER_QUEUE_DEPTH) for r in receivers
                 if r.free_slots > depth] or receivers
        bs = opts.batch_size
        for i in range(0, len(fired), bs):
            chunk = fired[i : i + bs]
            rcv = slots[(i // bs) % len(slots)]
            out: list[QueueEvent] = []
            for e in chunk:
                old = self._in_flight.get(e.id)
                for prev in (e.receiver, old.receiver if old is not None else None):
                    if prev is not None and prev is not rcv:
                        prev.in_flight.discard(e.id)
                e.receiver = rcv
                rcv.in_flight.add(e.id)
                self._in_flight[e.id] = e
                r = e.row
                out.append(QueueEvent(e.id, self.shard, e.epoch, r[TIME_SCHEDULED], e.priority,
                                      tuple(r[VALUES:])))
            rcv.batches.put_nowait(out)
        self.counters.fired += len(fired)
        self.counters.retries += retries
        metrics.FIRED.labels(*self._labels).inc(len(fired))
        if retries:
            metrics.RETRIES.labels(*self._labels).inc(retries)

    def _frozen(self, taken: list[Event], now: int) -> None:
        """A fire write met a frozen shard (invariant 7): nothing was written or sent;
        the events go back to the window, due :data:`FROZEN_RETRY_S` from now."""
        if not self.frozen:
            log.info("queue manager %s: the shard refuses writes (a reshard's cut-over); "
                     "dispatch paused", self._name)
            self.frozen = True
        self._put_back(taken, now + int(FROZEN_RETRY_S * _NS))

    def _put_back(self, taken: list[Event], due: int) -> None:
        """Events of a fire write that wrote nothing go back to the window, due at ``due``
        at the earliest."""
        for e in taken:
            if e.id in self._acked_while_firing:
                continue
            if self._order.enabled and self._order.owner.get(e.key) == e.id \
                    and e.id not in self._in_flight:
                self._order.owner.pop(e.key, None)  # owned it for this write only
            e.due = max(e.due, due)
            self._window.push(e)

    def _backoff(self, epoch: int) -> float:
        opts = self.options
        b = opts.min_backoff * (2 ** min(epoch, 40)) * random.uniform(0.67, 1.33)
        b = max(b, opts.min_backoff)
        if opts.max_backoff:
            b = min(b, opts.max_backoff)
        return b if epoch > 0 else 0.0

    # -- groups and purge --------------------------------------------------------------

    async def _check_groups(self, groups: dict[Any, int]) -> None:
        """Enqueue the follow-up of every group whose events are now all acked."""
        column = self.options.group_key
        assert column is not None
        for key, some_id in groups.items():
            fid = followup_id(self.store.table, key)
            if some_id == fid:
                continue
            started = self._clock()
            async with self.writer.use() as conn:
                if await self.store.group_open(conn, column, key, fid) == 0:
                    await self.store.insert_followup(conn, column, key, fid, some_id)
            self.notify("insert", since_ns=started)

    async def _purge_loop(self) -> None:
        interval = max(1.0, min(60.0, self.options.retention / 10))
        try:
            while not self.stopped.is_set():
                await asyncio.sleep(interval)
                cutoff = self._clock() - int(self.options.retention * _NS)
                while True:
                    async with self.writer.use() as conn:
                        try:
                            n = await self.store.purge(conn, cutoff)
                        except ShardgateError as exc:
                            if not writes_frozen(exc) and not _conflict(exc):
                                raise
                            n = 0  # invariants 7 and 8: skip the round
                    self.counters.purged += n
                    metrics.PURGED.labels(*self._labels).inc(n)
                    if n < 500:
                        break
                    await asyncio.sleep(0)
        except ShardgateError as exc:
            self._fail(exc)

    # -- figures -----------------------------------------------------------------------

    def memory_stats(self) -> dict[str, Any]:
        c = self.counters
        t = time.monotonic()
        c.window.append((t, c.fired, c.acked))
        first = c.window[0]
        span = t - first[0]

        def rate(now_count: int, then_count: int) -> float:
            return (now_count - then_count) / span if span > 0 else 0.0

        return {
            "in_flight": len(self._in_flight),
            "cached": len(self._window.events),
            "blocked_keys": self._order.blocked_keys(),
            "hot_keys": len(self._order.hot),
            "fired": c.fired,
            "acked": c.acked,
            "retries": c.retries,
            "failed": c.failed,
            "purged": c.purged,
            "fired_per_second": rate(c.fired, first[1]),
            "acked_per_second": rate(c.acked, first[2]),
            "receivers": len(self._receivers()),
        }


def followup_id(table: str, key: Any) -> int:
    """The id of group ``key``'s follow-up event (stable, so it is enqueued once)."""
    import hashlib

    digest = hashlib.sha256(f"{table}\x00{key!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def _conflict(exc: ShardgateError) -> bool:
    """A write the database rolled back for a lock conflict (invariant 8): a deadlock,
    a lock wait timeout, a serialization failure, a SQLite shard locked by another
    writer; not a reshard's freeze (invariant 7)."""
    return exc.code is Code.ABORTED and not writes_frozen(exc)


async def retry_conflicts(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, called again after a lock conflict (:func:`_conflict`), up to
    :data:`ACK_ATTEMPTS` times in all. For idempotent writes only (acks)."""
    for attempt in range(ACK_ATTEMPTS):
        try:
            return await call()
        except ShardgateError as exc:
            if not _conflict(exc) or attempt == ACK_ATTEMPTS - 1:
                raise
            await asyncio.sleep(CONFLICT_RETRY_S * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")
