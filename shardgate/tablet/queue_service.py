"""A tablet's queues: the lease, one manager per queue table, receivers and acks.

Invariants:

* Managers run only while this tablet holds the shard lease; they are all
  stopped (their windows dropped) before the lease is released, and a manager
  whose write failed drops the lease, so every manager restarts from the
  table under a freshly checked lease.
* Receivers subscribe to the service, not to a manager: they stay connected
  across lease changes (a standby's receivers get events once it takes over).
* Acks work without the lease (an ack is an idempotent conditional UPDATE);
  with it, they go through the manager so its window forgets the event.
* The tablet calls :meth:`QueueService.committed` after every commit (or
  autocommit statement) that wrote a queue table: that wake-up, not polling
  or NOTIFY, is how a manager learns of new events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardgate.backends.base import LeaseHandle
from shardgate.errors import NotFound, ShardgateError
from shardgate.queues import metrics
from shardgate.queues.ddl import comment_of, detect_sql
from shardgate.queues.events import QueueBatch
from shardgate.queues.manager import QueueManager, Receiver, Writer
from shardgate.queues.options import QueueOptions, parse_comment
from shardgate.queues.table_store import QueueStore
from shardgate.tablet.lease import ShardLease

if TYPE_CHECKING:
    from shardgate.tablet.tablet import Tablet

log = logging.getLogger(__name__)

_WRITE = re.compile(
    r"^\s*(insert|update|delete|replace)\s+(?:or\s+\w+\s+)?(?:ignore\s+)?(?:into\s+|from\s+)?"
    r"[`\"]?(\w+)",
    re.IGNORECASE,
)


class QueueService:
    """The queues of one tablet (see the module docstring)."""

    def __init__(self, tablet: Tablet, *, lease_retry: float = 0.5,
                 lease_check: float = 1.0) -> None:
        self.tablet = tablet
        self.options: dict[str, QueueOptions] = {}
        self.receivers: dict[str, list[Receiver]] = {}
        self.managers: dict[str, QueueManager] = {}
        self._writer: Writer | None = None
        self._lease: ShardLease | None = None
        self._lease_retry = lease_retry
        self._lease_check = lease_check
        self._detected = False
        self._watch: asyncio.Task[None] | None = None

    @property
    def lease_name(self) -> str:
        return f"shardgate/{self.tablet.keyspace}/{self.tablet.shard}/queues"

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
                if self._writer is not None and key not in self.managers:
                    asyncio.get_running_loop().create_task(self._start_manager(key))

    def start(self) -> None:
        """Start competing for the lease (idempotent; needs a running loop)."""
        if self._lease is None:
            self._lease = ShardLease(
                self.tablet.backend, self.lease_name, on_acquired=self._acquired,
                on_lost=self._lost, retry_interval=self._lease_retry,
                check_interval=self._lease_check)
            self._lease.start()

    async def detect(self) -> list[str]:
        """Find queue tables from their comment markers; configure them. Returns names."""
        dialect = self.tablet.dialect
        res = await self.tablet.backend.execute(detect_sql(dialect))
        found: dict[str, QueueOptions] = {}
        for name, text in res.rows:
            opts = parse_comment(comment_of(dialect, str(text or "")))
            if opts is not None:
                found[str(name).lower()] = opts
        self._detected = True
        self.configure(found)
        return sorted(found)

    async def _known(self, queue: str) -> str:
        key = queue.lower()
        if key not in self.options:
            await self.detect()
        if key not in self.options:
            raise NotFound(
                f"{queue!r} is not a queue table on {self.tablet.keyspace}/{self.tablet.shard}: "
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
            await self._start_manager(name)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_failures())

    async def _start_manager(self, name: str) -> None:
        if self._writer is None or name in self.managers:
            return
        tablet = self.tablet
        store = QueueStore(name, tablet.dialect, tablet.placeholder)
        manager = QueueManager(
            keyspace=tablet.keyspace, shard=tablet.shard, store=store,
            options=self.options[name], reader=tablet.backend, writer=self._writer,
            receivers=lambda n=name: self.receivers.get(n, []),  # type: ignore[misc]
        )
        self.managers[name] = manager
        try:
            await manager.start()
        except ShardgateError as exc:
            log.warning("queue %s on %s/%s cannot start: %s", name, tablet.keyspace,
                        tablet.shard, exc)
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
        managers, self.managers = self.managers, {}
        for m in managers.values():
            await m.stop()
        for rs in self.receivers.values():
            for r in rs:
                r.in_flight.clear()
                r.waker = None

    # -- the tablet's hooks ------------------------------------------------------------

    def touched(self, sql: str) -> tuple[str, str] | None:
        """``(queue, kind)`` if ``sql`` writes a queue table, else None."""
        if not self.options:
            return None
        m = _WRITE.match(sql)
        if m is None:
            return None
        name = m.group(2).lower()
        if name not in self.options:
            return None
        return name, "insert" if m.group(1).lower() in ("insert", "replace") else "update"

    def committed(self, touched: Sequence[tuple[str, str]]) -> None:
        for name, kind in touched:
            m = self.managers.get(name)
            if m is not None:
                m.notify(kind)

    # -- receivers and acks ------------------------------------------------------------

    async def subscribe(self, queue: str, max_batch: int = 0) -> tuple[Receiver, list[str]]:
        """A new receiver of ``queue`` and the queue's user columns."""
        name = await self._known(queue)
        self.start()
        rcv = Receiver(max_batch)
        self.receivers.setdefault(name, []).append(rcv)
        m = self.managers.get(name)
        if m is not None:
            rcv.waker = m.wake
            m.wake()
            fields = list(m.store.user_columns)
        else:
            store = QueueStore(name, self.tablet.dialect, self.tablet.placeholder)
            conn = await self.tablet.backend.acquire()
            try:
                fields = await store.load_columns(conn)
            finally:
                await self.tablet.backend.release(conn)
        self._gauge(name)
        return rcv, fields

    def unsubscribe(self, queue: str, rcv: Receiver) -> None:
        name = queue.lower()
        rs = self.receivers.get(name, [])
        if rcv in rs:
            rs.remove(rcv)
        rcv.end()
        m = self.managers.get(name)
        if m is not None:
            m.receiver_gone(rcv)
        self._gauge(name)

    def _gauge(self, name: str) -> None:
        t = self.tablet
        metrics.RECEIVERS.labels(t.keyspace, t.shard, name).set(len(self.receivers.get(name, [])))

    async def ack(self, queue: str, ids: Sequence[int]) -> int:
        name = await self._known(queue)
        m = self.managers.get(name)
        if m is not None and not m.stopped.is_set():
            return await m.ack(ids)
        store = QueueStore(name, self.tablet.dialect, self.tablet.placeholder)
        return await store.ack_via(self.tablet.backend, ids)

    async def stats(self, queue: str) -> dict[str, Any]:
        name = await self._known(queue)
        t = self.tablet
        store = QueueStore(name, t.dialect, t.placeholder)
        conn = await t.backend.acquire()
        try:
            out = await store.stats(conn)
        finally:
            await t.backend.release(conn)
        for state, n in out["depth"].items():
            metrics.DEPTH.labels(t.keyspace, t.shard, name, state).set(n)
        metrics.LAG.labels(t.keyspace, t.shard, name).set(out["lag_seconds"])
        out["shard"] = t.shard
        out["leader"] = self.leader
        m = self.managers.get(name)
        out.update(m.memory_stats() if m is not None else {"receivers": len(
            self.receivers.get(name, []))})
        return out

    async def close(self) -> None:
        for rs in self.receivers.values():
            for r in rs:
                r.end()
        self.receivers = {}
        if self._lease is not None:
            await self._lease.close()
            self._lease = None
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._lost()


async def receive_batches(
    service: QueueService, queue: str, max_batch: int = 0
) -> AsyncIterator[QueueBatch]:
    """A receiver's stream: first the fields (no events), then batches, until closed.

    Leaving the iteration unsubscribes; the receiver's unacked events go back
    to the window at once (nothing is lost).
    """
    rcv, fields = await service.subscribe(queue, max_batch)
    t = service.tablet
    try:
        yield QueueBatch(t.keyspace, queue, list(fields), [])
        while True:
            events = await rcv.get()
            if events is None:
                return
            yield QueueBatch(t.keyspace, queue, [], events)
    finally:
        service.unsubscribe(queue, rcv)
