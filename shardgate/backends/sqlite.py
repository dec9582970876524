"""SQLite shards (stdlib ``sqlite3``): the embedded default for laptops and CI.

Invariants:

* **Thread affinity.** Each :class:`SQLiteConnection` owns one
  ``sqlite3.Connection`` and one dedicated thread (:class:`Worker`); every call
  on the driver object, including opening and closing it, runs on that thread.
  The event loop never blocks on SQLite, and ``check_same_thread`` stays on as
  a tripwire.
* **Transactions.** The driver runs with ``isolation_level=None``: SQLite's own
  autocommit, no hidden BEGIN from the sqlite3 module. ``begin()`` issues
  ``BEGIN IMMEDIATE``: the write lock is taken at the start of the transaction,
  so two writers queue on ``busy_timeout`` instead of deadlocking. (With a
  plain deferred ``BEGIN``, two transactions that both read and then write
  cannot both upgrade; in WAL mode the loser gets ``SQLITE_BUSY_SNAPSHOT`` at
  once, with no waiting, and must restart.) The price is that a transaction
  that only reads also serialises with writers; plain autocommit reads never
  do. ``in_transaction`` is read from the driver after every call, so it is
  true even if a caller ran ``BEGIN`` itself.
* **Journal.** WAL mode (readers never block the writer), ``busy_timeout``
  (default 5000 ms, ``?busy_timeout=`` in the URL), ``foreign_keys=ON`` as on
  the server databases, and the default ``synchronous=FULL``: a commit
  survives power loss, which the queues need.
* **Cancellation.** A caller cancelled mid-statement interrupts it
  (``sqlite3_interrupt``, the one call made from the loop's thread) and marks
  the connection broken: SQLite keeps interrupting new statements until every
  open one has finished, so the pool closes the connection (which rolls back
  an open transaction) instead of reusing it.
* **Pool.** ``pool_size`` connections to one file; the file's directory is
  created if missing. ``sqlite:///:memory:`` gives each connection its own
  private database, so its pool has exactly one connection.
* ``insert_id`` is the rowid of the inserted row for INSERT/REPLACE. For a
  multi-row INSERT it is ``last rowid - rows + 1``, which is the first row's
  id when SQLite generated them (as MySQL reports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from shardgate.backends._pool import (
    PooledBackend,
    PooledConnection,
    ThreadedConnection,
    Worker,
    WorkerStopped,
    fetch_limited,
    is_insert,
)
from shardgate.backends.base import LeaseHandle
from shardgate.backends.changes.sqlite import CaptureConnection, end_of_statement
from shardgate.backends.sqlite_errors import translate
from shardgate.backends.urls import DatabaseURL, parse_url
from shardgate.errors import (
    FailedPrecondition,
    InvalidArgument,
    ShardgateError,
)
from shardgate.result import Result, ResultLimits
from shardgate.sql.dialects import Dialect

DEFAULT_BUSY_TIMEOUT_MS = 5000

#: statements that check names against the connection's cached schema when prepared
_DDL_HEAD = re.compile(r"\s*(?:create|drop|alter)\b", re.IGNORECASE)


def _refresh_schema(db: sqlite3.Connection) -> None:
    """Bring ``db``'s cached schema up to date before a DDL statement is prepared.

    SQLite checks a CREATE's name against the schema the connection cached when it
    last read, and answers "index ... already exists" from that cache without
    checking the schema cookie: a pooled connection last used before another
    connection's DROP TABLE refused to re-create the dropped table's index. A read
    of ``sqlite_master`` starts a read transaction, which compares the cookie and
    reloads a stale schema.
    """
    if not db.in_transaction:  # inside one the snapshot's schema is the one to keep
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()


def _open(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    if path != ":memory:":
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
    # CaptureConnection: provides sg_txn() for the change-capture triggers (changes_sqlite).
    raw = sqlite3.connect(
        path, timeout=busy_timeout_ms / 1000, isolation_level=None, factory=CaptureConnection
    )
    try:
        raw.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if path != ":memory:":
            raw.execute("PRAGMA journal_mode = WAL").fetchall()
        raw.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        raw.close()
        raise
    return raw


class SQLiteConnection(ThreadedConnection):
    """One ``sqlite3.Connection`` and the thread that owns it."""

    _translate = staticmethod(translate)

    def __init__(self, worker: Worker, raw: sqlite3.Connection, safe_url: str) -> None:
        self._worker = worker
        self._raw: sqlite3.Connection | None = raw
        self._safe_url = safe_url
        self._in_tx = False
        self._closing = False
        #: a private in-memory database (closing it would lose it)
        self._memory = False

    @classmethod
    async def open(cls, path: str, busy_timeout_ms: int, safe_url: str) -> SQLiteConnection:
        worker = Worker("sg-sqlite")
        try:
            raw = await worker.run(_open, path, busy_timeout_ms)
        except Exception as exc:
            worker.shutdown()
            raise translate(exc, safe_url) from exc
        except BaseException:
            worker.shutdown()
            raise
        conn = cls(worker, raw, safe_url)
        conn._memory = path == ":memory:"
        return conn

    # -- calls that run on the worker thread -------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self._raw is None:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        return self._raw

    def _execute_sync(
        self, sql: str, params: Sequence[Any], limits: ResultLimits | None = None
    ) -> Result:
        db = self._db()
        if _DDL_HEAD.match(sql):
            _refresh_schema(db)
        try:
            cur = db.execute(sql, params)
            try:
                description = cur.description
                if description is not None:
                    rows = (cur.fetchall() if limits is None
                            else fetch_limited(cur.fetchmany, limits, self._safe_url))
                    result = Result([d[0] for d in description], rows)
                else:
                    result = Result()
                count = cur.rowcount
                if count > 0:
                    result.rows_affected = count
                    if is_insert(sql):
                        last = cur.lastrowid
                        if last:
                            result.insert_id = last - count + 1
            finally:
                cur.close()
        finally:
            self._in_tx = db.in_transaction
            end_of_statement(db)
        return result

    def _executemany_sync(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int:
        db = self._db()
        own_tx = not db.in_transaction
        try:
            if own_tx:  # atomic, and one fsync instead of one per row
                db.execute("BEGIN IMMEDIATE")
            try:
                cur = db.executemany(sql, seq_of_params)
                count = cur.rowcount
                cur.close()
                if own_tx:
                    db.execute("COMMIT")
            except BaseException:
                if own_tx and db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise
        finally:
            self._in_tx = db.in_transaction
            end_of_statement(db)
        return max(count, 0)

    def _fetch_sync(self, cur: sqlite3.Cursor, n: int) -> list[tuple[Any, ...]]:
        try:
            return cur.fetchmany(n)
        finally:
            self._in_tx = self._db().in_transaction

    def _open_stream_sync(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[sqlite3.Cursor, list[str]]:
        cur = self._db().execute(sql, params)
        return cur, [d[0] for d in cur.description or ()]

    def _close_sync(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(sqlite3.Error):
                raw.close()

    # -- the Connection contract ----------------------------------------------

    def _cancelled(self) -> None:
        # Stop the statement still running on the thread (thread-safe in SQLite).
        # The interrupt can also hit statements started before every open one
        # finished, so the connection is not reused.
        self.broken = True
        if self._raw is not None:
            self._raw.interrupt()

    async def _end_stream(self, cur: Any, *, done: bool, same_loan: bool) -> None:
        if same_loan and not self.broken:
            with contextlib.suppress(sqlite3.Error, WorkerStopped):
                await self._worker.run(cur.close)

    async def begin(self) -> None:
        await self.execute("BEGIN IMMEDIATE")

    async def reset(self) -> None:
        """A file's connection is closed (a new one is cheap and clean: no PRAGMA,
        ATTACH or temporary table); an in-memory database's only connection holds
        the whole shard and is kept."""
        if not self._memory:
            self.broken = True

    async def commit(self) -> None:
        await self.execute("COMMIT")

    async def rollback(self) -> None:
        await self.execute("ROLLBACK")

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._in_tx = False
        closed = self._worker.run(self._close_sync)
        self._worker.shutdown()
        if not self.broken:
            await closed
        # A broken connection may still be finishing an interrupted statement:
        # its thread closes it right after, without holding up the caller.

    @property
    def in_transaction(self) -> bool:
        return self._in_tx


class SQLiteBackend(PooledBackend):
    """A SQLite file (or a private in-memory database) as a shard."""

    dialect = Dialect.SQLITE
    placeholder = "?"

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        parsed: DatabaseURL = parse_url(url)
        if parsed.kind != "sqlite":
            raise InvalidArgument(f"not a sqlite URL: {parsed.safe}")
        options = dict(parsed.options)
        busy = options.pop("busy_timeout", str(DEFAULT_BUSY_TIMEOUT_MS))
        if options:
            raise InvalidArgument(
                f"unknown option(s) {sorted(options)} in {parsed.safe}; "
                "sqlite accepts: busy_timeout"
            )
        try:
            self.busy_timeout_ms = int(busy)
        except ValueError:
            raise InvalidArgument(
                f"busy_timeout must be milliseconds, not {busy!r} in {parsed.safe}"
            ) from None
        super().__init__(url, pool_size=pool_size)  # validates pool_size
        if parsed.is_memory:  # one private database per connection: keep exactly one
            self.pool_size = 1
            self._slots = asyncio.Semaphore(1)
        self.path = parsed.database

    async def _connect(self) -> PooledConnection:
        return await SQLiteConnection.open(self.path, self.busy_timeout_ms, self.safe_url)

    async def try_lease(self, name: str) -> LeaseHandle | None:
        return await _sqlite_try_lease(self, name)


class SQLiteLease(LeaseHandle):
    """A lease on a SQLite shard: ``flock`` on ``<database>.<name>.lease``.

    The kernel drops the lock when the file is closed or the process dies.
    ``conn`` is a dedicated connection to the shard for the holder's writes.
    """

    def __init__(self, fd: int, conn: SQLiteConnection) -> None:
        self._fd: int | None = fd
        self.conn = conn

    async def check(self) -> bool:
        if self._fd is None:
            return False
        try:
            await self.conn.execute("SELECT 1")
        except ShardgateError:
            return False
        return True

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        await self.conn.close()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _lease_path(path: str, name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"{path}.{safe}.lease"


async def _sqlite_try_lease(backend: SQLiteBackend, name: str) -> SQLiteLease | None:
    if backend.path == ":memory:":
        raise FailedPrecondition("an in-memory SQLite shard has no lease: use a database file")
    lock_path = _lease_path(backend.path, name)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise translate(exc, backend.safe_url) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    try:
        conn = await SQLiteConnection.open(backend.path, backend.busy_timeout_ms, backend.safe_url)
    except BaseException:
        os.close(fd)
        raise
    return SQLiteLease(fd, conn)

