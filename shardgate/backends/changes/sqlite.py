"""SQLite change capture: triggers write before/after images into a change table.

The stdlib ``sqlite3`` module has no update, pre-update or commit hooks, so
every user table gets three ``AFTER ... FOR EACH ROW`` triggers that insert
into ``_sg_changes``:

``seq``     INTEGER PRIMARY KEY AUTOINCREMENT: the log position (never reused,
            so positions only grow);
``txn``     the writing transaction's id from the ``sg_txn()`` SQL function;
``ts``      the write time (seconds since the epoch, millisecond resolution);
``tbl, op`` table and ``i``/``u``/``d``;
``before, after``  the images as JSON objects (blobs as ``"\\u0000b:<hex>"``).

Invariants:

* **Commit order.** SQLite has one writer at a time and a writer holds the
  write lock from its first write to its commit, so the rows of a
  transaction are contiguous in ``seq`` and ``seq`` order is commit order.
  A rolled-back transaction's rows vanish with it; readers see only
  committed rows. Timestamps therefore also grow with ``seq``.
* **Transaction ids.** ``sg_txn()`` exists on connections opened by
  :class:`shardgate.backends.sqlite.SQLiteBackend` (:class:`CaptureConnection`):
  it returns one id per transaction, renewed after every statement that
  leaves the connection outside a transaction (:func:`end_of_statement`).
  Consecutive rows with the same ``txn`` form one transaction. A connection
  without the function cannot write to captured tables ("no such function:
  sg_txn"): writes behind shardgate's back are refused, not lost.
* **Schema.** Triggers are regenerated whenever ``PRAGMA schema_version``
  changes (checked on every poll, and by :meth:`SQLiteChangeLog.prepare`);
  rows written between a DDL statement and that poll are captured by the
  old triggers (a new column shows up from the regeneration on).
* **Cheap polling.** ``PRAGMA data_version`` (a few microseconds) tells the
  reader whether any other connection committed since its last look.
* **Retention.** :meth:`SQLiteChangeLog.purge` deletes rows and records the
  purged position in ``_sg_capture``; a start before it is ``OUT_OF_RANGE``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shardgate.backends.changes import (
    DEFAULT_HEARTBEAT_S,
    DELETE,
    INSERT,
    UPDATE,
    ChangeLog,
    Heartbeat,
    LogItem,
    RowChange,
    Transaction,
)
from shardgate.backends.sqlite_errors import translate
from shardgate.backends.urls import parse_url
from shardgate.errors import Code as _Code
from shardgate.errors import FailedPrecondition, ShardgateError
from shardgate.event_token import EventToken

T = TypeVar("T")

CHANGE_TABLE = "_sg_changes"
META_TABLE = "_sg_capture"
BATCH_ROWS = 5000
POLL_S = 0.002
_BLOB = "\x00b:"
_OPS = {"i": INSERT, "u": UPDATE, "d": DELETE}

_txn_base = secrets.randbits(40) << 20
_txn_counter = itertools.count(1)


class _TxnClock:
    """The ``sg_txn()`` state of one connection (kept apart from it: no reference cycle,
    so an abandoned connection is still closed, and its transaction rolled back, at once)."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: int | None = None

    def __call__(self) -> int:
        txn = self.current
        if txn is None:
            txn = self.current = _txn_base + next(_txn_counter)
        return txn


class CaptureConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` with the ``sg_txn()`` function the capture triggers call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sg_clock = _TxnClock()
        self.create_function("sg_txn", 0, self.sg_clock)


def end_of_statement(db: sqlite3.Connection) -> None:
    """Call after every statement: outside a transaction, the next write starts a new one."""
    if not db.in_transaction and isinstance(db, CaptureConnection):
        db.sg_clock.current = None


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _image(prefix: str, columns: list[str]) -> str:
    parts = []
    for c in columns:
        ref = f"{prefix}.{_q(c)}"
        parts.append(
            f"{_lit(c)}, CASE typeof({ref}) WHEN 'blob' THEN char(0) || 'b:' || hex({ref}) "
            f"ELSE {ref} END"
        )
    return "json_object(" + ", ".join(parts) + ")"


_TS = "(julianday('now') - 2440587.5) * 86400.0"


def _trigger_sql(table: str, columns: list[str]) -> list[str]:
    t, lt = _q(table), _lit(table)
    insert = f"INSERT INTO {CHANGE_TABLE} (txn, ts, tbl, op, before, after) VALUES (sg_txn(), {_TS}"
    return [
        f"CREATE TRIGGER {_q('_sg_ai_' + table)} AFTER INSERT ON {t} FOR EACH ROW BEGIN "
        f"{insert}, {lt}, 'i', NULL, {_image('NEW', columns)}); END",
        f"CREATE TRIGGER {_q('_sg_au_' + table)} AFTER UPDATE ON {t} FOR EACH ROW BEGIN "
        f"{insert}, {lt}, 'u', {_image('OLD', columns)}, {_image('NEW', columns)}); END",
        f"CREATE TRIGGER {_q('_sg_ad_' + table)} AFTER DELETE ON {t} FOR EACH ROW BEGIN "
        f"{insert}, {lt}, 'd', {_image('OLD', columns)}, NULL); END",
    ]


def _decode(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    image: dict[str, Any] = json.loads(text)
    for k, v in image.items():
        if isinstance(v, str) and v.startswith(_BLOB):
            image[k] = bytes.fromhex(v[len(_BLOB) :])
    return image


class SQLiteChangeLog(ChangeLog):
    """Tails ``_sg_changes`` of one SQLite shard file (see the module docstring).

    One dedicated thread runs every call on this object's own connection.
    """

    position_sql = (
        f"SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = '{CHANGE_TABLE}'), 0)"
    )

    def __init__(self, url: str, shard: str, *, poll_s: float = POLL_S) -> None:
        super().__init__(url, shard)
        parsed = parse_url(url)
        if parsed.is_memory:
            raise FailedPrecondition(
                "change streams need a SQLite file; sqlite:///:memory: is private to one connection"
            )
        self._path = parsed.database
        self._poll_s = poll_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sg-sqlite-changes")
        self._db: sqlite3.Connection | None = None
        self._schema_version = -1
        self._pks: dict[str, list[str]] = {}

    # -- the dedicated thread ---------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except sqlite3.Error as exc:
            raise translate(exc, self.url) from exc

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False,
                factory=CaptureConnection,
            )
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("PRAGMA journal_mode = WAL").fetchall()
            self._db = db
        return self._db

    def _ensure_sync(self, force: bool = False) -> None:
        """Bring the capture (change tables, one trigger per table and operation) in step
        with the schema. Idempotent and quiet: when every trigger already reads as it
        should, nothing is written (no write lock, no new ``schema_version``), so
        several readers of one file never make each other regenerate."""
        db = self._conn()
        version = db.execute("PRAGMA schema_version").fetchone()[0]
        if version == self._schema_version and not force:
            return
        wanted, pks = self._wanted_sync(db)
        if self._captured_sync(db) == wanted:
            self._pks = pks
            self._schema_version = version
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {CHANGE_TABLE} (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                " txn INTEGER NOT NULL, ts REAL NOT NULL, tbl TEXT NOT NULL, op TEXT NOT NULL,"
                " before TEXT, after TEXT)"
            )
            db.execute(f"CREATE TABLE IF NOT EXISTS {META_TABLE} (k TEXT PRIMARY KEY, v)")
            wanted, pks = self._wanted_sync(db)  # again, under the write lock
            have = self._captured_sync(db)
            for name, sql in have.items():
                if wanted.get(name) != sql:
                    db.execute(f"DROP TRIGGER IF EXISTS {_q(name)}")
            for name, sql in wanted.items():
                if have.get(name) != sql and sql:
                    db.execute(sql)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._pks = pks
        self._schema_version = db.execute("PRAGMA schema_version").fetchone()[0]

    @staticmethod
    def _wanted_sync(db: sqlite3.Connection) -> tuple[dict[str, str], dict[str, list[str]]]:
        """The capture triggers the schema needs (name -> SQL) and each table's key columns."""
        tables = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '\\_sg\\_%' ESCAPE '\\'"
            )
        ]
        wanted: dict[str, str] = {}
        pks: dict[str, list[str]] = {}
        for table in tables:
            info = db.execute(f"PRAGMA table_info({_q(table)})").fetchall()
            columns = [r[1] for r in info]
            pk = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]]
            pks[table] = pk or columns
            for sql, op in zip(_trigger_sql(table, columns), "iud", strict=True):
                wanted[f"_sg_a{op}_{table}"] = " ".join(sql.split())
        present = {r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE name IN (?, ?)", (CHANGE_TABLE, META_TABLE)
        )}
        if len(present) < 2:
            wanted["<change tables>"] = ""  # never matches: they must be created
        return wanted, pks

    @staticmethod
    def _captured_sync(db: sqlite3.Connection) -> dict[str, str]:
        """The capture triggers the file has (name -> SQL, whitespace normalized)."""
        return {
            str(name): " ".join(str(sql).split())
            for name, sql in db.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
                " AND name LIKE '\\_sg\\_a%' ESCAPE '\\'"
            )
        }

    def _position_sync(self) -> int:
        row = self._conn().execute(
            "SELECT seq FROM sqlite_sequence WHERE name = ?", (CHANGE_TABLE,)
        ).fetchone()
        return int(row[0]) if row else 0

    def _purged_sync(self) -> int:
        row = self._conn().execute(f"SELECT v FROM {META_TABLE} WHERE k = 'purged'").fetchone()
        return int(row[0]) if row else 0

    def _read_sync(self, after: int) -> tuple[list[tuple[Any, ...]], int, bool]:
        """Rows after ``after``; the data_version seen; whether the batch was full."""
        db = self._conn()
        self._ensure_sync()
        db.execute("BEGIN")
        try:
            version = db.execute("PRAGMA data_version").fetchone()[0]
            rows = db.execute(
                f"SELECT seq, txn, ts, tbl, op, before, after FROM {CHANGE_TABLE}"
                " WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, BATCH_ROWS),
            ).fetchall()
        finally:
            db.execute("COMMIT")
        return rows, version, len(rows) == BATCH_ROWS

    def _data_version_sync(self) -> int:
        return int(self._conn().execute("PRAGMA data_version").fetchone()[0])

    def _purge_sync(self, up_to: int) -> None:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            (newest,) = db.execute(
                f"SELECT max(ts) FROM {CHANGE_TABLE} WHERE seq <= ?", (up_to,)
            ).fetchone()
            db.execute(f"DELETE FROM {CHANGE_TABLE} WHERE seq <= ?", (up_to,))
            for k, v in (("purged", up_to), ("purged_ts", newest)):
                if v is not None:
                    db.execute(
                        f"INSERT INTO {META_TABLE} (k, v) VALUES (?, ?) "
                        "ON CONFLICT (k) DO UPDATE SET v = max(v, excluded.v)",
                        (k, v),
                    )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _drop_sync(self) -> None:
        db = self._conn()
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"
            " AND name LIKE '\\_sg\\_a%' ESCAPE '\\'"
        ).fetchall():
            db.execute(f"DROP TRIGGER IF EXISTS {_q(name)}")
        db.execute(f"DROP TABLE IF EXISTS {CHANGE_TABLE}")
        db.execute(f"DROP TABLE IF EXISTS {META_TABLE}")
        self._schema_version = -1

    def _close_sync(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    # -- the ChangeLog contract ----------------------------------------------

    async def prepare(self) -> None:
        await self._run(self._ensure_sync, True)

    async def current_position(self) -> str:
        await self._run(self._ensure_sync)
        return str(await self._run(self._position_sync))

    async def oldest_position(self) -> str:
        await self._run(self._ensure_sync)
        return str(await self._run(self._purged_sync))

    async def purge(self, up_to: str, *, through: float | None = None) -> None:
        # The exact newest commit time purged is taken from the rows themselves.
        await self._run(self._purge_sync, int(up_to))

    def _purged_ts_sync(self) -> float | None:
        row = self._conn().execute(
            f"SELECT v FROM {META_TABLE} WHERE k = 'purged_ts'"
        ).fetchone()
        return float(row[0]) if row else None

    async def purged_through(self) -> float | None:
        await self._run(self._ensure_sync)
        return await self._run(self._purged_ts_sync)

    async def drop(self) -> None:
        await self._run(self._drop_sync)

    async def close(self) -> None:
        try:
            await self._run(self._close_sync)
        finally:
            self._pool.shutdown(wait=True)

    async def read(
        self, start: str | None, *, heartbeat_s: float = DEFAULT_HEARTBEAT_S
    ) -> AsyncIterator[LogItem]:
        await self._run(self._ensure_sync)
        after = int(start) if start is not None else await self._run(self._position_sync)
        purged = await self._run(self._purged_sync)
        if after < purged:
            raise ShardgateError(
                f"position {after} of {self.shard} is no longer in the change log (purged up to "
                f"{purged}): restart from a newer token or a recent timestamp",
                code=_Code.OUT_OF_RANGE,
            )
        last_ts = 0.0
        last_version: int | None = None
        last_beat = time.monotonic()
        while True:
            polled_at = time.time()
            rows, last_version, full = await self._run(self._read_sync, after)
            if rows:
                if full:
                    # The last transaction may continue past the batch: keep it for next time.
                    last_txn = rows[-1][1]
                    cut = len(rows)
                    while cut > 0 and rows[cut - 1][1] == last_txn:
                        cut -= 1
                    if cut > 0:
                        rows = rows[:cut]
                for tx in self._transactions(rows, last_ts):
                    last_ts = tx.token.timestamp
                    after = int(tx.token.position)
                    yield tx
                last_beat = time.monotonic()
                if full:
                    continue
            now = time.monotonic()
            if now - last_beat >= heartbeat_s:
                yield Heartbeat(watermark=polled_at, position=str(after))
                last_beat = now
            # Wait for another connection's commit (data_version moves) or the next beat.
            while True:
                await asyncio.sleep(self._poll_s)
                version = await self._run(self._data_version_sync)
                if version != last_version or time.monotonic() - last_beat >= heartbeat_s:
                    break

    def _transactions(self, rows: list[tuple[Any, ...]], last_ts: float) -> list[Transaction]:
        out: list[Transaction] = []
        changes: list[RowChange] = []
        pks = self._pks
        for i, (seq, txn, ts, tbl, op, before_s, after_s) in enumerate(rows):
            before, after = _decode(before_s), _decode(after_s)
            image = after if after is not None else before
            assert image is not None
            pk_cols = pks.get(tbl) or list(image)
            changes.append(
                RowChange(tbl, _OPS[op], tuple(image.get(c) for c in pk_cols), before, after)
            )
            if i + 1 == len(rows) or rows[i + 1][1] != txn:
                last_ts = max(last_ts, round(float(ts), 3))
                out.append(Transaction(EventToken(last_ts, self.shard, str(seq)), changes))
                changes = []
        return out
