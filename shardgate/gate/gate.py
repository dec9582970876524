"""The gate service: sessions, plan cache, routing, transactions.

The life of a statement: ``execute(session, sql, bind_vars)`` → plan cache
lookup on ``(sql, session.plan_key)`` (on a miss, classify and plan:
:mod:`shardgate.gate.planning`; what the gate answers itself, such as USE or
SHOW VITESS_SHARDS, is cached as its typed statement and run by
:mod:`shardgate.gate.control`) → the plan's primitive executes through a
:class:`~shardgate.gate.cursor.SessionCursor`, which sends per-shard SQL to the
:class:`~shardgate.tablet.TabletClient` of each shard, inside the session's
transaction when one is open → merged :class:`Result`, recorded
(:mod:`shardgate.gate.recording`).

:class:`Gate` is the facade every door calls; it owns what it serves
(topology, VSchema, tablets, the topo store it follows) and composes the parts
that do the work, each holding the narrow view of the gate it needs:
:class:`~shardgate.gate.planning.Planner` (text to plan, authorization),
:class:`~shardgate.gate.transactions.Transactions` (BEGIN/COMMIT/ROLLBACK,
savepoints, implicit transactions, batches; two-phase commit in
:mod:`shardgate.gate.twopc`), :class:`~shardgate.gate.recording.Recorder`
(timeouts, kills, result limits, statistics),
:class:`~shardgate.gate.catalog.Catalog` (schemas read from the shards),
:class:`~shardgate.gate.sequences.SequenceTables` (sequence blocks) and
:class:`~shardgate.gate.queueing.Queueing` (queue calls). The hot path
(``execute`` → plan cache → ``_run`` → cursor) calls them directly, never
through the facade's own methods.

Sessions and limits (:mod:`shardgate.gate.limits`, :mod:`shardgate.gate.sessions`):
every session :meth:`Gate.session` makes is in the gate's session table under a
random id and its owner; a reaper rolls back transactions past the transaction
timeout and forgets idle sessions. A statement runs under the session's
``query_timeout_ms`` (cancelled on the shards past it: ``DEADLINE_EXCEEDED``),
and a result past the result limits is refused (``RESOURCE_EXHAUSTED``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from shardgate.auth.guard import Guard
from shardgate.auth.identity import Caller
from shardgate.engine.plan import Plan
from shardgate.engine.primitive import Primitive
from shardgate.engine.route import Route
from shardgate.errors import (
    Aborted,
    ShardgateError,
    Unavailable,
)
from shardgate.evalengine.coerce import Kind
from shardgate.gate import cutover, streaming, twopc, wire
from shardgate.gate import metrics as gate_metrics
from shardgate.gate import options as exec_options
from shardgate.gate.catalog import Catalog, TableInfo
from shardgate.gate.control import control
from shardgate.gate.cursor import SessionCursor
from shardgate.gate.failures import unexpected
from shardgate.gate.limits import GateLimits
from shardgate.gate.plan_cache import PlanCache
from shardgate.gate.planning import Planner
from shardgate.gate.querylog import LiveQueries, QueryLog, StreamConsumers
from shardgate.gate.queueing import Queueing
from shardgate.gate.recording import Recorder
from shardgate.gate.schema_tracker import SchemaTracker
from shardgate.gate.sequences import Sequences, SequenceTables
from shardgate.gate.serving import TopologyFollower, local_tablets
from shardgate.gate.session import Session
from shardgate.gate.sessions import SessionTable
from shardgate.gate.split import QuerySplit
from shardgate.gate.stats import QueryStats, Stats, Timeline
from shardgate.gate.transactions import Transactions
from shardgate.keys import KeyRange
from shardgate.queues import router as queue_router
from shardgate.queues.events import QueueBatch
from shardgate.result import ExecuteOptions, Result, WireResult
from shardgate.sql.dialects import Dialect
from shardgate.sql.inputs import check_bind_vars
from shardgate.sql.schema import ColumnsUnknown
from shardgate.sql.statements import GateStatement, StatementType
from shardgate.streams.merge import StartPoint, StreamEvent
from shardgate.tablet import TabletClient
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import MemoryTopoStore, Record
from shardgate.topo.watch import DEFAULT_INTERVAL
from shardgate.vschema import VSchema


class Gate:
    """Plans and routes statements over the shards of a topology (see the module).

    Invariants: every serving and pending shard of :attr:`topology` has a tablet
    in :attr:`tablets`; :attr:`vschema` is built from :attr:`topology`, and
    cached plans and column kinds are dropped whenever either changes.
    """

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
        self._tx = Transactions(self)
        self.sessions = SessionTable(self.limits, self._tx.expire)
        self.vschema: VSchema = topology.build_vschema()
        self.tablets = dict(tablets)
        #: where the topology lives and changes (a private in-memory store if none)
        self.topo = topo if topo is not None else TopoServer(MemoryTopoStore.seeded(topology))
        #: whether :meth:`close` closes ``topo``
        self._owns_topo = owns_topo
        self.plans: PlanCache[Plan | GateStatement] = PlanCache(plan_cache_size)
        self.stats = Stats()
        #: calls, errors, latency per 10 s, per keyspace and per shard (the console's charts)
        self.timeline = Timeline()
        #: statements in flight (killable) and the last ones finished
        self.live = LiveQueries()
        self.querylog = QueryLog()
        #: change streams being read through this gate
        self.streams = StreamConsumers()
        #: where each sequence lives, and its cached blocks
        self.sequence_tables = SequenceTables(self.first_shard)
        self.sequences = Sequences(self.sequence_tables.allocate)
        #: each keyspace's columns for the planner, read from its first shard on demand
        self.tracker = SchemaTracker(self.first_shard)
        #: the keyspaces' schemas, read from their first shards (column kinds cached;
        #: forgetting them forgets the tracked columns too)
        self.schema = Catalog(self, self.tracker.forget)
        #: ``open_tablet`` opens a tablet for a shard new in a topology (keyspace, shard, url)
        self._follower = TopologyFollower(self, open_tablet)  # (NotFound: a shard lacks one)
        #: where statements held across a reshard's write cut-over wait
        self.hold = cutover.Hold(self._follower.poll, self._follower.pending_tablets,
                                 lambda: self.topology.version)
        self._planner = Planner(self, self.plans)
        self._queues = Queueing(self)
        self._recorder = Recorder(self.limits, self.stats, self.timeline, self.live,
                                  self.querylog, self._tx.rollback)
        gate_metrics.COLLECTOR.gates.add(self)
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
        (see :func:`~shardgate.gate.serving.local_tablets`).
        """
        limits = limits if limits is not None else GateLimits()
        open_tablet = local_tablets(limits, pool_size)
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
        self._follower.watch(interval, on_records)

    @property
    def degraded(self) -> str | None:
        """Why the gate is serving a possibly stale topology (None: it is not)."""
        return self._follower.degraded

    def compete_for_leases(self) -> None:
        """Have every in-process tablet compete for its shard's lease now (a serving gate
        calls it: see :meth:`.TopologyFollower.compete_for_leases`)."""
        self._follower.compete_for_leases()

    async def close(self) -> None:
        """Stop following the store, end sessions, close the tablets (and ``topo`` if owned)."""
        await self._follower.stop()
        await self.sessions.close()
        await self.hold.close()
        for t in self.tablets.values():
            await t.close()
        await self._follower.retired()
        if self._owns_topo:
            await self.topo.close()

    def apply_topology(self, topology: Topology) -> bool:
        """Serve ``topology`` from now on; False if it is not newer than the current one
        (an invalid one changes nothing: see :meth:`.TopologyFollower.apply`)."""
        return self._follower.apply(topology)

    async def change_vschema(
        self, keyspace: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Change a keyspace's VSchema in the topo store, then serve it here at once
        (other gates following the store pick it up through their watcher)."""
        await self._follower.change_vschema(keyspace, change)

    def rebuild_vschema(self) -> None:
        """Rebuild the VSchema from the topology (changed at run time) and drop cached plans."""
        self._follower.rebuild_vschema()

    def first_shard(self, keyspace: str) -> tuple[tuple[str, str], TabletClient]:
        """``(keyspace, shard)`` and tablet of the keyspace's first shard (where its
        column types are read and its sequences live)."""
        key = (keyspace, self.topology.keyspace(keyspace).shards[0].name)
        return key, self.tablets[key]

    # -- queues (shardgate.gate.queueing) ---------------------------------------

    def queue_receive(
        self, keyspace: str, queue: str, *, shard: str | None = None,
        key_range: str | None = None, max_batch: int = 0,
    ) -> AsyncIterator[QueueBatch]:
        """Fired events of ``queue``: the fields first, then batches (events name their shard)."""
        return self._queues.receive(keyspace, queue, shard=shard, key_range=key_range,
                                    max_batch=max_batch)

    async def queue_ack(self, keyspace: str, queue: str, shard: str, ids: Sequence[int]) -> int:
        """Ack events of ``queue`` on the one shard their receiver was told (held across
        a reshard's write cut-over: :meth:`~shardgate.gate.queueing.Queueing.ack`)."""
        return await self._queues.ack(keyspace, queue, shard, ids)

    async def queue_enqueue(
        self, keyspace: str, queue: str, jobs: Sequence[tuple[Any, str | None]],
        *, session: Session | None = None,
    ) -> list[tuple[str, int]]:
        """Store ``(key, payload)`` jobs of a segmented queue; ``(shard, job_id)`` of each
        (in ``session``'s open transaction if any: :meth:`.Queueing.enqueue`)."""
        return await self._queues.enqueue(keyspace, queue, jobs, session)

    async def queue_nack(
        self, keyspace: str, queue: str, shard: str, ids: Sequence[int], reason: str,
        retry_at: int | None = None,
    ) -> int:
        """Record a failed attempt of segmented-queue jobs of one shard (see
        :meth:`.Queueing.nack`); how many were executing."""
        return await self._queues.nack(keyspace, queue, shard, ids, reason, retry_at)

    async def queue_stats(self, keyspace: str, queue: str) -> list[dict[str, Any]]:
        """Per-shard figures of ``queue`` (depth per state, lag, rates, in flight...)."""
        return await self._queues.stats(keyspace, queue)

    async def queue_admin(
        self, keyspace: str, queue: str, action: str, *, shard: str | None = None,
        ids: Sequence[int] = (),
    ) -> int:
        """An operator's action on ``queue`` (on one shard, or all); events changed."""
        return await self._queues.admin(keyspace, queue, action, shard=shard, ids=ids)

    # -- sessions ---------------------------------------------------------------

    def session(
        self,
        keyspace: str | None = None,
        *,
        identity: Caller,
        transaction_mode: str = twopc.BEST_EFFORT,
        owner: str | None = None,
        addressable: bool = False,
    ) -> Session:
        """A new session whose unqualified tables resolve in ``keyspace`` (None: the
        topology's default keyspace), run for ``identity`` (required, no default: see
        :meth:`.SessionTable.open`, which says what each argument does)."""
        return self.sessions.open(self.topology, keyspace, identity=identity,
                                  transaction_mode=transaction_mode, owner=owner,
                                  addressable=addressable)

    def find_session(self, session_id: int, owner: str | None) -> Session:
        """The session ``session_id`` if ``owner`` owns it; ``NOT_FOUND`` otherwise."""
        return self.sessions.find(session_id, owner)

    async def close_session(self, session_id: int, owner: str | None) -> None:
        """Roll back the session's open transaction and forget it (unknown ids: nothing)."""
        session = self.sessions.pop(session_id, owner)
        if session is not None:
            async with session.lock:
                if session.in_transaction:
                    await self._tx.rollback(session)

    # -- planning (shardgate.gate.planning) -------------------------------------

    def plan(self, sql: str, keyspace: str | None) -> Plan | GateStatement:
        """The cached plan of ``sql``, or the statement the gate answers itself.

        The one path from text to plan: :func:`~shardgate.sql.classify.classify`,
        then session control and gate statements (resolved against the
        topology) or a routed :class:`Plan`.
        """
        return self._planner.plan(sql, keyspace)

    async def plan_async(self, sql: str, keyspace: str | None) -> Plan | GateStatement:
        """:meth:`plan`, first reading from the shards the columns the planner needs
        (schema tracking: :mod:`shardgate.gate.schema_tracker`); :meth:`plan` refuses
        a statement that needs columns not read yet (``UNIMPLEMENTED``)."""
        return await self._planner.plan_async(sql, keyspace)

    async def load_schema(self, keyspace: str | None = None) -> None:
        """Read the columns of ``keyspace``'s tables (of every keyspace: None) now,
        so that :meth:`plan` and :meth:`explain` need not wait for a statement to."""
        names = [keyspace] if keyspace is not None else list(self.topology.keyspaces)
        for name in names:
            await self.tracker.load(name)

    def authorize(self, session: Session, sql: str) -> None:
        """PermissionDenied unless the session's caller may run ``sql`` (statement
        rules, the deny-list, table ACLs: :class:`~shardgate.auth.guard.Guard`)."""
        self._planner.authorize(session, sql)

    def dialect_of(self, keyspace: str) -> Dialect | None:
        """The dialect of ``keyspace``'s shards (None: no such keyspace or no shard)."""
        return self._planner.dialect_of(keyspace)

    def query_stats(self) -> list[QueryStats]:
        """Statistics per normalized query, the most time-consuming first."""
        return self.stats.snapshot()

    def split_query(self, sql: str, n: int, keyspace: str | None = None) -> list[QuerySplit]:
        """Split a scatter SELECT into about ``n`` key-range parts covering it exactly once."""
        return self._planner.split_query(sql, n, keyspace)

    def explain(self, sql: str, keyspace: str | None = None) -> dict[str, Any]:
        """The plan of ``sql`` as JSON-able data (Vitess planbuilder test shape)."""
        return self._planner.explain(sql, keyspace)

    async def explain_shards(
        self, sql: str, keyspace: str | None = None, *, identity: Caller
    ) -> dict[str, Any]:
        """:meth:`explain`, with the shards each route of the plan reaches (``"Shards"``,
        as ``keyspace/shard``), resolved from the statement's values as execution would
        (lookup vindexes read): so ``identity`` must be allowed to run ``sql`` itself."""
        return await self._planner.explain_shards(sql, keyspace, identity)

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
        self._planner.authorize(session, sql)
        try:
            planned = self._planner.plan(sql, session.plan_key)  # errors here change nothing
        except ColumnsUnknown as exc:  # read the columns the planner asks for, plan again
            planned = await self._planner.plan_reading(sql, session.plan_key, exc)
        if (type(planned) is Plan and not session.in_transaction and session.ended is None
                and type(planned.instructions) is Route and planned.instructions.direct):
            # The point path: a read of one shard outside a transaction (never held by a
            # cut-over, no transaction to expire or report): SessionTable.using and
            # check_ended inline, nothing else skipped (see _execute_plan and _run).
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
        with self.sessions.using(session):
            await self.sessions.check_ended(session, planned)
            if not isinstance(planned, Plan):
                return await control(self._tx, self.topology, session, planned)
            while True:
                try:
                    return await self._execute_plan(session, planned, bv)
                except ShardgateError as exc:
                    if not cutover.writes_frozen(exc):
                        raise
                    if session.in_transaction:
                        await self._tx.rollback(session)
                        raise Aborted(
                            "writes to these shards are paused for a reshard's cut-over; the "
                            "transaction was rolled back: retry it") from exc
                    if not await self.hold.wait(held_until):
                        raise Unavailable(
                            f"writes stayed paused by a reshard's cut-over for "
                            f"{cutover.HOLD_S:g}s; retry the statement") from exc
                planned = await self._planner.plan_async(sql, session.plan_key)
                if not isinstance(planned, Plan):  # pragma: no cover - same SQL, same kind
                    return await control(self._tx, self.topology, session, planned)

    async def execute_wire(
        self, session: Session, sql: str, bind_vars: Mapping[str, Any] | None = None,
        *, planned: Plan | GateStatement | None = None,
    ) -> WireResult | None:
        """:meth:`execute` for a MySQL client: a point read's answer as the shard's own
        packets, or None where the statement is not such a read (see :mod:`.wire`).
        ``planned``: ``sql``'s plan, given by a caller that has just authorized
        ``sql`` for ``session`` and planned it (neither is done again)."""
        return await wire.execute_wire(self, self._planner, self._recorder, session, sql,
                                       bind_vars, planned)

    async def _execute_plan(
        self, session: Session, planned: Plan, bv: Mapping[str, Any]
    ) -> Result:
        if planned.statement_type is not StatementType.DDL:
            return await self._recorder.run(
                session, planned, lambda: self._run(session, planned.instructions, bv),
                self._recorder.check_result)
        # column kinds and tracked columns before and after the DDL (a read while it
        # runs may see the old schema), and the plans built from them
        self.schema.forget()
        try:
            return await self._recorder.run(
                session, planned, lambda: self._run(session, planned.instructions, bv),
                self._recorder.check_result)
        finally:
            self.schema.forget()
            self.plans.clear()

    async def _run(self, session: Session, prim: Primitive, bv: Mapping[str, Any]) -> Result:
        """Execute a planned statement with the session's transaction rules."""
        cursor = SessionCursor(self, session)
        if type(prim) is Route and prim.direct and not session.in_transaction:
            # A point read: its one shard found directly, then what Route.execute
            # does for one shard (the shard's result as is); the rare values
            # point_shard leaves undecided take the general route.
            cursor.reads = True
            try:
                shard = await prim.point_shard(cursor, bv)
                if shard is None:
                    return await prim.execute(cursor, bv)
                return await cursor.one_shard(prim.keyspace, shard, prim.query, bv)
            except ShardgateError:
                raise
            except Exception as exc:
                raise unexpected(exc) from exc
        return await self._tx.run(session, prim, bv, cursor)

    async def execute_batch(
        self,
        session: Session,
        statements: Sequence[tuple[str, Mapping[str, Any] | None]],
        *,
        as_transaction: bool = False,
    ) -> list[Result | ShardgateError]:
        """Run several statements; each gets its result or its error (ExecuteBatch),
        ``as_transaction`` in one transaction (see :meth:`.Transactions.execute_batch`)."""
        return await self._tx.execute_batch(session, statements, as_transaction)

    def update_stream(
        self,
        keyspace: str,
        key_range: KeyRange | str | None = None,
        start: StartPoint = None,
        *,
        heartbeat_s: float = 1.0,
        identity: Caller,
    ) -> AsyncIterator[StreamEvent]:
        """The change stream of a keyspace or key range, as ``identity`` may read it
        (required, as for :meth:`session`: see :func:`.streaming.update_stream`)."""
        return streaming.update_stream(self, keyspace, key_range, start, heartbeat_s, identity)

    def stream_execute(
        self, session: Session, sql: str, bind_vars: Mapping[str, Any] | None = None
    ) -> AsyncIterator[Result]:
        """Run a statement and yield its result in chunks (the first has the fields).

        Outside a transaction a scatter SELECT streams shard by shard with
        bounded memory; everything else yields one chunk.
        """
        return streaming.stream_execute(self, session, sql, bind_vars)

    # -- transactions (shardgate.gate.transactions) -----------------------------

    async def begin(self, session: Session) -> None:
        """Open a transaction in ``session`` (an open one is committed first, as BEGIN)."""
        await self._tx.begin(session)

    async def commit(self, session: Session) -> None:
        """Commit every shard of the session's transaction, in the order they joined."""
        await self._tx.commit(session)

    async def rollback(self, session: Session) -> None:
        """Roll back every shard of the session's transaction."""
        await self._tx.rollback(session)

    async def resolve_transactions(
        self, *, grace_s: float = twopc.DEFAULT_RESOLVE_GRACE_S
    ) -> twopc.ResolveReport:
        """Commit or roll back the two-phase commits a dead gate left prepared.

        Safe while other gates run: records younger than ``grace_s`` are left alone.
        """
        return await self._tx.resolve(grace_s)

    # -- schemas (shardgate.gate.catalog) ---------------------------------------

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        """How each column of ``table`` converts values (:meth:`.Catalog.column_kinds`)."""
        return await self.schema.column_kinds(keyspace, table)

    async def catalog(self, keyspace: str, table: str | None = None) -> list[TableInfo]:
        """The tables of ``keyspace`` (or only ``table``) with columns and indexes, types in
        MySQL's shapes, read from its first shard (see :mod:`shardgate.gate.catalog`)."""
        return await self.schema.tables(keyspace, table)

    async def views(self, keyspace: str) -> list[str]:
        """The views of ``keyspace`` (its first shard's), sorted; not cached."""
        return await self.schema.views(keyspace)

    async def native_describe(self, keyspace: str, table: str) -> list[tuple[Any, ...]] | None:
        """``DESCRIBE keyspace.table`` as the keyspace's MariaDB/MySQL shards answer it
        (views included); None on other dialects or when not found."""
        return await self.schema.native_describe(keyspace, table)

    async def native_create(self, keyspace: str, table: str) -> str | None:
        """``SHOW CREATE TABLE`` of ``keyspace.table`` as the keyspace's MariaDB/MySQL
        shards answer it (foreign keys, checks, comments, view definitions), database
        names turned into keyspace names; None on other dialects or when not found."""
        return await self.schema.native_create(keyspace, table)
