"""The inbox store's SQL: table DDL per dialect, the catalog query, and the gate statements.

DDL and catalog queries go to every shard's tablet directly (they are the same
on every shard); appends, reads and pointer commits are ordinary statements
the gate routes by the user column (the tables are in the VSchema), so they
join the caller's session and transaction.

Tables (``<name>`` is the inbox name):

* ``<name>_<yyyymmdd>`` (``_<yyyymm>`` monthly, ``_<yyyymmddhh>`` hourly): one
  bucket, ``(user_id, ts, msg_id, body)``, primary key ``(user_id, ts, msg_id)``
  so a user's read is one index range scan (clustered: ``WITHOUT ROWID`` on
  SQLite, InnoDB's primary key on MariaDB).
* ``<name>_pointers``: ``(user_id, consumer, ts, msg_id, recent, updated_at)``,
  primary key ``(user_id, consumer)``: one row per user and consumer.
"""

from __future__ import annotations

from shardgate.errors import InvalidArgument
from shardgate.sql.dialects import Dialect, sql_dialect

#: the user column's type per inbox ``user_type`` (the same in every dialect)
_USER = {"bigint": "BIGINT", "varchar": "VARCHAR(255)"}
_TEXT = {Dialect.SQLITE: "TEXT", Dialect.POSTGRES: "TEXT", Dialect.MYSQL: "MEDIUMTEXT"}
#: Rows stored in primary key order, so a user's messages are adjacent (InnoDB always is).
_CLUSTERED = {Dialect.SQLITE: " WITHOUT ROWID", Dialect.POSTGRES: "", Dialect.MYSQL: ""}


def _check_dialect(dialect: Dialect) -> None:
    if dialect not in _TEXT:
        raise InvalidArgument(f"inbox store: unknown dialect {dialect!r}")


def bucket_ddl(table: str, dialect: Dialect, *, user_type: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of one bucket table."""
    _check_dialect(dialect)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (user_id {_USER[user_type]} NOT NULL, "
        f"ts BIGINT NOT NULL, msg_id BIGINT NOT NULL, body {_TEXT[dialect]}, "
        f"PRIMARY KEY (user_id, ts, msg_id)){_CLUSTERED[dialect]}"
    )


def pointers_ddl(table: str, dialect: Dialect, user_type: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the pointer table."""
    _check_dialect(dialect)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (user_id {_USER[user_type]} NOT NULL, "
        "consumer VARCHAR(64) NOT NULL, ts BIGINT NOT NULL, msg_id BIGINT NOT NULL, "
        f"recent {_TEXT[dialect]}, updated_at BIGINT NOT NULL, "
        f"PRIMARY KEY (user_id, consumer)){_CLUSTERED[dialect]}"
    )


#: One row per inbox of the shard's database: its name and stored options (JSON).
OPTIONS_TABLE = "_sg_inboxes"


def options_ddl(dialect: Dialect) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the table of inboxes and their options."""
    _check_dialect(dialect)
    return (f"CREATE TABLE IF NOT EXISTS {OPTIONS_TABLE} (name VARCHAR(64) NOT NULL "
            f"PRIMARY KEY, options {_TEXT[dialect]} NOT NULL, created_at BIGINT NOT NULL)")


def placeholder(dialect: Dialect) -> str:
    return sql_dialect(dialect).placeholder


def options_select_sql(dialect: Dialect) -> str:
    return f"SELECT options FROM {OPTIONS_TABLE} WHERE name = {placeholder(dialect)}"


def options_insert_sql(dialect: Dialect) -> str:
    ph = placeholder(dialect)
    return f"INSERT INTO {OPTIONS_TABLE} (name, options, created_at) VALUES ({ph}, {ph}, {ph})"


def options_delete_sql(dialect: Dialect) -> str:
    return f"DELETE FROM {OPTIONS_TABLE} WHERE name = {placeholder(dialect)}"


def options_list_sql() -> str:
    return f"SELECT name, options FROM {OPTIONS_TABLE} ORDER BY name"


def drop_ddl(table: str) -> str:
    return f"DROP TABLE IF EXISTS {table}"


def list_tables_sql(dialect: Dialect) -> str:
    """The names of the tables of the shard's database (schema)."""
    _check_dialect(dialect)
    return sql_dialect(dialect).tables_sql()


# Gate statements (named bind variables; the gate rewrites them per dialect).


def insert_sql(table: str) -> str:
    return (f"INSERT INTO {table} (user_id, ts, msg_id, body) "
            "VALUES (:user_id, :ts, :msg_id, :body)")


def scan_sql(table: str, limit: int) -> str:
    """A user's messages from ``ts >= :lo``, in position order."""
    return (f"SELECT ts, msg_id, body FROM {table} WHERE user_id = :user_id AND ts >= :lo "
            f"ORDER BY ts, msg_id LIMIT {int(limit)}")


def scan_after_sql(table: str, limit: int) -> str:
    """The next page: positions after ``(:ts, :msg_id)``."""
    return (f"SELECT ts, msg_id, body FROM {table} WHERE user_id = :user_id AND "
            "(ts > :ts OR (ts = :ts AND msg_id > :msg_id)) "
            f"ORDER BY ts, msg_id LIMIT {int(limit)}")


def pointer_select_sql(table: str) -> str:
    return (f"SELECT ts, msg_id, recent FROM {table} "
            "WHERE user_id = :user_id AND consumer = :consumer")


def pointer_update_sql(table: str) -> str:
    return (f"UPDATE {table} SET ts = :ts, msg_id = :msg_id, recent = :recent, "
            "updated_at = :updated_at WHERE user_id = :user_id AND consumer = :consumer")


def pointer_insert_sql(table: str) -> str:
    return (f"INSERT INTO {table} (user_id, consumer, ts, msg_id, recent, updated_at) "
            "VALUES (:user_id, :consumer, :ts, :msg_id, :recent, :updated_at)")
