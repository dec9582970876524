"""MariaDB change capture: the ROW binlog through ``mysql-replication``, GTID positions.

The server must log rows with full images and full metadata
(``binlog_format=ROW``, ``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``:
without it columns are ``UNKNOWN_COLn``); :meth:`MySQLChangeLog.prepare`
checks and refuses otherwise (``scripts/setup-servers.sh`` sets them).

Invariants and traps (see FIELD-NOTES, "Change capture"):

* Positions are GTIDs (``domain-server-seq``; a list for several domains).
  Starting at a transaction's GTID delivers the transactions after it
  (``@slave_connect_state`` semantics).
* The binlog is server-wide: rows are filtered to the shard's schema at packet
  level (``only_schemas``); other databases' transactions only advance the
  position (reported through :class:`Heartbeat`, never as empty transactions).
* ``blocking=True`` (non-blocking loses a large backlog's tail),
  ``freeze_schema=True`` (3x faster, correct across ALTER because the table
  id changes), a unique ``server_id`` per reader, server heartbeats so an idle
  reader notices it is asked to stop.
* The library reconnects silently from ``auto_position``: rows are buffered
  per transaction (a GTID event resets the buffer) and ``auto_position`` moves
  to each committed GTID, so a reconnect neither repeats nor skips.
* Rolled-back transactions never reach the binlog; a transaction is emitted
  at its XID (or ``COMMIT``) event only.
* Commit times have 1-second resolution (the XID event's); forced non-decreasing.
* A start older than the oldest binlog file's ``Gtid_list`` is ``OUT_OF_RANGE``
  (checked before connecting; the server's error 1236 maps to the same).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from shardgate.backends.changes import (
    DELETE,
    INSERT,
    UPDATE,
    Heartbeat,
    LogItem,
    RowChange,
    Transaction,
    Visibility,
)
from shardgate.backends.changes._logthread import Handoff, ThreadedChangeLog
from shardgate.backends.mysql import tls_kwargs
from shardgate.backends.urls import parse_url
from shardgate.errors import Code, FailedPrecondition, Internal, ShardgateError, Unavailable
from shardgate.event_token import EventToken, position_key

EMPTY_POSITION = "0-0-0"
#: how much older than a requested start time the refined start's next commit must be
#: (:meth:`MySQLChangeLog._refine`): a binlog commit carries its statement's start time
REFINE_SLACK_S = 5.0
#: transactions gathered into one hand-over at most while the consumer is busy
GATHER_TXS = 256
_REQUIRED = {
    "log_bin": "1",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


def _translate(url: str) -> Callable[[BaseException], BaseException]:
    def translate(exc: BaseException) -> BaseException:
        if isinstance(exc, ShardgateError):
            return exc
        if isinstance(exc, pymysql.err.MySQLError):
            code = exc.args[0] if exc.args else 0
            text = " ".join(str(exc).split())
            if code == 1236:
                return ShardgateError(
                    f"the binlog of {url} no longer holds the start ({text}): restart from a "
                    "newer token or a recent timestamp",
                    code=Code.OUT_OF_RANGE,
                )
            if isinstance(exc, pymysql.err.OperationalError | pymysql.err.InterfaceError):
                return Unavailable(f"lost the binlog stream of {url}: {text}; retry")
            return Internal(f"binlog error from {url}: {text}")
        if isinstance(exc, OSError):
            return Unavailable(f"lost the binlog stream of {url}: {exc}; retry")
        return exc

    return translate


class MySQLChangeLog(ThreadedChangeLog):
    """The binlog of one MariaDB shard database (rows of its schema only)."""

    thread_name = "binlog"
    log_name = "binlog"

    position_sql = "SELECT @@gtid_binlog_pos"
    snapshot_sql = (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.SESSION_STATUS"
        " WHERE VARIABLE_NAME IN ('BINLOG_SNAPSHOT_FILE', 'BINLOG_SNAPSHOT_POSITION')",
    )

    def visibility(self) -> BinlogVisibility:
        return BinlogVisibility(self)
    purged_by_tablet = False  # server-wide: binlog_expire_logs_seconds decides

    def __init__(self, url: str, shard: str) -> None:
        super().__init__(url, shard)
        u = parse_url(url)
        self._safe = u.safe
        self.schema = u.database
        self._settings: dict[str, Any] = {
            "host": u.host, "port": u.port or 3306, "user": u.user or "root",
            "password": u.password or "", **tls_kwargs(u),
        }

    def _sql_sync(self, fn: Callable[[Any], Any]) -> Any:
        try:
            conn = pymysql.connect(autocommit=True, connect_timeout=5, **self._settings)
        except pymysql.err.MySQLError as exc:
            raise _translate(self._safe)(exc) from exc
        try:
            with conn.cursor() as cur:
                return fn(cur)
        except pymysql.err.MySQLError as exc:
            raise _translate(self._safe)(exc) from exc
        finally:
            conn.close()

    async def _sql(self, fn: Callable[[Any], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, self._sql_sync, fn)

    async def prepare(self) -> None:
        def q(cur: Any) -> dict[str, str]:
            cur.execute(
                "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata"
            )
            return dict(zip(_REQUIRED, (str(v) for v in cur.fetchone()), strict=True))

        found = await self._sql(q)
        wrong = {k: v for k, v in found.items() if v.upper() != _REQUIRED[k]}
        if wrong:
            raise FailedPrecondition(
                f"change streams on {self._safe} need {_REQUIRED}, found {wrong}: "
                "run scripts/setup-servers.sh or set them in the server configuration"
            )

    async def current_position(self) -> str:
        def q(cur: Any) -> str:
            cur.execute("SELECT @@gtid_binlog_pos")
            return str(cur.fetchone()[0] or "")

        return await self._sql(q) or EMPTY_POSITION

    @staticmethod
    def _gtid_list(cur: Any, log_name: str) -> str:
        cur.execute(f"SHOW BINLOG EVENTS IN '{log_name}' LIMIT 4")
        for row in cur.fetchall():
            if row[2] == "Gtid_list":
                return str(row[5]).strip("[]").strip() or EMPTY_POSITION
        return EMPTY_POSITION

    async def oldest_position(self) -> str:
        def q(cur: Any) -> str:
            cur.execute("SHOW BINARY LOGS")
            first = cur.fetchone()[0]
            return self._gtid_list(cur, first)

        return str(await self._sql(q))

    async def position_at(self, timestamp: float) -> str | None:
        """Bisect the binlog files on the time of their first transaction, then the
        transactions of the file found.

        The start of file ``F`` (its ``Gtid_list``) is a safe start when the first
        commit read from ``F`` on is older than ``timestamp`` by more than the
        binlog's 1-second resolution: every commit before ``F`` is older still.
        The last such file is found with O(log files) probes, each reading the
        first GTID event from the file's start; None when even the oldest file
        starts too late (then the caller starts at the oldest position anyway).

        A file holds up to ``max_binlog_size`` (64 MB) of the whole server's
        transactions, which a reader started at the file's start decodes one by one
        (40,000 small transactions of other databases took 10 s). So the start is
        refined inside the file by :meth:`_refine` (see there); the caller drops
        transactions older than ``timestamp``, so an earlier start costs time only.
        """

        def files(cur: Any) -> list[str]:
            cur.execute("SHOW BINARY LOGS")
            return [str(r[0]) for r in cur.fetchall()]

        names: list[str] = await self._sql(files)
        limit = timestamp - 1.0
        lo, hi, found, index = 0, len(names) - 1, None, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            start = await self._file_start(names[mid])
            first = await asyncio.get_running_loop().run_in_executor(
                None, self._first_commit_time, start
            )
            if first is not None and first < limit:
                found, index, lo = start, mid, mid + 1
            else:
                hi = mid - 1
        if found is None:
            return None
        end = (await self._file_start(names[index + 1]) if index + 1 < len(names)
               else await self.current_position())
        return await self._refine(found, end, timestamp - REFINE_SLACK_S)

    async def _refine(self, start: str, end: str, limit: float) -> str:
        """The last GTID in ``[start, end)`` after which the first commit is older than
        ``limit``; ``start`` when none after it is (``start`` is safe: the caller checked).

        Bisects the sequence numbers between two positions of one domain and one
        server id (every number between them is then a transaction of the binlog),
        each probe reading the first GTID event after a GTID (the server finds it
        by scanning the file: 0.25 s for 24 MB). Any other shape of positions, or
        a probe the server refuses, keeps ``start``: correct, only slower to read.
        Commit times are assumed to grow with sequence numbers up to
        :data:`REFINE_SLACK_S` (a statement's time is when it began).
        """
        first, last = _one_gtid(start), _one_gtid(end)
        if first is None or last is None or first[:2] != last[:2]:
            return start
        domain, server, lo = first
        hi = last[2]  # the first commit after `hi`: none yet, or not older than `limit`
        loop = asyncio.get_running_loop()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                at = await loop.run_in_executor(
                    None, self._first_commit_time, f"{domain}-{server}-{mid}")
            except ShardgateError:
                return start
            if at is not None and at < limit:
                lo = mid
            else:
                hi = mid
        return f"{domain}-{server}-{lo}"

    async def _file_start(self, name: str) -> str:
        def q(cur: Any) -> str:
            return self._gtid_list(cur, name)

        return str(await self._sql(q))

    def _first_commit_time(self, start: str) -> float | None:
        """The time of the first transaction after GTID position ``start`` (MariaDB
        serves a file-and-offset start as from the beginning: GTIDs it is)."""
        stream = BinLogStreamReader(
            connection_settings=dict(self._settings),
            server_id=1000 + secrets.randbelow(2**31 - 2000),
            is_mariadb=True, auto_position=None if start == EMPTY_POSITION else start,
            blocking=False, only_events=[MariadbGtidEvent], enable_logging=False,
            pymysql_wrapper=_connect,
        )
        try:
            event = stream.fetchone()
            return None if event is None else float(event.timestamp)
        except pymysql.err.MySQLError as exc:
            raise _translate(self._safe)(exc) from exc
        finally:
            stream.close()

    async def purged_through(self) -> float | None:
        """The first commit time of the oldest binlog file, if older files were purged.

        An oldest file whose ``Gtid_list`` is empty starts the server's history:
        nothing was purged. Otherwise every purged commit is no later than the
        oldest file's first commit (whole seconds; now if the file holds none yet).
        """

        def first_file(cur: Any) -> str | None:
            cur.execute("SHOW BINARY LOGS")
            row = cur.fetchone()
            cur.fetchall()
            return None if row is None else str(row[0])

        name: str | None = await self._sql(first_file)
        if name is None:
            return None
        start = await self._file_start(name)
        if start == EMPTY_POSITION:
            return None
        first = await asyncio.get_running_loop().run_in_executor(
            None, self._first_commit_time, start
        )
        return time.time() if first is None else first

    async def purge(self, up_to: str, *, through: float | None = None) -> None:
        """Purge the binlog (server-wide!) up to at least ``up_to`` (``through`` is
        not needed: :meth:`purged_through` reads the binlog itself).

        The binlog is purged in whole files: the current file is closed and all
        before it go, so the log then starts at the end as of the purge.
        """
        position_key(up_to)  # validate

        def q(cur: Any) -> None:
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW BINARY LOGS")
            target = [r[0] for r in cur.fetchall()][-1]
            # Right after FLUSH the old file may still be needed (binlog checkpoint) or
            # read by a dump thread: the server then keeps it quietly. Retry briefly.
            deadline = time.monotonic() + 10
            while True:
                cur.execute(f"PURGE BINARY LOGS TO '{target}'")
                cur.execute("SHOW BINARY LOGS")
                first = cur.fetchone()[0]
                if first == target:
                    return
                if time.monotonic() > deadline:
                    cur.execute("SHOW WARNINGS")
                    raise FailedPrecondition(
                        f"could not purge the binlog of {self._safe} up to {target} (oldest is "
                        f"still {first}): {cur.fetchall()}"
                    )
                time.sleep(0.1)

        await self._sql(q)

    async def drop(self) -> None:
        return None  # nothing was created on the server

    def _translator(self) -> Callable[[BaseException], BaseException]:
        return _translate(self._safe)

    @staticmethod
    def _order(position: str) -> tuple[int, ...]:
        return position_key(position)

    def _stream(self, handoff: Handoff, start: str, heartbeat_s: float) -> None:
        stream = BinLogStreamReader(
            connection_settings=dict(self._settings),
            server_id=1000 + secrets.randbelow(2**31 - 2000),
            is_mariadb=True,
            auto_position=None if start == EMPTY_POSITION else start,
            blocking=True,
            resume_stream=True,
            only_events=[
                MariadbGtidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
                XidEvent, QueryEvent, HeartbeatLogEvent,
            ],
            only_schemas=[self.schema],
            freeze_schema=True,
            slave_heartbeat=min(heartbeat_s, 0.1),
            enable_logging=False,
            pymysql_wrapper=_connect,
        )
        try:
            self._follow(handoff, stream, start, heartbeat_s)
        finally:
            stream.close()

    def _follow(self, handoff: Handoff, stream: Any, start: str, heartbeat_s: float) -> None:
        shard = self.shard
        schema = self.schema
        position = start
        gtid: str | None = None
        standalone = False
        changes: list[RowChange] = []
        last_ts = 0.0
        last_sent = time.monotonic()

        gathered: list[LogItem] = []

        def flush(items: list[LogItem]) -> bool:
            nonlocal last_sent, gathered
            last_sent = time.monotonic()
            if gathered:
                items, gathered = gathered + items, []
            return handoff.put(items)

        while not handoff.stop.is_set():
            event = stream.fetchone()
            if event is None:
                continue
            if isinstance(event, MariadbGtidEvent):
                gtid, standalone, changes = event.gtid, bool(event.flags & 1), []
                continue
            if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                if event.schema == schema:
                    changes.extend(_row_changes(event))
                continue
            if isinstance(event, HeartbeatLogEvent):
                watermark = max(last_ts, math.floor(time.time()) - 1.0)
                if not flush([Heartbeat(watermark=watermark, position=position)]):
                    return
                continue
            committed = isinstance(event, XidEvent) or (
                isinstance(event, QueryEvent)
                and (standalone or event.query.strip().upper() == "COMMIT")
            )
            if not committed or gtid is None:
                continue
            stream.auto_position = gtid  # a silent reconnect resumes after it
            position = gtid
            last_ts = max(last_ts, float(event.timestamp))
            gtid = None
            if changes:
                item: LogItem = Transaction(EventToken(last_ts, shard, position), changes,
                                            binlog_mark(stream.log_file, stream.log_pos))
                changes = []
            else:  # another database's transaction: only the position moves
                item = Heartbeat(watermark=last_ts, position=position)
            # Gather while the consumer is busy; a server heartbeat (at most
            # 0.1 s away on an idle log) flushes what is gathered.
            if handoff.idle() or len(gathered) >= GATHER_TXS:
                if not flush([item]):
                    return
            else:
                gathered.append(item)


def binlog_mark(log_file: str, log_pos: int) -> tuple[int, int]:
    """``(file number, offset)`` of a binlog coordinate (``mysql-bin.000012``, 4567),
    ordered as the binlog is."""
    return int(log_file.rsplit(".", 1)[1]), int(log_pos)


class BinlogVisibility(Visibility):
    """The binlog coordinate of the last transaction read against that of a
    ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` (``binlog_snapshot_file`` and
    ``_position``: the snapshot holds exactly the transactions before it, MariaDB
    committing in binlog order); the binlog's end at the reader's start (its
    :meth:`started` horizon: a transaction binlogged before it may not be committed in
    the engine yet, and the reader never reads it) must be in it too."""

    def __init__(self, log: MySQLChangeLog) -> None:
        self.log = log
        self.last: tuple[int, int] | None = None
        self.horizon: tuple[int, int] | None = None

    async def started(self) -> None:
        def q(cur: Any) -> tuple[int, int] | None:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            return binlog_mark(str(row[0]), int(row[1])) if row else None

        self.horizon = await self.log._sql(q)

    def note(self, tx: Transaction) -> None:
        if isinstance(tx.mark, tuple) and (self.last is None or tx.mark > self.last):
            self.last = tx.mark

    def all_visible(self, snapshot: Sequence[Sequence[Any]]) -> bool:
        status = {str(name).upper(): str(value) for name, value in snapshot}
        try:
            at = binlog_mark(status["BINLOG_SNAPSHOT_FILE"],
                             int(status["BINLOG_SNAPSHOT_POSITION"]))
        except (KeyError, ValueError, IndexError):
            return False  # no binlog coordinate: cannot tell
        return all(m is None or m <= at for m in (self.last, self.horizon))


def _one_gtid(position: str) -> tuple[int, int, int] | None:
    """``(domain, server, seq)`` of a position naming one GTID; None for a list."""
    parts = position.strip().split("-")
    if "," in position or len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def _connect(**settings: Any) -> Any:
    # mysql-replication still passes the deprecated ``db`` keyword to PyMySQL.
    if "db" in settings:
        settings["database"] = settings.pop("db")
    return pymysql.connect(**settings)


def _row_changes(event: Any) -> list[RowChange]:
    pk_names = event.primary_key
    if isinstance(pk_names, str):
        pk_names = (pk_names,) if pk_names else ()
    table = event.table
    out: list[RowChange] = []
    for row in event.rows:
        if isinstance(event, WriteRowsEvent):
            before, after, op = None, row["values"], INSERT
        elif isinstance(event, UpdateRowsEvent):
            before, after, op = row["before_values"], row["after_values"], UPDATE
        else:
            before, after, op = row["values"], None, DELETE
        image = after if after is not None else before
        assert image is not None
        pk = tuple(image[c] for c in pk_names) if pk_names else tuple(image.values())
        out.append(RowChange(table, op, pk, before, after))
    return out


def raw_decode(log: MySQLChangeLog, start: str, end: str) -> tuple[int, float]:
    """Benchmark helper: read the binlog from ``start`` to GTID ``end`` in this thread with
    ``mysql-replication`` alone (the same settings); return the number of row changes and
    the ``time.perf_counter()`` at which the first one was decoded."""
    stream = BinLogStreamReader(
        connection_settings=dict(log._settings),
        server_id=1000 + secrets.randbelow(2**31 - 2000),
        is_mariadb=True, auto_position=start, blocking=True, resume_stream=True,
        only_events=[MariadbGtidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
                     XidEvent],
        only_schemas=[log.schema], freeze_schema=True, slave_heartbeat=0.1,
        enable_logging=False, pymysql_wrapper=_connect,
    )
    target = position_key(end)
    rows = 0
    first = 0.0
    gtid = start
    try:
        while True:
            event = stream.fetchone()
            if isinstance(event, MariadbGtidEvent):
                gtid = event.gtid
            elif isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                rows += len(_row_changes(event))
                first = first or time.perf_counter()
            elif isinstance(event, XidEvent) and position_key(gtid) >= target:
                return rows, first
    finally:
        stream.close()
