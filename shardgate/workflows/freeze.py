"""Frozen shards that the workflow's own appliers may still write.

A reshard's write cut-over makes shards refuse writes to the moving tables
(triggers whose error carries :data:`~shardgate.topo.model.WRITES_FROZEN`):
the sources after the write switch, the targets after ``reverse-traffic``.
They stay frozen while they are pending, so a gate that has not yet read the
new topology is refused (and holds its write) rather than writing where
nothing replicates from. Yet a frozen shard still receives the workflow's
catch-up (the reverse stream writes the frozen sources; the forward stream,
after a reverse, the frozen targets). The triggers therefore let through a
transaction that says it is the applier's:

PostgreSQL
    the transaction-local setting :data:`PG_SETTING` is ``on``
    (``set_config(..., true)``: it ends with the transaction, and no other
    session sees it).
SQLite
    the table :data:`MARK_TABLE` has a row. The applier inserts it first and
    deletes it last in its own transaction; SQLite has one writer at a time
    and readers see only committed rows, so no other writer ever sees it.
MariaDB
    the session's user variable :data:`MYSQL_VARIABLE` is 1 (MariaDB has no
    transaction-local setting). The applier sets it first in its transaction
    and clears it last; a transaction that fails between marks its connection
    broken, so the pool closes it instead of lending it with the variable set
    (:meth:`ApplyPass.abandon`). The workflow's backends are its own: no gate
    session ever sets it.

Each dialect's statements are one object (a ``_Freeze``, keyed by
:class:`~shardgate.sql.dialects.Dialect`): this package's own SQL (its
triggers carry :data:`~shardgate.topo.model.WRITES_FROZEN`, which the dialect
objects below ``topo`` cannot name).

Invariant: outside an applier's transaction a frozen table refuses every
write (the mark is never committed, the setting never outlives the
transaction, the variable never outlives the applier's use of its session).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from shardgate.backends._pool import PooledConnection
from shardgate.backends.base import Backend, Connection
from shardgate.errors import Aborted, Unsupported
from shardgate.sql.dialects import Dialect
from shardgate.topo.model import WRITES_FROZEN
from shardgate.workflows.rowsql import quote

#: SQLite: the table whose (uncommitted) row lets the applier's writes through
MARK_TABLE = "_sg_reshard_apply"
#: PostgreSQL: the transaction-local setting that lets the applier's writes through
PG_SETTING = "shardgate.reshard_apply"
#: MariaDB: the session's user variable (``@...``) that lets the applier's writes through
MYSQL_VARIABLE = "_sg_reshard_apply"

_MESSAGE = f"{WRITES_FROZEN}: writes paused for a reshard cut-over"

#: PostgreSQL: the function the freeze triggers run
PG_DENY_FUNCTION = (
    "CREATE OR REPLACE FUNCTION _sg_deny_writes() RETURNS trigger LANGUAGE plpgsql AS $$ "
    f"BEGIN IF current_setting('{PG_SETTING}', true) = 'on' THEN "
    "IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END IF; "
    f"RAISE EXCEPTION '{_MESSAGE}' USING ERRCODE = '55000'; END $$")

#: SQLite: the marker table (created with the freeze triggers)
SQLITE_MARK_DDL = f"CREATE TABLE IF NOT EXISTS {MARK_TABLE} (k INTEGER PRIMARY KEY)"


def sqlite_deny_trigger(trigger: str, op: str, table: str) -> str:
    """A SQLite trigger refusing ``op`` on ``table`` (names quoted) but the applier's."""
    return (f"CREATE TRIGGER IF NOT EXISTS {trigger} BEFORE {op} ON {table} "
            f"WHEN NOT EXISTS (SELECT 1 FROM {MARK_TABLE}) BEGIN "
            f"SELECT RAISE(ABORT, '{_MESSAGE}'); END")


#: freezing (or unfreezing) a shard: tries when its statements lose a lock conflict
FREEZE_ATTEMPTS = 4
_OPS = ("INSERT", "UPDATE", "DELETE")
log = logging.getLogger(__name__)


class _Freeze:
    """One dialect's freeze: the statement a freeze runs first, each table's triggers,
    and what the applier runs around each of its transactions to write through them."""

    #: run first when freezing (the trigger function, the marker table)
    first: str | None = None

    def table(self, table: str, on: bool) -> list[str]:
        """The statements freezing (``on``) or unfreezing ``table`` (idempotent)."""
        raise NotImplementedError

    async def begin(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        """The applier's first statement in a transaction."""

    async def end(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        """The applier's last statement before COMMIT."""

    def abandon(self, conn: Connection) -> None:
        """A transaction of the applier failed after :meth:`begin`."""


class _SQLiteFreeze(_Freeze):
    first = SQLITE_MARK_DDL

    def table(self, table: str, on: bool) -> list[str]:
        t = quote(Dialect.SQLITE, table)
        out = []
        for op in _OPS:
            trig = quote(Dialect.SQLITE, f"_sg_deny_{op.lower()}_{table}")
            out.append(sqlite_deny_trigger(trig, op, t) if on
                       else f"DROP TRIGGER IF EXISTS {trig}")
        return out

    async def begin(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        if await apply._has_mark(backend, conn):
            await conn.execute(f"INSERT OR REPLACE INTO {MARK_TABLE} (k) VALUES (1)")

    async def end(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        if apply._marked.get(id(backend)):
            await conn.execute(f"DELETE FROM {MARK_TABLE}")


class _PostgresFreeze(_Freeze):
    first = PG_DENY_FUNCTION

    def table(self, table: str, on: bool) -> list[str]:
        trig = quote(Dialect.POSTGRES, f"_sg_deny_{table}")
        t = quote(Dialect.POSTGRES, table)
        out = [f"DROP TRIGGER IF EXISTS {trig} ON {t}"]
        if on:
            out.append(f"CREATE TRIGGER {trig} BEFORE INSERT OR UPDATE OR DELETE ON {t} "
                       "FOR EACH ROW EXECUTE FUNCTION _sg_deny_writes()")
        return out

    async def begin(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        await conn.execute(f"SELECT set_config('{PG_SETTING}', 'on', true)")


class _MySQLFreeze(_Freeze):
    def table(self, table: str, on: bool) -> list[str]:
        """``CREATE OR REPLACE``: a trigger an older version left (refusing the applier
        too) is replaced by one that lets the applier through. Creating (or replacing)
        a trigger takes the table's exclusive metadata lock, so it waits for the
        transactions that wrote the table to end: after it, no write in flight can
        still commit."""
        out = []
        for op in _OPS:
            trig = quote(Dialect.MYSQL, f"_sg_deny_{op.lower()}_{table}")
            if not on:
                out.append(f"DROP TRIGGER IF EXISTS {trig}")
            else:
                out.append(
                    f"CREATE OR REPLACE TRIGGER {trig} BEFORE {op} ON "
                    f"{quote(Dialect.MYSQL, table)} "
                    f"FOR EACH ROW IF COALESCE(@{MYSQL_VARIABLE}, 0) <> 1 THEN "
                    f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{_MESSAGE}'; END IF")
        return out

    async def begin(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        await conn.execute(f"SET @{MYSQL_VARIABLE} = 1")

    async def end(self, apply: ApplyPass, backend: Backend, conn: Connection) -> None:
        await conn.execute(f"SET @{MYSQL_VARIABLE} = NULL")

    def abandon(self, conn: Connection) -> None:
        # the session may still carry the variable: the pool must close it
        if isinstance(conn, PooledConnection):
            conn.broken = True


_FREEZE: dict[Dialect, _Freeze] = {
    Dialect.SQLITE: _SQLiteFreeze(),
    Dialect.POSTGRES: _PostgresFreeze(),
    Dialect.MYSQL: _MySQLFreeze(),
}


def _freeze_of(dialect: Dialect) -> _Freeze:
    if dialect not in _FREEZE:
        raise Unsupported(f"write cut-over on {dialect} shards is not implemented")
    return _FREEZE[dialect]


def table_freeze_sql(dialect: Dialect, table: str, on: bool) -> list[str]:
    """The statements that make ``table`` refuse (``on``) or accept again writes but
    the applier's (idempotent)."""
    return _freeze_of(dialect).table(table, on)


def freeze_statements(dialect: Dialect, tables: Sequence[str], on: bool) -> list[str]:
    """Everything a freeze (``on``) or unfreeze of ``tables`` runs, in order: the
    trigger function or marker table first (freezing), then each table's triggers."""
    freeze = _freeze_of(dialect)
    out = [freeze.first] if on and freeze.first else []
    for table in tables:
        out += freeze.table(table, on)
    return out


async def set_frozen(backend: Backend, tables: Sequence[str], on: bool, *,
                     record: str) -> None:
    """Make ``backend`` refuse (``on``) or accept again writes to ``tables`` (but the
    applier's) for workflow ``record``.

    The statements are idempotent: a run that lost a lock conflict (``ABORTED``: a
    SQLite shard held by writers that wait on each other across shards, a deadlock)
    is run again, all of it, up to :data:`FREEZE_ATTEMPTS` times.
    """
    stmts = freeze_statements(backend.dialect, tables, on)
    for attempt in range(FREEZE_ATTEMPTS):
        try:
            conn = await backend.acquire()
            try:
                for sql in stmts:
                    await conn.execute(sql)
            finally:
                await backend.release(conn)
            return
        except Aborted:
            if attempt == FREEZE_ATTEMPTS - 1:
                raise
            log.info("%s: %s a shard met a lock conflict; again", record,
                     "freezing" if on else "unfreezing")
            await asyncio.sleep(0.05 * (attempt + 1))


class ApplyPass:
    """What an applier runs in each of its transactions to write through a freeze."""

    def __init__(self) -> None:
        #: SQLite databases (by backend id) known to have the marker table
        self._marked: dict[int, bool] = {}

    async def begin(self, backend: Backend, conn: Connection) -> None:
        """First statement of an applier's transaction on ``backend``."""
        await _FREEZE[backend.dialect].begin(self, backend, conn)

    async def end(self, backend: Backend, conn: Connection) -> None:
        """Last statement of an applier's transaction on ``backend`` (before COMMIT)."""
        await _FREEZE[backend.dialect].end(self, backend, conn)

    @staticmethod
    def abandon(backend: Backend, conn: Connection) -> None:
        """An applier's transaction on ``backend`` failed after :meth:`begin`: on
        MariaDB its session may still carry the variable, so the pool must close it."""
        _FREEZE[backend.dialect].abandon(conn)

    async def _has_mark(self, backend: Backend, conn: Connection) -> bool:
        key = id(backend)
        if key not in self._marked:
            res = await conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                     f"AND name = '{MARK_TABLE}'")
            self._marked[key] = bool(res.rows)
        return self._marked[key]
