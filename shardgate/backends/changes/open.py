"""The change log of a shard database: picks the reader for the database's kind.

The types every reader shares live in :mod:`shardgate.backends.changes`; the
readers in ``changes_sqlite``, ``changes_postgres`` and ``changes_mysql``.
"""

from __future__ import annotations

from typing import Any

from shardgate.backends.base import Backend
from shardgate.backends.changes import ChangeLog
from shardgate.backends.urls import parse_url


def open_change_log(url: str, shard: str, **options: Any) -> ChangeLog:
    """The change log of a shard database URL (``shard`` is ``keyspace/shard``).

    Imports only the reader of the URL's kind (a Spark task or a streaming
    source's planner process starts by importing this module: the MariaDB
    binlog client is a fifth of that for a PostgreSQL keyspace)."""
    kind = parse_url(url).kind
    match kind:
        case "sqlite":
            from shardgate.backends.changes.sqlite import SQLiteChangeLog

            return SQLiteChangeLog(url, shard, **options)
        case "postgresql":
            from shardgate.backends.changes.postgres import PostgresChangeLog

            return PostgresChangeLog(url, shard, **options)
        case "mysql":
            from shardgate.backends.changes.mysql import MySQLChangeLog

            return MySQLChangeLog(url, shard, **options)
    raise AssertionError(f"unknown backend kind {kind!r}")  # pragma: no cover


async def capture_exists(backend: Backend) -> bool:
    """Whether the database has shardgate's change capture (a PostgreSQL anchor slot,
    SQLite's change table; MariaDB: always, the binlog is the server's and nothing is
    created per database, so a workflow never drops it)."""
    match backend.dialect:
        case "postgres":
            sql = ("SELECT 1 FROM pg_replication_slots WHERE database = current_database() "
                   "AND left(slot_name, 4) = 'sga_'")
        case "sqlite":
            sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sg_changes'"
        case "mysql":
            return True
        case _:
            return False
    return bool((await backend.execute(sql)).rows)
