"""The tablet's change stream: one log reader per shard, fanned out to many clients.

Parts:

* **The shared reader** (``_reader`` task) follows the shard's
  :class:`~shardgate.backends.changes.ChangeLog` from the end of the log at
  start-up, forever. Every transaction it reads goes into ``_txs`` (a window
  of the most recent ``buffer_txs`` transactions, with their position keys in
  ``_keys``), into the :class:`~shardgate.backends.changes.TimeMap`, and
  becomes ``last_token``. It survives transient database errors
  (``UNAVAILABLE``) by reopening the log from ``_position``, so nothing is
  skipped or repeated; :meth:`TabletStream.restart_reader` does the same on
  demand (tests kill it mid-burst this way).
* **Subscribers** (:meth:`TabletStream.subscribe`) start from a position, a
  timestamp, or "now". A subscriber whose start lies inside the window reads
  the window (caught up: no database work per client). An older start gets a
  *private* reader on the log, which hands over to the window as soon as it
  reaches it; a subscriber that falls behind the window does the same.

Invariants (the reader is stateful):

* ``_base`` is the position just before ``_txs[0]``; the window holds every
  transaction after ``_base`` up to ``_position`` (``_position`` may be past
  the last transaction after a heartbeat), with ``_keys`` strictly increasing.
* ``_off`` counts transactions dropped from the window's front, so
  ``_off + i`` is a stable index of ``_txs[i]`` for subscribers.
* ``last_token`` is the token of the last transaction read (or, before any,
  of the log end at start-up): data read after it was set is at least as
  fresh as it (the ``include_event_token`` contract).
* A start the log no longer holds fails with ``OUT_OF_RANGE``; a start past
  the end of the log waits for the reader to get there.
* ``_changed`` is replaced and set after every append, heartbeat or failure;
  subscribers wait on it with their heartbeat interval as timeout.
* Retention: changes committed more than ``retention_s`` ago are purged from
  the log (PostgreSQL: the anchor slot advances, releasing WAL; SQLite: change
  rows deleted) and from the time map; MariaDB's binlog is server-wide and
  left to the server's expiry. A start before the purge point fails with
  ``OUT_OF_RANGE``, never silently later.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
import logging
import math
import time
from collections.abc import AsyncIterator

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends.changes import (
    DEFAULT_HEARTBEAT_S,
    ChangeLog,
    Heartbeat,
    LogItem,
    TimeMap,
    Transaction,
)
from shardgate.errors import Code, ShardgateError
from shardgate.event_token import EventToken, position_key

log = logging.getLogger(__name__)

DEFAULT_BUFFER_TXS = 10_000
#: how long the log keeps changes (PostgreSQL slot, SQLite change table); MariaDB's
#: binlog is server-wide and follows the server's ``binlog_expire_logs_seconds``
DEFAULT_RETENTION_S = 86400.0
_RETRY_S = (0.05, 0.2, 1.0, 2.0)


class TabletStream:
    """The change stream of one shard (see the module docstring)."""

    def __init__(
        self,
        changelog: ChangeLog,
        *,
        buffer_txs: int = DEFAULT_BUFFER_TXS,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        retention_s: float = DEFAULT_RETENTION_S,
    ) -> None:
        self.log = changelog
        self.shard = changelog.shard
        self.retention_s = retention_s
        self.time_map = TimeMap(fine_s=min(3600.0, retention_s), retention_s=retention_s)
        self._retention_task: asyncio.Task[None] | None = None
        self.last_token: EventToken | None = None
        #: what this reader has read, for exact event tokens (see Visibility)
        self.visibility = changelog.visibility()
        self.watermark = 0.0
        self._buffer_txs = buffer_txs
        self._heartbeat_s = heartbeat_s
        self._txs: list[Transaction] = []
        self._keys: list[tuple[int, ...]] = []
        self._off = 0
        self._base = ""
        self._position = ""
        self._error: ShardgateError | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._start_lock = asyncio.Lock()
        self._closed = False

    # -- the shared reader --------------------------------------------------------

    async def start(self) -> None:
        """Prepare capture and start the shared reader at the end of the log (idempotent)."""
        async with self._start_lock:
            if self._task is not None and self._error is None:
                return
            if self._closed:
                raise ShardgateError(f"the change stream of {self.shard} is closed",
                                     code=Code.FAILED_PRECONDITION)
            if not self._position:
                await self.log.prepare()
                # Stamped a second before the whole second, so it compares older than any
                # commit after it (MariaDB commit times are whole seconds).
                stamp = math.floor(time.time()) - 1.0
                self._position = self._base = await self.log.current_position()
                await self.visibility.started()
                self.last_token = EventToken(stamp, self.shard, self._position)
                self.watermark = self.last_token.timestamp
            self._error = None
            self._task = asyncio.create_task(self._reader(), name=f"log-reader {self.shard}")
            if self._retention_task is None and self.log.purged_by_tablet:
                self._retention_task = asyncio.create_task(
                    self._retention_loop(), name=f"log-retention {self.shard}"
                )

    async def enforce_retention(self, now: float | None = None) -> str | None:
        """Purge the log of changes committed more than ``retention_s`` ago.

        The cut is the time map's position for ``now - retention_s`` (before
        every commit at or after that time), so nothing younger goes; returns
        it, or None when the map does not reach back that far (nothing to do).
        Starts before the cut then fail with ``OUT_OF_RANGE``.
        """
        now = time.time() if now is None else now
        cut = self.time_map.lookup(now - self.retention_s)
        self.time_map.compact(now)
        if cut is None or not self.log.purged_by_tablet:
            return None
        await self.log.purge(cut, through=now - self.retention_s)
        return cut

    async def _refuse_purged(self, timestamp: float) -> None:
        """``OUT_OF_RANGE`` if changes committed at or after ``timestamp`` may be purged.

        (A start from the time map is checked by the log itself: a purged position
        fails to read.) Without this, a start older than the retained log would
        begin at the oldest change held and silently skip the purged ones.
        """
        purged = await self.log.purged_through()
        if purged is not None and timestamp <= purged:
            raise ShardgateError(
                f"changes of {self.shard} committed up to {_iso(purged)} were purged from "
                f"the log (retention {self.retention_s:g} s): a start at {_iso(timestamp)} "
                "would miss them; start after that time, or from a saved position still held",
                code=Code.OUT_OF_RANGE,
            )

    async def _retention_loop(self) -> None:
        period = min(60.0, max(1.0, self.retention_s / 10))
        while not self._closed:
            await asyncio.sleep(period)
            try:
                await self.enforce_retention()
            except ShardgateError as exc:  # retried next period
                log.warning("log retention %s: %s", self.shard, exc)

    async def restart_reader(self) -> None:
        """Kill the shared reader and start a new one where it stopped (nothing is lost)."""
        task, self._task = self._task, None
        await cancel_and_wait([task])
        await self.start()

    async def _reader(self) -> None:
        attempt = 0
        while True:
            try:
                items = self.log.read(self._position, heartbeat_s=self._heartbeat_s)
                try:
                    async for item in items:
                        attempt = 0
                        self._take(item)
                finally:
                    await items.aclose()  # type: ignore[attr-defined]
                return
            except ShardgateError as exc:
                if exc.code is not Code.UNAVAILABLE or self._closed:
                    self._fail(exc)
                    return
                delay = _RETRY_S[min(attempt, len(_RETRY_S) - 1)]
                attempt += 1
                log.warning("log reader %s: %s; reopening in %.2fs", self.shard, exc, delay)
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug: stop the stream loudly
                log.exception("log reader %s failed", self.shard)
                self._fail(ShardgateError(f"log reader of {self.shard} failed: {exc!r}",
                                          code=Code.INTERNAL))
                return

    def _take(self, item: LogItem) -> None:
        if isinstance(item, Transaction):
            self.visibility.note(item)
            self.time_map.record(item.token.timestamp, self._position)
            self._txs.append(item)
            self._keys.append(position_key(item.token.position))
            self._position = item.token.position
            self.last_token = item.token
            self.watermark = max(self.watermark, item.token.timestamp)
            if len(self._txs) > 2 * self._buffer_txs:
                drop = len(self._txs) - self._buffer_txs
                self._base = self._txs[drop - 1].token.position
                del self._txs[:drop]
                del self._keys[:drop]
                self._off += drop
        else:
            self.watermark = max(self.watermark, item.watermark)
            if item.position is not None and position_key(item.position) > position_key(
                self._position
            ):
                self._position = item.position
        self._notify()

    def _fail(self, exc: ShardgateError) -> None:
        self._error = exc
        self._notify()

    def _notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    # -- subscribers ----------------------------------------------------------------

    async def subscribe(
        self,
        *,
        position: str | None = None,
        timestamp: float | None = None,
        heartbeat_s: float | None = None,
    ) -> AsyncIterator[LogItem]:
        """Transactions after ``position`` / committed at or after ``timestamp`` / from now.

        Yields :class:`Transaction` and, on an idle stream, :class:`Heartbeat`
        items (every ``heartbeat_s``). Fails with ``OUT_OF_RANGE`` if the log
        no longer holds the start.
        """
        await self.start()
        beat = self._heartbeat_s if heartbeat_s is None else heartbeat_s
        not_before = 0.0
        if timestamp is not None:
            not_before = timestamp
            position = self.time_map.lookup(timestamp)
            if position is None:
                await self._refuse_purged(timestamp)
                position = await self.log.position_at(timestamp)
            if position is None:
                position = await self.log.oldest_position()
        if position is None:
            position = self._position
        pos = position
        key = position_key(pos)
        while True:
            if self._error is not None:
                raise self._error
            if self._keys_from(key) is None:
                # Before the window: a private reader until it reaches the window.
                items = self.log.read(pos, heartbeat_s=beat)
                try:
                    async for item in items:
                        if isinstance(item, Transaction):
                            pos = item.token.position
                            if item.token.timestamp >= not_before:
                                yield item
                        else:
                            if item.position is not None:
                                pos = item.position
                            yield item
                        key = position_key(pos)
                        if self._keys_from(key) is not None:
                            break
                finally:
                    await items.aclose()  # type: ignore[attr-defined]
                continue
            # Inside the window (or ahead of it): read the window.
            async for item in self._from_window(key, not_before, beat):
                if isinstance(item, Transaction):
                    pos = item.token.position
                elif item.position is not None:
                    pos = item.position
                yield item
            key = position_key(pos)  # fell behind the window: catch up privately

    def _keys_from(self, key: tuple[int, ...]) -> int | None:
        """The window index of the first transaction after ``key``, or None if before it."""
        if key < position_key(self._base):
            return None
        return self._off + bisect.bisect_right(self._keys, key)

    async def _from_window(
        self, key: tuple[int, ...], not_before: float, beat: float
    ) -> AsyncIterator[LogItem]:
        n = self._keys_from(key)
        assert n is not None
        # A start ahead of the reader (its restart is catching up): skip to it.
        loop = asyncio.get_running_loop()
        last_yield = loop.time()
        while True:
            if self._error is not None:
                raise self._error
            local = n - self._off
            if local < 0:
                return  # fell behind the window
            if local < len(self._txs):
                for tx in self._txs[local:]:
                    n += 1
                    if tx.token.timestamp >= not_before and position_key(tx.token.position) > key:
                        last_yield = loop.time()
                        yield tx
                continue
            # Idle: a heartbeat every ``beat`` (the reader's own heartbeats and
            # position moves wake us more often; they must not starve ours).
            wait = last_yield + beat - loop.time()
            if wait <= 0:
                if position_key(self._position) >= key:
                    yield Heartbeat(watermark=self.watermark, position=self._position)
                last_yield = loop.time()
                continue
            with contextlib.suppress(TimeoutError):
                await wait_for(self._changed.wait(), wait)

    async def wait_for(self, position: str, timeout: float) -> bool:
        """Wait until the shared reader has read the log up to ``position``; False on timeout."""
        key = position_key(position)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while position_key(self._position) < key:
            remaining = deadline - loop.time()
            if self._error is not None or remaining <= 0:
                return False
            try:
                await wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False
        return True

    async def close(self) -> None:
        self._closed = True
        tasks = (self._task, self._retention_task)
        self._task = self._retention_task = None
        await cancel_and_wait(tasks)
        await self.log.close()


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")
