"""Bulk reads and writes for the data pipeline: Arrow in, Arrow (or tuples) out.

The Spark data sources (:mod:`shardgate.spark`) move millions of rows, which
the row-at-a-time backend API is not made for. This module is their seam to
the databases, synchronous (Spark tasks are plain threads/processes) and
opened per task:

* **Reads.** :func:`open_reader` returns a :class:`ShardReader`: Arrow record
  batches from the native ADBC driver for PostgreSQL
  (``adbc-driver-postgresql``), lists of tuples from Python's ``sqlite3`` for
  SQLite and from PyMySQL's unbuffered cursor for MariaDB (Arrow built from
  Python tuples gains nothing). Never ADBC's SQLite: a second copy of SQLite in
  a process that also opens the file through ``sqlite3`` (the gate, the change
  log) releases the other's POSIX locks, and databases were corrupted so.
  :meth:`ShardReader.snapshot` opens the transaction every later read
  of the reader sees and returns the shard's change-log position at that
  snapshot (PostgreSQL: a ``REPEATABLE READ`` transaction on the snapshot
  exported by a new temporary logical slot + that slot's consistent point;
  MariaDB: consistent snapshot + ``@@gtid_binlog_pos``; SQLite: a read
  transaction + the last ``_sg_changes`` sequence).
* **Writes.** :func:`ingest` appends an Arrow table to a table: PostgreSQL
  through ADBC's COPY (binary), SQLite through ``executemany`` on a
  :class:`~shardgate.backends.changes.sqlite.CaptureConnection` (so change
  capture triggers keep working), MariaDB through PyMySQL's multi-row
  ``executemany``. :func:`run` executes a few statements in one transaction.
* **Schemas.** :func:`result_schema` gives the Arrow schema of a query's result
  (PostgreSQL: exact server types; SQLite: declared column types of a table by
  SQLite's affinity rules, or the types of the first rows of a query; MariaDB:
  the result's column types).

Driver exceptions become :class:`shardgate.errors.ShardgateError` here, once.
``pyarrow`` and the ADBC drivers are the ``spark`` extra; they are imported
when a function needs them.
"""

from __future__ import annotations

import atexit
import contextlib
import decimal
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from shardgate.backends.bulk.arrow import (
    inferred,
    mysql_field,
    normalize_schema,
    not_null,
    sqlite_type,
)
from shardgate.backends.urls import DatabaseURL, parse_url
from shardgate.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ShardgateError,
    Unavailable,
)

if TYPE_CHECKING:
    import pyarrow as pa

#: rows per Arrow batch / fetch round trip
BATCH_ROWS = 65_536
CONNECT_TIMEOUT_S = 5


def _translate(exc: BaseException, url: DatabaseURL, what: str) -> ShardgateError:
    """A driver error as a shardgate error (by the server's message, drivers differ)."""
    if isinstance(exc, ShardgateError):
        return exc
    text = " ".join(str(exc).split())
    where = f"{what} on {url.safe}: {text}"
    low = text.lower()
    if "duplicate" in low or "unique" in low or "1062" in low:
        return AlreadyExists(f"duplicate key: {where}")
    if "does not exist" in low or "no such table" in low or "doesn't exist" in low \
            or "unknown column" in low or "no such column" in low:
        return NotFound(where)
    if "syntax" in low:
        return InvalidArgument(where)
    if "connect" in low or "connection" in low or "timeout" in low or "lost" in low:
        return Unavailable(f"{where}; retry once the shard database is back")
    return Internal(where)


def _pg_uri(url: DatabaseURL) -> str:
    """A libpq URI for ADBC from a shardgate PostgreSQL URL (options kept)."""
    from urllib.parse import quote, urlencode

    auth = ""
    if url.user:
        auth = quote(url.user, safe="")
        if url.password:
            auth += ":" + quote(url.password, safe="")
        auth += "@"
    port = f":{url.port}" if url.port else ""
    opts = dict(url.options)
    opts.setdefault("connect_timeout", str(CONNECT_TIMEOUT_S))
    return f"postgresql://{auth}{url.host}{port}/{quote(url.database)}?{urlencode(opts)}"


def _mysql_connect(url: DatabaseURL) -> Any:
    import pymysql

    return pymysql.connect(
        host=url.host, port=url.port or 3306, user=url.user or "root",
        password=url.password or "", database=url.database or None, autocommit=True,
        charset="utf8mb4", connect_timeout=CONNECT_TIMEOUT_S,
        # TIMESTAMP values are read and written in UTC (they are zoned, see docs/types.md).
        init_command="SET time_zone = '+00:00'",
    )


def _sqlite_connect(url: DatabaseURL) -> sqlite3.Connection:
    from shardgate.backends.changes.sqlite import CaptureConnection

    db = sqlite3.connect(url.database, timeout=30, isolation_level=None,
                         factory=CaptureConnection)
    db.execute("PRAGMA busy_timeout = 30000")
    return db


class ConnectionPool:
    """Idle ADBC PostgreSQL connections of this process, kept for the next read of a shard.

    An ADBC connection costs about 25 ms to open (the driver loads the server's
    type catalog), as much as reading 100k rows; a Spark Python worker runs
    one task after another, and a planner worker one query plan after another,
    so they keep their connections here.

    Invariants:

    * a connection is in the pool only while nobody uses it, in autocommit mode
      with no transaction open and no result pending (:meth:`give` is called
      only by a reader that read every result to the end);
    * it belongs to the process that opened it: a forked child sees an empty
      pool and never uses, nor closes, its parent's connections;
    * at most :attr:`MAX_IDLE` per URI; one idle longer than :attr:`IDLE_S` is
      closed instead of reused; the rest are closed at interpreter exit;
    * :meth:`take` hands out a connection only after a round trip on it
      succeeded, so a server restart or a dropped database costs a reconnect,
      never a failed read.
    """

    MAX_IDLE = 4
    IDLE_S = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: dict[str, list[tuple[float, Any]]] = {}
        self._inherited: list[dict[str, list[tuple[float, Any]]]] = []
        # closed while the interpreter is still whole (the driver's finalizers
        # fail once module globals are torn down)
        atexit.register(self.clear)

    def _mine(self) -> dict[str, list[tuple[float, Any]]]:
        if os.getpid() != self._pid:
            # Forked: the parent's connections are not ours. They are kept referenced
            # and never closed here: closing one would end the parent's session too
            # (the socket is shared).
            self._inherited.append(self._idle)
            self._pid, self._idle = os.getpid(), {}
        return self._idle

    def take(self, uri: str) -> Any:
        """An open connection to ``uri``: a checked idle one, else a new one."""
        import adbc_driver_postgresql.dbapi as adbc_pg

        while True:
            with self._lock:
                idle = self._mine().get(uri)
                if not idle:
                    break
                since, conn = idle.pop()
            if time.monotonic() - since < self.IDLE_S and _alive(conn):
                return conn
            with contextlib.suppress(Exception):
                conn.close()
        return adbc_pg.connect(uri, autocommit=True)

    def give(self, uri: str, conn: Any) -> None:
        """Keep ``conn`` (idle, autocommit, nothing pending) for a later :meth:`take`."""
        with self._lock:
            idle = self._mine().setdefault(uri, [])
            if len(idle) < self.MAX_IDLE:
                idle.append((time.monotonic(), conn))
                return
        with contextlib.suppress(Exception):
            conn.close()

    def clear(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._mine(), {}
        for conns in idle.values():
            for _, conn in conns:
                with contextlib.suppress(Exception):
                    conn.close()


def _alive(conn: Any) -> bool:
    try:
        cur = conn.cursor()
        try:
            cur.execute("SELECT 1")
            cur.fetchall()
        finally:
            cur.close()
        return True
    except Exception:
        return False


#: the process's pool of PostgreSQL read connections
POOL = ConnectionPool()


def supports_arrow(url: str) -> bool:
    """True when reads of this shard come as Arrow batches (PostgreSQL)."""
    return parse_url(url).kind == "postgresql"


def quote_ident(kind: str, name: str) -> str:
    """``name`` quoted as an identifier for a backend kind (``mysql`` uses backticks)."""
    if kind == "mysql":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


class ShardReader:
    """Reads of one shard database on one connection (see the module docstring).

    Use as a context manager; ``snapshot()`` first if the reads must share one
    consistent view. SQL is in the shard's dialect, without parameters.
    """

    def __init__(self, url: str) -> None:
        self.url = parse_url(url)
        self.kind = self.url.kind
        self._conn: Any = None
        self._sqlite: sqlite3.Connection | None = None
        self._in_tx = False
        #: how the last :meth:`snapshot` took its position (MariaDB: ``consistent-snapshot``
        #: or ``table-lock``)
        self.snapshot_method = ""
        #: False while a result is being read, or after an error: the connection
        #: then goes back to no pool
        self._clean = True
        try:
            if self.kind == "postgresql":
                self._conn = POOL.take(_pg_uri(self.url))
            elif self.kind == "sqlite":
                # Python's own sqlite3, never a second SQLite library (ADBC's): two
                # copies of SQLite in one process break each other's POSIX locks on
                # the same file, and shard files were corrupted that way.
                self._conn = _sqlite_connect(self.url)
            else:
                self._conn = _mysql_connect(self.url)
        except ImportError as exc:
            raise FailedPrecondition(
                f"bulk reads need the 'spark' extra (pip install 'shardgate[spark]'): {exc}"
            ) from exc
        except Exception as exc:
            raise _translate(exc, self.url, "connect") from exc

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._in_tx:
            try:
                cur = self._conn.cursor()
                cur.execute("ROLLBACK")
                cur.close()
                self._in_tx = False
            except Exception:
                self._clean = False
        if self.kind == "postgresql" and self._clean and not self._in_tx:
            POOL.give(_pg_uri(self.url), self._conn)
            return
        with contextlib.suppress(Exception):
            self._conn.close()

    def snapshot(self, table: str | None = None) -> str:
        """Start the consistent read all later reads see; return the log position then.

        The position is the backend's own: a PostgreSQL LSN, a MariaDB GTID
        position, a SQLite ``_sg_changes`` sequence (``"0"`` if nothing was
        captured yet). Changes committed after the position are not in the
        snapshot; every change before it is. ``table``: the table the snapshot
        will read (MariaDB's table-lock method locks it, see :meth:`_mysql_snapshot`).
        """
        try:
            if self.kind == "postgresql":
                return self._pg_exported_snapshot()
            if self.kind == "sqlite":
                cur = self._conn.cursor()
                cur.execute("BEGIN")
                self._in_tx = True
                # The first read fixes the snapshot (WAL mode); the position comes from it.
                cur.execute("SELECT count(*) FROM sqlite_master WHERE name = '_sg_changes'")
                has_log = cur.fetchone()[0] > 0
                seq = 0
                if has_log:
                    cur.execute("SELECT COALESCE(MAX(seq), 0) FROM _sg_changes")
                    seq = int(cur.fetchone()[0])
                cur.close()
                return str(seq)
            return self._mysql_snapshot(table)
        except ShardgateError:
            raise
        except Exception as exc:
            raise _translate(exc, self.url, "snapshot") from exc

    def _mysql_snapshot(self, table: str | None) -> str:
        """MariaDB: the GTID position taken with the snapshot, exactly.

        MariaDB's ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` records the binlog
        file and offset that match the snapshot (status ``Binlog_snapshot_file``
        and ``Binlog_snapshot_position``, no lock); ``BINLOG_GTID_POS`` turns
        them into the GTID position. Where the server does not give them (binary
        log off, a server without the status), Vitess's table-lock method: ``LOCK
        TABLES ... READ`` stops writers of the table, the position and the
        snapshot are taken while no write can commit to it, then the lock goes.
        """
        with self._conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            self._in_tx = True
            cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            file = status.get("binlog_snapshot_file", "")
            offset = status.get("binlog_snapshot_position", "")
            if file and offset.isdigit():
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, int(offset)))
                row = cur.fetchone()
                if row is not None and row[0] is not None:
                    self.snapshot_method = "consistent-snapshot"
                    return str(row[0])
            # The table-lock method (as Vitess's vstreamer copy does): another connection
            # holds a read lock on the table (START TRANSACTION would release a lock
            # held by this one) while this one reads the position and starts its snapshot.
            cur.execute("ROLLBACK")
            self._in_tx = False
            locker = _mysql_connect(self.url)
            try:
                with locker.cursor() as lock:
                    lock.execute("FLUSH TABLES WITH READ LOCK" if table is None
                                 else f"LOCK TABLES {quote_ident('mysql', table)} READ")
                    cur.execute("SELECT @@gtid_binlog_pos")
                    row = cur.fetchone()
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    self._in_tx = True
                    cur.execute("SELECT 1")  # the snapshot is fixed by the first read
                    cur.fetchall()
                    lock.execute("UNLOCK TABLES")
            finally:
                locker.close()
            self.snapshot_method = "table-lock"
            return str(row[0] or "") if row else ""

    def _pg_exported_snapshot(self) -> str:
        """PostgreSQL: import the snapshot of a new temporary logical slot; its consistent point.

        ``pg_current_wal_lsn()`` read next to a ``REPEATABLE READ`` snapshot is
        not exact in either order (a commit record can be in the WAL before the
        transaction becomes visible). A logical slot created with ``SNAPSHOT
        'export'`` gives an exact pair: every transaction committed before its
        consistent point is in the exported snapshot, every later one is decoded
        from the point on. The replication connection only has to live until the
        snapshot is imported; the temporary slot goes with it.
        """
        import secrets

        import psycopg2
        import psycopg2.extensions
        import psycopg2.extras

        u = self.url
        dsn = psycopg2.extensions.make_dsn(
            host=u.host, port=u.port or 5432, user=u.user, password=u.password,
            dbname=u.database or "postgres", connect_timeout=CONNECT_TIMEOUT_S,
        )
        repl = psycopg2.connect(
            dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
        )
        try:
            rcur = repl.cursor()
            rcur.execute(f"CREATE_REPLICATION_SLOT sgs_{secrets.token_hex(8)} TEMPORARY"
                         " LOGICAL pgoutput (SNAPSHOT 'export')")
            _slot, position, snapshot_name, _plugin = rcur.fetchone()
            if not all(c.isalnum() or c == "-" for c in str(snapshot_name)):
                raise Internal(f"unexpected exported snapshot name {snapshot_name!r}")
            cur = self._conn.cursor()
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._in_tx = True
            cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot_name}'")
            cur.execute("SELECT 1")
            cur.fetchall()
            cur.close()
            return str(position)
        finally:
            repl.close()

    def arrow_batches(self, sql: str, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """The result of ``sql`` as Arrow batches (PostgreSQL only)."""
        if self.kind != "postgresql":
            raise FailedPrecondition(f"{self.kind} shards have no Arrow driver: use row_batches")
        self._clean = False
        try:
            cur = self._conn.cursor()
            cur.execute(sql)
            reader = cur.fetch_record_batch()
            try:
                yield from reader
            finally:
                cur.close()
        except ShardgateError:
            raise
        except Exception as exc:
            raise _translate(exc, self.url, "read") from exc
        self._clean = True

    def row_batches(
        self, sql: str, batch_rows: int = BATCH_ROWS
    ) -> Iterator[tuple[list[str], list[tuple[Any, ...]]]]:
        """``(fields, rows)`` batches of ``sql`` as tuples (any backend; MariaDB unbuffered)."""
        self._clean = False
        try:
            if self.kind == "mysql":
                import pymysql.cursors

                with self._conn.cursor(pymysql.cursors.SSCursor) as cur:
                    cur.execute(sql)
                    fields = [d[0] for d in cur.description]
                    while rows := cur.fetchmany(batch_rows):
                        yield fields, [tuple(r) for r in rows]
                return
            cur = self._conn.cursor()
            try:
                cur.execute(sql)
                fields = [d[0] for d in cur.description]
                while rows := cur.fetchmany(batch_rows):
                    yield fields, [tuple(r) for r in rows]
            finally:
                cur.close()
        except ShardgateError:
            raise
        except Exception as exc:
            raise _translate(exc, self.url, "read") from exc
        self._clean = True

    def result_schema(self, sql: str, table: str | None = None) -> pa.Schema:
        """The Arrow schema of ``sql``'s result.

        ``table``: ``sql`` reads that table's columns by name; SQLite then gives
        the declared types, and on SQLite and PostgreSQL the ``NOT NULL``
        columns become non-nullable fields (as Spark's JDBC reader makes them;
        Spark then skips their null checks). MariaDB's result metadata carries
        nullability of its own.
        """
        import pyarrow as pa

        try:
            if self.kind == "postgresql":
                self._clean = False
                cur = self._conn.cursor()
                try:
                    cur.execute(f"SELECT * FROM ({sql}) AS _sg_q LIMIT 0")
                    schema = normalize_schema(cur.fetch_arrow_table().schema)
                    if table is not None:
                        literal = quote_ident("postgresql", table).replace("'", "''")
                        cur.execute(
                            "SELECT attname FROM pg_attribute WHERE attrelid = "
                            f"to_regclass('{literal}') AND attnum > 0 AND attnotnull "
                            "AND NOT attisdropped")
                        schema = not_null(schema, {str(r[0]) for r in cur.fetchall()})
                finally:
                    cur.close()
                self._clean = True
                return schema
            if self.kind == "sqlite":
                if table is not None:
                    cur = self._conn.cursor()
                    try:
                        cur.execute(f"PRAGMA table_info({quote_ident('sqlite', table)})")
                        info = cur.fetchall()
                    finally:
                        cur.close()
                    if not info:
                        raise NotFound(f"table {table!r} does not exist on {self.url.safe}")
                    return pa.schema([pa.field(r[1], sqlite_type(r[2]), nullable=not r[3])
                                      for r in info])
                cur = self._conn.cursor()
                try:
                    cur.execute(f"SELECT * FROM ({sql}) LIMIT 1000")
                    names = [d[0] for d in cur.description]
                    columns = list(zip(*cur.fetchall(), strict=True)) or [()] * len(names)
                finally:
                    cur.close()
                return normalize_schema(pa.schema(
                    [pa.field(n, inferred(c)) for n, c in zip(names, columns, strict=True)]
                ))
            with self._conn.cursor() as cur:
                cur.execute(f"SELECT * FROM ({sql}) AS _sg_q LIMIT 0")
                fields = cur._result.fields
                return pa.schema([mysql_field(f) for f in fields])
        except ShardgateError:
            raise
        except Exception as exc:
            raise _translate(exc, self.url, "schema") from exc


# ----------------------------------------------------------------------- writes --


def run(url: str, statements: Sequence[str], *, transaction: bool = True) -> list[int]:
    """Run ``statements`` (no parameters) in one transaction; rows affected of each."""
    u = parse_url(url)
    counts: list[int] = []
    try:
        if u.kind == "postgresql":
            import psycopg

            with psycopg.connect(_pg_uri(u), autocommit=not transaction) as conn:
                for sql in statements:
                    counts.append(conn.execute(sql).rowcount)
            return counts
        if u.kind == "sqlite":
            db = _sqlite_connect(u)
            try:
                if transaction:
                    db.execute("BEGIN IMMEDIATE")
                for sql in statements:
                    counts.append(db.execute(sql).rowcount)
                if transaction:
                    db.execute("COMMIT")
            finally:
                db.close()
            return counts
        conn = _mysql_connect(u)
        try:
            with conn.cursor() as cur:
                if transaction:
                    cur.execute("START TRANSACTION")
                for sql in statements:
                    counts.append(cur.execute(sql))
                if transaction:
                    cur.execute("COMMIT")
        finally:
            conn.close()
        return counts
    except ShardgateError:
        raise
    except Exception as exc:
        raise _translate(exc, u, "write") from exc


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of one small autocommit query (no parameters)."""
    u = parse_url(url)
    try:
        if u.kind == "postgresql":
            import psycopg

            with psycopg.connect(_pg_uri(u), autocommit=True) as conn:
                return list(conn.execute(sql).fetchall())
        if u.kind == "sqlite":
            db = _sqlite_connect(u)
            try:
                return [tuple(r) for r in db.execute(sql).fetchall()]
            finally:
                db.close()
        conn = _mysql_connect(u)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()
    except ShardgateError:
        raise
    except Exception as exc:
        raise _translate(exc, u, "query") from exc


def byte_order_columns(url: str, table: str) -> set[str]:
    """The (lowercased) columns of ``table`` whose comparisons are exactly byte-wise.

    Those are the only string columns a range filter may be pushed to: under a
    case-insensitive, linguistic or PAD SPACE collation the database's ``>``
    disagrees with Spark's binary one and would drop rows Spark's re-check
    needs. PostgreSQL: the ``C``/``POSIX``/``ucs_basic`` collations (also as the
    database default); MariaDB: ``binary`` and ``*_nopad_bin`` (``*_bin`` pads
    trailing spaces); SQLite: every column of a table declaring no ``COLLATE``.
    Non-string columns are listed too (they have no collation).
    """
    u = parse_url(url)
    lit = "'" + table.replace("'", "''") + "'"
    if u.kind == "sqlite":
        rows = query(url, f"SELECT sql FROM sqlite_master WHERE type = 'table' AND name = {lit}")
        if rows and "COLLATE" in str(rows[0][0] or "").upper():
            return set()
        return {str(r[0]).lower() for r in query(url, f"SELECT name FROM pragma_table_info({lit})")}
    if u.kind == "postgresql":
        rows = query(url, (
            "SELECT a.attname, CASE WHEN a.attcollation = 0 THEN NULL WHEN c.collname = "
            "'default' THEN d.datcollate ELSE c.collname END FROM pg_attribute a "
            "LEFT JOIN pg_collation c ON c.oid = a.attcollation "
            "JOIN pg_database d ON d.datname = current_database() "
            f"WHERE a.attrelid = to_regclass({lit}) AND a.attnum > 0 AND NOT a.attisdropped"))
        return {str(n).lower() for n, coll in rows
                if coll is None or str(coll) in ("C", "POSIX", "ucs_basic")}
    rows = query(url, (
        "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE "
        f"TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {lit}"))
    return {str(n).lower() for n, coll in rows
            if coll is None or str(coll) == "binary" or str(coll).endswith("_nopad_bin")}


def table_schema(url: str, table: str) -> pa.Schema:
    """The Arrow schema of a table as the database declares it."""
    u = parse_url(url)
    with ShardReader(url) as r:
        q = quote_ident(u.kind, table)
        return r.result_schema(f"SELECT * FROM {q}", table=table if u.kind == "sqlite" else None)


def ingest(url: str, table: str, data: pa.Table) -> int:
    """Append ``data`` (columns named as the table's) to ``table``; rows written.

    One transaction per call: all rows or none.
    """
    import pyarrow as pa

    u = parse_url(url)
    if data.num_rows == 0:
        return 0
    try:
        if u.kind == "postgresql":
            import adbc_driver_postgresql.dbapi as adbc_pg

            with adbc_pg.connect(_pg_uri(u)) as conn:
                with conn.cursor() as cur:
                    n = cur.adbc_ingest(table, data, mode="append")
                conn.commit()
            return int(n) if n is not None and n >= 0 else data.num_rows
        cols = ", ".join(quote_ident(u.kind, c) for c in data.column_names)
        rows = list(zip(*(_py_column(c) for c in data.columns), strict=True))
        if u.kind == "sqlite":
            marks = ", ".join("?" for _ in data.column_names)
            db = _sqlite_connect(u)
            try:
                db.execute("BEGIN IMMEDIATE")
                db.executemany(f"INSERT INTO {quote_ident(u.kind, table)} ({cols}) "
                               f"VALUES ({marks})", rows)
                db.execute("COMMIT")
            finally:
                db.close()
            return len(rows)
        marks = ", ".join("%s" for _ in data.column_names)
        conn = _mysql_connect(u)
        try:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION")
                sql = f"INSERT INTO {quote_ident(u.kind, table)} ({cols}) VALUES ({marks})"
                for i in range(0, len(rows), 5000):
                    cur.executemany(sql, rows[i : i + 5000])
                cur.execute("COMMIT")
        finally:
            conn.close()
        return len(rows)
    except (ShardgateError, pa.ArrowException):
        raise
    except Exception as exc:
        raise _translate(exc, u, f"write into {table}") from exc


def _py_column(col: Any) -> list[Any]:
    values: list[Any] = col.to_pylist()
    if values and any(isinstance(v, decimal.Decimal) for v in values[:16]):
        return [str(v) if isinstance(v, decimal.Decimal) else v for v in values]
    return values
