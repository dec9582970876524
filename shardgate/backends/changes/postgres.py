"""PostgreSQL change capture: logical decoding with ``pgoutput``, decoded here.

Set-up (:meth:`PostgresChangeLog.prepare`, idempotent):

* publication ``sg_changes`` ``FOR ALL TABLES`` of the shard database;
* ``REPLICA IDENTITY FULL`` on every table (full before-images), and an event
  trigger that sets it on tables created later;
* one **anchor** slot per shard database (``sga_<db>_<hash>``): it never
  reads; it pins the log. Its ``confirmed_flush_lsn`` is the oldest position
  a stream may start from; :meth:`purge` advances it (retention).

Reading (:meth:`read`): a replication connection (psycopg2
``LogicalReplicationConnection``, psycopg 3 has no replication protocol)
copies the anchor into a *temporary* slot of its own
(``pg_copy_logical_replication_slot``) and starts it at the requested
position, so any number of readers start anywhere in the retained log; the
temporary slot disappears with the connection.

Invariants and traps (see FIELD-NOTES, "Change capture"):

* The position of a transaction is its Commit ``end_lsn``: starting there
  delivers the transactions after it (starting at ``commit_lsn`` would repeat it).
* PostgreSQL silently moves a start older than the slot's
  ``confirmed_flush_lsn`` forward; :meth:`read` checks against the anchor and
  refuses such a start with ``OUT_OF_RANGE`` instead.
* pgoutput protocol version 1 sends committed transactions only, whole, in
  commit order: nothing uncommitted or rolled back is ever decoded.
* Values arrive as text and are converted by type (integers, floats, numeric,
  booleans, bytea); other types stay text. An unchanged TOASTed value in a new
  image takes the old image's value.
* Timestamps are the commit times (microseconds), forced non-decreasing.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import re
import secrets
import select
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from decimal import Decimal
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from shardgate.backends.changes import (
    DELETE,
    INSERT,
    UPDATE,
    DecodedXids,
    Heartbeat,
    LogItem,
    RowChange,
    Transaction,
    Visibility,
    xid_precedes,
)
from shardgate.backends.changes._logthread import Handoff, ThreadedChangeLog
from shardgate.backends.urls import parse_url
from shardgate.errors import Code, Internal, ShardgateError, Unavailable
from shardgate.event_token import EventToken

log = logging.getLogger(__name__)

PUBLICATION = "sg_changes"
#: the publication's comment: "changes committed at or before <unix time> were purged"
_PURGED_MARK = "shardgate purged through "
_PG_EPOCH = 946684800.0
_FEEDBACK_S = 5.0
#: while the consumer is busy: transactions gathered into one hand-over at most, and
#: the longest a decoded transaction waits to be handed over
GATHER_TXS = 256
GATHER_S = 0.02


def lsn_to_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def int_to_lsn(n: int) -> str:
    return f"{n >> 32:X}/{n & 0xFFFFFFFF:X}"


def _bool(s: str) -> bool:
    return s == "t"


def _bytea(s: str) -> bytes:
    return bytes.fromhex(s[2:]) if s.startswith("\\x") else s.encode()


_CONVERT: dict[int, Callable[[str], Any]] = {
    16: _bool, 17: _bytea, 20: int, 21: int, 23: int, 26: int,
    700: float, 701: float, 1083: datetime.time.fromisoformat, 1700: Decimal,
}


# table, column names, converters, primary key column indexes
_Relation = tuple[str, list[str], list[Callable[[str], Any]], list[int]]


class PgOutputDecoder:
    """pgoutput (protocol 1) messages -> :class:`Transaction` objects.

    ``pk_columns(oid, schema, table)`` names a relation's primary key columns
    (the relation message marks every column as key under REPLICA IDENTITY FULL).
    """

    def __init__(self, shard: str, pk_columns: Callable[[int, str, str], list[str]]) -> None:
        self.shard = shard
        self._pk_columns = pk_columns
        # oid -> (table, column names, converters, pk indexes)
        self._relations: dict[int, _Relation] = {}
        self._changes: list[RowChange] = []
        self._last_ts = 0.0
        self._xid: int | None = None
        #: between a Begin and its Commit
        self.in_transaction = False

    def decode(self, data: bytes) -> Transaction | None:
        """Feed one message; returns the transaction when it is its Commit."""
        tag = data[0]
        if tag == 0x49:  # 'I'
            oid = struct.unpack_from("!I", data, 1)[0]
            after, _ = self._tuple(oid, data, 6)
            self._row(oid, INSERT, None, after)
        elif tag == 0x55:  # 'U'
            oid = struct.unpack_from("!I", data, 1)[0]
            before = None
            pos = 5
            if data[pos] in (0x4B, 0x4F):  # 'K' / 'O'
                before, pos = self._tuple(oid, data, pos + 1)
            after, _ = self._tuple(oid, data, pos + 1, before)
            self._row(oid, UPDATE, before, after)
        elif tag == 0x44:  # 'D'
            oid = struct.unpack_from("!I", data, 1)[0]
            before, _ = self._tuple(oid, data, 6)
            self._row(oid, DELETE, before, None)
        elif tag == 0x42:  # 'B': final lsn, commit time, xid
            self._changes = []
            self._xid = struct.unpack_from("!I", data, 17)[0]
            self.in_transaction = True
        elif tag == 0x43:  # 'C'
            _flags, _commit_lsn, end_lsn, ts = struct.unpack_from("!bqqq", data, 1)
            stamp = max(self._last_ts, ts / 1e6 + _PG_EPOCH)
            self._last_ts = stamp
            tx = Transaction(EventToken(stamp, self.shard, int_to_lsn(end_lsn)), self._changes,
                             self._xid)
            self._changes = []
            self.in_transaction = False
            return tx
        elif tag == 0x52:  # 'R'
            self._relation(data)
        elif tag == 0x54:  # 'T' truncate
            n = struct.unpack_from("!I", data, 1)[0]
            for i in range(n):
                oid = struct.unpack_from("!I", data, 6 + 4 * i)[0]
                rel = self._relations.get(oid)
                if rel is not None:
                    self._changes.append(RowChange(rel[0], "truncate", (), None, None))
        return None  # 'Y' type, 'O' origin, 'M' message: nothing to emit

    def _relation(self, data: bytes) -> None:
        oid = struct.unpack_from("!I", data, 1)[0]
        pos = 5
        end = data.index(b"\x00", pos)
        schema = data[pos:end].decode()
        pos = end + 1
        end = data.index(b"\x00", pos)
        name = data[pos:end].decode()
        pos = end + 2  # replica identity setting
        ncols = struct.unpack_from("!H", data, pos)[0]
        pos += 2
        columns: list[str] = []
        converters: list[Callable[[str], Any]] = []
        for _ in range(ncols):
            pos += 1  # flags
            end = data.index(b"\x00", pos)
            columns.append(data[pos:end].decode())
            pos = end + 1
            type_oid = struct.unpack_from("!I", data, pos)[0]
            pos += 8  # type oid, type modifier
            converters.append(_CONVERT.get(type_oid, str))
        table = name if schema == "public" else f"{schema}.{name}"
        pk = self._pk_columns(oid, schema, name)
        pk_idx = [columns.index(c) for c in pk if c in columns] or list(range(len(columns)))
        self._relations[oid] = (table, columns, converters, pk_idx)

    def _tuple(
        self, oid: int, data: bytes, pos: int, old: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], int]:
        _table, columns, converters, _pk = self._relations[oid]
        n = struct.unpack_from("!H", data, pos)[0]
        pos += 2
        image: dict[str, Any] = {}
        for i in range(n):
            kind = data[pos]
            pos += 1
            if kind == 0x74:  # 't'
                length = struct.unpack_from("!I", data, pos)[0]
                pos += 4
                image[columns[i]] = converters[i](data[pos : pos + length].decode())
                pos += length
            elif kind == 0x6E:  # 'n'
                image[columns[i]] = None
            elif kind == 0x75:  # 'u': unchanged TOAST, not sent
                image[columns[i]] = old.get(columns[i]) if old is not None else None
            else:  # 'b' binary: not requested
                length = struct.unpack_from("!I", data, pos)[0]
                pos += 4 + length
        return image, pos

    def _row(
        self, oid: int, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> None:
        table, columns, _conv, pk_idx = self._relations[oid]
        image = after if after is not None else before
        assert image is not None
        pk = tuple(image.get(columns[i]) for i in pk_idx)
        self._changes.append(RowChange(table, op, pk, before, after))


#: server messages of a slot whose WAL is gone (invalidated by max_slot_wal_keep_size)
_WAL_LOST = ("doesn't reserve WAL", "has been invalidated", "has already been removed",
             "can no longer get changes")


def _translate(url: str) -> Callable[[BaseException], BaseException]:
    def translate(exc: BaseException) -> BaseException:
        if isinstance(exc, ShardgateError):
            return exc
        text = " ".join(str(exc).split())
        if isinstance(exc, psycopg2.Error) and any(m in text for m in _WAL_LOST):
            return ShardgateError(
                f"the change log of {url} lost the WAL its anchor slot kept ({text}; "
                "max_slot_wal_keep_size exceeded): positions before now are gone; "
                "restart consumers from a new snapshot",
                code=Code.OUT_OF_RANGE,
            )
        if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
            return Unavailable(f"lost the replication stream of {url}: {exc}; retry")
        if isinstance(exc, psycopg2.Error) and "no message from the libpq" in text:
            # the server closed the stream without a word (wal_sender_timeout, a restart)
            return Unavailable(f"lost the replication stream of {url}: the server ended it "
                               f"({text}); retry")
        if isinstance(exc, psycopg2.Error):
            if "replication slot" in text and "does not exist" in text:
                return ShardgateError(
                    f"no change capture on {url} ({text}): prepare it first",
                    code=Code.FAILED_PRECONDITION,
                )
            return Internal(f"replication error from {url}: {text}")
        return exc

    return translate


class PgVisibility(Visibility):
    """Decoded transaction ids against a ``pg_current_snapshot()`` (``xmin:xmax:xip,...``,
    64-bit ids): a decoded transaction is invisible when its id is at or past
    ``xmax`` or listed in progress; one older than the reader's start (its
    :meth:`started` horizon: committed before the start, so never decoded) must be
    over (below ``xmin``)."""

    def __init__(self, log: PostgresChangeLog) -> None:
        self.log = log
        self.decoded = DecodedXids()
        #: a transaction id (32 bits) newer than any committed before the reader's start
        self.horizon: int | None = None

    async def started(self) -> None:
        def q(cur: Any) -> str:
            # a new id: every transaction flushed before the start has a smaller one
            cur.execute("SELECT pg_current_xact_id()::text")
            return str(cur.fetchone()[0])

        self.horizon = int(await self.log._sql(q)) & 0xFFFFFFFF

    def note(self, tx: Transaction) -> None:
        if isinstance(tx.mark, int):
            self.decoded.add(tx.mark)

    def all_visible(self, snapshot: Sequence[Sequence[Any]]) -> bool:
        xmin, xmax, xip = str(snapshot[0][0]).split(":")
        horizon = self.horizon
        if horizon is not None and xid_precedes(int(xmin) & 0xFFFFFFFF, horizon):
            return False
        top = int(xmax) & 0xFFFFFFFF
        newest = self.decoded.newest
        if newest is not None and not xid_precedes(newest, top):
            return False
        return not any(int(x) in self.decoded for x in xip.split(",") if x)


class PostgresChangeLog(ThreadedChangeLog):
    """The logical replication log of one PostgreSQL shard database."""

    thread_name = "pg-log"
    log_name = "log"

    position_sql = "SELECT pg_current_wal_lsn()::text"
    snapshot_sql = ("BEGIN ISOLATION LEVEL REPEATABLE READ",
                    "SELECT pg_current_snapshot()::text")

    def visibility(self) -> PgVisibility:
        return PgVisibility(self)

    def __init__(self, url: str, shard: str, *, publication: str = PUBLICATION) -> None:
        super().__init__(url, shard)
        u = parse_url(url)
        self._safe = u.safe
        self._dsn = psycopg2.extensions.make_dsn(
            host=u.host, port=u.port or 5432, user=u.user, password=u.password,
            dbname=u.database or "postgres", connect_timeout=5,
        )
        self.publication = publication
        db = u.database or "postgres"
        clean = re.sub(r"[^a-z0-9_]", "_", db.lower())[:40]
        self.anchor = f"sga_{clean}_{hashlib.sha1(db.encode()).hexdigest()[:8]}"

    # -- plain SQL, in a worker thread ----------------------------------------------

    def _sql_sync(self, fn: Callable[[Any], Any]) -> Any:
        try:
            conn = psycopg2.connect(self._dsn)
        except psycopg2.Error as exc:
            raise _translate(self._safe)(exc) from exc
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                return fn(cur)
        except psycopg2.Error as exc:
            raise _translate(self._safe)(exc) from exc
        finally:
            conn.close()

    async def _sql(self, fn: Callable[[Any], Any]) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self._sql_sync, fn)

    def _export_sync(self) -> tuple[Any, str, str]:
        try:
            repl = psycopg2.connect(
                self._dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
        except psycopg2.Error as exc:
            raise _translate(self._safe)(exc) from exc
        try:
            cur = repl.cursor()
            cur.execute(f"CREATE_REPLICATION_SLOT sgs_{secrets.token_hex(8)} TEMPORARY "
                        "LOGICAL pgoutput EXPORT_SNAPSHOT")
            _slot, consistent_point, snapshot, _plugin = cur.fetchone()
            return repl, str(snapshot), str(consistent_point)
        except psycopg2.Error as exc:
            repl.close()
            raise _translate(self._safe)(exc) from exc
        except BaseException:
            repl.close()
            raise

    @contextlib.asynccontextmanager
    async def exported_snapshot(self) -> AsyncIterator[tuple[str, str]]:
        """A temporary logical slot's exported snapshot and its consistent point.

        Transactions whose commit is before the point are in the snapshot, the
        others are after it in the log (``read(point)`` delivers exactly those).
        Import it with ``SET TRANSACTION SNAPSHOT`` in a ``REPEATABLE READ``
        transaction before the block ends (the slot and its connection go then).
        """
        import asyncio

        loop = asyncio.get_running_loop()
        repl, snapshot, point = await loop.run_in_executor(None, self._export_sync)
        try:
            yield snapshot, point
        finally:
            await loop.run_in_executor(None, repl.close)

    def _prepare(self, cur: Any) -> None:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,))
        if cur.fetchone() is None:
            cur.execute(f'CREATE PUBLICATION "{self.publication}" FOR ALL TABLES')
        cur.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND c.relreplident <> 'f'"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg_toast%'"
        )
        for (name,) in cur.fetchall():
            cur.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        cur.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = 'sg_replica_identity_full'")
        if cur.fetchone() is None:
            cur.execute(
                "CREATE OR REPLACE FUNCTION sg_replica_identity_full() RETURNS event_trigger"
                " LANGUAGE plpgsql AS $$ DECLARE obj record; BEGIN"
                " FOR obj IN SELECT * FROM pg_event_trigger_ddl_commands()"
                " WHERE object_type = 'table' AND command_tag IN"
                " ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO') LOOP"
                " EXECUTE 'ALTER TABLE ' || obj.object_identity || ' REPLICA IDENTITY FULL';"
                " END LOOP; END $$"
            )
            cur.execute(
                "CREATE EVENT TRIGGER sg_replica_identity_full ON ddl_command_end"
                " WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO')"
                " EXECUTE FUNCTION sg_replica_identity_full()"
            )
        # An anchor the server invalidated (it held more WAL than max_slot_wal_keep_size)
        # can serve nothing any more: replace it. Positions before now are gone, and
        # starts there fail with OUT_OF_RANGE against the new anchor.
        cur.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s AND wal_status = 'lost' AND NOT active",
            (self.anchor,),
        )
        if cur.fetchall():
            self._mark_purged(cur, time.time())
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.anchor,))
        if cur.fetchone() is None:
            self._warn_blockers(cur)
            cur.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.anchor,)
            )

    def _warn_blockers(self, cur: Any) -> None:
        """Name the transactions the anchor slot's creation will wait for.

        PostgreSQL creates a logical slot only once every transaction that holds
        a transaction id anywhere on the server (any database, and prepared
        ones) has ended: one long or forgotten transaction stalls the first
        change stream of a shard with no error. Say which, so it can be ended
        (those open a second or more: brief ones, such as other shards setting
        up their capture at the same time, are not worth a warning).
        """
        cur.execute(
            "SELECT pid::text, datname, state, (now() - xact_start)::text FROM pg_stat_activity"
            " WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
            " AND xact_start < now() - interval '1 second'"
            " UNION ALL SELECT 'prepared ' || gid, database, 'prepared',"
            " (now() - prepared)::text FROM pg_prepared_xacts"
        )
        rows = cur.fetchall()
        if rows:
            log.warning(
                "change capture on %s waits for %d transaction(s) open on the server to end "
                "before its replication slot exists: %s",
                self._safe,
                len(rows),
                "; ".join(f"{who} (database {db}, {state}, open {age})"
                          for who, db, state, age in rows),
            )

    async def prepare(self) -> None:
        await self._sql(self._prepare)

    async def current_position(self) -> str:
        def q(cur: Any) -> str:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            return str(cur.fetchone()[0])

        return str(await self._sql(q))

    def _oldest(self, cur: Any) -> str:
        cur.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (self.anchor,),
        )
        row = cur.fetchone()
        if row is None or row[0] is None:
            raise ShardgateError(
                f"no change capture on {self._safe}: the anchor slot {self.anchor} is missing",
                code=Code.FAILED_PRECONDITION,
            )
        return str(row[0])

    async def oldest_position(self) -> str:
        return str(await self._sql(self._oldest))

    async def purge(self, up_to: str, *, through: float | None = None) -> None:
        """Advance the anchor to ``up_to``; remember ``through`` (the newest purged time).

        The time is kept in the publication's comment (the database holds one
        anchor), so a restarted tablet still refuses starts the log lost.
        """
        stamp = time.time() if through is None else through

        def q(cur: Any) -> None:
            cur.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.anchor, up_to))
            self._mark_purged(cur, stamp)

        await self._sql(q)

    def _mark_purged(self, cur: Any, stamp: float) -> None:
        old = self._purged_ts(cur)
        if old is None or stamp > old:
            cur.execute(
                f"COMMENT ON PUBLICATION \"{self.publication}\" IS '{_PURGED_MARK}{stamp!r}'"
            )

    def _purged_ts(self, cur: Any) -> float | None:
        cur.execute(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
            (self.publication,),
        )
        row = cur.fetchone()
        text = str(row[0]) if row and row[0] else ""
        return float(text[len(_PURGED_MARK):]) if text.startswith(_PURGED_MARK) else None

    async def purged_through(self) -> float | None:
        ts: float | None = await self._sql(self._purged_ts)
        return ts

    async def drop(self) -> None:
        def q(cur: Any) -> None:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s AND NOT active",
                (self.anchor,),
            )
            cur.execute(f'DROP PUBLICATION IF EXISTS "{self.publication}"')
            cur.execute("DROP EVENT TRIGGER IF EXISTS sg_replica_identity_full")
            cur.execute("DROP FUNCTION IF EXISTS sg_replica_identity_full()")

        await self._sql(q)

    # -- reading --------------------------------------------------------------------

    def _translator(self) -> Callable[[BaseException], BaseException]:
        return _translate(self._safe)

    @staticmethod
    def _order(position: str) -> tuple[int, ...]:
        return (lsn_to_int(position),)

    def _stream(self, handoff: Handoff, start: str, heartbeat_s: float) -> None:
        catalog = psycopg2.connect(self._dsn)
        catalog.autocommit = True
        repl = psycopg2.connect(
            self._dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
        )
        try:
            self._stream_on(handoff, start, heartbeat_s, catalog, repl)
        finally:
            repl.close()
            catalog.close()

    def _stream_on(
        self, handoff: Handoff, start: str, heartbeat_s: float, catalog: Any, repl: Any
    ) -> None:
        def pk_columns(oid: int, _schema: str, _table: str) -> list[str]:
            with catalog.cursor() as c:
                c.execute(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid ="
                    " i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND"
                    " i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
                    (oid,),
                )
                return [r[0] for r in c.fetchall()]

        decoder = PgOutputDecoder(self.shard, pk_columns)
        cur = repl.cursor()
        slot = f"sgt_{secrets.token_hex(8)}"
        cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (self.anchor, slot))
        cur.start_replication(
            slot_name=slot, decode=False, start_lsn=start,
            options={"proto_version": "1", "publication_names": self.publication},
        )
        position = start

        def keepalive() -> None:
            # The consumer is not taking what was decoded: tell the server this client
            # is alive, or its wal_sender_timeout ends the connection (the next read then
            # fails with "PGRES_COPY_BOTH and no message from the libpq").
            cur.send_feedback(flush_lsn=lsn_to_int(position), force=True)

        handoff.keepalive = keepalive
        last_item = time.monotonic()
        last_feedback = 0.0
        batch: list[LogItem] = []
        while not handoff.stop.is_set():
            msg = cur.read_message()
            if msg is not None:
                tx = decoder.decode(msg.payload)
                if tx is not None:
                    batch.append(tx)
                    position = tx.token.position
                    # Hand over at once to an idle consumer; while it is busy, gather
                    # (bounded in size and age, so a long backlog still streams).
                    if handoff.idle() or len(batch) >= GATHER_TXS or (
                        time.monotonic() - last_item >= GATHER_S
                    ):
                        if not handoff.put(batch):
                            return
                        batch = []
                        last_item = time.monotonic()
                continue
            if batch:
                if not handoff.put(batch):
                    return
                batch = []
                last_item = time.monotonic()
            now = time.monotonic()
            # Idle, everything received decoded: the server's keepalives say how far
            # it has decoded (sentPtr); no commit before that is still to come.
            moved = not decoder.in_transaction and cur.wal_end > lsn_to_int(position)
            if moved:
                position = int_to_lsn(cur.wal_end)
            if moved or now - last_item >= heartbeat_s:
                if not handoff.put([Heartbeat(watermark=time.time() - 0.5, position=position)]):
                    return
                last_item = now
            if now - last_feedback >= min(_FEEDBACK_S, heartbeat_s, 0.1):
                # Feedback below the server's send position makes it answer with a keepalive.
                cur.send_feedback(flush_lsn=lsn_to_int(position), force=True)
                last_feedback = now
            select.select([repl], [], [], min(0.1, heartbeat_s))


def raw_decode(log: PostgresChangeLog, start: str, end: str) -> tuple[int, float]:
    """Benchmark helper: decode the log from ``start`` to ``end`` in this thread, with no
    hand-off to asyncio; return the number of row changes and the ``time.perf_counter()``
    at which the first was decoded. Blocking."""
    catalog = psycopg2.connect(log._dsn)
    catalog.autocommit = True
    repl = psycopg2.connect(
        log._dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    try:
        decoder = PgOutputDecoder(log.shard, lambda oid, s, t: [])
        cur = repl.cursor()
        slot = f"sgt_{secrets.token_hex(8)}"
        cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (log.anchor, slot))
        cur.start_replication(
            slot_name=slot, decode=False, start_lsn=start,
            options={"proto_version": "1", "publication_names": log.publication},
        )
        target = lsn_to_int(end)
        rows = 0
        first = 0.0
        while True:
            msg = cur.read_message()
            if msg is None:
                select.select([repl], [], [], 0.1)
                continue
            tx = decoder.decode(msg.payload)
            if tx is not None:
                rows += len(tx.changes)
                first = first or time.perf_counter()
                if lsn_to_int(tx.token.position) >= target:
                    return rows, first
    finally:
        repl.close()
        catalog.close()
