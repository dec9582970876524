"""PostgreSQL shards through psycopg 3's native asyncio connection.

Invariants:

* **Task affinity.** A :class:`PostgresConnection` is used by one task at a
  time (the pool lends it to one borrower). psycopg's ``AsyncConnection`` is
  asyncio-native, so no thread is involved.
* **Transactions.** Connections run with ``autocommit=True``: each statement
  commits on its own unless ``begin()`` (a plain ``BEGIN``) opened a block.
  ``in_transaction`` is read from libpq's transaction status, so it is also
  true after a caller's own ``BEGIN`` and while a failed block awaits its
  ``ROLLBACK``.
* **Prepared statements.** psycopg prepares a statement server-side after it
  ran 5 times on a connection (``prepare_threshold``); kept, it is the hot
  path. BEGIN/COMMIT/ROLLBACK are never prepared. ``execute`` turns the ``%s``
  placeholders into PostgreSQL's ``$n`` once per statement text (a bounded
  cache, :func:`native_placeholders`) and sends it through a raw cursor:
  psycopg would otherwise re-parse every statement with more than 50
  parameters (a multi-row INSERT) on every call.
* **Streaming.** ``stream`` declares a server-side (named) cursor and fetches
  ``batch_size`` rows per round trip. A named cursor lives inside a
  transaction: outside one, ``stream`` opens its own and ends it when the
  iteration ends (COMMIT) or fails (ROLLBACK). Do not commit or roll back the
  connection while iterating; close an abandoned iterator with
  ``contextlib.aclosing``.
* **insert_id.** PostgreSQL has no "last insert id" on the wire. An INSERT with
  a ``RETURNING`` clause whose first column is an integer reports that value
  of the first row; the dialect layer adds ``RETURNING <auto-increment
  column>`` when it needs the id. Otherwise ``insert_id`` is None.
* **Broken connections.** A statement that fails with ``Unavailable`` or is
  cancelled mid-flight marks the connection broken; the pool closes it on
  release. An idle connection whose socket became readable (server restart,
  killed backend) is dropped before it is lent again.
* **Two-phase commit.** ``begin_twopc`` is a plain ``BEGIN``; ``prepare`` is
  ``PREPARE TRANSACTION 'xid'``, after which the session is free again and the
  transaction belongs to the database (``pg_prepared_xacts``), to be ended by
  ``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` from any session on the same
  database. A failed transaction is never prepared: PostgreSQL would answer
  ``ROLLBACK`` instead of an error, so ``prepare`` checks first and after.
  Needs ``max_prepared_transactions`` > 0.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg.pq import TransactionStatus

from shardgate.backends import copytext
from shardgate.backends._pool import (
    LIMITED_FETCH_ROWS,
    PooledBackend,
    PooledConnection,
    changes_session,
    is_insert,
    is_read,
    socket_looks_alive,
)
from shardgate.backends.base import LeaseHandle, check_xid
from shardgate.backends.missing import missing
from shardgate.backends.urls import parse_url
from shardgate.errors import (
    Aborted,
    AlreadyExists,
    Code,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    ShardgateError,
    Unavailable,
)
from shardgate.result import Result, ResultLimits, rows_size
from shardgate.sql.dialects import Dialect

DEFAULT_CONNECT_TIMEOUT_S = 3

_stream_names = itertools.count(1)
#: how psycopg's ``stream()`` says the statement was a command, not a query
_NO_RESULT = "didn't produce a result"

_NOT_FOUND = {"42P01", "42703", "42704", "42883", "3D000", "3F000"}
_ALREADY_EXISTS = {"23505", "42P07", "42710", "42P06", "42701", "42P04", "42723"}
_ABORTED = {"40001", "40P01", "25P02", "55P03"}
_UNAVAILABLE_PREFIXES = ("08", "57P")  # connection exceptions; admin shutdown, crash


def _describe(exc: psycopg.Error) -> str:
    """The server's message on one line, with its DETAIL when there is one."""
    diag = exc.diag
    primary = diag.message_primary or str(exc)
    text = " ".join(primary.split())
    if diag.message_detail:
        text += f" ({' '.join(diag.message_detail.split())})"
    return text


def translate(exc: psycopg.Error, safe_url: str) -> ShardgateError:
    """Map a psycopg exception to a shardgate error, by SQLSTATE first."""
    state = exc.sqlstate or ""
    text = _describe(exc)
    where = f"shard database {safe_url}: {text}"
    if state in _ALREADY_EXISTS:
        return AlreadyExists(f"duplicate in {where}")
    if state in _NOT_FOUND:
        return missing(text, safe_url)
    if state in _ABORTED:
        return Aborted(f"transaction aborted by {where}; retry it")
    if state == "42501" or state.startswith("28"):
        return ShardgateError(f"permission denied by {where}", code=Code.PERMISSION_DENIED)
    if state.startswith(_UNAVAILABLE_PREFIXES):
        return Unavailable(f"lost shard database {safe_url}: {text}; retry once it is back")
    if state == "57014":
        return ShardgateError(f"statement cancelled by {where}", code=Code.DEADLINE_EXCEEDED)
    if state.startswith("53"):
        return ResourceExhausted(f"out of resources on {where}")
    if state == "23503":
        return FailedPrecondition(f"foreign key violated in {where}")
    if state.startswith(("42", "22", "23", "2F", "0A")):
        # syntax / access rule, data exception, other integrity, routine, unsupported
        return InvalidArgument(f"bad statement or value for {where}")
    if state.startswith("25"):
        return FailedPrecondition(f"invalid transaction state in {where}")
    if not state:
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return Unavailable(f"lost shard database {safe_url}: {text}; retry once it is back")
        if isinstance(exc, psycopg.ProgrammingError | psycopg.DataError):
            return InvalidArgument(f"bad statement or parameters for {where}")
    return Internal(f"unexpected error (SQLSTATE {state or 'none'}) from {where}")


def _load_infinities(conn: psycopg.AsyncConnection[tuple[Any, ...]]) -> None:
    """Read PostgreSQL's ``infinity``/``-infinity`` dates and timestamps as the ends of
    Python's (and Spark's) range, as every shardgate path does (``docs/types.md``),
    instead of failing the whole result."""
    import datetime

    from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader

    utc = datetime.UTC
    low = datetime.datetime(1, 1, 2)  # shardgate.spark.types.TS_MIN
    ends: list[tuple[str, type[Any], Any, Any]] = [
        ("date", DateLoader, datetime.date.max, datetime.date.min),
        ("timestamp", TimestampLoader, datetime.datetime.max, low),
        ("timestamptz", TimestamptzLoader, datetime.datetime.max.replace(tzinfo=utc),
         low.replace(tzinfo=utc)),
    ]
    for name, base, high, low in ends:
        def load(self: Any, data: Any, _base: Any = base, _hi: Any = high, _lo: Any = low
                 ) -> Any:
            raw = bytes(data)
            if raw == b"infinity":
                return _hi
            if raw == b"-infinity":
                return _lo
            return _base.load(self, data)

        loader = type(f"Infinite{base.__name__}", (base,), {"load": load})
        conn.adapters.register_loader(name, loader)


def translate_connect(exc: psycopg.Error, safe_url: str) -> ShardgateError:
    """A failed connect: unreachable unless the server said something more precise."""
    state = exc.sqlstate or ""
    if state == "3D000" or state.startswith("28") or state.startswith("53"):
        return translate(exc, safe_url)
    reason = " ".join(str(exc).split())
    return Unavailable(f"shard database {safe_url} is unreachable: {reason}; check it is running")


def _gid(xid: str) -> str:
    """``xid`` as the string literal PREPARE TRANSACTION takes (no parameters there)."""
    return "'" + xid.replace("'", "''") + "'"


_PERCENT = re.compile(r"%(.)", re.DOTALL)
#: statement texts converted by :func:`native_placeholders` (cleared when full)
_NATIVE: dict[str, tuple[str, int] | None] = {}
_NATIVE_MAX = 2048


def native_placeholders(sql: str) -> tuple[str, int] | None:
    """``sql`` with each ``%s`` as ``$1``, ``$2``... and ``%%`` as ``%``, and the
    number of placeholders; None when it holds another ``%`` sequence (psycopg
    then reads it, and refuses what it must)."""
    hit = _NATIVE.get(sql, False)
    if hit is not False:
        return hit  # type: ignore[return-value]
    count = 0
    bad = False

    def sub(m: re.Match[str]) -> str:
        nonlocal count, bad
        c = m.group(1)
        if c == "s":
            count += 1
            return f"${count}"
        if c != "%":
            bad = True
        return "%"

    out = _PERCENT.sub(sub, sql)
    answer = None if bad or "%" in sql[-1:] else (out, count)
    if len(_NATIVE) >= _NATIVE_MAX:
        _NATIVE.clear()
    _NATIVE[sql] = answer
    return answer


#: one round trip setting the source's COPY text output (``SET LOCAL`` of each)
_SETTINGS_SQL = "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(copytext.SOURCE_SETTINGS))


class _Calling:
    """``with conn._calling:`` around driver calls: a psycopg error leaves as the
    shardgate error it means (the connection marked broken when it is one, see
    ``_fail``); any other exception (a caller cancelled mid-statement) marks the
    connection broken, its session state unknown. (A class: cheaper than a generator
    context manager on the statement path.)"""

    __slots__ = ("conn",)

    def __init__(self, conn: PostgresConnection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        if exc is None:
            return
        if isinstance(exc, psycopg.Error):
            raise self.conn._fail(exc) from exc
        self.conn.broken = True


class PostgresConnection(PooledConnection):
    """One psycopg ``AsyncConnection`` in autocommit mode."""

    def __init__(self, raw: psycopg.AsyncConnection[tuple[Any, ...]], safe_url: str) -> None:
        self._raw = raw
        self._safe_url = safe_url
        self._calling = _Calling(self)

    def _fail(self, exc: psycopg.Error) -> ShardgateError:
        err = translate(exc, self._safe_url)
        if err.code is Code.UNAVAILABLE or self._raw.broken:
            self.broken = True
        return err

    def looks_alive(self) -> bool:
        raw = self._raw
        if self.broken or raw.closed or raw.broken:
            return False
        if raw.info.transaction_status != TransactionStatus.IDLE:
            return False
        return socket_looks_alive(raw.pgconn.socket)

    async def execute(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> Result:
        if not self.dirty and changes_session(sql):
            self.dirty = True
        if limits is not None and is_read(sql):
            return await self._execute_limited(sql, params, limits)
        with self._calling:
            native = native_placeholders(sql)
            cur: psycopg.AsyncCursor[Any] | psycopg.AsyncRawCursor[Any]
            if native is not None and native[1] == len(params):
                cur = psycopg.AsyncRawCursor(self._raw)
                await cur.execute(native[0], params)
            else:
                cur = self._raw.cursor()
                await cur.execute(sql, params)
            description = cur.description
            if description is not None:
                result = Result([c.name for c in description], await cur.fetchall())
                if result.rows and is_insert(sql):
                    first = result.rows[0][0]
                    if isinstance(first, int) and not isinstance(first, bool):
                        result.insert_id = first
            else:
                result = Result()
            if cur.rowcount > 0:
                result.rows_affected = cur.rowcount
            await cur.close()
            return result

    async def _execute_limited(
        self, sql: str, params: Sequence[Any], limits: ResultLimits
    ) -> Result:
        """A query read in chunks (libpq's chunked mode), cancelled once past ``limits``.

        libpq describes the columns only with a row: a query that streamed no
        row runs again the plain way to learn them (it found nothing, so this
        is cheap, and its answer is as valid as the first).
        """
        rows: list[tuple[Any, ...]] = []
        size = 0
        cur = self._raw.cursor()
        try:
            stream = cur.stream(sql, params, size=LIMITED_FETCH_ROWS)
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for row in stream:
                    rows.append(row)
                    if len(rows) % LIMITED_FETCH_ROWS == 0:
                        size += rows_size(rows[-LIMITED_FETCH_ROWS:])
                        limits.check(len(rows), size, self._safe_url)
            size += rows_size(rows[len(rows) - len(rows) % LIMITED_FETCH_ROWS :])
            limits.check(len(rows), size, self._safe_url)
            if not rows:
                await cur.close()
                return await self.execute(sql, params)
            fields = [c.name for c in cur.description or ()]
            await cur.close()
        except psycopg.ProgrammingError as exc:
            if not rows and _NO_RESULT in str(exc):
                return Result()  # a command after all (SELECT ... INTO): it ran, no rows
            raise self._fail(exc) from exc
        except psycopg.Error as exc:
            raise self._fail(exc) from exc
        except ShardgateError:
            raise  # the stream's close cancelled the query; the connection is usable
        except BaseException:
            self.broken = True
            raise
        return Result(fields, rows)

    async def executemany(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int:
        self.note(sql)
        with self._calling:
            cur = self._raw.cursor()
            if self.in_transaction:
                await cur.executemany(sql, seq_of_params)
            else:
                async with self._raw.transaction():  # atomic, one commit
                    await cur.executemany(sql, seq_of_params)
            count = cur.rowcount
            await cur.close()
            return max(count, 0)

    supports_copy_in = True

    async def copy_in(self, table: str, columns: Sequence[str],
                      rows: Sequence[Sequence[Any]]) -> int:
        cols = ", ".join(columns)
        with self._calling:
            cur = self._raw.cursor()
            async with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for row in rows:
                    await copy.write_row(row)
            await cur.close()
            return len(rows)

    supports_text_copy = True

    @property
    def text_copy_encoding(self) -> str | None:
        return self._raw.info.encoding

    async def text_copy_types(self, sql: str, params: Sequence[Any] = ()) -> list[int] | None:
        with self._calling:
            cur = self._raw.cursor()
            await cur.execute(f"SELECT * FROM ({sql}) AS q LIMIT 0", params)
            oids = [c.type_code for c in cur.description or ()]
            await cur.close()
        return oids if oids and all(o in copytext.PORTABLE_OIDS for o in oids) else None

    async def copy_out_text(self, sql: str, params: Sequence[Any], columns: Sequence[str],
                            oids: Sequence[int], order: Sequence[str]) -> copytext.TextRows:
        if not self.in_transaction:
            await self._control("BEGIN")
            try:
                return await self.copy_out_text(sql, params, columns, oids, order)
            finally:
                await self._control("ROLLBACK")
        with self._calling:
            await self._raw.execute(_SETTINGS_SQL, [v for kv in copytext.SOURCE_SETTINGS
                                                    for v in kv])
            # loaders made now read the text as the settings just set write it (ISO dates)
            tx = psycopg.adapt.Transformer(self._raw)
            tx.set_loader_types(list(oids), psycopg.pq.Format.TEXT)
            cur = self._raw.cursor()
            await cur.execute(copytext.batch_sql(sql, columns, oids, order), params)
            found = await cur.fetchone()
            await cur.close()
        text = found[0] if found is not None else None
        if isinstance(text, str):  # (SQL_ASCII databases give bytes)
            text = text.encode(self._raw.info.encoding)
        lines = text.split(b"\n") if text else []
        return copytext.TextRows(lines, oids, tx.load_sequence)

    async def copy_in_text(self, table: str, columns: Sequence[str], data: bytes) -> None:
        cols = ", ".join(columns)
        with self._calling:
            cur = self._raw.cursor()
            async with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                await copy.write(data)
            await cur.close()

    async def _control(self, statement: str) -> None:
        with self._calling:
            await self._raw.execute(statement, prepare=False)

    async def stream(
        self, sql: str, params: Sequence[Any] = (), batch_size: int = 1000
    ) -> AsyncIterator[tuple[list[str], list[tuple[Any, ...]]]]:
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be >= 1, not {batch_size}")
        self.note(sql)
        own_tx = not self.in_transaction
        if own_tx:
            await self._control("BEGIN")
        loan = self.loans
        self.open_streams += 1
        ok = False
        cur = self._raw.cursor(name=f"sg_stream_{next(_stream_names)}")
        try:
            try:
                await cur.execute(sql, params)
                fields = [c.name for c in cur.description or ()]
                while True:
                    rows = await cur.fetchmany(batch_size)
                    if rows:
                        yield fields, rows
                    if len(rows) < batch_size:
                        break
                await cur.close()
            except psycopg.Error as exc:
                raise self._fail(exc) from exc
            ok = True
        finally:
            self.open_streams -= 1
            # Finalised late, the connection was released (rolled back, closed)
            # meanwhile and may not be ours any more: touch nothing then.
            if self.loans == loan and not self._raw.closed and not self.broken:
                if not cur.closed:
                    with contextlib.suppress(psycopg.Error):
                        await cur.close()
                if own_tx:
                    await self._control("COMMIT" if ok else "ROLLBACK")
            elif not cur.closed:
                # Only mark the cursor closed (the plain-cursor close sends
                # nothing); the server drops it with the session.
                await psycopg.AsyncCursor.close(cur)

    async def begin(self) -> None:
        await self._control("BEGIN")

    async def reset(self) -> None:
        """``DISCARD ALL``: settings, prepared statements, cursors, temporary tables,
        advisory locks, LISTENs. psycopg is told its prepared statements are gone (it
        notices a ``DISCARD ALL`` only the first time it sees one; it then sends a
        ``DEALLOCATE ALL`` of its own before the next statement)."""
        await self._control("DISCARD ALL")
        self._raw._prepared.clear()

    async def commit(self) -> None:
        await self._control("COMMIT")

    async def rollback(self) -> None:
        await self._control("ROLLBACK")

    # -- two-phase commit: PREPARE TRANSACTION / COMMIT PREPARED ------------------------

    async def begin_twopc(self, xid: str) -> None:
        check_xid(xid)
        await self._control("BEGIN")

    async def prepare(self, xid: str) -> None:
        status = self._raw.info.transaction_status
        if status != TransactionStatus.INTRANS:
            raise FailedPrecondition(
                f"cannot prepare {xid} on shard database {self._safe_url}: "
                + ("the transaction failed" if status == TransactionStatus.INERROR else "none open")
            )
        with self._calling:
            cur = await self._raw.execute(f"PREPARE TRANSACTION {_gid(xid)}", prepare=False)
        if cur.statusmessage != "PREPARE TRANSACTION":  # the server rolled it back instead
            raise Aborted(
                f"shard database {self._safe_url} rolled back {xid} instead of preparing it"
            )

    async def commit_prepared(self, xid: str) -> None:
        await self._control(f"COMMIT PREPARED {_gid(check_xid(xid))}")

    async def rollback_prepared(self, xid: str) -> None:
        await self._control(f"ROLLBACK PREPARED {_gid(check_xid(xid))}")

    async def list_prepared(self, prefix: str) -> list[str]:
        result = await self.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            " AND starts_with(gid, %s) ORDER BY prepared",
            (prefix,),
        )
        return [str(row[0]) for row in result.rows]

    async def close(self) -> None:
        await self._raw.close()

    @property
    def in_transaction(self) -> bool:
        status = self._raw.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class PostgresBackend(PooledBackend):
    """A PostgreSQL database as a shard."""

    dialect = Dialect.POSTGRES
    placeholder = "%s"
    supports_twopc = True

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        parsed = parse_url(url)
        if parsed.kind != "postgresql":
            raise InvalidArgument(f"not a postgresql URL: {parsed.safe}")
        params: dict[str, Any] = {"connect_timeout": str(DEFAULT_CONNECT_TIMEOUT_S)}
        params.update(parsed.options)
        for key, value in (
            ("host", parsed.host),
            ("port", parsed.port),
            ("user", parsed.user),
            ("password", parsed.password),
            ("dbname", parsed.database or None),
        ):
            if value is not None:
                params[key] = str(value)
        try:
            self._conninfo = psycopg.conninfo.make_conninfo("", **params)
        except psycopg.Error as exc:
            raise InvalidArgument(
                f"bad option in {parsed.safe}: {' '.join(str(exc).split())}; "
                "options are libpq connection keywords (sslmode, application_name, ...)"
            ) from exc
        super().__init__(url, pool_size=pool_size)

    async def _connect(self) -> PooledConnection:
        try:
            raw = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise translate_connect(exc, self.safe_url) from exc
        _load_infinities(raw)
        if self.collation is None:
            # The gate merges, groups and sorts strings as this collation does.
            try:
                cur = await raw.execute(_COLLATION_QUERY)
                row = await cur.fetchone()
            except BaseException:
                await raw.close()
                raise
            self.collation = _collation_name(row)
        return PostgresConnection(raw, self.safe_url)

    async def try_lease(self, name: str) -> LeaseHandle | None:
        conn = await self._connect()
        try:
            res = await conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [name])
        except BaseException:
            await conn.close()
            raise
        if not res.rows or not res.rows[0][0]:
            await conn.close()
            return None
        return PostgresLease(conn, name)


#: the database's collation and locale provider, on every version (to_jsonb:
#: the provider columns appeared in PostgreSQL 15, ``datlocale`` in 17)
_COLLATION_QUERY = (
    "SELECT d.datcollate, to_jsonb(d) ->> 'datlocprovider', "
    "coalesce(to_jsonb(d) ->> 'datlocale', to_jsonb(d) ->> 'daticulocale') "
    "FROM pg_database d WHERE d.datname = current_database()"
)


def _collation_name(row: Any) -> str | None:
    """``datcollate``, or ``icu:<locale>`` / the builtin locale when another provider sorts."""
    if not row:
        return None
    collate, provider, locale = row
    if provider == "i":
        return f"icu:{locale}"
    if provider == "b":
        return str(locale)
    return str(collate)


class PostgresLease(LeaseHandle):
    """A session-level advisory lock, held as long as its connection lives."""

    def __init__(self, conn: PooledConnection, name: str) -> None:
        self.conn = conn
        self._name = name
        self._released = False

    async def check(self) -> bool:
        if self._released:
            return False
        try:
            res = await self.conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid = pg_backend_pid()"
                " AND objid::bigint = (hashtext(%s)::bigint & 4294967295)",
                [self._name],
            )
        except ShardgateError:
            return False
        return bool(res.rows and res.rows[0][0])

    async def release(self) -> None:
        self._released = True
        with contextlib.suppress(Exception):
            await self.conn.close()
