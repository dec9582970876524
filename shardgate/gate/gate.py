"""The gate service: sessions, plan cache, routing, transactions.

The life of a statement: ``execute(session, sql, bind_vars)`` → plan cache
lookup on ``(sql, session.plan_key)`` (on a miss, classify and plan; what the
gate answers itself, such as USE or SHOW VITESS_SHARDS, is cached as its typed
statement) → the plan's
primitive executes through :class:`_SessionCursor`, which sends per-shard SQL
to the :class:`~shardgate.tablet.TabletClient` of each shard, inside the
session's transaction when one is open → merged :class:`Result`.

Transactions: BEGIN opens a session transaction that shards join lazily.
COMMIT commits the shards one after the other (best effort: if a later shard
fails after an earlier one committed, the error says which committed; a shard
lost after COMMIT was sent gives ``CommitOutcomeUnknown``, never "nothing was
committed"). A
statement that fails inside a transaction rolls the whole transaction back
and says so, so no partial statement survives. Outside a transaction, a
write that may reach more than one shard (multi-shard DML, multi-row insert,
inserts maintaining lookup vindexes) runs in an implicit transaction.

Sessions and limits (:mod:`shardgate.gate.limits`, :mod:`shardgate.gate.sessions`):
every session :meth:`Gate.session` makes is in the gate's session table under a
random id and its owner; a reaper rolls back transactions past the transaction
timeout and forgets idle sessions. A statement runs under the session's
``query_timeout_ms`` (cancelled on the shards past it: ``DEADLINE_EXCEEDED``),
and a result past the result limits is refused (``RESOURCE_EXHAUSTED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlglot import exp

from shardgate.auth import catalogs
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED, Caller, Identity, Trusted
from shardgate.engine.dml import LookupDML
from shardgate.engine.insert_select import InsertSelect
from shardgate.engine.plan import Plan
from shardgate.engine.primitives import (
    ExecCursor,
    Insert,
    Opcode,
    Primitive,
    Route,
    ShardQuery,
    _InsertQuery,
)
from shardgate.engine.readswitch import ReadSwitch
from shardgate.engine.scalar import ScalarSubqueries
from shardgate.errors import (
    COMMIT_OUTCOME_UNKNOWN,
    Aborted,
    Code,
    CommitOutcomeUnknown,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ShardgateError,
    Unavailable,
    Unsupported,
    error_for_code,
)
from shardgate.evalengine.coerce import Kind, column_types_sql, kind_of_type
from shardgate.gate import cutover, twopc, vschema_ddl, worker
from shardgate.gate import metrics as gate_metrics
from shardgate.gate import options as exec_options
from shardgate.gate.catalog import (
    TableInfo,
    database_name,
    native_create,
    native_describe,
    read_catalog,
    read_views,
    rename_databases,
)
from shardgate.gate.create_select import CreateTableAsSelect
from shardgate.gate.limits import GateLimits
from shardgate.gate.plan_cache import PlanCache
from shardgate.gate.querylog import LiveQueries, QueryLog, StreamConsumers
from shardgate.gate.sequences import Sequences
from shardgate.gate.session import Session
from shardgate.gate.sessions import SessionTable
from shardgate.gate.split import QuerySplit, split_query
from shardgate.gate.stats import QueryStats, Stats, Timeline
from shardgate.gate.stream_access import check_stream_reader, readable_events
from shardgate.keys import KeyRange, ShardMap
from shardgate.planner.build import (
    auto_increment_column,
    build_plan,
    first_primary_key_column,
    normalize,
    reads_other_keyspace,
)
from shardgate.queues import router as queue_router
from shardgate.queues.ddl import create_queue_from
from shardgate.queues.events import QueueBatch
from shardgate.result import ExecuteOptions, Result, Row, WireResult, rows_size
from shardgate.sql.classify import classify
from shardgate.sql.inputs import check_bind_vars, check_sql
from shardgate.sql.parse import too_deep
from shardgate.sql.statements import (
    AlterVSchema,
    Begin,
    Commit,
    CreateQueueStatement,
    DropQueueStatement,
    GateStatement,
    ReleaseSavepoint,
    Rollback,
    RollbackToSavepoint,
    Savepoint,
    SetQueryTimeout,
    SetTransactionMode,
    ShowShardgateWorker,
    ShowVitessKeyspaces,
    ShowVitessShards,
    ShowVitessTablets,
    StatementType,
    Use,
    like_match,
)
from shardgate.streams.merge import StartPoint, StreamEvent, update_stream
from shardgate.tablet import LocalTabletClient, Tablet, TabletClient
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import MemoryTopoStore, Record
from shardgate.topo.watch import DEFAULT_INTERVAL, TopoWatcher
from shardgate.vindexes import VCursor
from shardgate.vschema import VSchema

R = TypeVar("R")


class Gate:
    """Plans and routes statements over the shards of a topology."""

    def __init__(
        self,
        topology: Topology,
        tablets: Mapping[tuple[str, str], TabletClient],
        *,
        plan_cache_size: int = 10_000,
        topo: TopoServer | None = None,
        open_tablet: Callable[[str, str, str], TabletClient] | None = None,
        guard: Guard | None = None,
        limits: GateLimits | None = None,
        owns_topo: bool = False,
    ) -> None:
        self.topology = topology
        #: statement rules and table ACLs, asked before every caller's statement
        self.guard = guard if guard is not None else Guard()
        self.limits = limits if limits is not None else GateLimits()
        self.sessions = SessionTable(self.limits, self._expire_transaction)
        self.vschema: VSchema = topology.build_vschema()
        self.tablets = dict(tablets)
        #: where the topology lives and changes (a private in-memory store if none)
        self.topo = topo if topo is not None else TopoServer(MemoryTopoStore.seeded(topology))
        #: opens a tablet for a shard that appears in a newer topology (keyspace, shard, url)
        self._open_tablet = open_tablet
        self._watcher: TopoWatcher | None = None
        #: whether :meth:`close` closes ``topo``
        self._owns_topo = owns_topo
        #: the database URL each tablet serves, and tablets being closed after a reshard
        self._tablet_urls = {(ks.name, shard.name): shard.url
                             for ks in topology.keyspaces.values() for shard in ks.all_shards}
        self._retired: set[asyncio.Task[None]] = set()
        #: catches up with the topo store for statements held across a cut-over
        self._refresh = cutover.Refresher(self._poll_topo)
        #: opens connections to pending shards when a cut-over holds a first write
        self._warm = cutover.Warmer(self._pending_tablets, lambda: self.topology.version)
        for ks in topology.keyspaces.values():
            for shard in ks.all_shards:
                if (ks.name, shard.name) not in self.tablets:
                    raise NotFound(f"no tablet for shard {ks.name}/{shard.name}")
        self.plans: PlanCache[Plan | GateStatement] = PlanCache(plan_cache_size)
        self.stats = Stats()
        #: calls, errors, latency per 10 s, per keyspace and per shard (the console's charts)
        self.timeline = Timeline()
        #: statements in flight (killable) and the last ones finished
        self.live = LiveQueries()
        self.querylog = QueryLog()
        #: change streams being read through this gate
        self.streams = StreamConsumers()
        gate_metrics.COLLECTOR.gates.add(self)
        self.sequences = Sequences(self._allocate_sequence)
        #: (keyspace, table) -> column kinds, read from the first shard (DDL clears it)
        self._kinds: dict[tuple[str, str], dict[str, Kind]] = {}
        queue_router.configure_local(self)

    @classmethod
    def open(
        cls, topology: Topology, *, pool_size: int | None = None,
        topo: TopoServer | None = None, guard: Guard | None = None,
        limits: GateLimits | None = None,
    ) -> Gate:
        """A gate with an in-process tablet for every shard of ``topology``.

        ``topo``: the store ``topology`` was read from (changes are saved there);
        without one the gate keeps its topology in a private in-memory store.
        The tablets take ``limits``' pool timeout, result limits and transaction caps
        (without ``pool_size``, each pool holds ``limits.transaction_cap`` connections
        for transactions and a few for autocommit statements). The gate's
        reaper ends transactions; as a safety net for one the gate lost track
        of, the tablets roll back a transaction idle for twice the
        transaction timeout (which no live session reaches).
        """
        limits = limits if limits is not None else GateLimits()
        tx_timeout = limits.transaction_timeout_s
        idle = 2 * tx_timeout if tx_timeout is not None else None

        def open_tablet(keyspace: str, shard: str, url: str) -> TabletClient:
            return LocalTabletClient(Tablet.open(
                keyspace, shard, url, pool_size=pool_size, pool_timeout_s=limits.pool_timeout_s,
                result_limits=limits.result_limits, idle_transaction_timeout_s=idle,
                transaction_cap=limits.transaction_cap if pool_size is None else None,
                transaction_cap_per_user=limits.transaction_cap_per_user))

        tablets = {
            (ks.name, shard.name): open_tablet(ks.name, shard.name, shard.url)
            for ks in topology.keyspaces.values()
            for shard in ks.all_shards
        }
        return cls(topology, tablets, topo=topo, open_tablet=open_tablet, guard=guard,
                   limits=limits)

    @classmethod
    async def from_topo(
        cls, topo: TopoServer, *, pool_size: int | None = None, watch: bool = True,
        guard: Guard | None = None, limits: GateLimits | None = None,
    ) -> Gate:
        """A gate (in-process tablets) serving the topology in ``topo``, following it.

        Unavailable (coded) if the store cannot be reached; FailedPrecondition
        if it holds no keyspace.
        """
        gate = cls.open(await topo.load_topology(), pool_size=pool_size, topo=topo, guard=guard,
                        limits=limits)
        gate._owns_topo = True
        if watch:
            gate.watch()
        return gate

    def watch(
        self,
        interval: float = DEFAULT_INTERVAL,
        *,
        on_records: Callable[[list[Record]], None] | None = None,
    ) -> None:
        """Follow the topo store: changes from any process apply within ``interval``.

        ``on_records`` gets changed records other than keyspaces (e.g. tablets).
        """
        if self._watcher is None:
            self._watcher = TopoWatcher(self.topo, self.apply_topology,
                                        version=self.topology.version, interval=interval,
                                        on_records=on_records)
            self._watcher.start()

    async def _poll_topo(self) -> None:
        """Apply the store's topology now if it changed (the watcher's poll, if any)."""
        if self._watcher is not None:
            await self._watcher.poll()
        elif await self.topo.store.clock() > self.topology.version:
            self.apply_topology(await self.topo.load_topology())

    def _pending_tablets(self) -> list[TabletClient]:
        """The tablets of every pending shard (the targets of cut-overs under way)."""
        return [self.tablets[(ks.name, shard.name)] for ks in self.topology.keyspaces.values()
                for shard in ks.pending if (ks.name, shard.name) in self.tablets]

    @property
    def degraded(self) -> str | None:
        """Why the gate is serving a possibly stale topology (None: it is not)."""
        return None if self._watcher is None else self._watcher.degraded

    def compete_for_leases(self) -> None:
        """Have every in-process tablet compete for its shard's lease now, as ``shardgate
        tablet`` does when it starts (otherwise a tablet competes once a queue receiver
        first subscribes). A serving gate calls it: the lease is the shard's, not a
        queue's, and the console names its holder from the start."""
        for tablet in self.tablets.values():
            if isinstance(tablet, LocalTabletClient):
                tablet.tablet.queues.start()

    async def close(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
        await self.sessions.close()
        await self._warm.close()
        for t in self.tablets.values():
            await t.close()
        for task in self._retired:
            with contextlib.suppress(Exception):
                await task
        if self._owns_topo:
            await self.topo.close()

    def apply_topology(self, topology: Topology) -> bool:
        """Serve ``topology`` from now on; False if it is not newer than the current one.

        Checked first (an invalid topology changes nothing). Statements
        already running finish on the topology they started with (their
        cursor holds it); cached plans are dropped; shards new to this gate
        get a tablet.
        """
        if topology.version and topology.version <= self.topology.version:
            return False
        vschema = topology.build_vschema()
        for ks in topology.keyspaces.values():
            for shard in ks.all_shards:
                key = (ks.name, shard.name)
                known = self._tablet_urls.get(key)
                if key in self.tablets and known is not None and known != shard.url \
                        and self._open_tablet is not None:
                    # a shard name reused for another database (a reshard merging back
                    # to the names of shards it removed): the old tablet goes
                    old = self.tablets.pop(key)
                    self._retired.add(asyncio.get_running_loop().create_task(old.close()))
                if key not in self.tablets:
                    if self._open_tablet is None:
                        raise FailedPrecondition(
                            f"shard {ks.name}/{shard.name} appeared in the topology and this "
                            "gate cannot open a tablet for it"
                        )
                    self.tablets[key] = self._open_tablet(ks.name, shard.name, shard.url)
                self._tablet_urls[key] = shard.url
        self.topology, self.vschema = topology, vschema
        self.plans.clear()
        self._kinds.clear()
        self._retain_sequences()
        return True

    async def change_vschema(
        self, keyspace: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Change a keyspace's VSchema in the topo store, then serve it here at once.

        Other gates following the same store pick it up through their watcher.
        """
        await self.topo.update_vschema(keyspace, change)
        self.apply_topology(await self.topo.load_topology())

    def rebuild_vschema(self) -> None:
        """Rebuild the VSchema from the topology (changed at run time) and drop cached plans."""
        self.vschema = self.topology.build_vschema()
        self.plans.clear()
        self._retain_sequences()

    def _retain_sequences(self) -> None:
        """Forget cached blocks of sequences the served VSchema no longer names."""
        self.sequences.retain({t.qualified for ks in self.vschema.keyspaces.values()
                               for t in ks.tables.values() if t.type == "sequence"})

    # -- queues (shardgate.queues.router) ---------------------------------------

    def queue_receive(
        self, keyspace: str, queue: str, *, shard: str | None = None,
        key_range: str | None = None, max_batch: int = 0,
    ) -> AsyncIterator[QueueBatch]:
        """Fired events of ``queue``: the fields first, then batches (events name their shard)."""
        return queue_router.receive(self, keyspace, queue, shard=shard, key_range=key_range,
                                    max_batch=max_batch)

    async def queue_ack(self, keyspace: str, queue: str, shard: str, ids: Sequence[int]) -> int:
        """Ack events of ``queue`` on the one shard their receiver was told.

        An ack that meets a shard frozen by a reshard's write cut-over is held like a
        write (:mod:`.cutover`): replayed once the switch is published, on the shards
        that then own the events' rows (or on the same shard if the cut-over rolled
        back); an ack changes nothing when refused, and replays are idempotent."""
        held_until = time.monotonic() + cutover.HOLD_S
        while True:
            try:
                return await queue_router.ack(self, keyspace, queue, shard, ids)
            except ShardgateError as exc:
                if not cutover.writes_frozen(exc):
                    raise
                if not await cutover.wait_for_switch(
                        self._refresh, lambda: self.topology.version, held_until, self._warm):
                    raise Unavailable(
                        f"acks stayed paused by a reshard's cut-over for {cutover.HOLD_S:g}s; "
                        "retry the ack") from exc

    async def queue_enqueue(
        self, keyspace: str, queue: str, jobs: Sequence[tuple[Any, str | None]],
        *, session: Session | None = None,
    ) -> list[tuple[str, int]]:
        """Store ``(key, payload)`` jobs of a segmented queue; ``(shard, job_id)`` of each.

        Without ``session`` (or with one outside a transaction) the jobs are
        committed when this returns; with a session in a transaction they are
        written in it and commit or roll back with it (see ``queues.router.enqueue``).
        """
        join: queue_router.JoinTransaction | None = None
        if session is not None and session.in_transaction:
            cursor = _SessionCursor(self, session)
            in_tx = session

            async def joined(keyspace: str, shard: str) -> queue_router.Execute:
                tablet = self.tablets[(keyspace, shard)]
                tid = await cursor.join(keyspace, shard, tablet)

                async def execute(sql: str, params: Sequence[Any]) -> Result:
                    in_tx.shard_calls += 1
                    return await tablet.execute(sql, params, tid)

                return execute

            join = joined
        return await queue_router.enqueue(self, keyspace, queue, jobs, join=join)

    async def queue_nack(
        self, keyspace: str, queue: str, shard: str, ids: Sequence[int], reason: str,
        retry_at: int | None = None,
    ) -> int:
        """Record a failed attempt of segmented-queue jobs of one shard: each is retried
        after the queue's backoff (or at ``retry_at``, ns since the epoch), or aborted
        once out of attempts; how many were executing."""
        return await queue_router.nack(self, keyspace, queue, shard, ids, reason, retry_at)

    async def queue_stats(self, keyspace: str, queue: str) -> list[dict[str, Any]]:
        """Per-shard figures of ``queue`` (depth per state, lag, rates, in flight...)."""
        return await queue_router.stats(self, keyspace, queue)

    async def queue_admin(
        self, keyspace: str, queue: str, action: str, *, shard: str | None = None,
        ids: Sequence[int] = (),
    ) -> int:
        """An operator's action on ``queue`` (on one shard, or all); events changed."""
        return await queue_router.admin(self, keyspace, queue, action, shard=shard, ids=ids)

    def session(
        self,
        keyspace: str | None = None,
        *,
        identity: Caller,
        transaction_mode: str = twopc.BEST_EFFORT,
        owner: str | None = None,
        addressable: bool = False,
    ) -> Session:
        """A new session whose unqualified tables resolve in ``keyspace``.

        ``identity`` (required, no default) is who its statements are authorized
        for: the :class:`~shardgate.auth.identity.Identity` a front door
        authenticated, or :data:`~shardgate.auth.identity.TRUSTED` for the gate's
        own work and in-process code (statement rules apply, table ACLs do not;
        see :mod:`shardgate.auth.guard`). Front doors never pass TRUSTED.
        ``transaction_mode`` is ``"best_effort"`` or ``"twopc"`` (see
        :mod:`shardgate.gate.twopc`); ``SET transaction_mode = '...'`` changes it.
        ``addressable`` (transports, an Identity only) puts the session in the gate's table, found
        by id with :meth:`find_session` by the same ``owner`` (the caller's
        identity) only, until :meth:`close_session` or the idle timeout. Any
        session is in the table while its transaction holds a shard, so the
        transaction timeout applies to in-process sessions too.
        """
        if not isinstance(identity, Identity | Trusted):
            raise TypeError(f"Gate.session(identity=...) takes the caller's Identity or "
                            f"TRUSTED (in-process code), not {identity!r}")
        if addressable and not isinstance(identity, Identity):
            raise TypeError("an addressable (transport) session needs the caller's Identity")
        ks = keyspace if keyspace is not None else self.topology.default_keyspace
        if ks is not None and ks not in self.topology.keyspaces:
            raise NotFound(
                f"keyspace {ks!r} does not exist; keyspaces: {sorted(self.topology.keyspaces)}"
            )
        session = Session(keyspace=ks, transaction_mode=twopc.check_mode(transaction_mode),
                          identity=identity, owner=owner, addressable=addressable)
        if addressable:
            self.sessions.add(session)
        return session

    def find_session(self, session_id: int, owner: str | None) -> Session:
        """The session ``session_id`` if ``owner`` owns it; ``NOT_FOUND`` otherwise."""
        return self.sessions.find(session_id, owner)

    async def close_session(self, session_id: int, owner: str | None) -> None:
        """Roll back the session's open transaction and forget it (unknown ids: nothing)."""
        session = self.sessions.pop(session_id, owner)
        if session is not None:
            async with session.lock:
                if session.in_transaction:
                    await self.rollback(session)

    async def _expire_transaction(self, session: Session, reason: str) -> None:
        """End ``session``'s transaction on the gate's own initiative (a timeout)."""
        session.ended = (f"the gate rolled back this session's transaction: {reason}; "
                         "nothing of it was committed, start it again")
        await self.rollback(session)

    # -- planning ---------------------------------------------------------------

    def plan(self, sql: str, keyspace: str | None) -> Plan | GateStatement:
        """The cached plan of ``sql``, or the statement the gate answers itself.

        The one path from text to plan: :func:`~shardgate.sql.classify.classify`,
        then session control and gate statements (resolved against the
        topology) or a routed :class:`Plan`.
        """
        key = (check_sql(sql), keyspace)
        found = self.plans.get(key)
        if found is not None:
            return found
        stmt = classify(sql)
        planned: Plan | GateStatement
        match stmt:
            case CreateQueueStatement():  # not cached: it changes the VSchema
                cq = create_queue_from(stmt)
                ks = self.vschema.keyspace(cq.keyspace or keyspace or "").name
                return Plan(StatementType.DDL, sql, queue_router.CreateQueuePrimitive(cq, ks, self))
            case Use():
                planned = self._resolve_use(stmt)
            case SetTransactionMode(mode=mode):
                planned = SetTransactionMode(twopc.check_mode(mode))
            case AlterVSchema():  # not cached: it changes the VSchema
                ks = self.vschema.keyspace(_ddl_keyspace(stmt.keyspace, keyspace)).name
                alter = vschema_ddl.AlterVSchemaPrimitive(stmt, ks, self)
                return Plan(StatementType.DDL, sql, alter)
            case DropQueueStatement():
                ks = self.vschema.keyspace(_ddl_keyspace(stmt.keyspace, keyspace)).name
                return Plan(StatementType.DDL, sql, queue_router.DropQueuePrimitive(stmt, ks, self))
            case exp.Drop() if (cascade := self._drop_cascade(stmt, sql, keyspace)) is not None:
                return Plan(StatementType.DDL, sql, cascade)
            case exp.Create() if (ctas := self._create_as_select(stmt, keyspace)) is not None:
                return Plan(StatementType.DDL, sql, ctas)  # not cached: it may change the VSchema
            case exp.Create() if (auto := self._auto_shard(stmt, sql, keyspace)) is not None:
                return Plan(StatementType.DDL, sql, auto)  # not cached: it changes the VSchema
            case exp.Expression() if keyspace is not None and ":" in keyspace:
                planned = self._targeted(stmt, sql, keyspace)
            case exp.Expression():
                try:
                    planned = build_plan(stmt, sql, self.vschema, keyspace)
                except ShardgateError:
                    raise
                except Exception as exc:  # a bug: still a coded error for the caller
                    raise _unexpected(exc, "planning") from exc
            case _:
                planned = stmt
        self.plans.put(key, planned)
        return planned

    def _drop_cascade(self, stmt: exp.Drop, sql: str,
                      keyspace: str | None) -> vschema_ddl.DropTableCascade | None:
        """The plan of a ``DROP TABLE`` that changes a VSchema, else None (plain DDL)."""
        if str(stmt.args.get("kind", "")).upper() != "TABLE" or (keyspace and ":" in keyspace):
            return None
        tables = [t for t in stmt.find_all(exp.Table)]
        known = [(t.db or keyspace, t.name) for t in tables
                 if (t.db or keyspace) and vschema_ddl.needs_cascade(
                     self.topology, t.db or keyspace or "", t.name)]
        if not known:
            return None
        if len(tables) != 1:
            raise Unsupported(
                f"DROP TABLE of several tables where {known[0][0]}.{known[0][1]} is in the "
                "VSchema: drop the tables one per statement"
            )
        ks, name = known[0]
        assert ks is not None
        return vschema_ddl.DropTableCascade(ks, name, self, vschema_ddl.confirmed(sql))

    def _create_as_select(self, stmt: exp.Create,
                          keyspace: str | None) -> CreateTableAsSelect | None:
        """The plan of a ``CREATE TABLE ... AS SELECT`` the gate runs itself (into a
        sharded keyspace, or reading another keyspace: :mod:`shardgate.gate.create_select`),
        else None (the keyspace's database runs it)."""
        select = stmt.expression
        if (str(stmt.args.get("kind", "")).upper() != "TABLE" or not isinstance(select, exp.Query)
                or (keyspace and ":" in keyspace) or stmt.find(exp.TemporaryProperty)):
            return None
        schema = stmt.this if isinstance(stmt.this, exp.Schema) else None
        target = schema.this if schema is not None else stmt.this
        if not isinstance(target, exp.Table) or not (target.db or keyspace):
            return None
        ks = self.vschema.keyspace(target.db or keyspace or "")
        if not ks.sharded and not reads_other_keyspace(select, ks.name, self.vschema, keyspace):
            return None
        source = build_plan(select, "", self.vschema, keyspace).instructions
        return CreateTableAsSelect(
            ks.name, target.name, tuple(schema.expressions) if schema is not None else (),
            select, source, keyspace, bool(stmt.args.get("exists")), self)

    def _auto_shard(self, stmt: exp.Create, sql: str,
                    keyspace: str | None) -> vschema_ddl.AutoShardCreate | None:
        """The plan of a ``CREATE TABLE`` that a keyspace's ``auto_shard`` adds to its
        VSchema (a table the VSchema does not name yet), else None (plain DDL).

        The table is sharded by the ``auto_shard`` vindex on its first primary key
        column, or, without a primary key, on its first column (as any Vitess
        primary vindex, the column need not be unique: equal values share a shard).
        A CREATE TABLE ... AS SELECT or LIKE (no column list) is refused: its
        columns are not known before it runs.
        """
        if str(stmt.args.get("kind", "")).upper() != "TABLE" or (keyspace and ":" in keyspace):
            return None
        target = stmt.this.this if isinstance(stmt.this, exp.Schema) else stmt.this
        if not isinstance(target, exp.Table) or not (target.db or keyspace):
            return None
        ks = self.vschema.keyspaces.get(target.db or keyspace or "")
        if ks is None or ks.auto_shard is None or target.name in ks.tables:
            return None
        column = first_primary_key_column(stmt)
        if column is None:
            first = stmt.this.find(exp.ColumnDef) if isinstance(stmt.this, exp.Schema) else None
            column = str(first.name) if first is not None else None
        if column is None:
            raise Unsupported(
                f"CREATE TABLE {ks.name}.{target.name}: keyspace {ks.name} shards new tables "
                "by their first primary key column, else their first column (auto_shard), "
                "and this statement lists no columns; write them out, or add the table to "
                "the VSchema first (ALTER VSCHEMA)"
            )
        ddl = build_plan(stmt, sql, self.vschema, keyspace)
        counter = auto_increment_column(stmt)
        sequence = None
        if counter is not None and ks.auto_shard_sequences is not None:
            sequence = vschema_ddl.AutoSequence(ks.auto_shard_sequences,
                                                vschema_ddl.sequence_name(target.name),
                                                counter.lower())
        return vschema_ddl.AutoShardCreate(ks.name, target.name, column, ks.auto_shard,
                                           ddl.instructions, self, sequence)

    def _resolve_use(self, use: Use) -> Use:
        """``USE`` with its target checked, and a keyspace id resolved to its shard."""
        tablet_type = use.tablet_type or "primary"
        if tablet_type != "primary" and not all(t.has_replicas for t in self.tablets.values()):
            raise Unsupported(
                f"USE {use.keyspace}@{use.tablet_type}: this gate serves each shard from one "
                "in-process tablet; replica reads need tablet processes (`shardgate gate "
                "--topo URL` with two `shardgate tablet` processes per shard)"
            )
        if use.shard is None and use.keyspace_id is None:
            return Use(self.vschema.keyspace(use.keyspace).name, tablet_type=tablet_type)
        ks = self.topology.keyspace(use.keyspace)
        if use.shard is not None:
            ks.shard(use.shard)
            return Use(ks.name, shard=use.shard, tablet_type=tablet_type)
        assert use.keyspace_id is not None
        return Use(ks.name, shard=ks.shard_map.find(use.keyspace_id), tablet_type=tablet_type)

    def _targeted(self, stmt: exp.Expression, sql: str, key: str) -> Plan:
        """A statement sent as is to the shard the session targets (no routing)."""
        ks_name, _, shard = key.partition(":")
        ks = self.topology.keyspace(ks_name)
        ks.shard(shard)
        # a data-changing CTE or a locking read writes too; catalogs kept to the shard's own
        write = isinstance(stmt, exp.Insert | exp.Update | exp.Delete) or any(
            True for _ in stmt.find_all(exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Lock))
        shard_stmt = catalogs.for_shard(stmt, self.tablets[(ks.name, shard)].dialect)
        route = Route(Opcode.BY_DESTINATION, ks.name, ks.sharded,
                      ShardQuery(shard_stmt), write=write, target_shards=(shard,))
        return Plan(StatementType.TARGETED, sql, route, normalize(stmt))

    def authorize(self, session: Session, sql: str) -> None:
        """PermissionDenied unless the session's caller may run ``sql`` (statement
        rules, the deny-list, table ACLs: :class:`~shardgate.auth.guard.Guard`)."""
        self.guard.authorize(session.identity, check_sql(sql), session.plan_key, self.vschema,
                             self.dialect_of)

    def dialect_of(self, keyspace: str) -> str | None:
        """The dialect of ``keyspace``'s shards (None: no such keyspace or no shard)."""
        ks = self.topology.keyspaces.get(keyspace)
        if ks is None or not ks.shards:
            return None
        tablet = self.tablets.get((ks.name, ks.shards[0].name))
        return tablet.dialect if tablet is not None else None

    def query_stats(self) -> list[QueryStats]:
        """Statistics per normalized query, the most time-consuming first."""
        return self.stats.snapshot()

    def split_query(self, sql: str, n: int, keyspace: str | None = None) -> list[QuerySplit]:
        """Split a scatter SELECT into about ``n`` key-range parts covering it exactly once."""
        planned = self.plan(sql, keyspace if keyspace is not None else
                            self.topology.default_keyspace)
        if not isinstance(planned, Plan) or not isinstance(planned.instructions, Route):
            raise Unsupported(
                "split_query takes a single-table SELECT without aggregates, ORDER BY or LIMIT"
            )
        shards = {
            ks.name: [(s.name, s.key_range) for s in ks.shards]
            for ks in self.topology.keyspaces.values()
        }
        return split_query(shards, planned.instructions, sql, n)

    def explain(self, sql: str, keyspace: str | None = None) -> dict[str, Any]:
        """The plan of ``sql`` as JSON-able data (Vitess planbuilder test shape)."""
        planned = self.plan(sql, keyspace)
        if not isinstance(planned, Plan):
            return {"QueryType": planned.query_type, "Original": sql}
        return planned.describe()

    async def explain_shards(
        self, sql: str, keyspace: str | None = None, *, identity: Caller
    ) -> dict[str, Any]:
        """:meth:`explain`, with the shards each route of the plan reaches (``"Shards"``,
        as ``keyspace/shard``), resolved from the statement's values as execution would
        (lookup vindexes read): so ``identity`` must be allowed to run ``sql`` itself."""
        from shardgate.engine.explain import with_target_shards

        session = self.session(keyspace, identity=identity)
        self.authorize(session, sql)
        planned = self.plan(sql, keyspace)
        if not isinstance(planned, Plan):
            return {"QueryType": planned.query_type, "Original": sql}
        cursor = _SessionCursor(self, session)
        cursor.reads = not _writes(planned.instructions)  # as _run routes it
        return await with_target_shards(planned.instructions, planned.describe(), cursor)

    # -- execution --------------------------------------------------------------

    async def execute(
        self,
        session: Session,
        sql: str,
        bind_vars: Mapping[str, Any] | None = None,
        *,
        options: ExecuteOptions | None = None,
    ) -> Result:
        """Run one statement in ``session`` (``options``: see :mod:`shardgate.gate.options`)."""
        if options is not None and exec_options.active(options):
            return await exec_options.with_options(
                lambda: self.execute(session, sql, bind_vars), options
            )
        bv = check_bind_vars(bind_vars)
        self.authorize(session, sql)
        planned = self.plan(sql, session.plan_key)  # errors here change nothing
        if (type(planned) is Plan and not session.in_transaction and session.ended is None
                and type(planned.instructions) is Route and planned.instructions.point):
            # The point path: a read of one shard outside a transaction (never held by a
            # cut-over, no transaction to expire or report): _using and _check_ended
            # inline, nothing else skipped (see _execute_plan and _run).
            session.busy += 1
            try:
                return await self._execute_plan(session, planned, bv)
            finally:
                session.busy -= 1
                session.last_used = time.monotonic()
                if session.shard_txs and session.internal is None:  # pragma: no cover
                    self.sessions.add(session)  # (a read outside a transaction joins none)
                elif not session.addressable:
                    self.sessions.discard(session)
        held_until = time.monotonic() + cutover.HOLD_S
        with self._using(session):
            await self._check_ended(session, planned)
            if not isinstance(planned, Plan):
                return await self._control(session, planned)
            while True:
                try:
                    return await self._execute_plan(session, planned, bv)
                except ShardgateError as exc:
                    if not cutover.writes_frozen(exc):
                        raise
                    if session.in_transaction:
                        await self.rollback(session)
                        raise Aborted(
                            "writes to these shards are paused for a reshard's cut-over; the "
                            "transaction was rolled back: retry it") from exc
                    if not await cutover.wait_for_switch(
                            self._refresh, lambda: self.topology.version, held_until, self._warm):
                        raise Unavailable(
                            f"writes stayed paused by a reshard's cut-over for "
                            f"{cutover.HOLD_S:g}s; retry the statement") from exc
                planned = self.plan(sql, session.plan_key)
                if not isinstance(planned, Plan):  # pragma: no cover - same SQL, same kind
                    return await self._control(session, planned)

    async def execute_wire(
        self, session: Session, sql: str, bind_vars: Mapping[str, Any] | None = None
    ) -> WireResult | None:
        """:meth:`execute` for a MySQL client: a point read's answer as the MariaDB/MySQL
        shard's own packets (:class:`~shardgate.result.WireResult`), or None where the
        statement is not such a read (a transaction open, more than one shard, another
        database, a tablet in another process): the caller then runs :meth:`execute`.

        The same checks and records as :meth:`execute`'s point path: authorization,
        routing, the query timeout, the result limits, statistics, query log, metrics.
        """
        bv = check_bind_vars(bind_vars)
        self.authorize(session, sql)
        planned = self.plan(sql, session.plan_key)
        if (type(planned) is not Plan or session.in_transaction or session.ended is not None
                or type(planned.instructions) is not Route or not planned.instructions.point):
            return None
        prim = planned.instructions
        if not self._first_shard(prim.keyspace)[1].gives_wire:
            return None  # (a keyspace of another database: no vindex hashed in vain)
        cursor = _SessionCursor(self, session)
        cursor.reads = True
        try:
            shard = await prim.point_shard(cursor, bv)
        except ShardgateError:
            raise
        except Exception as exc:
            raise _unexpected(exc) from exc
        if shard is None:
            return None
        tablet = cursor._tablet(prim.keyspace, shard)
        if not tablet.gives_wire:
            return None
        sql_shard, args = prim.query.for_dialect(tablet.dialect, tablet.placeholder).bind(bv)

        async def run() -> WireResult:
            session.shard_calls += 1
            start, failed = time.perf_counter(), True
            try:
                result = await tablet.execute_wire(sql_shard, args)
                failed = False
            finally:
                self.timeline.record((prim.keyspace, shard), time.perf_counter() - start,
                                     failed)
            return result

        session.busy += 1
        try:
            return await self._recorded(session, planned, run, self._check_result)
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()

    @contextlib.contextmanager
    def _using(self, session: Session) -> Iterator[None]:
        """Mark ``session`` busy for one call (the reaper leaves it alone), then used."""
        session.busy += 1
        try:
            yield
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()
            if session.shard_txs and session.internal is None:
                self.sessions.add(session)  # the transaction timeout watches it
            elif not session.addressable:
                self.sessions.discard(session)

    async def _check_ended(self, session: Session, planned: Plan | GateStatement) -> None:
        """Report (once) a transaction the gate ended on its own; expire an overdue one."""
        if session.ended is None and self.sessions.transaction_expired(
            session, time.monotonic()
        ):
            await self._expire_transaction(
                session, "the transaction ran longer than the transaction timeout "
                f"({self.limits.transaction_timeout_s:g}s)")
        if session.ended is not None:
            reason, session.ended = session.ended, None
            if not isinstance(planned, Rollback):
                raise Aborted(reason)

    async def _execute_plan(
        self, session: Session, planned: Plan, bv: Mapping[str, Any]
    ) -> Result:
        if planned.statement_type is StatementType.DDL:
            self._kinds.clear()
        return await self._recorded(
            session, planned, lambda: self._run(session, planned.instructions, bv),
            self._check_result)

    async def _recorded(self, session: Session, planned: Plan, run: Callable[[], Awaitable[R]],
                        check: Callable[[R], None]) -> R:
        """``run()`` as the statement ``planned``: under the session's query timeout (the
        shards' statements cancelled with it), listed among the live queries (an operator
        may kill it), its answer ``check``-ed, and recorded (statistics, query log,
        metrics), failed or not."""
        start, calls = time.perf_counter(), session.shard_calls
        timeout_ms = (session.query_timeout_ms if session.query_timeout_ms is not None
                      else self.limits.query_timeout_ms)
        live = self.live.start(session, planned.normalized)
        try:
            if timeout_ms:
                result = await self._with_timeout(session, run, timeout_ms)
            else:
                result = await run()
            check(result)
        except ShardgateError as exc:
            self._finished(session, planned, start, calls, None, exc.code.value)
            raise
        except asyncio.CancelledError:
            if not live.killed:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._finished(session, planned, start, calls, None, "ABORTED")
            raise Aborted("the statement was killed by an operator") from None
        finally:
            self.live.finish(live)
        self._finished(session, planned, start, calls, result, None)  # type: ignore[arg-type]
        return result

    async def _with_timeout(self, session: Session, run: Callable[[], Awaitable[R]],
                            timeout_ms: int) -> R:
        """``run()`` cancelled after ``timeout_ms``: the shards' statements are
        cancelled with it (the backends cancel a statement whose caller is)."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await run()
        except TimeoutError:
            note = ""
            if session.in_transaction:
                await self.rollback(session)
                note = "; the transaction was rolled back"
            raise DeadlineExceeded(
                f"the statement ran longer than query_timeout_ms = {timeout_ms} and was "
                f"cancelled on the shards{note}. Raise it with SET query_timeout_ms = N "
                "(0: no timeout), or narrow the statement"
            ) from None

    def _check_result(self, result: Result | WireResult) -> None:
        """The merged result against the result limits (each shard's part was checked
        while it arrived; this bounds what the shards add up to)."""
        limits = self.limits.result_limits
        n = len(result.rows)
        if n > 1000 or (limits.max_rows and n > limits.max_rows):
            size = (result.size if type(result) is WireResult
                    else rows_size(result.rows) if limits.max_bytes else 0)  # type: ignore[arg-type]
            limits.check(n, size, "the shards")

    def _finished(self, session: Session, planned: Plan, start: float, calls: int,
                  result: Result | WireResult | None, error: str | None) -> None:
        """Count a finished statement: statistics, query log, metrics."""
        seconds = time.perf_counter() - start
        shard_calls = session.shard_calls - calls
        rows = len(result.rows) if result is not None else 0
        affected = result.rows_affected if type(result) is Result else 0
        self.stats.record(planned.normalized, seconds, rows or affected, shard_calls,
                          error is not None)
        self.timeline.record((session.keyspace or "", ""), seconds, error is not None)
        self.querylog.record(time.time() - seconds, session.keyspace, planned.normalized,
                             seconds, rows or affected, shard_calls, error, session)
        gate_metrics.record(session.keyspace, planned.statement_type, seconds, rows, affected,
                            shard_calls, error)

    async def _run(self, session: Session, prim: Primitive, bv: Mapping[str, Any]) -> Result:
        """Execute a planned statement with the session's transaction rules."""
        cursor = _SessionCursor(self, session)
        if type(prim) is Route and prim.point and not session.in_transaction:
            # A point read: its one shard found directly, then what Route.execute
            # does for one shard (the shard's result as is); the rare values
            # point_shard leaves undecided take the general route.
            cursor.reads = True
            try:
                shard = await prim.point_shard(cursor, bv)
                if shard is None:
                    return await prim.execute(cursor, bv)
                return await cursor._one(prim.keyspace, shard, prim.query, bv)
            except ShardgateError:
                raise
            except Exception as exc:
                raise _unexpected(exc) from exc
        if isinstance(prim, CreateTableAsSelect):
            # Select and create, then insert the rows as a statement of its own (its
            # transaction rules); a failed insert is undone, then the table dropped.
            insert = await prim.create(cursor, bv)
            if insert is None:
                return Result()
            try:
                return await self._run(session, insert, bv)
            except ShardgateError:
                await prim.undo(_SessionCursor(self, session), bv)
                raise
        cursor.reads = not session.in_transaction and not _writes(prim)
        if session.in_transaction and not session.implicit:
            if _writes(prim):
                return await self._statement_savepoint(session, prim, bv)
            try:
                return await _execute(prim, cursor, bv)
            except ShardgateError as exc:
                # A failed read may have aborted a shard's transaction (PostgreSQL).
                await self.rollback(session)
                raise _with_note(exc, "the transaction was rolled back") from exc
        if session.in_transaction:  # an implicit transaction: its owner handles errors
            return await _execute(prim, cursor, bv)
        if _one_statement_insert(prim):
            # Rows of one shard go in one autocommit statement (atomic by itself, no
            # BEGIN/COMMIT); rows of several shards open the implicit transaction
            # when they reach the shards (_SessionCursor._each).
            cursor.may_open_implicit = True
            try:
                result = await _execute(prim, cursor, bv)
            except BaseException:
                if session.in_transaction:
                    await self.rollback(session)
                raise
            if session.in_transaction:
                await self.commit(session)
            return result
        if _needs_implicit_tx(prim):
            session.in_transaction = session.implicit = True
            try:
                result = await _execute(prim, cursor, bv)
            except BaseException:
                await self.rollback(session)
                raise
            await self.commit(session)
            return result
        try:  # (inline: the common path, a statement on its own)
            return await prim.execute(cursor, bv)
        except ShardgateError:
            raise
        except Exception as exc:
            raise _unexpected(exc) from exc

    async def execute_batch(
        self,
        session: Session,
        statements: Sequence[tuple[str, Mapping[str, Any] | None]],
        *,
        as_transaction: bool = False,
    ) -> list[Result | ShardgateError]:
        """Run several statements; each gets its result or its error (ExecuteBatch).

        With ``as_transaction`` they run in one transaction (opened and
        committed here unless the session already has one): the first error
        rolls it back, and the statements after it are not run (they get
        ``ABORTED``). Across a reshard's write cut-over a statement outside a
        transaction is held like :meth:`execute` holds it, and a transaction
        the batch opened itself is rolled back, held and replayed whole; in
        the caller's transaction the refused statement gets ``ABORTED``.
        """
        own = as_transaction and not session.in_transaction
        held_until = time.monotonic() + cutover.HOLD_S
        while True:
            out = await self._batch_once(session, statements, as_transaction, own)
            # A transaction the batch opened itself and a reshard's cut-over aborted
            # changed nothing: it is held and replayed whole, as execute holds a
            # statement. In the caller's transaction the ABORTED result stays.
            frozen = next((r for r in out if isinstance(r, ShardgateError)
                           and cutover.writes_frozen(r)), None)
            if not own or frozen is None:
                return out
            if not await cutover.wait_for_switch(
                    self._refresh, lambda: self.topology.version, held_until, self._warm):
                return out

    async def _batch_once(
        self,
        session: Session,
        statements: Sequence[tuple[str, Mapping[str, Any] | None]],
        as_transaction: bool,
        own: bool,
    ) -> list[Result | ShardgateError]:
        out: list[Result | ShardgateError] = []
        if own:
            await self.begin(session)
        for i, (sql, bv) in enumerate(statements):
            try:
                out.append(await self.execute(session, sql, bv))
            except ShardgateError as exc:
                out.append(exc)
                if as_transaction:
                    if session.in_transaction:
                        await self.rollback(session)
                    out.extend(Aborted(f"not run: statement {i + 1} of the batch failed")
                               for _ in statements[i + 1 :])
                    return out
        if own:
            await self.commit(session)
        return out

    def update_stream(
        self,
        keyspace: str,
        key_range: KeyRange | str | None = None,
        start: StartPoint = None,
        *,
        heartbeat_s: float = 1.0,
        identity: Caller,
    ) -> AsyncIterator[StreamEvent]:
        """The change stream of a keyspace or key range (see :mod:`shardgate.streams.merge`).

        While it is being read it is listed in :attr:`streams` (the console's
        consumers, their position and lag). ``identity`` is the reader: with a
        table ACL, each change of a table an :class:`Identity` may not read is left
        out (see :mod:`shardgate.gate.stream_access`), PERMISSION_DENIED at once
        when it may read no table of the keyspace; TRUSTED (in-process code only; a
        transport always passes its caller) reads every table. Required, as for
        :meth:`session`: no stream is read without saying who reads it.
        """
        who = identity if isinstance(identity, Identity) else None
        tables = self.vschema.keyspace(keyspace).tables
        acl = check_stream_reader(self.guard, who, keyspace, tables)
        events = update_stream(self, keyspace, key_range, start, heartbeat_s=heartbeat_s)
        if acl is not None and who is not None:
            events = readable_events(events, acl, who, keyspace)
        return self.streams.follow(
            keyspace, str(key_range) if key_range is not None else None, events)

    async def stream_execute(
        self, session: Session, sql: str, bind_vars: Mapping[str, Any] | None = None
    ) -> AsyncIterator[Result]:
        """Run a statement and yield its result in chunks (the first has the fields).

        Outside a transaction a scatter SELECT streams shard by shard with
        bounded memory; everything else yields one chunk.
        """
        bv = check_bind_vars(bind_vars)
        self.authorize(session, sql)
        planned = self.plan(sql, session.plan_key)
        instructions = planned.instructions if isinstance(planned, Plan) else None
        if isinstance(instructions, ReadSwitch) and not session.in_transaction:
            instructions = instructions.reads  # a read outside a transaction
        if (
            not isinstance(planned, Plan)
            or session.in_transaction
            or not isinstance(instructions, Route)
            or _writes(instructions)  # held across a cut-over, as execute holds it
        ):
            yield await self.execute(session, sql, bv)
            return
        with self._using(session):
            await self._check_ended(session, planned)
            try:
                async for chunk in instructions.stream(_SessionCursor(self, session), bv):
                    yield chunk
            except ShardgateError:
                raise
            except Exception as exc:
                raise _unexpected(exc) from exc

    async def _statement_savepoint(
        self, session: Session, prim: Primitive, bind_vars: Mapping[str, Any]
    ) -> Result:
        """Run a write in an open transaction so that, if it fails, it leaves nothing.

        Shards already in the transaction get ``SAVEPOINT`` first and
        ``ROLLBACK TO`` on failure; shards that joined during the statement are
        rolled back whole and leave the transaction. The transaction stays open.
        """
        before = list(session.shard_txs.items())
        await self._broadcast(before, "SAVEPOINT sg_stmt")
        try:
            result = await _execute(prim, _SessionCursor(self, session), bind_vars)
        except ShardgateError as exc:
            joined = [k for k in session.shard_txs if k not in dict(before)]
            for key in joined:
                await _quiet_rollback(self.tablets[key], session.shard_txs.pop(key))
            try:
                await self._broadcast(before, "ROLLBACK TO SAVEPOINT sg_stmt")
            except ShardgateError:
                await self.rollback(session)
                raise _with_note(exc, "the transaction was rolled back") from exc
            raise _with_note(exc, "the statement was undone; the transaction is still open") \
                from exc
        await self._broadcast(before, "RELEASE SAVEPOINT sg_stmt")
        return result

    async def _broadcast(self, txs: list[tuple[tuple[str, str], int]], sql: str) -> None:
        """Run the gate's own ``sql`` (savepoints) in each transaction of ``txs``."""
        if txs:
            await asyncio.gather(*(self._internal(k, tid, sql) for k, tid in txs))

    async def _internal(self, key: tuple[str, str], tid: int, sql: str) -> None:
        try:
            await self.tablets[key].execute(sql, [], tid)
        except ShardgateError as exc:
            raise internal_failure(exc, f"{key[0]}/{key[1]}", sql) from exc

    async def _savepoint_statement(
        self, session: Session, stmt: Savepoint | RollbackToSavepoint | ReleaseSavepoint
    ) -> Result:
        """User savepoints: sent to every shard in the transaction and replayed on joiners."""
        name = stmt.name
        if not session.in_transaction:
            raise FailedPrecondition(
                f"{_SAVEPOINT_VERBS[type(stmt)]} {name} needs an open transaction (BEGIN)"
            )
        ident = f"sgu_{name}"
        txs = list(session.shard_txs.items())
        if isinstance(stmt, Savepoint):
            await self._broadcast(txs, f"SAVEPOINT {ident}")
            session.savepoints.append(name)
        else:
            if name not in session.savepoints:
                raise NotFound(f"savepoint {name} does not exist in this transaction")
            rollback_to = isinstance(stmt, RollbackToSavepoint)
            sql = "ROLLBACK TO SAVEPOINT " if rollback_to else "RELEASE SAVEPOINT "
            await self._broadcast(txs, sql + ident)
            keep = session.savepoints.index(name) + (1 if rollback_to else 0)
            session.savepoints = session.savepoints[:keep]
        return Result()

    async def _control(self, session: Session, stmt: GateStatement) -> Result:
        """Run a statement the gate answers itself (session control, SHOW VITESS_*)."""
        match stmt:
            case Begin():
                if session.in_transaction:
                    await self.commit(session)  # MySQL semantics: BEGIN commits the open one
                session.in_transaction = True
            case Commit():
                await self.commit(session)
            case Rollback():
                await self.rollback(session)
            case Use(keyspace=keyspace, shard=shard, tablet_type=tablet_type):
                session.keyspace, session.target = keyspace, shard
                session.tablet_type = tablet_type or "primary"
            case SetTransactionMode(mode=mode):
                if session.shard_txs:
                    raise FailedPrecondition(
                        "SET transaction_mode inside a transaction: commit or roll back first"
                    )
                session.transaction_mode = mode
            case SetQueryTimeout(ms=ms):
                session.query_timeout_ms = ms
            case Savepoint() | RollbackToSavepoint() | ReleaseSavepoint():
                return await self._savepoint_statement(session, stmt)
            case ShowVitessShards(like=like):
                shards = [f"{ks.name}/{shard.name}" for ks in self.topology.keyspaces.values()
                          for shard in ks.shards]
                return Result.of_rows(["Shards"], [(n,) for n in _like(shards, like)])
            case ShowVitessTablets(like=like):
                rows = [("local", ks.name, shard.name, "PRIMARY", "SERVING",
                         f"local-{ks.name}-{shard.name}", "localhost", "")
                        for ks in self.topology.keyspaces.values() for shard in ks.shards]
                return Result.of_rows(
                    ["Cell", "Keyspace", "Shard", "TabletType", "State", "Alias", "Hostname",
                     "PrimaryTermStartTime"],
                    [r for r in rows if like is None or like_match(r[5], like)])
            case ShowVitessKeyspaces(like=like):
                names = sorted(self.topology.keyspaces)
                return Result.of_rows(["Database"], [(n,) for n in _like(names, like)])
            case ShowShardgateWorker():
                me = worker.current()
                return Result.of_rows(["Worker", "Workers", "Pid"],
                                      [(me.index, me.count, me.pid)])
            case _:
                raise Internal(f"the gate cannot run {stmt.query_type} statements here")
        return Result()

    async def begin(self, session: Session) -> None:
        await self._control(session, Begin())

    async def commit(self, session: Session) -> None:
        """Commit every shard of the session's transaction, in the order they joined."""
        txs = list(session.shard_txs.items())
        xids, dtid = twopc.take(session)
        session.shard_txs = {}
        session.in_transaction = session.implicit = False
        session.savepoints = []
        session.tx_started = None
        if session.transaction_mode == twopc.TWOPC and len(txs) > 1:
            await twopc.commit(self.tablets, txs, xids, dtid)
            return
        done: list[str] = []
        for i, ((ks, shard), tid) in enumerate(txs):
            try:
                await self.tablets[(ks, shard)].commit(tid)
            except ShardgateError as exc:
                rest = txs[i + 1 :]
                for (rks, rshard), rtid in rest:
                    await _quiet_rollback(self.tablets[(rks, rshard)], rtid)
                if _outcome_unknown(exc):
                    raise CommitOutcomeUnknown(
                        f"{COMMIT_OUTCOME_UNKNOWN} on shard {ks}/{shard}: the shard was lost "
                        f"after COMMIT was sent ({exc.message}); it may or may not have "
                        f"committed. Committed before it: {done or 'none'}; rolled back: "
                        f"{[f'{k}/{s}' for (k, s), _ in rest] or 'none'}. Read the rows back "
                        "before retrying (see docs/operations.md, commit outcome unknown)"
                    ) from exc
                if not done:
                    raise Aborted(
                        f"commit failed on {ks}/{shard}: {exc.message}; "
                        "nothing was committed, retry the transaction"
                    ) from exc
                raise Internal(
                    f"commit failed on {ks}/{shard} after {done} committed: {exc.message}; "
                    f"{[f'{k}/{s}' for (k, s), _ in rest]} were rolled back. "
                    "Use the two-phase commit mode for atomic multi-shard commits"
                ) from exc
            done.append(f"{ks}/{shard}")

    async def rollback(self, session: Session) -> None:
        txs = list(session.shard_txs.items())
        twopc.take(session)
        session.shard_txs = {}
        session.in_transaction = session.implicit = False
        session.savepoints = []
        session.tx_started = None
        for (ks, shard), tid in txs:
            await _quiet_rollback(self.tablets[(ks, shard)], tid)

    async def resolve_transactions(
        self, *, grace_s: float = twopc.DEFAULT_RESOLVE_GRACE_S
    ) -> twopc.ResolveReport:
        """Commit or roll back the two-phase commits a dead gate left prepared.

        Safe while other gates run: records younger than ``grace_s`` are left alone.
        """
        return await twopc.resolve(self.tablets, grace_s=grace_s)

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        """How each column of ``table`` converts values, from its first shard's schema.

        Cached until the next DDL through the gate; a table the shard does not
        know (yet) gives an empty mapping, which is not cached.
        """
        key = (keyspace, table.lower())
        found = self._kinds.get(key)
        if found is not None:
            return found
        _, tablet = self._first_shard(keyspace)
        res = await tablet.execute(column_types_sql(tablet.dialect, tablet.placeholder), [table])
        found = {str(r[0]).lower(): kind_of_type(str(r[1] or ""), tablet.dialect)
                 for r in res.rows}
        if found:
            self._kinds[key] = found
        return found

    async def catalog(self, keyspace: str, table: str | None = None) -> list[TableInfo]:
        """The tables of ``keyspace`` (or only ``table``) with columns and indexes.

        Read from the keyspace's first shard's own catalog, types in MySQL's
        shapes (see :mod:`shardgate.gate.catalog`); not cached.
        """
        _, tablet = self._first_shard(self.topology.keyspace(keyspace).name)
        return await read_catalog(tablet, table)

    async def views(self, keyspace: str) -> list[str]:
        """The views of ``keyspace`` (its first shard's), sorted; not cached."""
        _, tablet = self._first_shard(self.topology.keyspace(keyspace).name)
        return await read_views(tablet)

    async def native_describe(self, keyspace: str, table: str) -> list[tuple[Any, ...]] | None:
        """``DESCRIBE keyspace.table`` as the keyspace's MariaDB/MySQL shards answer it
        (views included); None on other dialects or when not found."""
        _, tablet = self._first_shard(self.topology.keyspace(keyspace).name)
        return await native_describe(tablet, table)

    async def native_create(self, keyspace: str, table: str) -> str | None:
        """``SHOW CREATE TABLE`` of ``keyspace.table`` as the keyspace's MariaDB/MySQL
        shards answer it (foreign keys, checks, comments, view definitions), database
        names turned into keyspace names; None on other dialects or when not found."""
        _, tablet = self._first_shard(self.topology.keyspace(keyspace).name)
        text = await native_create(tablet, table)
        if text is None:
            return None
        names: dict[str, str] = {}
        for ks in self.topology.keyspaces:
            db = await database_name(self._first_shard(ks)[1])
            if db is not None:
                names[db] = ks
        return rename_databases(text, names)

    # -- sequences --------------------------------------------------------------

    async def _allocate_sequence(self, sequence: str, count: int) -> tuple[int, int]:
        """Reserve a block of ``max(cache, count)`` values in a transaction of its own."""
        key, tablet, table = self._sequence_home(sequence)
        tid = await tablet.begin()
        try:
            end, cache = await self._reserve(tablet, sequence, table, tid, count, cached=True)
            await tablet.commit(tid)
        except ShardgateError as exc:
            await _quiet_rollback(tablet, tid)
            raise internal_failure(exc, f"{key[0]}/{key[1]}",
                                   f"allocating values of sequence {sequence}") from exc
        except BaseException:
            await _quiet_rollback(tablet, tid)
            raise
        return end - max(cache, count), end

    async def _allocate_in_transaction(
        self, tid: int, sequence: str, count: int
    ) -> tuple[int, int]:
        """Reserve exactly ``count`` values inside the session's transaction ``tid``."""
        _, tablet, table = self._sequence_home(sequence)
        end, _ = await self._reserve(tablet, sequence, table, tid, count, cached=False)
        return end - count, end

    def _first_shard(self, keyspace: str) -> tuple[tuple[str, str], TabletClient]:
        """``(keyspace, shard)`` and tablet of the keyspace's first shard.

        A keyspace's column types are read there and its sequences live there.
        """
        key = (keyspace, self.topology.keyspace(keyspace).shards[0].name)
        return key, self.tablets[key]

    def _sequence_home(self, sequence: str) -> tuple[tuple[str, str], TabletClient, str]:
        """Where sequence ``ks.table`` lives: the first shard of ``ks``; and ``table``."""
        ks_name, table = sequence.split(".", 1)
        key, tablet = self._first_shard(ks_name)
        return key, tablet, table

    async def _reserve(
        self, tablet: TabletClient, sequence: str, table: str, tid: int, count: int,
        *, cached: bool,
    ) -> tuple[int, int]:
        """Move ``next_id`` on (UPDATE first: the row lock serialises gates); its new value."""
        ident = exp.to_identifier(table).sql(dialect=tablet.dialect)
        ph = tablet.placeholder
        if ph == "%s":  # a driver formatting its parameters: a % of the name is doubled
            ident = ident.replace("%", "%%")
        step = f"CASE WHEN cache > {ph} THEN cache ELSE {ph} END" if cached else ph
        await tablet.execute(
            f"UPDATE {ident} SET next_id = next_id + {step} WHERE id = 0",
            [count, count] if cached else [count],
            tid,
        )
        res = await tablet.execute(f"SELECT next_id, cache FROM {ident} WHERE id = 0", [], tid)
        if not res.rows:
            raise FailedPrecondition(
                f"sequence {sequence} has no row with id = 0: "
                f"INSERT INTO {table} (id, next_id, cache) VALUES (0, 1, 1000)"
            )
        return int(res.rows[0][0]), int(res.rows[0][1])


_SAVEPOINT_VERBS = {Savepoint: "SAVEPOINT", RollbackToSavepoint: "ROLLBACK TO",
                   ReleaseSavepoint: "RELEASE SAVEPOINT"}


def _ddl_keyspace(written: str | None, session: str | None) -> str:
    """The keyspace a gate DDL statement changes: the written one, else the session's."""
    ks = written or (session.partition(":")[0] if session else None)
    if not ks:
        raise InvalidArgument(
            "the statement needs a keyspace: qualify the name (keyspace.name) or set a "
            "default keyspace (USE ks)"
        )
    return ks


def _like(names: Sequence[str], pattern: str | None) -> list[str]:
    """``names`` matching a MySQL LIKE ``pattern`` (``%``, ``_``; case-insensitive)."""
    if pattern is None:
        return list(names)
    return [n for n in names if like_match(n, pattern)]


async def _execute(prim: Primitive, cursor: _SessionCursor, bv: Mapping[str, Any]) -> Result:
    """``prim.execute``, where an exception that is not a ShardgateError becomes one.

    Such an exception is a bug (user input is checked before), but the caller
    still gets a coded error, and the transaction handling around this call
    (which reacts to ShardgateError) still undoes the statement.
    """
    try:
        return await prim.execute(cursor, bv)
    except ShardgateError:
        raise
    except Exception as exc:
        raise _unexpected(exc) from exc


def _unexpected(exc: Exception, doing: str = "running the statement") -> ShardgateError:
    """The coded error for an exception that escaped planning or execution."""
    if isinstance(exc, RecursionError):
        return too_deep()
    return Internal(
        f"{doing} failed with {type(exc).__name__}: {exc} "
        "(a shardgate bug: please report the statement)"
    )


def _outcome_unknown(exc: ShardgateError) -> bool:
    """Whether a failed COMMIT may still have committed: the shard (or the tablet
    in between) was lost or stopped answering, rather than refusing the commit."""
    return exc.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.CANCELED, Code.UNKNOWN)


def _writes(prim: object) -> bool:
    if isinstance(prim, InsertSelect):
        return True
    if isinstance(prim, ScalarSubqueries):
        return _writes(prim.outer)
    if isinstance(prim, Insert | LookupDML):
        return True
    return isinstance(prim, Route) and prim.write


def _one_statement_insert(prim: object) -> bool:
    """An INSERT whose only shard call is the insert itself (no lookup rows, no
    sequence, no secondary vindex checks, not a reference table)."""
    return (isinstance(prim, Insert) and len(prim.rows) > 1 and not prim.owned_lookups
            and not prim.broadcast and not prim.secondary and prim.auto_increment is None)


def _needs_implicit_tx(prim: object) -> bool:
    if isinstance(prim, InsertSelect):
        return True  # its SELECT and its rows' inserts, as one statement
    if isinstance(prim, ScalarSubqueries):
        return _needs_implicit_tx(prim.outer)
    if isinstance(prim, Insert):
        return len(prim.rows) > 1 or bool(prim.owned_lookups) or prim.broadcast
    if isinstance(prim, Route):
        return prim.write and prim.opcode.value in (
            "Scatter", "IN", "MultiEqual", "Equal", "Reference", "ByDestination")
    return isinstance(prim, LookupDML)


def internal_failure(exc: ShardgateError, shard: str, purpose: str) -> ShardgateError:
    """``exc`` (same class and code) saying the gate's own query on ``shard`` failed."""
    if exc.message.startswith("internal query"):
        return exc  # already said by an inner layer
    return error_for_code(
        exc.code, f"internal query for shard {shard} failed ({purpose}): {exc.message}"
    )


def _with_note(exc: ShardgateError, note: str) -> ShardgateError:
    exc.args = (f"{exc.message} ({note})",)
    return exc


async def _quiet_rollback(tablet: TabletClient, tid: int) -> None:
    # If the shard is gone, its transaction died with the connection.
    with contextlib.suppress(ShardgateError):
        await tablet.rollback(tid)


class _SessionCursor(ExecCursor):
    """Executes primitives for one session: shard targeting and transactions.

    ``internal`` (or the session's) says what the SQL is for when the gate
    wrote it itself (lookup vindex queries): a shard error then names that
    query and the shard, instead of reading as a fault of the user's statement.
    """

    __slots__ = ("gate", "internal", "may_open_implicit", "reads", "session", "topology")

    def __init__(self, gate: Gate, session: Session, internal: str | None = None) -> None:
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
        return _LookupCursor(self.gate, self.session)

    def dialect(self, keyspace: str) -> str:
        return self.gate._first_shard(keyspace)[1].dialect

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        return await self.gate.column_kinds(keyspace, table)

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
        # SQLite has one writer: if this session's transaction holds the sequence's
        # database, a transaction of the allocator's own would wait for it forever.
        key, tablet, _ = self.gate._sequence_home(sequence)
        tid = self.session.shard_txs.get(key)
        if tid is not None and tablet.dialect == "sqlite":
            return await self.gate.sequences.next_values(
                sequence, count, in_transaction=functools.partial(
                    self.gate._allocate_in_transaction, tid))
        return await self.gate.sequences.next_values(sequence, count)

    def _tablet(self, keyspace: str, shard: str) -> TabletClient:
        """The shard's client; outside a transaction, of the session's tablet type."""
        tablet = self.gate.tablets[(keyspace, shard)]
        if self.session.tablet_type != "primary" and not self.session.in_transaction:
            return tablet.for_tablet_type(self.session.tablet_type)
        return tablet

    async def _one(
        self,
        keyspace: str,
        shard: str,
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
    ) -> Result:
        tablet = self._tablet(keyspace, shard)
        self.session.shard_calls += 1
        if isinstance(query, _InsertQuery):
            sql, args = query.for_shard(shard, tablet.dialect, tablet.placeholder, bind_vars)
        else:
            sql, args = query.for_dialect(tablet.dialect, tablet.placeholder).bind(bind_vars)
        tid: int | None = None
        if self.session.in_transaction:
            tid = await self.join(keyspace, shard, tablet)
        start, failed = time.perf_counter(), True
        try:
            result = await exec_options.shard_execute(tablet, sql, args, tid)
            failed = False
        except ShardgateError as exc:
            if self.internal is None:
                raise
            raise internal_failure(exc, f"{keyspace}/{shard}", self.internal) from exc
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
        if write and self.session.tablet_type != "primary":
            raise FailedPrecondition(
                f"writes go to the primary: the session reads from @{self.session.tablet_type} "
                f"tablets (USE {keyspace} or USE {keyspace}@primary first)"
            )
        if len(shards) == 1:
            return [await self._one(keyspace, shards[0], query, bind_vars[0])]
        if write and not self.session.in_transaction:
            if not self.may_open_implicit:
                raise Internal("a multi-shard write reached the shards outside a transaction")
            self.session.in_transaction = self.session.implicit = True
        results = await asyncio.gather(
            *(self._one(keyspace, s, query, bv) for s, bv in zip(shards, bind_vars, strict=True)),
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
            tablet = self._tablet(keyspace, shard)
            bv = {**bind_vars, **shard_vars[shard]} if shard_vars else bind_vars
            sql, args = query.for_dialect(tablet.dialect, tablet.placeholder).bind(bv)
            async for fields, rows in tablet.stream_execute(sql, args):
                yield shard, fields, rows


class _LookupCursor:
    """The VCursor lookup vindexes use: gate SQL in the caller's session.

    ``autocommit=True`` runs the statement in a session of its own, committed
    at once (Vitess's ``autocommit`` lookup param, consistent lookups' "pre"
    writes) — except when the caller's transaction already holds a SQLite
    shard of the target keyspace: SQLite has one writer per database, so a
    second connection would wait for the first forever; joining the caller's
    transaction is then the only deadlock-free order, and the database lock
    already serialises every writer.
    """

    def __init__(self, gate: Gate, session: Session) -> None:
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
        cursor = _SessionCursor(self.gate, self.session, internal=purpose)
        return await planned.instructions.execute(cursor, bind_vars)

    def _holds_sqlite(self, prim: object) -> bool:
        keyspace = getattr(prim, "keyspace", None)
        return any(
            ks == keyspace and self.gate.tablets[(ks, shard)].dialect == "sqlite"
            for ks, shard in self.session.shard_txs
        )
