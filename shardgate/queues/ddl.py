"""``CREATE QUEUE`` and the per-dialect DDL of a queue table.

Gate syntax (sqlglot does not know it: :func:`shardgate.sql.classify.classify`
reads it into a :class:`~shardgate.sql.statements.CreateQueueStatement`)::

    CREATE QUEUE [IF NOT EXISTS] [keyspace.]name (user column definitions, ...)
        [SHARD BY column [USING vindex]] [WITH (option = value, ...)]

It creates on every shard of the keyspace a table holding the mandatory
columns followed by the user's, its two scan indexes (plus one per ordering /
group key column), and the comment marker ``shardgate_queue,option=value,...``
(a table comment on PostgreSQL and MariaDB, a comment inside the statement
that SQLite keeps in ``sqlite_master``), so a tablet recognises a queue table
from the database alone. Then it adds the table to the keyspace's VSchema as
``type: "queue"``. In a sharded keyspace ``SHARD BY`` names the column (and
vindex, default ``hash``) that places each event.

Mandatory columns: ``id`` (64-bit, random by default so inserts spread over
the primary key instead of hitting one hot spot), ``time_scheduled``
(nanoseconds, default now), ``time_next`` (default 0, never NULL),
``epoch`` (times fired), ``state``, ``time_acked``, ``priority``.

``WITH (storage = segmented)`` creates a segmented queue instead
(:mod:`shardgate.queues.segmented`): its tables are the segmented store's
(catalog, datasets, status tables, the ``<q>_job_state`` view), not a queue
table. Its column list names the job key (the ``SHARD BY`` column, or the
first column in an unsharded keyspace) and at most one more column, the
payload (text); receivers see them as ``job_key`` and ``payload``. The
``SHARD BY`` vindex must be functional and single-column (``hash``,
``xxhash``, ``numeric``, ...), and ``ordering_key`` / ``group_key`` do not
apply (a segmented queue always keeps per-key order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from shardgate.errors import InvalidArgument
from shardgate.queues.events import MANDATORY_COLUMNS
from shardgate.queues.options import QueueOptions
from shardgate.sql.classify import create_queue_statement, head_words
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.statements import CreateQueueStatement
from shardgate.vschema import TableType

#: the word a queue table's comment marker starts with
MARKER = "shardgate_queue"
#: whether ``CREATE QUEUE IF NOT EXISTS`` also writes ``CREATE INDEX IF NOT EXISTS``
#: (MariaDB's queue indexes are created without it, as they always were)
_INDEX_IF_NOT_EXISTS = {Dialect.SQLITE: True, Dialect.POSTGRES: True, Dialect.MYSQL: False}


def is_create_queue(sql: str) -> bool:
    """Whether ``sql`` is a ``CREATE QUEUE`` statement (cheap: reads two words)."""
    return head_words(sql, 2) == ("create", "queue")


@dataclass
class CreateQueue:
    """A parsed ``CREATE QUEUE``."""

    name: str
    keyspace: str | None
    columns: list[exp.ColumnDef]
    if_not_exists: bool = False
    shard_column: str | None = None
    vindex: str = "hash"
    options: QueueOptions = field(default_factory=QueueOptions)
    raw_options: dict[str, Any] = field(default_factory=dict)

    def vschema_table(self) -> dict[str, Any]:
        """The VSchema entry of the queue table."""
        doc: dict[str, Any] = {"type": TableType.QUEUE.value}
        if self.raw_options:
            doc["queue"] = dict(self.raw_options)
        if self.shard_column:
            doc["column_vindexes"] = [{"column": self.shard_column, "name": self.vindex}]
        return doc

    @property
    def segmented(self) -> bool:
        """Whether this creates a segmented queue (``WITH (storage = segmented)``)."""
        return self.options.storage == "segmented"

    def table_ddl(self, dialect: Dialect) -> list[str]:
        """CREATE TABLE and CREATE INDEX statements for ``dialect``."""
        return queue_table_ddl(self.name, self.columns, self.options, dialect,
                               if_not_exists=self.if_not_exists)


def parse_create_queue(sql: str) -> CreateQueue:
    """Parse ``CREATE QUEUE``; raise ``InvalidArgument`` naming what is wrong."""
    return create_queue_from(create_queue_statement(sql))


def create_queue_from(stmt: CreateQueueStatement) -> CreateQueue:
    """The queue a classified ``CREATE QUEUE`` declares, its columns and options checked."""
    columns = list(stmt.columns)
    for c in columns:
        if c.name.lower() in MANDATORY_COLUMNS:
            raise InvalidArgument(
                f"CREATE QUEUE: column {c.name!r} is a mandatory queue column; "
                f"user columns may not be named {list(MANDATORY_COLUMNS)}"
            )
    names = {c.name.lower() for c in columns}
    if stmt.shard_column is not None and stmt.shard_column not in names:
        raise InvalidArgument(
            f"CREATE QUEUE: SHARD BY column {stmt.shard_column!r} is not in the column list"
        )
    cq = CreateQueue(name=stmt.name, keyspace=stmt.keyspace, columns=columns,
                     if_not_exists=stmt.if_not_exists, shard_column=stmt.shard_column,
                     vindex=stmt.vindex or "hash")
    cq.raw_options = {key: _number(value) for key, value in stmt.options}
    cq.options = QueueOptions.from_mapping(cq.raw_options, path=f"queue {cq.name}")
    if cq.segmented:
        _check_segmented(cq)
    for opt in ("ordering_key", "group_key"):
        col = getattr(cq.options, opt)
        if col is not None and col not in names:
            raise InvalidArgument(f"CREATE QUEUE: {opt} {col!r} is not a column of the queue")
    return cq


def _check_segmented(cq: CreateQueue) -> None:
    """A segmented queue's column list is its key and at most one payload column."""
    if not cq.columns or len(cq.columns) > 2:
        raise InvalidArgument(
            f"CREATE QUEUE {cq.name} WITH (storage = segmented): a segmented queue holds a key "
            "and a text payload; give the key column (SHARD BY) and at most one payload "
            f"column, not {len(cq.columns)} columns")
    if cq.options.ordering_key is not None or cq.options.group_key is not None:
        raise InvalidArgument(
            f"CREATE QUEUE {cq.name}: ordering_key and group_key do not apply to a segmented "
            "queue (it keeps the order of each SHARD BY key's jobs)")
    key = cq.shard_column or cq.columns[0].name.lower()
    if len(cq.columns) == 2:
        payload = next(c for c in cq.columns if c.name.lower() != key)
        kind = payload.args.get("kind")
        if kind is not None and not kind.is_type(*exp.DataType.TEXT_TYPES):
            raise InvalidArgument(
                f"CREATE QUEUE {cq.name}: the payload column {payload.name!r} of a segmented "
                f"queue must be text (TEXT, VARCHAR, ...), not {kind.sql()}")


def _number(v: str) -> Any:
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def _defaults(dialect: Dialect) -> dict[str, str]:
    """The mandatory columns' defaults on ``dialect`` (``time_acked`` has none): ``id``
    is random (inserts spread over the primary key), ``time_scheduled`` the database's
    clock in ns."""
    d = sql_dialect(dialect)
    return {"id": d.random_id_sql, "time_scheduled": d.now_ns_sql, "time_next": "0",
            "epoch": "0", "state": "'to_be_fired'", "priority": "0"}


def queue_table_ddl(
    name: str,
    user_columns: list[exp.ColumnDef],
    options: QueueOptions,
    dialect: Dialect,
    *,
    if_not_exists: bool = False,
) -> list[str]:
    """The statements creating queue table ``name`` on one shard of ``dialect``."""
    target = sql_dialect(dialect)
    q = target.quote(name)
    ine = "IF NOT EXISTS " if if_not_exists else ""
    d = _defaults(dialect)
    cols = [
        f"id BIGINT NOT NULL DEFAULT {d['id']} PRIMARY KEY",
        f"time_scheduled BIGINT NOT NULL DEFAULT {d['time_scheduled']}",
        f"time_next BIGINT NOT NULL DEFAULT {d['time_next']}",
        f"epoch INT NOT NULL DEFAULT {d['epoch']}",
        f"state VARCHAR(16) NOT NULL DEFAULT {d['state']}",
        "time_acked BIGINT NULL",
        f"priority INT NOT NULL DEFAULT {d['priority']}",
    ]
    cols += [c.sql(dialect=dialect) for c in user_columns]
    comment = target.table_comment(q, options.to_comment())
    if comment.inner:  # one column a line, the marker first
        body = ",\n  ".join(cols)
        create = f"CREATE TABLE {ine}{q} (\n  {comment.inner}\n  {body}\n)"
    else:
        create = f"CREATE TABLE {ine}{q} ({', '.join(cols)}){comment.suffix}"
    idx_ine = "IF NOT EXISTS " if if_not_exists and _INDEX_IF_NOT_EXISTS[dialect] else ""
    return [create, *comment.after, *_scan_indexes(name, options, dialect, idx_ine)]


def _scan_indexes(name: str, options: QueueOptions, dialect: Dialect, ine: str) -> list[str]:
    """``CREATE INDEX`` of a queue table's scan indexes and its ordering/group keys.

    PostgreSQL and SQLite get one partial index per scanned state: new events by
    ``time_scheduled``, fired ones and acked ones (the purge) by ``time_next``.
    Each write of an event's life (insert, fire, ack) then adds one scan-index
    entry, not one to each index, and a scan reads only its state's entries.
    MariaDB has no partial indexes: ``(state, time_scheduled)`` and ``(state,
    time_next)`` serve the same scans there."""
    target = sql_dialect(dialect)
    q = target.quote(name)
    indexes: list[tuple[str, str]]
    if target.partial_indexes:
        indexes = [("due", "(time_scheduled) WHERE state = 'to_be_fired'"),
                   ("next", "(time_next) WHERE state = 'fired'"),
                   ("acked", "(time_next) WHERE state = 'acked'")]
    else:
        indexes = [("due", "(state, time_scheduled)"), ("next", "(state, time_next)")]
    for opt in (options.ordering_key, options.group_key):
        if opt is not None:
            indexes.append((opt, f"({target.quote(opt)})"))
    return [f"CREATE INDEX {ine}{target.quote(f'{name}_sg_{suffix}')} ON {q} {cols_sql}"
            for suffix, cols_sql in indexes]


def queue_table_extras(name: str, options: QueueOptions, dialect: Dialect, *,
                       comment: bool = True) -> list[str]:
    """What makes an existing copy of queue table ``name`` (its columns and primary
    key, e.g. a reshard target's) a queue table like :func:`queue_table_ddl` would
    create: the mandatory columns' defaults, the comment marker (``comment``; not
    on SQLite, whose marker lives in the ``CREATE TABLE`` statement) and the scan
    indexes. Idempotent."""
    target = sql_dialect(dialect)
    q = target.quote(name)
    out: list[str] = []
    for col, expr in _defaults(dialect).items():
        default = target.set_default(q, col, expr)
        if default is not None:
            out.append(default)
    marker = target.comment_on_table(q, options.to_comment()) if comment else None
    if marker is not None:
        out.append(marker)
    return out + _scan_indexes(name, options, dialect, "IF NOT EXISTS ")


def detect_sql(dialect: Dialect) -> str:
    """SQL listing ``(table, comment)`` of the tables that may carry the queue marker."""
    return sql_dialect(dialect).commented_tables_sql(MARKER)


def comment_of(dialect: Dialect, text: str) -> str:
    """The marker inside what :func:`detect_sql` returned for one table."""
    return sql_dialect(dialect).comment_from(text, MARKER)
