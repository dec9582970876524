"""The shard lease: which tablet of a shard runs its queue managers.

A lease is a database-level exclusive lock (PostgreSQL advisory lock,
MariaDB ``GET_LOCK``, ``flock`` on a file next to a SQLite database) taken
through :meth:`shardgate.backends.Backend.try_lease` and held on a dedicated
connection for as long as the holder lives.

Invariants:

* At most one :class:`ShardLease` of a shard is ``held`` at a time, because
  the database grants the lock to one session and frees it only when that
  session (connection, or process for SQLite) ends.
* The holder's queue writes run on the lease's connection
  (:class:`~shardgate.queues.table.manager.Writer`): if the lock is gone because
  the connection died, the next write fails with it, before anything is sent.
* ``on_lost`` runs before the lease is released, and the holder checks the
  lease every ``check_interval`` seconds. A check that has not answered within
  ``check_timeout`` seconds (a host cut off from its database: the round trip
  waits on TCP, minutes) is a lost lease: the holder stops firing at once, and
  the check is cancelled in the background (a driver's cancellation can itself
  wait on the network); a release that does not end in time is left the same
  way. A standby retries every
  ``retry_interval`` seconds, so a takeover after the holder dies takes at
  most ``retry_interval`` after the database noticed (immediately for a
  killed process; PostgreSQL and MariaDB notice a dead client when its TCP
  connection closes).
* :meth:`ShardLease.hurry` (a planned hand-over, ``shardgate cluster restart
  --rolling``): for a few seconds a standby retries every
  ``HURRY_INTERVAL_S`` instead of ``retry_interval``, so it takes the lease
  within tens of milliseconds of the holder giving it up; it stops hurrying
  once it holds the lease or the time is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends import Backend
from shardgate.backends.base import LeaseHandle
from shardgate.errors import ShardgateError

log = logging.getLogger(__name__)

DEFAULT_RETRY_INTERVAL_S = 0.5
DEFAULT_CHECK_INTERVAL_S = 1.0
#: how long the holder's lease check (one round trip) may take before the lease counts
#: as lost; far above a round trip on a loaded machine, far below TCP's give-up time
DEFAULT_CHECK_TIMEOUT_S = 5.0
#: a hurried standby's retry interval (each try opens a database session: kept brief)
HURRY_INTERVAL_S = 0.02
#: how long a standby hurries by default
DEFAULT_HURRY_S = 10.0
#: every lease of this process (``hurry_all``: a tablet process's SIGUSR1)
_LEASES: weakref.WeakSet[ShardLease] = weakref.WeakSet()

T = TypeVar("T")


def hurry_all(seconds: float = DEFAULT_HURRY_S) -> int:
    """:meth:`ShardLease.hurry` every lease of this process; how many there are."""
    leases = list(_LEASES)
    for lease in leases:
        lease.hurry(seconds)
    return len(leases)


class ShardLease:
    """Acquire, hold and lose one shard's lease, calling back on each change."""

    def __init__(
        self,
        backend: Backend,
        name: str,
        *,
        on_acquired: Callable[[LeaseHandle], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
        retry_interval: float = DEFAULT_RETRY_INTERVAL_S,
        check_interval: float = DEFAULT_CHECK_INTERVAL_S,
        check_timeout: float = DEFAULT_CHECK_TIMEOUT_S,
    ) -> None:
        self.backend = backend
        self.name = name
        self._on_acquired = on_acquired
        self._on_lost = on_lost
        self.retry_interval = retry_interval
        self.check_interval = check_interval
        self.check_timeout = check_timeout
        #: checks and releases that did not end in time, cancelled, ending in the background
        self._stragglers: set[asyncio.Future[Any]] = set()
        self.handle: LeaseHandle | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: monotonic time until which a standby retries every HURRY_INTERVAL_S
        self._hurry_until = 0.0
        self._woken = asyncio.Event()
        _LEASES.add(self)

    @property
    def held(self) -> bool:
        return self.handle is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lease {self.name}")

    def drop(self) -> None:
        """Give the lease up now (a write failed): the loop releases it and retries."""
        self._lost.set()

    def hurry(self, seconds: float = DEFAULT_HURRY_S) -> None:
        """Retry every ``HURRY_INTERVAL_S`` for ``seconds`` (at once too): the holder is
        about to give the lease up in a planned hand-over. Nothing changes for a holder."""
        self._hurry_until = asyncio.get_running_loop().time() + seconds
        self._woken.set()

    async def _pause(self) -> None:
        """Wait before the next try: ``retry_interval``, or briefly while hurried."""
        loop = asyncio.get_running_loop()
        self._woken.clear()
        if loop.time() < self._hurry_until:
            await asyncio.sleep(HURRY_INTERVAL_S)
            return
        with contextlib.suppress(TimeoutError):
            await wait_for(self._woken.wait(), self.retry_interval)

    async def _run(self) -> None:
        while True:
            try:
                handle = await self.backend.try_lease(self.name)
            except ShardgateError as exc:
                log.warning("lease %s: %s", self.name, exc)
                handle = None
            if handle is None:
                await self._pause()
                continue
            self.handle = handle
            self._hurry_until = 0.0
            self._lost.clear()
            try:
                await self._on_acquired(handle)
                while not self._lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await wait_for(self._lost.wait(), self.check_interval)
                    if not self._lost.is_set() and not await self._within(
                            handle.check(), "check"):
                        break
            finally:
                self.handle = None
                try:
                    await self._on_lost()
                finally:
                    await self._within(handle.release(), "release")
            await asyncio.sleep(self.retry_interval)

    async def _within(self, aw: Awaitable[T], what: str) -> T | None:
        """``await aw`` for at most ``check_timeout`` seconds; None when it has not ended
        by then (it is cancelled and left to end in the background: on a connection cut
        off from its database the driver's cancellation waits on the network too)."""
        task = asyncio.ensure_future(aw)
        try:
            done, _ = await asyncio.wait([task], timeout=self.check_timeout)
        except BaseException:
            task.cancel()
            raise
        if done:
            return task.result()
        log.warning("lease %s: the %s did not answer within %.1f s: the lease counts as "
                    "lost", self.name, what, self.check_timeout)
        task.cancel()
        self._stragglers.add(task)
        task.add_done_callback(self._straggler_done)
        return None

    def _straggler_done(self, task: asyncio.Future[Any]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("lease %s: a late check or release ended in %r", self.name,
                     task.exception())

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])
