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
  lease every ``check_interval`` seconds; a standby retries every
  ``retry_interval`` seconds, so a takeover after the holder dies takes at
  most ``retry_interval`` after the database noticed (immediately for a
  killed process; PostgreSQL and MariaDB notice a dead client when its TCP
  connection closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends import Backend
from shardgate.backends.base import LeaseHandle
from shardgate.errors import ShardgateError

log = logging.getLogger(__name__)

DEFAULT_RETRY_INTERVAL_S = 0.5
DEFAULT_CHECK_INTERVAL_S = 1.0


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
    ) -> None:
        self.backend = backend
        self.name = name
        self._on_acquired = on_acquired
        self._on_lost = on_lost
        self.retry_interval = retry_interval
        self.check_interval = check_interval
        self.handle: LeaseHandle | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self.handle is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lease {self.name}")

    def drop(self) -> None:
        """Give the lease up now (a write failed): the loop releases it and retries."""
        self._lost.set()

    async def _run(self) -> None:
        while True:
            try:
                handle = await self.backend.try_lease(self.name)
            except ShardgateError as exc:
                log.warning("lease %s: %s", self.name, exc)
                handle = None
            if handle is None:
                await asyncio.sleep(self.retry_interval)
                continue
            self.handle = handle
            self._lost.clear()
            try:
                await self._on_acquired(handle)
                while not self._lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await wait_for(self._lost.wait(), self.check_interval)
                    if not self._lost.is_set() and not await handle.check():
                        break
            finally:
                self.handle = None
                try:
                    await self._on_lost()
                finally:
                    await handle.release()
            await asyncio.sleep(self.retry_interval)

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])
