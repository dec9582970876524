"""MariaDB / MySQL shards through PyMySQL (pure Python, synchronous).

Invariants:

* **Thread affinity.** Each :class:`MySQLConnection` owns one PyMySQL
  connection and one dedicated thread (:class:`Worker`); connect, every
  statement, fetch and close run on that thread, one at a time, so the event
  loop never blocks on the socket. The only thing read from the loop's thread
  is the socket's readability, before an idle connection is lent.
* **Transactions.** ``autocommit=1`` on every connection; ``begin()`` sends
  ``START TRANSACTION``. ``in_transaction`` comes from the server's status
  flags (``SERVER_STATUS_IN_TRANS``) carried by each OK packet, so it follows
  implicit commits (DDL) and a caller's own ``BEGIN``.
* **Encoding.** ``utf8mb4`` both ways; ``bytes`` parameters are sent as
  ``_binary'...'`` literals and VARBINARY/BLOB columns come back as ``bytes``.
* **Streaming.** ``stream`` uses an unbuffered ``SSCursor``: rows are read off
  the socket ``batch_size`` at a time. While it is open the connection can do
  nothing else (a MySQL protocol rule). An iterator abandoned early inside a
  transaction drains the rest of the result; outside one the connection is
  marked broken and closed by the pool instead, which is cheaper than reading
  a large remainder.
* ``rows_affected`` counts rows *matched* (``CLIENT_FOUND_ROWS``), like the
  other backends, not MySQL's default of rows actually changed.
* **insert_id** is ``LAST_INSERT_ID()`` as the OK packet reports it: the first
  auto-increment value of the statement, None when none was generated.
* **Two-phase commit.** ``begin_twopc`` is ``XA START`` (an XA transaction
  must be started as one), ``prepare`` is ``XA END`` + ``XA PREPARE``;
  ``commit()`` of an unprepared XA transaction is ``XA COMMIT ... ONE PHASE``.
  The xid is the gtrid; the bqual is the shard's database name, because XA ids
  are server-wide and ``XA RECOVER`` says nothing about databases. While the
  preparing session lives, only it can end the transaction (MariaDB answers
  ``XAER_NOTA`` elsewhere); once it is gone, any session can.
* **Cancellation.** A caller cancelled mid-statement (a query timeout)
  sends ``KILL QUERY <connection id>`` from a short-lived connection of its
  own, so the statement stops on the server too.
* **Broken connections.** ``Unavailable`` (2003/2006/2013, ...) or a caller
  cancelled mid-statement marks the connection broken; the pool closes it on
  release and the next acquire reconnects. An idle connection whose socket
  turned readable (server restart, ``wait_timeout``) is dropped before it is
  lent again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import asyncmy.errors
import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from shardgate.backends._pool import (
    PooledBackend,
    PooledConnection,
    ThreadedConnection,
    Worker,
    fetch_limited,
    is_read,
    socket_looks_alive,
)
from shardgate.backends.base import LeaseHandle, check_xid
from shardgate.backends.missing import missing
from shardgate.backends.mysql_queries import QueryPool, asyncmy_kwargs
from shardgate.backends.urls import DatabaseURL, parse_url
from shardgate.errors import (
    Aborted,
    AlreadyExists,
    Code,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ShardgateError,
    Unavailable,
)
from shardgate.result import Result, ResultLimits, WireResult
from shardgate.sql.dialects import Dialect

DEFAULT_CONNECT_TIMEOUT_S = 3
DEFAULT_PORT = 3306
_SERVER_STATUS_IN_TRANS = 1

_ALREADY_EXISTS = {1062, 1586, 1050, 1007, 1022, 1061, 1060}
_NOT_FOUND = {1146, 1054, 1049, 1051, 1091, 1305, 1176, 1109, 1397}  # 1397: unknown XA xid
_ABORTED = {1213, 1205, 1180, 1181, 1412, 1402, 1613, 1614}  # 14xx/16xx: XA branch rolled back
_UNAVAILABLE = {2002, 2003, 2005, 2006, 2013, 2055, 1053, 1927, 4031, 1152, 1158, 1159, 1160, 1161}
_INVALID = {
    1064, 1149, 1048, 1364, 1366, 1264, 1406, 1136, 1292, 1265, 1367, 1110, 1052,
    1058, 1093, 1111, 1140, 1241, 1242, 1327, 1582, 1583, 4025, 3819,
}  # fmt: skip
_FOREIGN_KEY = {1451, 1452, 1216, 1217}
_PERMISSION = {1044, 1045, 1142, 1143, 1227, 1370}
_TIMEOUT = {1969, 3024}
_RESOURCE = {1040, 1041, 1114, 1203, 1226}


#: the drivers' (PyMySQL's, asyncmy's) "not connected" and "bad statement or parameters"
#: MariaDB >= 10.2.4 / MySQL >= 5.7.3: reset the session without re-authenticating
_COM_RESET_CONNECTION = 0x1F
_INTERFACE_ERRORS = (pymysql.err.InterfaceError, asyncmy.errors.InterfaceError)
_PROGRAMMING_ERRORS = (pymysql.err.ProgrammingError, asyncmy.errors.ProgrammingError,
                       TypeError, ValueError)


def translate(exc: BaseException, safe_url: str) -> ShardgateError:
    """Map a PyMySQL or asyncmy exception to a shardgate error, by MySQL errno."""
    args: tuple[Any, ...] = getattr(exc, "args", ())
    errno = args[0] if args and isinstance(args[0], int) else 0
    text = " ".join(str(args[1] if len(args) > 1 else exc).split())
    where = f"shard database {safe_url}: {text}"
    if errno in _ALREADY_EXISTS:
        return AlreadyExists(f"duplicate in {where}")
    if errno in _NOT_FOUND:
        return missing(text, safe_url)
    if errno in _ABORTED:
        return Aborted(f"transaction aborted by {where}; retry it")
    if errno in _UNAVAILABLE or (errno == 0 and isinstance(exc, _INTERFACE_ERRORS)):
        return Unavailable(f"lost shard database {safe_url}: {text}; retry once it is back")
    if errno in _INVALID:
        return InvalidArgument(f"bad statement or value for {where}")
    if errno in _FOREIGN_KEY:
        return FailedPrecondition(f"foreign key violated in {where}")
    if errno in _PERMISSION:
        return ShardgateError(f"permission denied by {where}", code=Code.PERMISSION_DENIED)
    if errno in _TIMEOUT:
        return ShardgateError(f"statement timed out on {where}", code=Code.DEADLINE_EXCEEDED)
    if errno in _RESOURCE:
        return ResourceExhausted(f"out of resources on {where}")
    if isinstance(exc, _PROGRAMMING_ERRORS):
        # PyMySQL formats parameters client-side: a count mismatch is a TypeError.
        return InvalidArgument(f"bad statement or parameters for {where}")
    return Internal(f"unexpected error (errno {errno}) from {where}")


def translate_connect(exc: BaseException, safe_url: str) -> ShardgateError:
    err = translate(exc, safe_url)
    if err.code in (Code.UNAVAILABLE, Code.INTERNAL):
        reason = " ".join(str(exc).split())
        return Unavailable(
            f"shard database {safe_url} is unreachable: {reason}; check it is running"
        )
    return err


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def tls_kwargs(parsed: DatabaseURL) -> dict[str, Any]:
    """PyMySQL's TLS settings for a URL's ``ssl`` option.

    ``ssl=disabled`` or ``ssl=preferred`` (PyMySQL's own default: TLS when the
    server offers it). Unset: disabled on loopback and Unix sockets, where TLS
    protects nothing and PyMySQL would load the system CA bundle on every
    connect (tens of milliseconds of CPU each), preferred elsewhere.
    """
    mode = parsed.options.get("ssl")
    if mode is None:
        local = parsed.host in LOOPBACK_HOSTS or "unix_socket" in parsed.options
        mode = "disabled" if local else "preferred"
    if mode not in ("disabled", "preferred"):
        raise InvalidArgument(
            f"option ssl must be disabled or preferred, not {mode!r}, in {parsed.safe}"
        )
    return {"ssl_disabled": True} if mode == "disabled" else {}


class MySQLConnection(ThreadedConnection):
    """One PyMySQL connection and the thread that owns it."""

    _translate = staticmethod(translate)

    def __init__(self, worker: Worker, raw: Any, safe_url: str) -> None:
        self._worker = worker
        self._raw = raw
        self._safe_url = safe_url
        self._closed = False
        #: the xid of the XA transaction open on this session, and its XA state
        self._xa: str | None = None
        self._xa_state: str = ""  # "active" | "idle" | "prepared"
        #: how to open the side connection that cancels a running statement
        self._kill_kwargs: dict[str, Any] | None = None

    @classmethod
    async def open(cls, kwargs: dict[str, Any], safe_url: str) -> MySQLConnection:
        worker = Worker("sg-mysql")
        try:
            raw = await worker.run(lambda: _connect_reading_collation(kwargs))
        except Exception as exc:
            worker.shutdown()
            raise translate_connect(exc, safe_url) from exc
        except BaseException:
            worker.shutdown()
            raise
        conn = cls(worker, raw, safe_url)
        conn._kill_kwargs = kwargs
        return conn

    def looks_alive(self) -> bool:
        if self.broken or self._closed or not self._raw.open:
            return False
        sock = self._raw._sock
        return sock is not None and socket_looks_alive(sock.fileno())

    # -- calls that run on the worker thread -------------------------------------

    def _execute_sync(
        self, sql: str, params: Sequence[Any], limits: ResultLimits | None = None
    ) -> Result:
        if limits is not None and is_read(sql):
            return self._execute_limited_sync(sql, params, limits)
        with self._raw.cursor() as cur:
            cur.execute(sql, tuple(params))
            description = cur.description
            if description is not None:
                result = Result([d[0] for d in description], list(cur.fetchall()))
            else:
                result = Result()
            if cur.rowcount > 0 and description is None:
                result.rows_affected = cur.rowcount
            if cur.lastrowid:
                result.insert_id = cur.lastrowid
        return result

    def _execute_limited_sync(
        self, sql: str, params: Sequence[Any], limits: ResultLimits
    ) -> Result:
        """A query read unbuffered, stopped (connection dropped) once past ``limits``."""
        cur, fields = self._open_stream_sync(sql, params)
        try:
            rows = fetch_limited(cur.fetchmany, limits, self._safe_url)
        except ResourceExhausted:
            self.broken = True  # the rest of the rows are never read: drop the socket
            self._abandon_stream_sync(cur)
            raise
        cur.close()
        return Result(fields, rows)

    def _executemany_sync(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int:
        raw = self._raw
        own_tx = not (raw.server_status or 0) & _SERVER_STATUS_IN_TRANS
        if own_tx:  # atomic, as when PyMySQL folds the rows into one INSERT
            raw.begin()
        try:
            with raw.cursor() as cur:
                count = cur.executemany(sql, [tuple(p) for p in seq_of_params])
            if own_tx:
                raw.commit()
        except BaseException:
            if own_tx and raw.open:
                with contextlib.suppress(pymysql.err.MySQLError):
                    raw.rollback()
            raise
        return max(int(count or 0), 0)

    def _open_stream_sync(self, sql: str, params: Sequence[Any]) -> tuple[Any, list[str]]:
        cur = self._raw.cursor(pymysql.cursors.SSCursor)
        try:
            cur.execute(sql, tuple(params))
        except BaseException:
            cur.close()
            raise
        return cur, [d[0] for d in cur.description or ()]

    def _fetch_sync(self, cur: Any, n: int) -> list[tuple[Any, ...]]:
        return list(cur.fetchmany(n))

    def _abandon_stream_sync(self, cur: Any) -> None:
        # PyMySQL's SSCursor and its unbuffered result drain the rest of the
        # rows in close() and __del__; disarm both, then drop the socket.
        result = getattr(cur, "_result", None)
        if result is not None:
            result.unbuffered_active = False
        cur.connection = None
        self._raw._force_close()

    def _close_sync(self) -> None:
        # An unread unbuffered result (a stream never finished) would try to
        # drain the closed socket from its __del__: disarm it first.
        result = getattr(self._raw, "_result", None)
        if result is not None and getattr(result, "unbuffered_active", False):
            result.unbuffered_active = False
        with contextlib.suppress(Exception):  # closing a broken connection may fail
            if self._raw.open:
                self._raw.close()
            else:
                self._raw._force_close()

    # -- the Connection contract ----------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable(f"connection to shard database {self._safe_url} is closed")

    def _cancelled(self) -> None:
        # The statement still runs on the thread; do not lend the connection
        # again (close() will not wait for it either), and stop it on the server.
        self.broken = True
        if self._kill_kwargs is not None and self._raw.open:
            threading.Thread(target=_kill_query, args=(self._kill_kwargs, self._raw.thread_id()),
                             name="sg-mysql-kill", daemon=True).start()

    async def _end_stream(self, cur: Any, *, done: bool, same_loan: bool) -> None:
        if not same_loan or self._closed:
            return  # finalised late: the connection was released (and closed) meanwhile
        if done or self.in_transaction:
            if not self.broken:
                await self._call(cur.close)
        else:
            # Abandoned early: closing the connection beats draining the rest.
            self.broken = True
            await self._worker.run(self._abandon_stream_sync, cur)

    async def begin(self) -> None:
        await self._call(self._execute_sync, "START TRANSACTION", ())

    async def reset(self) -> None:
        """``COM_RESET_CONNECTION``: session variables (to the server's defaults; the
        handshake's character set), user variables, temporary tables, prepared
        statements, named and table locks; then the URL's database again (a ``USE``
        outlives the reset). Without a database in the URL the connection is closed."""
        if not self._raw.db:
            self.broken = True
            return
        await self._call(self._reset_sync)

    def _reset_sync(self) -> None:
        raw = self._raw
        raw._execute_command(_COM_RESET_CONNECTION, b"")
        raw._read_ok_packet()
        raw.select_db(raw.db)
        raw.autocommit(True)  # (a round trip only if the server's default is off)

    async def commit(self) -> None:
        if self._xa is not None:
            await self._commit_xa(self._xa)
            return
        await self._call(self._execute_sync, "COMMIT", ())

    async def rollback(self) -> None:
        if self._xa is not None:
            await self._rollback_xa(self._xa)
            return
        await self._call(self._execute_sync, "ROLLBACK", ())

    # -- two-phase commit: XA ------------------------------------------------------

    def _xid_sql(self, xid: str) -> str:
        """``gtrid,bqual`` as hex literals: the xid, then this database's name.

        XA ids are server-wide; the branch qualifier scopes ours to one database,
        so ``list_prepared`` on one shard never sees another database's.
        """
        check_xid(xid)
        db = self._raw.db
        name = db.encode() if isinstance(db, str) else bytes(db or b"")
        if not name:
            raise FailedPrecondition(
                f"two-phase commit on {self._safe_url} needs the database named in the shard URL"
            )
        return f"X'{xid.encode().hex()}',X'{name.hex()}'"

    async def _xa_command(self, command: str, xid: str) -> None:
        await self._call(self._execute_sync, f"XA {command} {self._xid_sql(xid)}", ())

    async def begin_twopc(self, xid: str) -> None:
        await self._xa_command("START", xid)
        self._xa, self._xa_state = xid, "active"

    async def prepare(self, xid: str) -> None:
        if self._xa != xid or self._xa_state != "active":
            raise FailedPrecondition(
                f"cannot prepare {xid} on shard database {self._safe_url}: "
                "it is not the XA transaction open on this connection"
            )
        await self._xa_command("END", xid)
        self._xa_state = "idle"
        await self._xa_command("PREPARE", xid)
        self._xa_state = "prepared"

    async def _commit_xa(self, xid: str) -> None:
        if self._xa_state == "active":
            await self._xa_command("END", xid)
            self._xa_state = "idle"
        if self._xa_state == "idle":
            await self._call(self._execute_sync, f"XA COMMIT {self._xid_sql(xid)} ONE PHASE", ())
        else:
            await self._xa_command("COMMIT", xid)
        self._xa, self._xa_state = None, ""

    async def _rollback_xa(self, xid: str) -> None:
        if self._xa_state == "prepared":
            # Only the commit decision ends a prepared branch. Refusing here makes
            # the pool close the session, which leaves the branch to recovery.
            raise FailedPrecondition(
                f"{xid} is prepared on {self._safe_url}: end it with commit_prepared or "
                "rollback_prepared (`shardgate twopc resolve`)"
            )
        try:
            if self._xa_state == "active":
                with contextlib.suppress(ShardgateError):  # e.g. already ended by an error
                    await self._xa_command("END", xid)
            # NotFound: the server already rolled the branch back (deadlock, failed prepare)
            with contextlib.suppress(NotFound):
                await self._xa_command("ROLLBACK", xid)
        finally:
            self._xa, self._xa_state = None, ""

    async def commit_prepared(self, xid: str) -> None:
        await self._xa_command("COMMIT", xid)
        if self._xa == xid:
            self._xa, self._xa_state = None, ""

    async def rollback_prepared(self, xid: str) -> None:
        await self._xa_command("ROLLBACK", xid)
        if self._xa == xid:
            self._xa, self._xa_state = None, ""

    async def list_prepared(self, prefix: str) -> list[str]:
        db = self._raw.db
        name = db.encode() if isinstance(db, str) else bytes(db or b"")
        result = await self.execute("XA RECOVER")
        found: list[str] = []
        for format_id, gtrid_length, bqual_length, data in result.rows:
            raw = data.encode() if isinstance(data, str) else bytes(data)
            gtrid, bqual = raw[:gtrid_length], raw[gtrid_length : gtrid_length + bqual_length]
            if format_id != 1 or bqual != name:
                continue
            xid = gtrid.decode("ascii", "replace")
            if xid.startswith(prefix):
                found.append(xid)
        return found

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        closed = self._worker.run(self._close_sync)
        self._worker.shutdown()
        if not self.broken:
            await closed
        # A broken connection may still be busy with a cancelled statement:
        # its thread closes it when that ends, without holding up the caller.

    @property
    def in_transaction(self) -> bool:
        if self._closed:
            return False
        return bool((self._raw.server_status or 0) & _SERVER_STATUS_IN_TRANS)


class MySQLBackend(PooledBackend):
    """A MariaDB (or MySQL) database as a shard."""

    dialect = Dialect.MYSQL
    placeholder = "%s"
    supports_twopc = True

    _OPTIONS = ("connect_timeout", "read_timeout", "write_timeout", "unix_socket", "ssl")

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        parsed = parse_url(url)
        if parsed.kind != "mysql":
            raise InvalidArgument(f"not a mysql URL: {parsed.safe}")
        unknown = sorted(set(parsed.options) - set(self._OPTIONS))
        if unknown:
            raise InvalidArgument(
                f"unknown option(s) {unknown} in {parsed.safe}; "
                f"mysql accepts: {', '.join(self._OPTIONS)}"
            )
        kwargs: dict[str, Any] = {
            "host": parsed.host,
            "port": parsed.port or DEFAULT_PORT,
            "user": parsed.user,
            "password": parsed.password or "",
            "database": parsed.database or None,
            "charset": "utf8mb4",
            "autocommit": True,
            "binary_prefix": True,
            # rows_affected counts rows matched, as PostgreSQL and SQLite do.
            "client_flag": CLIENT.FOUND_ROWS,
            "connect_timeout": DEFAULT_CONNECT_TIMEOUT_S,
        }
        kwargs.update(tls_kwargs(parsed))
        for key, value in parsed.options.items():
            if key == "ssl":
                continue
            if key == "unix_socket":
                kwargs[key] = value
                continue
            try:
                kwargs[key] = float(value)
            except ValueError:
                raise InvalidArgument(
                    f"option {key} must be seconds, not {value!r}, in {parsed.safe}"
                ) from None
        self._kwargs = kwargs
        super().__init__(url, pool_size=pool_size)
        #: autocommit statements on asyncio-native connections (mysql_queries); shards
        #: reached with TLS (asyncmy has no "preferred" mode) use the connection pool
        self._queries: QueryPool | None = None
        self._collation_read = False
        if kwargs.get("ssl_disabled"):
            self._queries = QueryPool(
                asyncmy_kwargs(kwargs), self.safe_url, pool_size, self.pool_timeout_s,
                translate, translate_connect, functools.partial(_kill_query, kwargs))
        self.gives_wire = self._queries is not None

    async def execute(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> Result:
        """One autocommit statement: on the query pool (the first on the connection
        pool, whose connect reads the database's collation)."""
        if self._queries is None or not self._collation_read or self._closed:
            return await super().execute(sql, params, limits)
        return await self._queries.execute(sql, params, limits)

    async def execute_wire(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> WireResult:
        """A read's answer as the server's packets, on the query pool."""
        if self._queries is None:
            return await super().execute_wire(sql, params, limits)
        if not self._collation_read:  # (a first connection reads the collation)
            await self.release(await self.acquire())
        if self._closed:
            raise FailedPrecondition(f"backend for {self.safe_url} is closed")
        return await self._queries.execute_wire(sql, params, limits)

    async def close(self) -> None:
        if self._queries is not None:
            await self._queries.close()
        await super().close()

    async def _connect(self) -> PooledConnection:
        conn = await MySQLConnection.open(self._kwargs, self.safe_url)
        self.collation = getattr(conn._raw, "sg_collation", None) or self.collation
        self._collation_read = True
        return conn

    async def try_lease(self, name: str) -> LeaseHandle | None:
        conn = await self._connect()
        try:
            res = await conn.execute("SELECT GET_LOCK(%s, 0)", [_lock_name(name)])
        except BaseException:
            await conn.close()
            raise
        if not res.rows or res.rows[0][0] != 1:
            await conn.close()
            return None
        return MySQLLease(conn, _lock_name(name))


def _connect_reading_collation(kwargs: dict[str, Any]) -> Any:
    """Connect, and note the database's default collation on the connection.

    The gate merges, groups and sorts strings the way that collation compares them.
    """
    raw = pymysql.connect(**kwargs)
    try:
        with raw.cursor() as cur:
            cur.execute("SELECT @@collation_database")
            row = cur.fetchone()
    except BaseException:
        raw.close()
        raise
    raw.sg_collation = str(row[0]) if row and row[0] else None
    return raw


def _kill_query(kwargs: dict[str, Any], connection_id: int) -> None:
    """``KILL QUERY`` the statement running on ``connection_id`` (best effort)."""
    with contextlib.suppress(Exception):  # the statement may have ended; nothing to do
        side = pymysql.connect(**kwargs)
        try:
            with side.cursor() as cur:
                cur.execute(f"KILL QUERY {int(connection_id)}")
        finally:
            side.close()


def _lock_name(name: str) -> str:
    # MariaDB lock names are at most 64 characters.
    return name if len(name) <= 64 else name[:40] + hashlib.sha1(name.encode()).hexdigest()[:20]


class MySQLLease(LeaseHandle):
    """A ``GET_LOCK`` named lock, held as long as its connection lives."""

    def __init__(self, conn: PooledConnection, name: str) -> None:
        self.conn = conn
        self._name = name
        self._released = False

    async def check(self) -> bool:
        if self._released:
            return False
        try:
            res = await self.conn.execute(
                "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", [self._name]
            )
        except ShardgateError:
            return False
        return bool(res.rows and res.rows[0][0])

    async def release(self) -> None:
        self._released = True
        with contextlib.suppress(Exception):
            await self.conn.close()
