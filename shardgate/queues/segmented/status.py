"""The status writer of a segmented queue's consumer (:class:`StatusWriter`).

Every change of a job's state (``executing``, ``succeeded``, ``failed``, ``aborted``,
``pending``) is a row appended to the job's dataset. Rows asked for while one write runs
are gathered and written together (one INSERT per dataset touched; several datasets in one
transaction), through the lease's own connection, so a lost lease fails the next write.

Invariants
----------
1. :meth:`StatusWriter.write` returns only once its rows committed, or raises the error
   that stopped them (then ``on_broken`` was told, and the consumer starts over).
2. One write at a time: every statement on the lease's connection holds :attr:`lock`.
3. :meth:`StatusWriter.fail_waiters` drops the rows not written yet and fails their callers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from shardgate.backends import Connection
from shardgate.backends.base import transaction
from shardgate.errors import ShardgateError
from shardgate.queues.segmented.pending import Job
from shardgate.queues.segmented.store import SegmentedStore

#: one status row: the job, its attempt, the state, the reason, the time (ns)
StatusRow = tuple[Job, int, str, str | None, int]


class StatusWriter:
    """Writes a consumer's status rows in batches on the lease's connection."""

    def __init__(self, store: SegmentedStore, not_leader: Callable[[], ShardgateError],
                 on_broken: Callable[[ShardgateError], None]) -> None:
        self.store = store
        self._not_leader = not_leader
        self._on_broken = on_broken
        #: the lease's connection while the consumer holds the lease
        self.conn: Connection | None = None
        #: held by every statement on :attr:`conn`
        self.lock = asyncio.Lock()
        self._buf: list[StatusRow] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None

    def connection(self) -> Connection:
        """The lease's connection; UNAVAILABLE when the consumer holds no lease."""
        if self.conn is None:
            raise self._not_leader()
        return self.conn

    async def write(self, rows: Sequence[StatusRow]) -> None:
        """Append ``rows``; return once they committed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf.extend(rows)
        self._waiters.append(fut)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        await fut

    async def drain(self) -> None:
        """Wait for the write running now (errors are its callers')."""
        if self._flusher is not None and not self._flusher.done():
            with contextlib.suppress(ShardgateError, asyncio.CancelledError):
                await self._flusher

    def fail_waiters(self, exc: ShardgateError) -> None:
        """Drop the rows not written yet; their callers get ``exc``."""
        waiters, self._waiters = self._waiters, []
        self._buf = []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    async def _flush(self) -> None:
        while self._buf:
            async with self.lock:
                rows, self._buf = self._buf, []
                waiters, self._waiters = self._waiters, []
                by_n: dict[int, list[tuple[int, int, str, str | None, int]]] = {}
                for job, attempt, state, reason, at in rows:
                    by_n.setdefault(job.n, []).append((job.job_id, attempt, state, reason, at))
                try:
                    conn = self.connection()
                    if len(by_n) == 1:
                        for n, part in by_n.items():
                            await self.store.append_status(conn, n, part)
                    else:
                        async with transaction(conn):
                            for n, part in by_n.items():
                                await self.store.append_status(conn, n, part)
                except ShardgateError as exc:
                    for fut in waiters:
                        if not fut.done():
                            fut.set_exception(exc)
                    self._on_broken(exc)  # the consumer starts over
                    return
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
