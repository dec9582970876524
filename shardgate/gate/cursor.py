"""The cursors primitives execute through: one session's shard calls and lookups.

As Vitess's ``vcursor_impl``: a :class:`SessionCursor` is made per statement
for one session; it picks each shard's tablet (of the session's tablet type
outside a transaction), joins the session's open transaction on a shard the
first time a statement reaches it, renders the query for that shard's dialect,
and records each call on the gate's timeline. A :class:`LookupCursor` is what
lookup vindexes run their SQL through: gate SQL, planned and routed like any
statement, in the caller's session (or, ``autocommit``, in one of its own).

The cursor reads the gate through :class:`CursorGate` (the few parts it needs),
so this module does not import the gate.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from shardgate.auth.identity import TRUSTED
from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.engine.insert import InsertQuery
from shardgate.engine.plan import Plan
from shardgate.errors import FailedPrecondition, Internal, InvalidArgument, ShardgateError
from shardgate.evalengine.coerce import Kind
from shardgate.gate import options as exec_options
from shardgate.gate import twopc
from shardgate.gate.catalog import Catalog
from shardgate.gate.failures import internal_failure
from shardgate.gate.sequences import Sequences, SequenceTables
from shardgate.gate.session import Session
from shardgate.gate.stats import Timeline
from shardgate.keys import ShardId, ShardMap
from shardgate.result import ExecuteOptions, Result, Row
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.statements import GateStatement, TabletType
from shardgate.tablet import TabletClient
from shardgate.topo.model import Topology
from shardgate.vindexes import VCursor


class CursorGate(Protocol):
    """What the cursors need of the gate."""

    @property
    def topology(self) -> Topology: ...

    @property
    def tablets(self) -> Mapping[tuple[str, str], TabletClient]: ...

    @property
    def timeline(self) -> Timeline: ...

    @property
    def sequences(self) -> Sequences: ...

    @property
    def sequence_tables(self) -> SequenceTables: ...

    @property
    def schema(self) -> Catalog: ...

    def first_shard(self, keyspace: str) -> tuple[tuple[str, str], TabletClient]: ...

    def plan(self, sql: str, keyspace: str | None) -> Plan | GateStatement: ...

    async def execute(
        self, session: Session, sql: str, bind_vars: Mapping[str, Any] | None = None, *,
        options: ExecuteOptions | None = None,
    ) -> Result: ...


class SessionCursor(ExecCursor):
    """Executes primitives for one session: shard targeting and transactions.

    ``internal`` (or the session's) says what the SQL is for when the gate
    wrote it itself (lookup vindex queries): a shard error then names that
    query and the shard, instead of reading as a fault of the user's statement.
    """

    __slots__ = ("gate", "internal", "may_open_implicit", "reads", "session", "topology")

    def __init__(self, gate: CursorGate, session: Session, internal: str | None = None) -> None:
        self.gate = gate
        self.session = session
        self.internal = internal or session.internal
        #: the topology the statement started with: a change mid-statement waits
        self.topology = gate.topology
        #: a write to several shards outside a transaction opens the implicit one
        #: (the caller commits or rolls it back) instead of being refused
        self.may_open_implicit = False
        #: a read outside a transaction: it goes to the keyspace's read-serving shards
        #: (which differ from the write-serving ones between the two traffic switches
        #: of a reshard, see :class:`~shardgate.topo.model.KeyspaceTopo`)
        self.reads = False

    def shard_map(self, keyspace: str) -> ShardMap:
        ks = self.topology.keyspace(keyspace)
        return ks.read_shard_map if self.reads else ks.shard_map

    def lookup_cursor(self) -> VCursor:
        return LookupCursor(self.gate, self.session)

    def dialect(self, keyspace: str) -> Dialect:
        return self.gate.first_shard(keyspace)[1].dialect

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        return await self.gate.schema.column_kinds(keyspace, table)

    async def unique_keys(self, keyspace: str, table: str) -> tuple[tuple[str, ...], ...]:
        # read anew from the first shard's catalog each time (upserts into owners of
        # lookup vindexes only)
        found = await self.gate.schema.tables(keyspace, table)
        return tuple(i.columns for t in found[:1] for i in t.indexes if i.unique and i.columns)

    def collation(self, keyspace: str) -> str | None:
        ks = self.topology.keyspace(keyspace)
        if ks.collation:
            return ks.collation
        # Read by each shard's first connection: any shard already reached tells.
        for shard in ks.shards:
            found = self.gate.tablets[(keyspace, shard.name)].collation
            if found:
                return found
        return None

    async def next_sequence_values(self, sequence: str, count: int) -> int:
        # SQLite has one writer (an embedded database: a transaction holds its lock): if
        # this session's transaction holds the sequence's database, a transaction of
        # the allocator's own would wait for it forever.
        tables = self.gate.sequence_tables
        key, tablet, _ = tables.home(sequence)
        tid = self.session.shard_txs.get(key)
        if tid is not None and sql_dialect(tablet.dialect).embedded:
            return await self.gate.sequences.next_values(
                sequence, count, in_transaction=functools.partial(tables.allocate_in, tid))
        return await self.gate.sequences.next_values(sequence, count)

    def tablet(self, keyspace: str, shard: str) -> TabletClient:
        """The shard's client; outside a transaction, of the session's tablet type."""
        tablet = self.gate.tablets[(keyspace, shard)]
        if self.session.tablet_type != TabletType.PRIMARY and not self.session.in_transaction:
            return tablet.for_tablet_type(self.session.tablet_type)
        return tablet

    async def one_shard(
        self,
        keyspace: str,
        shard: str,
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
    ) -> Result:
        """``query`` on one shard (in the session's transaction if one is open)."""
        tablet = self.tablet(keyspace, shard)
        self.session.shard_calls += 1
        if isinstance(query, InsertQuery):
            sql, args = query.for_shard(shard, tablet.dialect, tablet.placeholder, bind_vars)
        else:
            sql, args = query.for_dialect(tablet.dialect, tablet.placeholder).bind(bind_vars)
        tid: int | None = None
        if self.session.in_transaction:
            tid = await self.join(keyspace, shard, tablet)
        start, failed = time.perf_counter(), True
        try:
            result = await exec_options.shard_execute(tablet, sql, args, tid,
                                                      query.write_target)
            failed = False
        except ShardgateError as exc:
            if self.internal is None:
                raise
            raise internal_failure(exc, str(ShardId(keyspace, shard)), self.internal) from exc
        finally:
            self.gate.timeline.record((keyspace, shard), time.perf_counter() - start, failed)
        return result

    async def join(self, keyspace: str, shard: str, tablet: TabletClient) -> int:
        """The session's transaction id on the shard, which joins the open transaction
        the first time (twopc participants included; user savepoints replayed)."""
        key = (keyspace, shard)
        tid = self.session.shard_txs.get(key)
        if tid is None:
            if self.session.transaction_mode == twopc.TWOPC:
                tid = await twopc.begin_participant(self.session, keyspace, shard, tablet)
            else:
                tid = await tablet.begin(twopc.transaction_caller(self.session))
            if not self.session.shard_txs:  # the transaction now holds a shard
                self.session.tx_started = time.monotonic()
            self.session.shard_txs[key] = tid
            for name in self.session.savepoints:  # replay user savepoints on a joiner
                await tablet.execute(f"SAVEPOINT sgu_{name}", [], tid)
        return tid

    async def execute_shards(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
        *,
        write: bool,
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Result]:
        if shard_vars is not None:
            per_shard = [{**bind_vars, **shard_vars[s]} for s in shards]
            return await self._each(keyspace, shards, query, per_shard, write)
        return await self._each(keyspace, shards, query, [bind_vars] * len(shards), write)

    async def _each(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Sequence[Mapping[str, Any]],
        write: bool,
    ) -> list[Result]:
        if write and self.session.tablet_type != TabletType.PRIMARY:
            raise FailedPrecondition(
                f"writes go to the primary: the session reads from @{self.session.tablet_type} "
                f"tablets (USE {keyspace} or USE {keyspace}@primary first)"
            )
        if len(shards) == 1:
            return [await self.one_shard(keyspace, shards[0], query, bind_vars[0])]
        if write and not self.session.in_transaction:
            if not self.may_open_implicit:
                raise Internal("a multi-shard write reached the shards outside a transaction")
            self.session.in_transaction = self.session.implicit = True
        results = await asyncio.gather(
            *(self.one_shard(keyspace, s, query, bv)
              for s, bv in zip(shards, bind_vars, strict=True)),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def stream_shards(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> AsyncIterator[tuple[str, list[str], list[Row]]]:
        for shard in shards:
            tablet = self.tablet(keyspace, shard)
            bv = {**bind_vars, **shard_vars[shard]} if shard_vars else bind_vars
            sql, args = query.for_dialect(tablet.dialect, tablet.placeholder).bind(bv)
            async for fields, rows in tablet.stream_execute(sql, args):
                yield shard, fields, rows


class LookupCursor:
    """The VCursor lookup vindexes use: gate SQL in the caller's session.

    ``autocommit=True`` runs the statement in a session of its own, committed
    at once (Vitess's ``autocommit`` lookup param, consistent lookups' "pre"
    writes) — except when the caller's transaction already holds a SQLite
    shard of the target keyspace: SQLite has one writer per database, so a
    second connection would wait for the first forever; joining the caller's
    transaction is then the only deadlock-free order, and the database lock
    already serialises every writer.
    """

    def __init__(self, gate: CursorGate, session: Session) -> None:
        self.gate = gate
        self.session = session

    async def execute(
        self, sql: str, bind_vars: Mapping[str, Any], *, autocommit: bool = False
    ) -> Result:
        planned = self.gate.plan(sql, self.session.keyspace)
        if not isinstance(planned, Plan):
            raise InvalidArgument(f"lookup vindexes cannot run {planned.query_type}")
        purpose = f"the lookup vindex query {' '.join(sql.split())[:100]!r}"
        if autocommit and not self._holds_sqlite(planned.instructions):
            own = Session(keyspace=self.session.keyspace, internal=purpose,
                          identity=TRUSTED)
            return await self.gate.execute(own, sql, bind_vars)
        # Inside the caller's statement: its transaction handling applies.
        cursor = SessionCursor(self.gate, self.session, internal=purpose)
        return await planned.instructions.execute(cursor, bind_vars)

    def _holds_sqlite(self, prim: object) -> bool:
        keyspace = getattr(prim, "keyspace", None)
        return any(
            ks == keyspace and sql_dialect(self.gate.tablets[(ks, shard)].dialect).embedded
            for ks, shard in self.session.shard_txs
        )
