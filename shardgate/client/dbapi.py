"""A synchronous PEP 249 (DB-API 2.0) driver for shardgate.

::

    from shardgate.client import dbapi

    conn = dbapi.connect("grpc://127.0.0.1:15991")     # a gate server
    cur = conn.cursor()
    cur.execute("insert into customer (email, name) values (:email, :name)",
                {"email": "a@example.com", "name": "A"})
    print(cur.lastrowid)                               # the sequence value
    conn.commit()

Targets: ``"grpc://host:port"`` (a :class:`~shardgate.api.grpc.client.GateClient` on
a private loop thread the connection owns), or an in-process
:class:`~shardgate.gate.Gate` with ``loop=`` the event loop it runs on, which
another thread must be running (:func:`shardgate.client.embedded.open_embedded`
gives both), and ``identity=`` whom its statements run for: an
:class:`~shardgate.auth.identity.Identity` (the table ACL applies to it) or
:data:`~shardgate.auth.identity.TRUSTED` (the application's own code, as the
gate's own work: no table ACL). There is no default: say which.

Parameters are ``:name`` placeholders filled from a dict (``paramstyle =
"named"``), exactly the bind variables the gate takes; the driver never edits
the SQL.

Transactions follow PEP 249: ``autocommit`` is off by default, so the first
statement after connect / commit / rollback sends ``BEGIN`` and
:meth:`Connection.commit` / :meth:`Connection.rollback` send ``COMMIT`` /
``ROLLBACK``. With ``autocommit = True`` each statement commits on its own
(the gate still wraps multi-shard writes in an implicit transaction). A
statement that fails inside a transaction ends it: the driver sends
``ROLLBACK`` and the next statement begins a new transaction. (The gate itself
undoes only the failed statement and keeps the transaction open; the driver
is stricter because the gRPC response does not yet carry the session's
transaction state, and a driver that guessed wrong could autocommit.) Closing
a connection rolls back what was not committed.

Errors are the PEP 249 classes below, chosen by the gate's error code; each
carries ``.code`` (:class:`~shardgate.errors.Code`) and the original
:class:`~shardgate.errors.ShardgateError` as ``__cause__``. A COMMIT whose
call broke after it was sent (the gate died during it) raises
:class:`OutcomeUnknownError` (code ``UNKNOWN``), not an ``OperationalError``:
the transaction may be committed, so check before running it again. Results are read
whole (``fetch*`` page through memory); ``cursor.description`` names the
columns, with ``type_code`` None (the protocol carries no column types yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

from shardgate.api.grpc.client import GateClient, with_user
from shardgate.api.grpc.security import ClientSecurity
from shardgate.auth.identity import Caller
from shardgate.client.sync import LoopRunner, LoopThread
from shardgate.errors import Code, OutcomeUnknown, ShardgateError
from shardgate.gate import Gate, Session
from shardgate.result import Result, Row
from shardgate.sql.inputs import check_bind_vars, check_sql

T = TypeVar("T")

apilevel = "2.0"
#: Threads may share the module, not connections.
threadsafety = 1
paramstyle = "named"


# -- exceptions (PEP 249 hierarchy) ----------------------------------------------------


class Warning(Exception):
    """Important warnings (not raised by this driver yet)."""


class Error(Exception):
    """Root of the driver's errors; ``code`` is the gate's error code, if any."""

    def __init__(self, message: str = "", code: Code | None = None) -> None:
        super().__init__(message)
        self.code = code


class InterfaceError(Error):
    """Misuse of the driver itself (e.g. a closed connection or cursor)."""


class DatabaseError(Error):
    """Errors reported by the gate."""


class DataError(DatabaseError):
    """A value is out of range for its column or type."""


class OperationalError(DatabaseError):
    """The gate or a shard is unavailable, or the transaction was aborted: retry later."""


class IntegrityError(DatabaseError):
    """A duplicate key (including a unique lookup vindex) or another constraint violation."""


class InternalError(DatabaseError):
    """An internal error of the gate: a bug, or an unexpected database error."""


class OutcomeUnknownError(InternalError):
    """The outcome is unknown: the gate or a shard was lost after the statement (a COMMIT,
    an autocommitted write) was sent. It may have been applied: read the data back
    before running it again. Never an :class:`OperationalError`, which callers retry.
    ``code`` is ``UNKNOWN``; a lost COMMIT's message starts with "commit outcome unknown".
    """


class ProgrammingError(DatabaseError):
    """Bad SQL, unknown table or keyspace, an unsupported statement, or a misused cursor."""


class NotSupportedError(DatabaseError):
    """A DB-API feature this driver does not support (e.g. ``callproc``)."""


_ERROR_BY_CODE: dict[Code, type[DatabaseError]] = {
    Code.INVALID_ARGUMENT: ProgrammingError,
    Code.NOT_FOUND: ProgrammingError,
    Code.UNIMPLEMENTED: ProgrammingError,
    Code.PERMISSION_DENIED: ProgrammingError,
    Code.ALREADY_EXISTS: IntegrityError,
    Code.OUT_OF_RANGE: DataError,
    Code.UNAVAILABLE: OperationalError,
    Code.UNAUTHENTICATED: OperationalError,
    Code.ABORTED: OperationalError,
    Code.FAILED_PRECONDITION: OperationalError,
    Code.RESOURCE_EXHAUSTED: OperationalError,
    Code.DEADLINE_EXCEEDED: OperationalError,
    Code.CANCELED: OperationalError,
    Code.INTERNAL: InternalError,
    Code.UNKNOWN: InternalError,
}


def error_from(exc: ShardgateError) -> DatabaseError:
    """The DB-API error reporting ``exc`` (raise it ``from exc``)."""
    if isinstance(exc, OutcomeUnknown):
        return OutcomeUnknownError(exc.message, exc.code)
    return _ERROR_BY_CODE.get(exc.code, DatabaseError)(exc.message, exc.code)


# -- types (PEP 249 constructors and type objects) ---------------------------------------

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> datetime.date:
    """The local date of a Unix time."""
    return datetime.date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> datetime.time:
    """The local time of day of a Unix time."""
    return datetime.time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> datetime.datetime:
    """The local date and time of a Unix time."""
    return datetime.datetime(*time.localtime(ticks)[:6])


class _TypeObject:
    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.upper() in self.names

    def __hash__(self) -> int:
        return hash(self.names)


STRING = _TypeObject("CHAR", "VARCHAR", "TEXT")
BINARY = _TypeObject("BINARY", "VARBINARY", "BLOB")
NUMBER = _TypeObject("INT", "BIGINT", "SMALLINT", "TINYINT", "DECIMAL", "FLOAT", "DOUBLE")
DATETIME = _TypeObject("DATE", "TIME", "DATETIME", "TIMESTAMP")
ROWID = _TypeObject("ROWID")


# -- sessions: what a connection talks to ------------------------------------------------


class _GateSession(Protocol):
    async def execute(self, sql: str, bind_vars: Mapping[str, Any] | None = None) -> Result: ...

    async def close(self) -> None: ...


class _LocalSession:
    """A session on an in-process gate."""

    def __init__(self, gate: Gate, keyspace: str | None, identity: Caller) -> None:
        self.gate = gate
        self.session: Session = gate.session(keyspace, identity=identity)

    async def execute(self, sql: str, bind_vars: Mapping[str, Any] | None = None) -> Result:
        return await self.gate.execute(self.session, sql, bind_vars)

    async def close(self) -> None:
        if self.session.in_transaction:
            await self.gate.rollback(self.session)


async def _grpc_session(
    target: str, keyspace: str | None, timeout: float | None, security: ClientSecurity
) -> GateClient:
    return GateClient(target, keyspace=keyspace, timeout=timeout, security=security)


def connect(
    target: str | Gate,
    *,
    keyspace: str | None = None,
    autocommit: bool = False,
    loop: asyncio.AbstractEventLoop | None = None,
    timeout: float | None = None,
    user: str | None = None,
    password: str | None = None,
    security: ClientSecurity | None = None,
    identity: Caller | None = None,
) -> Connection:
    """Open a connection to a gate.

    ``target``: ``"grpc://host:port"``, or an in-process :class:`Gate` together
    with ``loop``, the running event loop (in another thread) the gate lives on,
    and ``identity``, whom the statements run for (an
    :class:`~shardgate.auth.identity.Identity`, or
    :data:`~shardgate.auth.identity.TRUSTED`; required with a Gate, unused with
    a gRPC target, where ``user`` authenticates).
    ``keyspace``: the session's default keyspace (None: the topology's default).
    ``timeout``: seconds per gRPC call (None: no deadline).
    ``user`` / ``password``: the gate's users file entry; ``security``: TLS
    files (:class:`~shardgate.api.grpc.security.ClientSecurity`).
    """
    if isinstance(target, Gate):
        if loop is None:
            raise InterfaceError(
                "an in-process Gate needs loop=<the event loop it runs on>; "
                "shardgate.client.embedded.open_embedded(topology) returns both"
            )
        if identity is None:
            raise InterfaceError(
                "an in-process Gate needs identity=<whom the statements run for>: an "
                "shardgate.auth.identity.Identity (the table ACL applies) or "
                "shardgate.auth.identity.TRUSTED (the application's own code)"
            )
        try:
            local = _LocalSession(target, keyspace, identity)
        except ShardgateError as exc:
            raise error_from(exc) from exc
        return Connection(local, LoopRunner(loop), autocommit=autocommit)
    if not isinstance(target, str):
        raise InterfaceError(f"connect() takes 'grpc://host:port' or a Gate, not {target!r}")
    if identity is not None:
        raise InterfaceError("identity= is for an in-process Gate; a gRPC target "
                             "authenticates with user= and password= (or a certificate)")
    loop_thread = LoopThread("shardgate-dbapi")
    try:
        client = loop_thread.run(
            _grpc_session(target, keyspace, timeout, with_user(security, user, password)))
    except ShardgateError as exc:
        loop_thread.close()
        raise error_from(exc) from exc
    except BaseException:
        loop_thread.close()
        raise
    return Connection(client, loop_thread, autocommit=autocommit, owned_loop=loop_thread)


# -- connection ----------------------------------------------------------------------------

_CONTROL = {"begin": "begin", "start": "begin", "commit": "commit", "rollback": "rollback"}


def _control_keyword(sql: str) -> str | None:
    words = sql.split(None, 1)
    return _CONTROL.get(words[0].rstrip(";").lower()) if words else None


class Connection:
    """A DB-API connection: one gate session. Use :func:`connect` to make one."""

    def __init__(
        self,
        session: _GateSession,
        runner: LoopRunner,
        *,
        autocommit: bool = False,
        owned_loop: LoopThread | None = None,
    ) -> None:
        self._session = session
        self._runner = runner
        self._owned_loop = owned_loop
        self._autocommit = autocommit
        self._in_transaction = False
        self._closed = False

    # -- properties --

    @property
    def autocommit(self) -> bool:
        """Whether each statement commits on its own; setting True commits an open transaction."""
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        if value and self._in_transaction:
            self.commit()
        self._autocommit = bool(value)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_transaction(self) -> bool:
        """Whether the driver has an open transaction (BEGIN sent, not yet ended)."""
        return self._in_transaction

    # -- PEP 249 methods --

    def cursor(self) -> Cursor:
        """A new cursor on this connection."""
        self._check_open()
        return Cursor(self)

    def commit(self) -> None:
        """Commit the open transaction (nothing to do without one)."""
        self._check_open()
        if self._in_transaction:
            self._in_transaction = False
            self._run(self._session.execute("COMMIT"))

    def rollback(self) -> None:
        """Roll back the open transaction (nothing to do without one)."""
        self._check_open()
        if self._in_transaction:
            self._in_transaction = False
            self._run(self._session.execute("ROLLBACK"))

    def close(self) -> None:
        """Roll back what is not committed, end the session and release the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._session.close())
        finally:
            self._in_transaction = False
            if self._owned_loop is not None:
                self._owned_loop.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Commit on success, roll back on an exception, then close."""
        try:
            if not self._closed:
                if exc_type is None:
                    self.commit()
                else:
                    self.rollback()
        finally:
            self.close()

    # -- used by cursors --

    def _execute(self, sql: str, params: Mapping[str, Any] | None) -> Result:
        self._check_open()
        control = _control_keyword(sql)
        if not self._autocommit and not self._in_transaction and control is None:
            self._run(self._session.execute("BEGIN"))
            self._in_transaction = True
        try:
            result = self._run(self._session.execute(sql, params))
        except DatabaseError:
            if self._in_transaction:
                # End the transaction the statement failed in (see the module docstring).
                self._in_transaction = False
                self._quiet_rollback()
            raise
        if control is not None:
            self._in_transaction = control == "begin"
        return result

    def _quiet_rollback(self) -> None:
        # Already gone with the failed statement, or the gate is unreachable.
        with contextlib.suppress(Error):
            self._run(self._session.execute("ROLLBACK"))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self._runner.run(coro)
        except ShardgateError as exc:
            raise error_from(exc) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed")


# -- cursor ----------------------------------------------------------------------------------

Description = tuple[tuple[str, None, None, None, None, None, None], ...]


class Cursor:
    """A DB-API cursor: runs statements and pages through their (buffered) results."""

    #: Rows :meth:`fetchmany` returns by default.
    arraysize: int = 1

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.description: Description | None = None
        #: Rows a write affected, or rows a SELECT returned; -1 before any execute.
        self.rowcount = -1
        #: The first auto-increment / sequence value the last INSERT generated, or None.
        self.lastrowid: int | None = None
        self._rows: list[Row] = []
        self._pos = 0
        self._closed = False

    def execute(self, operation: str, parameters: Mapping[str, Any] | None = None) -> Cursor:
        """Run one statement with ``:name`` parameters from ``parameters``; return the cursor."""
        self._check_open()
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ProgrammingError(
                "parameters must be a dict: paramstyle is 'named' (:name placeholders)"
            )
        try:  # refused here, before a transaction is begun for it
            check_sql(operation)
            check_bind_vars(parameters)
        except ShardgateError as exc:
            raise error_from(exc) from exc
        result = self.connection._execute(operation, parameters)
        self._set_result(result)
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Mapping[str, Any]]) -> Cursor:
        """Run one statement once per parameter dict; ``rowcount`` is the total affected."""
        self._check_open()
        total = 0
        last_id: int | None = None
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
            total += max(self.rowcount, 0)
            last_id = self.lastrowid if self.lastrowid is not None else last_id
        self._set_result(Result(rows_affected=total, insert_id=last_id))
        return self

    def fetchone(self) -> Row | None:
        """The next row, or None when there are no more."""
        self._check_result()
        if self._pos >= len(self._rows):
            return None
        row = self._rows[self._pos]
        self._pos += 1
        return row

    def fetchmany(self, size: int | None = None) -> list[Row]:
        """Up to ``size`` (default :attr:`arraysize`) next rows."""
        self._check_result()
        n = self.arraysize if size is None else size
        rows = self._rows[self._pos : self._pos + n]
        self._pos += len(rows)
        return rows

    def fetchall(self) -> list[Row]:
        """All remaining rows."""
        self._check_result()
        rows = self._rows[self._pos :]
        self._pos = len(self._rows)
        return rows

    def close(self) -> None:
        """Release the result; the cursor cannot be used afterwards."""
        self._closed = True
        self._rows = []

    def callproc(self, procname: str, parameters: Sequence[Any] = ()) -> None:
        """Stored procedures are not supported."""
        raise NotSupportedError("stored procedures are not supported by shardgate")

    def setinputsizes(self, sizes: Sequence[Any]) -> None:
        """Does nothing (allowed by PEP 249)."""

    def setoutputsize(self, size: int, column: int | None = None) -> None:
        """Does nothing (allowed by PEP 249)."""

    def __iter__(self) -> Iterator[Row]:
        return self

    def __next__(self) -> Row:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _set_result(self, result: Result) -> None:
        self._rows = list(result.rows)
        self._pos = 0
        self.lastrowid = result.insert_id
        if result.fields:
            self.description = tuple(
                (name, None, None, None, None, None, None) for name in result.fields
            )
            self.rowcount = len(result.rows)
        else:
            self.description = None
            self.rowcount = result.rows_affected

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        if self.connection.closed:
            raise InterfaceError("the connection is closed")

    def _check_result(self) -> None:
        self._check_open()
        if self.description is None:
            raise ProgrammingError("no result set: the last statement returned no rows")
