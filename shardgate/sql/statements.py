"""shardgate's and Vitess's own statements, as small frozen dataclasses.

:func:`shardgate.sql.classify.classify` turns SQL text into either a sqlglot
expression (standard SQL the planner routes) or one of these. They are
syntax only: whether a keyspace or shard exists is the gate's business.

``query_type`` is what ``EXPLAIN`` reports for a statement the gate answers
itself (Vitess's ``QueryType``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from sqlglot import exp


class StatementType(StrEnum):
    """What a statement is, as ``EXPLAIN`` and the query statistics report it (Vitess's
    ``QueryType``). The gate's planned statements carry one in
    :attr:`shardgate.engine.plan.Plan.statement_type`."""

    SELECT = "SELECT"
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    DDL = "DDL"
    EXPLAIN = "EXPLAIN"
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    SAVEPOINT = "SAVEPOINT"
    ROLLBACK_TO = "ROLLBACK_TO"
    RELEASE = "RELEASE"
    USE = "USE"
    TRANSACTION_MODE = "TRANSACTION_MODE"
    SET = "SET"
    SHOW = "SHOW"
    #: a statement sent as is to the shard a targeted session names
    TARGETED = "TARGETED"


class TabletType(StrEnum):
    """Which tablets of a shard serve a session's reads outside transactions (Vitess's
    ``USE ks@replica``); writes and transactions always go to the primary."""

    PRIMARY = "primary"
    REPLICA = "replica"
    RDONLY = "rdonly"


@dataclass(frozen=True, slots=True)
class Begin:
    """``BEGIN`` / ``START TRANSACTION``."""

    query_type: ClassVar[StatementType] = StatementType.BEGIN


@dataclass(frozen=True, slots=True)
class Commit:
    """``COMMIT``."""

    query_type: ClassVar[StatementType] = StatementType.COMMIT


@dataclass(frozen=True, slots=True)
class Rollback:
    """``ROLLBACK`` (of the whole transaction)."""

    query_type: ClassVar[StatementType] = StatementType.ROLLBACK


@dataclass(frozen=True, slots=True)
class Savepoint:
    """``SAVEPOINT name`` (``name`` lower-cased: savepoint names ignore case)."""

    name: str
    query_type: ClassVar[StatementType] = StatementType.SAVEPOINT


@dataclass(frozen=True, slots=True)
class RollbackToSavepoint:
    """``ROLLBACK [WORK] TO [SAVEPOINT] name``."""

    name: str
    query_type: ClassVar[StatementType] = StatementType.ROLLBACK_TO


@dataclass(frozen=True, slots=True)
class ReleaseSavepoint:
    """``RELEASE SAVEPOINT name``."""

    name: str
    query_type: ClassVar[StatementType] = StatementType.RELEASE


@dataclass(frozen=True, slots=True)
class Use:
    """``USE ks``, ``USE `ks:-80``` / ``ks/-80`` (a shard), ``USE `ks[<hex>]```.

    ``keyspace_id`` is the keyspace id of the bracket form (the gate resolves
    it to the shard owning it); ``tablet_type`` is Vitess's ``@primary`` suffix.
    """

    keyspace: str
    shard: str | None = None
    keyspace_id: bytes | None = None
    tablet_type: TabletType | None = None
    query_type: ClassVar[StatementType] = StatementType.USE


@dataclass(frozen=True, slots=True)
class SetTransactionMode:
    """``SET [SESSION] transaction_mode = 'twopc'`` (the mode as written)."""

    mode: str
    query_type: ClassVar[StatementType] = StatementType.TRANSACTION_MODE


@dataclass(frozen=True, slots=True)
class SetQueryTimeout:
    """``SET [SESSION] query_timeout_ms = N``: the session's per-statement timeout (0: none)."""

    ms: int
    query_type: ClassVar[StatementType] = StatementType.SET


@dataclass(frozen=True, slots=True)
class ShowVitessShards:
    """``SHOW VITESS_SHARDS [LIKE 'pattern']``: one ``ks/shard`` row per shard."""

    like: str | None = None
    query_type: ClassVar[StatementType] = StatementType.SHOW


@dataclass(frozen=True, slots=True)
class ShowVitessKeyspaces:
    """``SHOW VITESS_KEYSPACES [LIKE 'pattern']`` (also ``SHOW KEYSPACES``)."""

    like: str | None = None
    query_type: ClassVar[StatementType] = StatementType.SHOW


@dataclass(frozen=True, slots=True)
class ShowVitessTablets:
    """``SHOW VITESS_TABLETS [LIKE 'pattern']``: a primary tablet per shard (LIKE: its alias)."""

    like: str | None = None
    query_type: ClassVar[StatementType] = StatementType.SHOW


@dataclass(frozen=True, slots=True)
class ShowShardgateWorker:
    """``SHOW SHARDGATE_WORKER``: which worker process of the gate answers this session
    (``gate --workers N``; see :mod:`shardgate.gate.worker`)."""

    query_type: ClassVar[StatementType] = StatementType.SHOW


@dataclass(frozen=True, slots=True)
class AlterVSchema:
    """``ALTER VSCHEMA ...``: one change to one keyspace's VSchema (Vitess's forms).

    ``keyspace`` is the qualifier written before the table or vindex name
    (``ALTER VSCHEMA ON ks.t ...``), None when unqualified (the session's
    keyspace applies). The subclasses are the forms; the gate turns each into
    a pure edit of the VSchema JSON (:mod:`shardgate.topo.vschema_edits`).
    """

    keyspace: str | None
    query_type: ClassVar[StatementType] = StatementType.DDL


@dataclass(frozen=True, slots=True)
class AddVSchemaTable(AlterVSchema):
    """``ALTER VSCHEMA ADD TABLE [ks.]t`` (unsharded keyspaces, as in Vitess)."""

    table: str


@dataclass(frozen=True, slots=True)
class DropVSchemaTable(AlterVSchema):
    """``ALTER VSCHEMA DROP TABLE [ks.]t``: the VSchema entry only, never the data."""

    table: str


@dataclass(frozen=True, slots=True)
class AddVSchemaSequence(AlterVSchema):
    """``ALTER VSCHEMA ADD SEQUENCE [ks.]s``: a table of type ``sequence``."""

    table: str


@dataclass(frozen=True, slots=True)
class CreateVSchemaVindex(AlterVSchema):
    """``ALTER VSCHEMA CREATE VINDEX [ks.]name USING type [WITH k = v, ...]``."""

    vindex: str
    vindex_type: str
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class DropVSchemaVindex(AlterVSchema):
    """``ALTER VSCHEMA DROP VINDEX [ks.]name`` (refused while a table uses it)."""

    vindex: str


@dataclass(frozen=True, slots=True)
class AddColumnVindex(AlterVSchema):
    """``ALTER VSCHEMA ON [ks.]t ADD VINDEX name(col, ...) [USING type] [WITH k = v, ...]``.

    Without ``USING`` the vindex must already be defined in the keyspace;
    with it, it is created (or must match the existing definition). The
    ``owner`` param is not a vindex param: it makes ``t`` the vindex's owner.
    """

    table: str
    vindex: str
    columns: tuple[str, ...]
    vindex_type: str | None = None
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class DropColumnVindex(AlterVSchema):
    """``ALTER VSCHEMA ON [ks.]t DROP VINDEX name``."""

    table: str
    vindex: str


@dataclass(frozen=True, slots=True)
class AddAutoIncrement(AlterVSchema):
    """``ALTER VSCHEMA ON [ks.]t ADD AUTO_INCREMENT col USING [ks.]seq``."""

    table: str
    column: str
    sequence: str


@dataclass(frozen=True, slots=True)
class DropAutoIncrement(AlterVSchema):
    """``ALTER VSCHEMA ON [ks.]t DROP AUTO_INCREMENT``."""

    table: str


@dataclass(frozen=True, slots=True)
class DropQueueStatement:
    """``DROP QUEUE [IF EXISTS] [ks.]name``: the queue's tables and its VSchema entry."""

    name: str
    keyspace: str | None
    if_exists: bool = False
    query_type: ClassVar[StatementType] = StatementType.DDL


@dataclass(frozen=True, slots=True)
class CreateQueueStatement:
    """``CREATE QUEUE`` as written (see :mod:`shardgate.queues.ddl` for its meaning).

    ``options`` are the ``WITH (key = value, ...)`` pairs in order, keys
    lower-cased and values unquoted but otherwise as written.
    """

    name: str
    keyspace: str | None
    columns: tuple[exp.ColumnDef, ...]
    if_not_exists: bool = False
    shard_column: str | None = None
    vindex: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    query_type: ClassVar[StatementType] = StatementType.DDL


#: Statements that change the session or the transaction, answered by the gate.
SessionControl = (
    Begin | Commit | Rollback | Savepoint | RollbackToSavepoint | ReleaseSavepoint | Use
    | SetTransactionMode | SetQueryTimeout
)

#: Statements the gate answers from its topology, or refuses until their feature comes.
GateStatement = (
    SessionControl | ShowVitessShards | ShowVitessKeyspaces | ShowVitessTablets
    | ShowShardgateWorker | AlterVSchema
)

#: What :func:`shardgate.sql.classify.classify` returns.
Statement = exp.Expression | GateStatement | CreateQueueStatement | DropQueueStatement


def like_match(text: str, pattern: str) -> bool:
    """Whether ``text`` matches the SQL LIKE ``pattern`` (``%``, ``_``, ``\\`` escapes;
    case-insensitive, as MySQL's default collation)."""
    parts: list[str | None] = []  # None is '%', '' is '_', else one literal character
    chars = iter(pattern.lower())
    for c in chars:
        if c == "\\":
            parts.append(next(chars, "\\"))
        else:
            parts.append(None if c == "%" else "" if c == "_" else c)
    text = text.lower()
    # reach[i]: the pattern parts seen so far can match text[:i]
    reach = [True] + [False] * len(text)
    for part in parts:
        if part is None:
            for i in range(1, len(text) + 1):
                reach[i] = reach[i] or reach[i - 1]
        else:
            reach = [False] + [reach[i] and (part == "" or text[i] == part)
                               for i in range(len(text))]
    return reach[len(text)]
