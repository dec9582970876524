"""The connection pool every backend shares, and the dedicated-thread runner.

Pool rules (the invariants the three backends rely on):

* At most ``size`` connections exist at once (idle + lent). ``acquire`` waits
  for a free slot; it never opens more, and it waits at most ``timeout_s``:
  then it fails with ``RESOURCE_EXHAUSTED`` naming the pool, so a client that
  holds every connection (an abandoned transaction) slows others down but
  never hangs them.
* Idle connections are kept last-in first-out, so a burst does not keep every
  connection warm for ever, and the hottest one keeps its prepared statements.
* A connection is opened by the task that needs it, in that task: when the
  database is down, ``acquire`` fails at once with the driver's reason
  (``Unavailable``) instead of waiting on a background reconnect loop.
* A lent connection comes back through ``release``. If it is still inside a
  transaction it is rolled back. If it is ``broken`` (it raised
  ``Unavailable``, was cancelled mid-statement, or its rollback failed), if a
  ``stream`` on it is still open (abandoned without ``aclose``), or the pool is
  closed, it is closed instead of being kept.
* Every acquire and release bumps the connection's ``loans`` count. A
  stream remembers the loan it started under and, if it is finalised late (an
  abandoned async generator), touches nothing once the loan moved on: the
  connection may be serving someone else by then.
* Before an idle connection is lent again, ``looks_alive`` (a local check, no
  round trip) may reject it; a server restart is then noticed without paying a
  ``SELECT 1`` on the hot path. A connection that dies while lent raises
  ``Unavailable`` from the statement that noticed it and is dropped on release.

This is our own pool rather than ``psycopg_pool``: it is 100 lines, behaves the
same for all three drivers, has no background tasks to leak at shutdown, and
surfaces a failed connect immediately with its cause rather than after a pool
timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import select
import threading
import weakref
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from shardgate.backends.base import Backend, Connection
from shardgate.backends.urls import redacted
from shardgate.errors import (
    Code,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    ShardgateError,
)
from shardgate.result import Result, ResultLimits, rows_size

T = TypeVar("T")

#: Seconds ``acquire`` waits for a free connection before RESOURCE_EXHAUSTED.
DEFAULT_POOL_TIMEOUT_S = 10.0


class PooledConnection(Connection):
    """A :class:`Connection` with the two bits of state the pool needs."""

    #: Set when the connection must not be reused (lost, cancelled mid-call, ...).
    broken: bool = False
    #: Bumped by the pool on every acquire and release.
    loans: int = 0
    #: Streams started and not yet finished on this connection.
    open_streams: int = 0

    def looks_alive(self) -> bool:
        """Cheap local check (no round trip) before an idle connection is lent."""
        return not self.broken


class ThreadedConnection(PooledConnection):
    """A pooled connection whose blocking driver runs on its own :class:`Worker` thread.

    The SQLite and MariaDB backends share this; each supplies the calls that run
    on the thread (``_execute_sync``, ``_executemany_sync``, ``_open_stream_sync``,
    ``_fetch_sync``), its error ``_translate`` and the two hooks that differ:
    what a cancelled call does to the connection (:meth:`_cancelled`) and how a
    stream ends (:meth:`_end_stream`).

    Invariants: a driver error reaches the caller translated, with a code; an
    ``UNAVAILABLE`` one or a cancellation mid-call marks the connection
    ``broken`` (the pool then closes it instead of lending it again); a stream
    counts itself in ``open_streams`` while open and, finalised after its loan
    ended, leaves the connection alone.
    """

    _worker: Worker
    _safe_url: str

    @staticmethod
    @abstractmethod
    def _translate(exc: BaseException, safe_url: str) -> ShardgateError: ...

    @abstractmethod
    def _execute_sync(
        self, sql: str, params: Sequence[Any], limits: ResultLimits | None = None
    ) -> Result: ...

    @abstractmethod
    def _executemany_sync(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int: ...

    @abstractmethod
    def _open_stream_sync(self, sql: str, params: Sequence[Any]) -> tuple[Any, list[str]]: ...

    @abstractmethod
    def _fetch_sync(self, cur: Any, n: int) -> list[tuple[Any, ...]]: ...

    def _check_open(self) -> None:
        """Raise if the connection may not take calls any more (default: it may)."""

    def _cancelled(self) -> None:
        """A caller was cancelled while its call runs on the thread."""
        self.broken = True

    @abstractmethod
    async def _end_stream(self, cur: Any, *, done: bool, same_loan: bool) -> None:
        """Close a stream's cursor: read to the end (``done``) or abandoned early;
        ``same_loan`` is False when the connection was released meanwhile."""

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        self._check_open()
        try:
            return await self._worker.run(fn, *args)
        except ShardgateError:
            raise
        except asyncio.CancelledError:
            self._cancelled()
            raise
        except Exception as exc:
            err = self._translate(exc, self._safe_url)
            if err.code is Code.UNAVAILABLE:
                self.broken = True
            raise err from exc

    async def execute(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> Result:
        if limits is None:
            return await self._call(self._execute_sync, sql, params)
        return await self._call(self._execute_sync, sql, params, limits)

    async def executemany(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int:
        return await self._call(self._executemany_sync, sql, seq_of_params)

    async def stream(
        self, sql: str, params: Sequence[Any] = (), batch_size: int = 1000
    ) -> AsyncIterator[tuple[list[str], list[tuple[Any, ...]]]]:
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be >= 1, not {batch_size}")
        cur, fields = await self._call(self._open_stream_sync, sql, params)
        loan = self.loans
        self.open_streams += 1
        done = False
        try:
            while True:
                rows = await self._call(self._fetch_sync, cur, batch_size)
                if rows:
                    yield fields, rows
                if len(rows) < batch_size:
                    break
            done = True
        finally:
            self.open_streams -= 1
            await self._end_stream(cur, done=done, same_loan=self.loans == loan)


def socket_looks_alive(fd: int) -> bool:
    """True if an idle connection's socket has nothing to read.

    An idle client socket that is readable has either been closed by the
    server (EOF: restart, idle timeout, killed) or holds an unsolicited
    message; either way the connection is not worth lending. Costs one
    ``select`` syscall (about a microsecond).
    """
    if fd < 0:
        return False
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


_READS = ("SELECT", "WITH", "VALUES", "TABLE", "SHOW", "EXPLAIN", "(")
_WRITE_WORDS = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE|REPLACE)\b", re.IGNORECASE)


def is_read(sql: str) -> bool:
    """Whether a statement is a query whose result size the caller does not bound.

    Such statements are read in chunks when result limits apply; writes (even
    with ``RETURNING``, or a ``WITH`` holding one) return what they were given
    and take the plain path.
    """
    head = sql.lstrip()[:7].upper()
    if not head.startswith(_READS):
        return False
    return not head.startswith("WITH") or _WRITE_WORDS.search(sql) is None


def is_insert(sql: str) -> bool:
    """Whether a statement starts with INSERT or REPLACE (for ``insert_id``)."""
    head = sql.lstrip()[:7].upper()
    return head.startswith("INSERT") or head == "REPLACE"


class WorkerStopped(RuntimeError):
    """A call was submitted to a connection whose thread was shut down."""


class Worker:
    """One dedicated OS thread for one synchronous driver connection.

    Every call of the connection runs on this thread, in submission order, so
    the driver object is never touched by two threads and the event loop never
    blocks. A call is one hop: the whole statement (execute, fetch, counts) is
    a single function run on the thread.

    Not ``loop.run_in_executor`` on a one-worker ``ThreadPoolExecutor``:
    measured here, that round trip costs ~100 us (a concurrent Future, a
    wrapping asyncio Future and their callbacks); this plain queue plus one
    ``call_soon_threadsafe`` costs ~50 us. The thread is a daemon (a backend
    never closed must not hang interpreter exit; SQLite and the servers roll
    back a transaction cut short) and ends on ``shutdown()`` or when the
    Worker is garbage collected.

    A caller cancelled while its call runs gets ``CancelledError`` at once; the
    call itself still finishes on the thread before the next one starts.
    """

    __slots__ = ("__weakref__", "_queue", "_stopped")

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        thread = threading.Thread(target=_work, args=(self._queue,), name=name, daemon=True)
        thread.start()
        self._stopped = False
        weakref.finalize(self, self._queue.put, None)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Schedule ``fn(*args)`` on the thread; await the returned future."""
        if self._stopped:
            raise WorkerStopped("the connection's thread was shut down (connection closed)")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        # The thread exits after the calls already queued (e.g. a close) finish.
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)


_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _work(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        loop, future, fn, args = job
        try:
            result = fn(*args)
        except BaseException as exc:
            _deliver(loop, _set_exception, future, exc)
        else:
            _deliver(loop, _set_result, future, result)
        del job, loop, future, fn, args


def _deliver(
    loop: asyncio.AbstractEventLoop,
    setter: Callable[[asyncio.Future[Any], Any], None],
    future: asyncio.Future[Any],
    value: Any,
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop was closed: nobody is waiting
        loop.call_soon_threadsafe(setter, future, value)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # the awaiting task may have been cancelled
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


#: rows fetched per round when a result is read under limits
LIMITED_FETCH_ROWS = 1000


def fetch_limited(
    fetchmany: Callable[[int], Sequence[tuple[Any, ...]]], limits: ResultLimits, where: str
) -> list[tuple[Any, ...]]:
    """Every row ``fetchmany`` gives, checked against ``limits`` after each chunk."""
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        chunk = fetchmany(LIMITED_FETCH_ROWS)
        rows.extend(chunk)
        size += rows_size(chunk)
        limits.check(len(rows), size, where)
        if len(chunk) < LIMITED_FETCH_ROWS:
            return rows


async def wait_for_slot(
    slots: asyncio.Semaphore, timeout_s: float, why: Callable[[], str]
) -> None:
    """Take one of ``slots``, waiting at most ``timeout_s``; ``RESOURCE_EXHAUSTED`` after.

    The message is built only on failure (``why``).
    """
    if not slots.locked():
        await slots.acquire()  # free: no timer on the hot path
        return
    try:
        async with asyncio.timeout(timeout_s):
            await slots.acquire()
    except TimeoutError:
        raise ResourceExhausted(why()) from None


async def close_quietly(conn: Connection) -> None:
    # The connection is being thrown away; an error closing it is of no use.
    with contextlib.suppress(Exception):
        await conn.close()


class PooledBackend(Backend):
    """Implements the pool half of :class:`Backend`; subclasses open connections."""

    def __init__(
        self, url: str, *, pool_size: int, pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S
    ) -> None:
        super().__init__(url)
        if not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidArgument(f"pool_size must be an integer >= 1, not {pool_size!r}")
        if not pool_timeout_s > 0:
            raise InvalidArgument(f"pool_timeout_s must be > 0, not {pool_timeout_s!r}")
        self.pool_size = pool_size
        self.pool_timeout_s = pool_timeout_s
        self._slots = asyncio.Semaphore(pool_size)
        self._idle: list[PooledConnection] = []
        self._lent: set[PooledConnection] = set()
        self._closed = False

    @property
    def safe_url(self) -> str:
        return redacted(self.url)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.safe_url} pool_size={self.pool_size}>"

    @abstractmethod
    async def _connect(self) -> PooledConnection:
        """Open one connection (autocommit); raise ``Unavailable`` if unreachable."""

    def can_lend_now(self) -> bool:
        return not self._slots.locked()

    async def acquire(self) -> Connection:
        if self._closed:
            raise FailedPrecondition(f"backend for {self.safe_url} is closed")
        await wait_for_slot(self._slots, self.pool_timeout_s, lambda: (
            f"no free connection to {self.safe_url} after {self.pool_timeout_s:g}s: all "
            f"{self.pool_size} are in use (long or abandoned transactions, or too many "
            "concurrent queries); retry later, or raise the pool size"))
        try:
            conn: PooledConnection | None = None
            while self._idle:
                candidate = self._idle.pop()
                if candidate.looks_alive():
                    conn = candidate
                    break
                await close_quietly(candidate)
            if conn is None:
                conn = await self._connect()
        except BaseException:
            self._slots.release()
            raise
        conn.loans += 1
        self._lent.add(conn)
        return conn

    async def release(self, conn: Connection) -> None:
        if not isinstance(conn, PooledConnection) or conn not in self._lent:
            raise InvalidArgument(f"connection was not acquired from the backend {self.safe_url}")
        self._lent.discard(conn)
        conn.loans += 1
        if conn.open_streams:
            conn.broken = True  # an abandoned stream: its state cannot be undone cheaply
        try:
            if not conn.broken and conn.in_transaction:
                try:
                    await conn.rollback()
                except ShardgateError:
                    conn.broken = True
            if conn.broken or self._closed:
                await close_quietly(conn)
            else:
                self._idle.append(conn)
        except BaseException:
            # Cancelled while rolling back: the session state is unknown.
            await close_quietly(conn)
            raise
        finally:
            self._slots.release()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        # Lent connections stay in ``_lent`` so their ``release`` still works.
        for conn in idle + list(self._lent):
            await close_quietly(conn)

    async def ping(self) -> None:
        conn = await self.acquire()
        try:
            await conn.execute("SELECT 1")
        finally:
            await self.release(conn)
