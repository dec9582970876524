"""mysql-mimic's connection, with what shardgate's clients need on the wire.

Over mysql-mimic's ``Connection`` this adds:

* OK packets that carry the statement's affected rows and last insert id
  (``cursor.rowcount`` / ``lastrowid``; ORMs check both), and status flags
  saying whether autocommit is on and a transaction is open;
* error packets with the SQLSTATE of each MySQL error number
  (:mod:`shardgate.api.mysql.errors`);
* result rows written with back-pressure: after each batch the writer waits
  until the socket drained, so a slow client holds back the stream instead of
  filling the gate's memory;
* a failed authentication closes the connection (mysql-mimic would go on to
  the command phase), and so does an unknown default database;
* binary columns (``bytes`` values) are sent with the binary character set,
  so clients return bytes rather than decoding them as text;
* TIME values in text results written as MySQL writes them (``30:00:07``,
  ``-01:00:00``; mysql-mimic wrote Python's ``1 day, 6:00:07``);
* prepared statements (:mod:`shardgate.api.mysql.prepared`): parameters read
  with the types kept between executes, a SELECT's columns in the prepare answer.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

from mysql_mimic.charset import CharacterSet
from mysql_mimic.connection import Connection
from mysql_mimic.errors import MysqlError
from mysql_mimic.packets import (
    make_binary_resultrow,
    make_column_count,
    make_column_definition_41,
    make_text_resultset_row,
)
from mysql_mimic.prepared import REGEX_PARAM, PreparedStatement
from mysql_mimic.results import ResultColumn, ResultSet
from mysql_mimic.stream import MysqlStream
from mysql_mimic.types import (
    Capabilities,
    ColumnType,
    ServerStatus,
    str_fixed,
    uint_1,
    uint_2,
    uint_4,
    uint_len,
)
from mysql_mimic.utils import aiterate

from shardgate.aio import wait_for
from shardgate.api.mysql.errors import BAD_DB, sqlstate_of
from shardgate.api.mysql.prepared import StatementParams, columns_probe
from shardgate.api.mysql.session import GateSession, WireRows
from shardgate.backends.mysql_queries import lenenc_int

log = logging.getLogger(__name__)

#: Seconds a client has to finish the handshake (MySQL's default ``connect_timeout``).
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Rows written between two waits for the socket to drain.
ROW_BATCH = 500
#: Column definition packets kept, by everything they are made of (a cached plan's
#: result names the same columns every time); past this many, started afresh.
COLUMN_CACHE = 1024
_COLUMN_PACKETS: dict[tuple[str, ColumnType, CharacterSet, CharacterSet], bytes] = {}
#: shard column definition packets with the keyspace as their schema (see COLUMN_CACHE)
_WIRE_COLUMNS: dict[tuple[bytes, str], bytes] = {}
_BINARY_TYPES = frozenset({ColumnType.BLOB, ColumnType.TINY_BLOB, ColumnType.MEDIUM_BLOB,
                           ColumnType.LONG_BLOB})


def with_schema(payload: bytes, schema: str) -> bytes:
    """A ColumnDefinition41 payload with its schema (the second length-encoded string,
    after the catalog) replaced by ``schema``: clients see the keyspace, never the
    shard database's name."""
    n, pos = lenenc_int(payload, 0)
    start = pos + n  # after the catalog ("def")
    n, end = lenenc_int(payload, start)
    end += n
    name = schema.encode()
    if len(name) >= 0xFB:
        return payload  # (a keyspace name is far shorter)
    return payload[:start] + bytes((len(name),)) + name + payload[end:]


class GateStream:
    """mysql-mimic's packet stream (wrapped: it is compiled), with a TLS upgrade that
    keeps early bytes.

    A client sends its TLS ClientHello right after the SSLRequest packet,
    without waiting; when both arrive together the ClientHello sits in the
    ``StreamReader``'s buffer, which ``loop.start_tls`` does not see (the
    handshake would hang). :meth:`start_tls` hands those bytes to the TLS
    protocol once it is connected, before any later read.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.inner = MysqlStream(reader, writer)
        self.reader = reader
        self.writer = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def start_tls(self, ssl_context: ssl.SSLContext) -> None:
        transport = cast(asyncio.Transport, self.writer.transport)  # a socket's: both ways
        # Reading stops before the buffer is taken: a ClientHello arriving between the
        # take and start_tls's own pause (one turn of the loop later) would stay in the
        # StreamReader, unseen by TLS, and the handshake would hang until the connect
        # timeout closed it (the client's SSLEOFError). Pausing cancels a read the loop
        # already queued; start_tls resumes reading once the TLS protocol is connected.
        transport.pause_reading()
        reader_buffer: bytearray = self.reader._buffer  # type: ignore[attr-defined]
        early = bytes(reader_buffer)
        reader_buffer.clear()
        loop = asyncio.get_running_loop()
        plain = transport.get_protocol()
        upgrade = loop.create_task(loop.start_tls(transport, plain, ssl_context,
                                                  server_side=True))
        if early:
            # start_tls swaps in its TLS protocol at once (asyncio's and uvloop's alike)
            # and connects it with call_soon: two turns of the loop later it is
            # connected and nothing new was read; the early bytes go in through its
            # buffered-protocol interface, as if just read.
            while transport.get_protocol() is plain and not upgrade.done():
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            tls = cast(asyncio.BufferedProtocol, transport.get_protocol())
            if tls is not plain and hasattr(tls, "buffer_updated"):  # (uvloop's has no base)
                buf = memoryview(tls.get_buffer(len(early)))
                buf[: len(early)] = early
                tls.buffer_updated(len(early))
        new_transport = await upgrade
        self.writer._transport = new_transport  # type: ignore[attr-defined]
        self.reader._transport = new_transport  # type: ignore[attr-defined]


class AuthenticationFailed(BaseException):
    """The client did not authenticate (the error packet was sent): close the connection.

    A ``BaseException`` so that mysql-mimic's handlers (``except Exception``,
    which would send a second error packet or go on serving) let it through
    to :meth:`GateConnection._start`.
    """


class GateConnection(Connection):
    """One client connection of the MySQL listener."""

    session: GateSession
    #: refuse clients that did not switch to TLS in the handshake
    require_tls = False
    #: seconds a client has to finish the handshake (MySQL's ``connect_timeout``)
    connect_timeout_s = DEFAULT_CONNECT_TIMEOUT_S

    async def connection_phase(self) -> None:
        """The handshake, closed when the client does not finish it in time."""
        # the handshake's status says autocommit is on, as it is: clients (PyMySQL) read
        # it there and send SET autocommit only when they want another mode
        self.status_flags = self._flags()
        try:
            await wait_for(super().connection_phase(), self.connect_timeout_s)
        except TimeoutError:
            log.info("mysql connection %s: no handshake in %ss, closed", self.connection_id,
                     self.connect_timeout_s)
            raise AuthenticationFailed() from None

    # -- handshake ---------------------------------------------------------------

    async def authenticate(self, *args: Any, **kwargs: Any) -> None:
        """mysql-mimic's authentication; a failure ends the connection."""
        if self.require_tls and Capabilities.CLIENT_SSL not in self.capabilities:
            await self.stream.write(self.error(
                msg="Connections using insecure transport are prohibited: connect with TLS",
                code=3159))
            raise AuthenticationFailed()
        self._authenticating = True
        try:
            await super().authenticate(*args, **kwargs)
        finally:
            self._authenticating = False
        if self.session.username is None or self._refused:
            raise AuthenticationFailed()

    _authenticating = False
    _refused = False

    async def handle_change_user(self, data: bytes) -> None:
        """COM_CHANGE_USER: the new user authenticates, or the connection is closed (as
        MySQL does); the session is then the new user's (:meth:`GateSession.reset`)."""
        self.session.username = None  # a failed authentication leaves no user: closed
        await super().handle_change_user(data)

    async def handle_reset_connection(self, data: bytes) -> None:
        """COM_RESET_CONNECTION: the session afresh (its transaction rolled back), same user."""
        await self.session.reset()
        await self.stream.write(self.ok())

    def _unknown_database(self) -> str | None:
        """The client's default database when it names no keyspace (checked once authenticated)."""
        db = self.session.database
        keyspace = db.partition(":")[0].partition("[")[0] if db else None
        if keyspace and keyspace not in self.session.gate.topology.keyspaces:
            return str(db)
        return None

    async def _start(self) -> None:
        try:
            await super()._start()
        except AuthenticationFailed:
            return

    def error(self, **kwargs: Any) -> bytes:
        """An ERR packet: the error number, its SQLSTATE, the message."""
        code = int(kwargs.get("code", 1105))
        parts = [uint_1(0xFF), uint_2(code)]
        if Capabilities.CLIENT_PROTOCOL_41 in self.capabilities or not self.capabilities:
            parts += [str_fixed(1, b"#"), str_fixed(5, sqlstate_of(code).encode())]
        parts.append(self.server_charset.encode(str(kwargs.get("msg", ""))))
        return b"".join(parts)

    # -- status and counts ---------------------------------------------------------

    def _flags(self) -> ServerStatus:
        flags = ServerStatus(0)
        session = self.session
        if isinstance(session, GateSession):
            if session.autocommit:
                flags |= ServerStatus.SERVER_STATUS_AUTOCOMMIT
            if session.in_transaction:
                flags |= ServerStatus.SERVER_STATUS_IN_TRANS
        return flags

    def ok(self, **kwargs: Any) -> bytes:
        """An OK packet; after a statement it carries the statement's counts.

        The handshake's OK becomes error 1049 when the default database is unknown.
        """
        if self._authenticating and self.session.username is not None:
            unknown = self._unknown_database()
            if unknown is not None:
                self._refused = True
                return self.error(msg=f"Unknown database '{unknown}'", code=BAD_DB.errno)
        self.status_flags = self._flags()
        if self._counted and "affected_rows" not in kwargs:
            last = self.session.last
            kwargs.update(affected_rows=last.rows_affected, last_insert_id=last.insert_id or 0)
        self._counted = False
        packet: bytes = super().ok(**kwargs)
        return packet

    def eof(self, **kwargs: Any) -> bytes:
        self.status_flags = self._flags()
        packet: bytes = super().eof(**kwargs)
        return packet

    _counted = False

    async def handle_query(self, data: bytes) -> None:
        self.session.text_protocol = True
        try:
            await self._counting(super().handle_query, data)
        finally:
            self.session.text_protocol = False

    async def handle_stmt_prepare(self, data: bytes) -> None:
        """A statement prepared: its parameters and, for a SELECT, its result columns
        (see :func:`~shardgate.api.mysql.prepared.columns_probe`)."""
        sql = self.client_charset.decode(data)
        stmt = PreparedStatement(stmt_id=next(self.prepared_stmt_seq), sql=sql,
                                 num_params=len(REGEX_PARAM.findall(sql)))
        columns: list[ResultColumn] = []
        probe = columns_probe(sql)
        if probe is not None:
            try:
                result_set = await self.query(probe, {})
            except MysqlError as exc:  # the execute will answer it; the prepare stays
                log.debug("mysql prepare: no columns for %r: %s", sql, exc.msg)
            else:
                async for _ in aiterate(result_set.rows):
                    pass
                columns = list(result_set.columns)
        self.prepared_stmts[stmt.stmt_id] = stmt
        out = [b"".join((b"\x00", uint_4(stmt.stmt_id), uint_2(len(columns)),
                         uint_2(stmt.num_params), b"\x00", uint_2(0)))]
        for defs in ([self._column_definition(ResultColumn(name="?", type=ColumnType.VAR_STRING))
                      ] * stmt.num_params, [self._column_definition(c) for c in columns]):
            if defs:
                out += defs
                if not self.deprecate_eof():
                    out.append(self.eof())
        self.stream.write_many(out)
        await self.stream.drain()

    async def handle_stmt_execute(self, data: bytes) -> None:
        await self._counting(self._stmt_execute, data)

    _params: StatementParams | None = None

    async def _stmt_execute(self, data: bytes) -> None:
        """A prepared statement's execute: its parameters read by
        :class:`~shardgate.api.mysql.prepared.StatementParams` (types kept between
        executes, values escaped), its rows in the binary protocol, written in one go."""
        if self._params is None:
            self._params = StatementParams()
        execute = self._params.read_execute(self.capabilities, self.client_charset, data,
                                            self.get_stmt)
        execute.stmt.param_buffers = None
        result_set = await self.query(execute.sql, execute.query_attrs)
        if not result_set:
            await self.stream.write(self.ok())
            return
        cols = result_set.columns
        header = [uint_len(len(cols))]
        header += [self._column_definition(c) for c in cols]

        async def binary_rows() -> AsyncIterator[bytes]:
            async for row in aiterate(result_set.rows):
                yield make_binary_resultrow(row, cols)

        if execute.use_cursor:  # the rows wait for COM_STMT_FETCH
            execute.stmt.cursor = binary_rows()
            self.stream.write_many(header)
            await self.stream.write(
                self.ok_or_eof(flags=ServerStatus.SERVER_STATUS_CURSOR_EXISTS))
            return
        if not self.deprecate_eof():
            header.append(self.eof())
        self.stream.write_many(header)
        batch: list[bytes] = []
        async for row in binary_rows():
            batch.append(row)
            if len(batch) >= ROW_BATCH:
                self.stream.write_many(batch)
                batch = []
                await self.stream.drain()
        self.stream.write_many(batch)
        await self.stream.write(self.ok_or_eof(), drain=False)
        await self.stream.drain()

    async def handle_stmt_reset(self, data: bytes) -> None:
        """COM_STMT_RESET: the statement's long data and open cursor are dropped; the
        session is left alone (mysql-mimic reset the whole session: the connection's
        open transaction was rolled back behind the client's back)."""
        if len(data) >= 4:
            stmt = self.get_stmt(int.from_bytes(data[:4], "little"))
            stmt.param_buffers = None
            stmt.cursor = None
        await self.stream.write(self.ok())

    async def handle_stmt_close(self, data: bytes) -> None:
        await super().handle_stmt_close(data)
        if self._params is not None and len(data) >= 4:
            self._params.forget(int.from_bytes(data[:4], "little"))

    async def _counting(self, handler: Callable[[bytes], Awaitable[None]], data: bytes) -> None:
        """Run a statement command; its OK packet carries the statement's counts."""
        self._counted = True
        try:
            await handler(data)
        finally:
            self._counted = False

    async def query(self, sql: str, query_attrs: dict[str, str]) -> ResultSet:
        result_set = await super().query(sql, query_attrs)
        if type(result_set.rows) is WireRows:
            return result_set
        for column in result_set.columns:
            if column.type in _BINARY_TYPES:
                column.character_set = CharacterSet.binary
                column.codec = CharacterSet.binary.codec
        return result_set

    # -- results -------------------------------------------------------------------

    def _column_definition(self, column: ResultColumn) -> bytes:
        """A column definition packet, remembered (see ``COLUMN_CACHE``)."""
        charset = self.server_charset
        key = (column.name, column.type, column.character_set, charset)
        packet = _COLUMN_PACKETS.get(key)
        if packet is None:
            if len(_COLUMN_PACKETS) >= COLUMN_CACHE:
                _COLUMN_PACKETS.clear()
            packet = _COLUMN_PACKETS[key] = make_column_definition_41(
                server_charset=charset, name=column.name, column_type=column.type,
                character_set=column.character_set)
        return packet

    def _wire_column(self, payload: bytes, schema: str) -> bytes:
        """A shard's column definition packet with ``schema`` as its schema, remembered."""
        key = (payload, schema)
        packet = _WIRE_COLUMNS.get(key)
        if packet is None:
            if len(_WIRE_COLUMNS) >= COLUMN_CACHE:
                _WIRE_COLUMNS.clear()
            packet = _WIRE_COLUMNS[key] = with_schema(payload, schema)
        return packet

    async def _write_wire(self, rows: WireRows) -> None:
        """A shard's answer: its column definitions and rows as it sent them, framed for
        this client, and this session's EOF/OK (its counts and status)."""
        wire = rows.wire
        n = len(wire.rows)
        if Capabilities.CLIENT_PROTOCOL_41 in self.capabilities:
            # the status a wire read leaves (no transaction: autocommit or not), framed
            # here rather than built through the flag enums each time
            status = b"\x02\x00" if self.session.autocommit else b"\x00\x00"
            middle = b"\xfe\x00\x00" + status
            end = (b"\xfe" + uint_len(n) + b"\x00" + status + b"\x00\x00"
                   if self.deprecate_eof() else middle)
        else:  # (pre-4.1 clients)
            middle, end = self.eof(), self.ok_or_eof(affected_rows=n)
        header = [make_column_count(capabilities=self.capabilities,
                                    column_count=len(wire.columns))]
        header += [self._wire_column(c, rows.schema) for c in wire.columns]
        if not self.deprecate_eof():
            header.append(middle)
        self.stream.write_many(header)
        self.stream.write_many(wire.rows)
        await self.stream.write(end, drain=False)
        await self.stream.drain()

    async def write_text_resultset(self, result_set: ResultSet) -> None:
        """Column definitions, then rows in batches, each batch drained before the next
        (a small result in memory goes out whole, in one write)."""
        if type(result_set.rows) is WireRows:
            await self._write_wire(result_set.rows)
            return
        header = [make_column_count(capabilities=self.capabilities,
                                    column_count=len(result_set.columns))]
        header += [self._column_definition(c) for c in result_set.columns]
        if not self.deprecate_eof():
            header.append(self.eof())
        self.stream.write_many(header)
        cols = result_set.columns
        rows = result_set.rows
        times = [i for i, c in enumerate(cols) if c.type == ColumnType.TIME]
        if times:  # MySQL's text of a TIME ('30:00:07'), not Python's ('1 day, 6:00:07')
            rows = _times_as_text(rows, times)
        if isinstance(rows, list | tuple) and len(rows) <= ROW_BATCH:
            # a result already in memory (a point select's): framed straight into the
            # stream's buffer and sent with its header and EOF in one write
            count = self.stream.write_text_rows(rows, cols)
            await self.stream.write(self.ok_or_eof(affected_rows=count), drain=False)
            await self.stream.drain()
            return
        count = 0
        batch: list[bytes] = []
        async for row in aiterate(rows):
            count += 1
            batch.append(make_text_resultset_row(row, cols))
            if len(batch) >= ROW_BATCH:
                self.stream.write_many(batch)
                batch = []
                await self.stream.drain()
                await asyncio.sleep(0)
        if batch:
            self.stream.write_many(batch)
        await self.stream.write(self.ok_or_eof(affected_rows=count), drain=False)
        await self.stream.drain()


def time_text(value: datetime.timedelta) -> str:
    """A TIME value as MySQL writes it: ``[-]HH:MM:SS[.ffffff]``, hours past 24."""
    micros = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, micro = divmod(abs(micros), 1_000_000)
    hours, rest = divmod(seconds, 3600)
    text = f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{text}.{micro:06d}" if micro else text


def _times_as_text(rows: Any, columns: list[int]) -> Any:
    """``rows`` (a list or an async iterable) with the timedeltas of ``columns`` as text."""

    def fixed(row: Sequence[Any]) -> tuple[Any, ...]:
        out = list(row)
        for i in columns:
            if isinstance(out[i], datetime.timedelta):
                out[i] = time_text(out[i])
        return tuple(out)

    if isinstance(rows, list | tuple):
        return [fixed(r) for r in rows]

    async def each() -> AsyncIterator[tuple[Any, ...]]:
        async for row in aiterate(rows):
            yield fixed(row)

    return each()

