"""Schema tracking (Vitess's vtgate schema tracker): each keyspace's columns, read from
its first shard, for the planner.

The planner receives the tracked columns as data (:class:`~shardgate.sql.schema.Schema`
in its planning context, :meth:`~shardgate.vschema.VSchema.with_schema`) and asks for
a keyspace it lacks by raising :class:`~shardgate.sql.schema.ColumnsUnknown`; the
gate then :meth:`SchemaTracker.load`\\ s that keyspace and plans again. Every shard of
a keyspace has the same schema (DDL goes through the gate to all of them), so the
first shard speaks for the keyspace; the SQL that lists the columns is the
dialect object's (:meth:`~shardgate.sql.dialects.base.SQLDialect.schema_columns_sql`).

What is read is kept per keyspace until the gate forgets it: on every DDL through the
gate (before and after it runs) and on every new topology (VSchema or shards), as the
gate forgets cached column kinds (:meth:`~shardgate.gate.catalog.Catalog.forget`).
DDL that reaches the shards another way (a targeted session, another gate, the
database itself) is seen after the next topology change or :meth:`SchemaTracker.forget`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from shardgate.aio import wait_for
from shardgate.errors import ShardgateError
from shardgate.gate.catalog import is_internal
from shardgate.sql.dialects import sql_dialect
from shardgate.sql.schema import EMPTY, ColumnInfo, KeyspaceSchema, Schema, TableColumns
from shardgate.tablet import TabletClient

#: how long a keyspace whose columns could not be read stays refused before a
#: statement that needs them reads again
RETRY_S = 2.0
#: the longest wait for a keyspace's columns (a shard that does not answer)
READ_TIMEOUT_S = 10.0

FirstShard = Callable[[str], tuple[tuple[str, str], TabletClient]]


class SchemaTracker:
    """The columns of each keyspace's tables, read on demand and kept until forgotten.

    Invariants: :attr:`schema` holds only keyspaces read since they were last
    forgotten: a read that started before a :meth:`forget` is not kept (the
    generation counter), so an answer is never older than the last DDL through
    the gate; a failed read is kept as the keyspace's ``error`` for
    :data:`RETRY_S`, then the keyspace is read again when a statement needs it;
    one read per keyspace runs at a time (callers asking meanwhile wait for it).
    """

    def __init__(self, first_shard: FirstShard,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first_shard = first_shard
        self._clock = clock
        self._schema: Schema = EMPTY
        #: when each failed keyspace may be read again
        self._retry_at: dict[str, float] = {}
        self._generation = 0
        self._reads: dict[str, asyncio.Task[None]] = {}
        #: reads run so far (each keyspace read counts once)
        self.reads = 0

    @property
    def schema(self) -> Schema:
        """The columns read so far (failed keyspaces past their retry time left out)."""
        if self._retry_at:
            now = self._clock()
            expired = [ks for ks, at in self._retry_at.items() if at <= now]
            if expired:
                for ks in expired:
                    del self._retry_at[ks]
                self._schema = Schema({k: v for k, v in self._schema.keyspaces.items()
                                       if k not in expired})
        return self._schema

    def forget(self, keyspace: str | None = None) -> None:
        """Drop what was read (of ``keyspace``, or of every keyspace): a DDL or a new
        topology may have changed it. Reads in flight are not kept."""
        self._generation += 1
        if keyspace is None:
            self._schema, self._retry_at = EMPTY, {}
            return
        self._retry_at.pop(keyspace, None)
        self._schema = Schema({k: v for k, v in self._schema.keyspaces.items()
                               if k != keyspace})

    async def load(self, keyspace: str) -> None:
        """Read ``keyspace``'s columns unless they are known (a failure is kept as
        the keyspace's ``error``, never raised)."""
        if keyspace in self.schema.keyspaces:
            return
        task = self._reads.get(keyspace)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._read(keyspace, self._generation))
            self._reads[keyspace] = task
            task.add_done_callback(lambda _t: self._reads.pop(keyspace, None))
        await asyncio.shield(task)

    async def _read(self, keyspace: str, generation: int) -> None:
        self.reads += 1
        try:
            found = await wait_for(self._columns(keyspace), READ_TIMEOUT_S)
        except ShardgateError as exc:
            found = KeyspaceSchema(error=f"its first shard did not answer: {exc}")
        except TimeoutError:
            found = KeyspaceSchema(error=f"its first shard did not answer in {READ_TIMEOUT_S:g}s")
        if generation != self._generation:
            return  # forgotten meanwhile: what was read may be older than a DDL
        if found.error is not None:
            self._retry_at[keyspace] = self._clock() + RETRY_S
        self._schema = self._schema.with_keyspace(keyspace, found)

    async def _columns(self, keyspace: str) -> KeyspaceSchema:
        _, tablet = self._first_shard(keyspace)
        sql = sql_dialect(tablet.dialect).schema_columns_sql()
        tables: dict[str, list[ColumnInfo]] = {}
        for table, column, declared in (await tablet.execute(sql, [])).rows:
            if not is_internal(str(table)):
                tables.setdefault(str(table), []).append(
                    ColumnInfo(str(column), str(declared or "").lower()))
        return KeyspaceSchema.of(TableColumns(t, tuple(cols)) for t, cols in tables.items())
