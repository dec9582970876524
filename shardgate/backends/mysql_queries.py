"""MariaDB / MySQL's query pool: autocommit statements on asyncio-native connections.

A MySQL shard has two pools, as a Vitess tablet has a query pool beside its
transaction pool:

* **Connections** (:class:`~shardgate.backends.mysql.MySQLConnection`, PyMySQL
  on a thread each): transactions, XA, streams, leases: everything that holds a
  session across calls.
* **Queries** (:class:`QueryPool`, asyncmy on the event loop): a statement on
  its own (``Backend.execute``: the autocommit reads and writes of the
  tablet). No thread hop: the statement is sent and its rows parsed (asyncmy's
  compiled protocol) on the event loop. A point read costs about 60 us of the
  loop's CPU here instead of a hand-off to a thread and back.

Both pools are ``pool_size`` large: a shard sees at most twice that many
connections. Values come back as PyMySQL returns them (asyncmy is its
compiled port: the same converters), ``rows_affected`` counts rows matched
(``CLIENT_FOUND_ROWS``) and ``bytes`` go as ``_binary`` literals, as on the
connection pool.

Invariants:

* At most ``size`` query connections exist; a statement waits at most
  ``timeout_s`` for one (``RESOURCE_EXHAUSTED`` after).
* A connection runs one statement at a time, and is lent again only if its
  last statement left its session as it found it (not one that may change it:
  :func:`~shardgate.backends._pool.changes_session`, such connections are
  closed, not kept) and ended with the server's answer read whole: a statement
  that failed in the driver or on the wire (``Unavailable``), was cancelled
  mid-way, or was cut short by the result limits closes it. A cancelled
  statement is also stopped on the server (``KILL QUERY`` from a side
  connection).
* Reads with limits are read unbuffered, ``LIMITED_FETCH_ROWS`` at a time,
  checked after each chunk, so a result past the limits is never held whole.
* An idle connection the server closed (restart, ``wait_timeout``: its
  protocol saw EOF) is dropped before it is lent.

:meth:`QueryPool.execute_wire` runs a read and keeps its answer as the
server's packets (:class:`~shardgate.result.WireResult`), unparsed, for the
gate's MySQL listener to hand on: no value is decoded or encoded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import asyncmy
import asyncmy.cursors

from shardgate.backends._pool import (
    LIMITED_FETCH_ROWS,
    changes_session,
    is_read,
    wait_for_slot,
)
from shardgate.errors import Code, ShardgateError
from shardgate.result import Result, ResultLimits, WireResult, rows_size

_COM_QUERY = 3
#: the first byte of an EOF packet, and of the OK packet ending rows with DEPRECATE_EOF
_EOF = 0xFE
#: a row packet starting with 0xFE (an 8-byte length) is at least this long
_MAX_PACKET = 0xFFFFFF

#: The server's errors (1000-1999, 3000-4999) leave the connection usable; the
#: client's (2000-2999: lost connection, bad packet) do not.
_SERVER_ERRORS = (range(1000, 2000), range(3000, 5000))


def _usable_after(exc: BaseException) -> bool:
    args = getattr(exc, "args", ())
    errno = args[0] if args and isinstance(args[0], int) else 0
    return any(errno in r for r in _SERVER_ERRORS)


class QueryPool:
    """asyncio-native connections for statements on their own (see the module docstring)."""

    def __init__(
        self,
        kwargs: dict[str, Any],
        safe_url: str,
        size: int,
        timeout_s: float,
        translate: Callable[[BaseException, str], ShardgateError],
        translate_connect: Callable[[BaseException, str], ShardgateError],
        kill: Callable[[int], None],
    ) -> None:
        self._kwargs = kwargs
        self._safe_url = safe_url
        self._size = size
        self._timeout_s = timeout_s
        self._translate = translate
        self._translate_connect = translate_connect
        self._kill = kill
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Any] = []
        self._closed = False

    async def execute(self, sql: str, params: Sequence[Any],
                      limits: ResultLimits | None) -> Result:
        """Run one autocommit statement; its rows and counts."""
        result: Result = await self._lend(self._run, sql, params, limits)
        return result

    async def execute_wire(self, sql: str, params: Sequence[Any],
                           limits: ResultLimits | None) -> WireResult:
        """Run one read; its answer as the server's packets (see the module docstring)."""
        result: WireResult = await self._lend(self._run_wire, sql, params, limits)
        return result

    async def _lend(self, run: Callable[..., Any], sql: str, params: Sequence[Any],
                    limits: ResultLimits | None) -> Any:
        """``run(conn, sql, params, limits)`` on a connection of the pool (the rules in
        the module docstring)."""
        await wait_for_slot(self._slots, self._timeout_s, self._busy)
        try:
            conn = await self._take()
            keep = False
            try:
                result = await run(conn, sql, params, limits)
                keep = not changes_session(sql)  # never lend a changed session again
                return result
            except ShardgateError as exc:  # the limits: rows left unread
                keep = exc.code is not Code.RESOURCE_EXHAUSTED
                raise
            except asyncio.CancelledError:
                self._stop_on_server(conn)
                raise
            except Exception as exc:
                keep = _usable_after(exc) and not changes_session(sql)
                raise self._translate(exc, self._safe_url) from exc
            finally:
                if keep and not self._closed:
                    self._idle.append(conn)
                else:
                    _close(conn)
        finally:
            self._slots.release()

    def _busy(self) -> str:
        return (f"no free query connection to {self._safe_url} after {self._timeout_s:g}s: all "
                f"{self._size} are in use (too many concurrent statements); retry later, or "
                "raise the pool size")

    async def _take(self) -> Any:
        while self._idle:
            conn = self._idle.pop()
            if conn.connected and not conn._proto.eof:
                return conn
            _close(conn)
        try:
            return await asyncmy.connect(**self._kwargs)
        except Exception as exc:
            raise self._translate_connect(exc, self._safe_url) from exc

    async def _run(self, conn: Any, sql: str, params: Sequence[Any],
                   limits: ResultLimits | None) -> Result:
        args = tuple(params)
        if limits is not None and is_read(sql):
            cur = conn.cursor(asyncmy.cursors.SSCursor)
            await cur.execute(sql, args)
            fields = [d[0] for d in cur.description or ()]
            rows: list[tuple[Any, ...]] = []
            size = 0
            while True:
                chunk = await cur.fetchmany(LIMITED_FETCH_ROWS)
                rows.extend(chunk)
                size += rows_size(chunk)
                limits.check(len(rows), size, self._safe_url)
                if len(chunk) < LIMITED_FETCH_ROWS:
                    break
            await cur.close()
            return Result(fields, rows)
        cur = conn.cursor()
        try:
            await cur.execute(sql, args)
            description = cur.description
            if description is not None:
                result = Result([d[0] for d in description], list(await cur.fetchall()))
            else:
                result = Result()
                if cur.rowcount > 0:
                    result.rows_affected = cur.rowcount
            if cur.lastrowid:
                result.insert_id = cur.lastrowid
            return result
        finally:
            await cur.close()

    async def _run_wire(self, conn: Any, sql: str, params: Sequence[Any],
                        limits: ResultLimits | None) -> WireResult:
        text = sql % tuple(conn.literal(p) for p in params)  # as PyMySQL's cursor formats
        await conn._execute_command(_COM_QUERY, text.encode(conn._encoding))
        first = (await conn.read_packet()).get_all_data()  # an error packet raises
        count, _ = lenenc_int(first, 0)
        if count == 0:  # an OK packet: a statement without rows (a read still ends so)
            return WireResult([], [])
        columns = [(await conn.read_packet()).get_all_data() for _ in range(count)]
        if not conn._deprecate_eof:
            await conn.read_packet()  # the EOF after the column definitions
        rows: list[bytes] = []
        size = 0
        check = limits is not None and (limits.max_rows or limits.max_bytes)
        while True:
            row = (await conn.read_packet()).get_all_data()
            if row[0] == _EOF and len(row) < _MAX_PACKET:
                return WireResult(columns, rows, size)
            rows.append(row)
            size += len(row)
            if check:
                limits.check(len(rows), size, self._safe_url)  # type: ignore[union-attr]

    def _stop_on_server(self, conn: Any) -> None:
        with contextlib.suppress(Exception):  # a connection that never got an id
            connection_id = conn.thread_id()
            threading.Thread(target=self._kill, args=(connection_id,),
                             name="sg-mysql-kill", daemon=True).start()

    async def close(self) -> None:
        """Close the idle connections; lent ones close when their statement ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            _close(conn)


def lenenc_int(payload: bytes, pos: int) -> tuple[int, int]:
    """The MySQL protocol's length-encoded integer at ``pos`` of a packet's payload: its
    value and the position after it (a column count packet's; 0 for an OK packet)."""
    first = payload[pos]
    if first < 0xFB:
        return first, pos + 1
    size = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
    return int.from_bytes(payload[pos + 1:pos + 1 + size], "little"), pos + 1 + size


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail
        conn.close()


def asyncmy_kwargs(pymysql_kwargs: dict[str, Any]) -> dict[str, Any]:
    """asyncmy's connect arguments for a shard's PyMySQL ones (same names, but a
    whole-second connect timeout and no write timeout)."""
    kwargs = {k: v for k, v in pymysql_kwargs.items() if k != "ssl_disabled"}
    kwargs["connect_timeout"] = max(1, int(kwargs.get("connect_timeout") or 1))
    kwargs.pop("write_timeout", None)  # (asyncmy has none; PyMySQL's applies to writes)
    return kwargs
