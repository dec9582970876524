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
* A connection comes back **clean**: a statement that may have changed its
  session (``SET``, ``set_config``, ``USE``, ``PREPARE``, a temporary table,
  a user variable, a lock function, any function the pool does not know to be
  harmless: :func:`changes_session`) marks it ``dirty``, in or out of a
  transaction, and ``release`` resets it (PostgreSQL ``DISCARD ALL``,
  MariaDB ``COM_RESET_CONNECTION``; a connection that cannot be reset is
  closed) before anyone else borrows it. A plain statement costs no reset: the
  check is a cached look at the statement's text.
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
    #: A statement may have changed the session: reset before it is lent again.
    dirty: bool = False

    def looks_alive(self) -> bool:
        """Cheap local check (no round trip) before an idle connection is lent."""
        return not self.broken

    def note(self, sql: str) -> None:
        """Mark the connection ``dirty`` if ``sql`` may change its session."""
        if not self.dirty and changes_session(sql):
            self.dirty = True

    async def reset(self) -> None:
        """Bring the session back to a new connection's state (``dirty`` ones, on
        release). By default none is possible: the pool closes it instead."""
        self.broken = True


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
        self.note(sql)
        if limits is None:
            return await self._call(self._execute_sync, sql, params)
        return await self._call(self._execute_sync, sql, params, limits)

    async def executemany(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int:
        self.note(sql)
        return await self._call(self._executemany_sync, sql, seq_of_params)

    async def stream(
        self, sql: str, params: Sequence[Any] = (), batch_size: int = 1000
    ) -> AsyncIterator[tuple[list[str], list[tuple[Any, ...]]]]:
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be >= 1, not {batch_size}")
        self.note(sql)
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


#: statements that change the session by what they are (their first word)
_SESSION_HEADS = frozenset({
    "set", "reset", "prepare", "deallocate", "execute", "listen", "unlisten", "declare",
    "close", "load", "discard", "lock", "unlock", "handler", "use", "do", "call", "pragma",
    "attach", "detach", "flush", "kill", "install", "uninstall",
})
#: anywhere in a statement (lower case): a temporary table, a user variable (``@x``,
#: not ``@@x``), a file written by the server
_TEMP = re.compile(r"\btemp(?:orary)?\b")
_USER_VARIABLE = re.compile(r"(?<![@\w])@(?!@)[\w`'\"$]")
#: the words before a parenthesis that make it a table's column list, not a call
_TABLE_WORDS = frozenset({"into", "table", "exists", "references", "join", "from", "update",
                          "as", "with", "only"})
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_$")
_SPACE = frozenset(" \t\r\n")
#: words before a parenthesis that are SQL, and functions that touch no session state
#: (what a routed statement calls); any other call may (``set_config``, ``GET_LOCK``,
#: ``pg_advisory_lock``, a user's function that runs any of them)
_SAFE_CALLS = """
    in values exists any all some over partition using on as and or not from join where
    select then else when filter within row array cast convert coalesce nullif ifnull isnull
    nvl greatest least case set key primary unique check default returning by with lateral
    is like ilike between distinct union intersect except limit offset interval
    count sum min max avg total group_concat string_agg array_agg json_agg jsonb_agg
    bool_and bool_or every stddev variance bit_and bit_or
    abs round floor ceil ceiling mod power pow sqrt exp ln log log10 sign trunc truncate div
    length char_length character_length octet_length bit_length lower upper lcase ucase trim
    ltrim rtrim btrim substr substring mid left right lpad rpad reverse repeat replace
    position strpos instr locate concat concat_ws split_part format printf quote hex unhex
    ascii chr char md5 sha1 sha2 crc32 hashtext to_hex encode decode regexp_replace
    regexp_like regexp_matches regexp_substr field elt
    now current_timestamp current_date current_time localtime localtimestamp utc_timestamp
    sysdate curdate curtime date time datetime timestamp extract date_trunc date_part
    date_format str_to_date to_char to_date to_timestamp to_number unix_timestamp
    from_unixtime timestampdiff timestampadd datediff date_add date_sub adddate subdate
    strftime julianday epoch age make_date make_timestamp
    json_extract json_unquote json_object json_array json_build_object jsonb_build_object
    json_build_array jsonb_build_array to_json to_jsonb row_to_json json_value
    jsonb_set jsonb_array_elements json_array_elements jsonb_each json_each
    unnest generate_series array_length cardinality array_position
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value
    last_value nth_value
    if iif typeof last_insert_id last_insert_rowid changes found_rows row_count
    uuid gen_random_uuid random rand
    current_schema current_database database schema version pg_backend_pid connection_id
    current_setting pg_current_wal_lsn pg_current_wal_insert_lsn pg_wal_lsn_diff
    txid_current pg_current_xact_id pg_current_snapshot pg_snapshot_xmin
    txid_current_snapshot txid_snapshot_xmin pg_total_relation_size pg_relation_size
    pg_table_size to_regclass format_type pg_get_indexdef pg_get_constraintdef
    obj_description col_description pg_get_serial_sequence
    pg_try_advisory_xact_lock pg_advisory_xact_lock
"""
SESSION_SAFE_CALLS = frozenset(_SAFE_CALLS.split())
#: statement texts checked by :func:`changes_session` (cleared when full)
_SESSION: dict[str, bool] = {}
_SESSION_MAX = 4096


def changes_session(sql: str) -> bool:
    """Whether ``sql`` may leave its connection's session changed for the next
    borrower (see the pool rules): a session statement (``SET``, ``USE``,
    ``PREPARE``, ``PRAGMA``...), a temporary table, a user variable, or a call of any
    function not in :data:`SESSION_SAFE_CALLS`. Conservative: a false alarm costs
    one reset; a miss would leak one user's settings to another. Cached per text;
    plain string scans (about 2 us for a short statement, 0.5 ms for an 18 kB
    multi-row INSERT of literals) before any regular expression."""
    hit = _SESSION.get(sql)
    if hit is not None:
        return hit
    low = sql.lower()
    text = low.lstrip().lstrip("(").lstrip()
    head = text[:12].split(None, 1)[0].rstrip(";") if text else ""
    found = (
        head in _SESSION_HEADS
        or ("temp" in low and _TEMP.search(low) is not None)
        or ("@" in low and _USER_VARIABLE.search(low) is not None)
        or "outfile" in low or "dumpfile" in low
        or ("(" in low and _calls_unsafe(low))
    )
    if len(_SESSION) >= _SESSION_MAX:
        _SESSION.clear()
    _SESSION[sql] = found
    return found


def _calls_unsafe(low: str) -> bool:
    """Whether lower-cased ``low`` calls a function outside :data:`SESSION_SAFE_CALLS`
    (a name, or a quoted name, right before a parenthesis that is not a table's
    column list)."""
    i = low.find("(")
    while i != -1:
        j = i - 1
        while j >= 0 and low[j] in _SPACE:
            j -= 1
        end = j + 1
        quoted = end > 0 and low[end - 1] in "\"`"
        if quoted:  # a quoted name: back to its opening quote
            j = low.rfind(low[end - 1], 0, end - 1) - 1
        else:
            while j >= 0 and low[j] in _NAME_CHARS:
                j -= 1
        name = low[j + 1:end]
        if name and (quoted or name not in SESSION_SAFE_CALLS):
            while j >= 0 and (low[j] in _NAME_CHARS or low[j] in ".\"`"):
                j -= 1  # a qualified name: back over its schema
            k = j
            while k >= 0 and low[k] in _SPACE:
                k -= 1
            start = k
            while start >= 0 and low[start] in _NAME_CHARS:
                start -= 1
            if low[start + 1:k + 1] not in _TABLE_WORDS:
                return True
        i = low.find("(", i + 1)
    return False


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
            if not conn.broken and conn.dirty:
                try:
                    await conn.reset()  # the next borrower gets a clean session
                    conn.dirty = False
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
