"""From SQL text to what the gate runs: the plan cache, gate DDL, USE, targeted sessions.

The one path from text to plan (:meth:`Planner.plan`): the plan cache is
looked up on ``(sql, plan key)``; on a miss the statement is classified
(:func:`~shardgate.sql.classify.classify`), then it is either a statement the
gate answers itself (session control, ``SHOW VITESS_*``: cached as its typed
statement, ``USE`` resolved against the topology), a DDL the gate runs itself
(``CREATE/DROP QUEUE``, ``ALTER VSCHEMA``, ``DROP TABLE`` of VSchema tables,
``CREATE TABLE ... AS SELECT`` across shards or keyspaces, ``CREATE TABLE`` in
an ``auto_shard`` keyspace: never cached, they change the VSchema), a
statement sent as is to the shard a targeted session names (``USE `ks:-80```,
:func:`~shardgate.planner.target.session_target`), or a routed plan
(:func:`~shardgate.planner.build.build_plan`).

Authorization (:meth:`Planner.authorize`) is asked before planning, for every
caller's statement; ``EXPLAIN`` and ``split_query`` read plans from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from sqlglot import exp

from shardgate.auth import catalogs
from shardgate.auth.guard import Guard
from shardgate.auth.identity import Caller
from shardgate.engine.cursor import ShardQuery
from shardgate.engine.plan import Plan
from shardgate.engine.primitive import Opcode
from shardgate.engine.route import Route
from shardgate.errors import InvalidArgument, ShardgateError, Unsupported
from shardgate.gate import twopc, vschema_ddl
from shardgate.gate.create_select import CreateTableAsSelect, TableCreator
from shardgate.gate.cursor import CursorGate, SessionCursor
from shardgate.gate.failures import unexpected
from shardgate.gate.plan_cache import PlanCache
from shardgate.gate.schema_tracker import SchemaTracker
from shardgate.gate.session import Session
from shardgate.gate.split import QuerySplit, split_query
from shardgate.gate.transactions import writes
from shardgate.planner.build import build_plan, normalize
from shardgate.planner.ddl import (
    auto_increment_column,
    first_primary_key_column,
    reads_other_keyspace,
)
from shardgate.planner.target import Target, session_target
from shardgate.queues import router as queue_router
from shardgate.queues.ddl import create_queue_from
from shardgate.sql.classify import classify
from shardgate.sql.dialects import Dialect
from shardgate.sql.inputs import check_sql
from shardgate.sql.schema import ColumnsUnknown
from shardgate.sql.statements import (
    AlterVSchema,
    CreateQueueStatement,
    DropQueueStatement,
    GateStatement,
    SetTransactionMode,
    StatementType,
    TabletType,
    Use,
)
from shardgate.tablet import TabletClient
from shardgate.vschema import VSchema


class PlanningGate(CursorGate, vschema_ddl.VSchemaChanger, TableCreator,
                   queue_router.QueueDDLGate, Protocol):
    """What :class:`Planner` needs of the gate: what it serves, and what the gate's
    own DDL primitives it plans need (they hold the gate)."""

    @property
    def tablets(self) -> Mapping[tuple[str, str], TabletClient]: ...

    @property
    def vschema(self) -> VSchema: ...

    @property
    def guard(self) -> Guard: ...

    @property
    def tracker(self) -> SchemaTracker: ...

    def session(self, keyspace: str | None = None, *, identity: Caller) -> Session: ...


class Planner:
    """Plans statements for a gate and keeps its plan cache (see the module docstring).

    Invariant: a cached entry was planned against the VSchema served now (the
    gate clears ``plans`` whenever it serves another).
    """

    def __init__(self, gate: PlanningGate, plans: PlanCache[Plan | GateStatement]) -> None:
        self._gate = gate
        self._plans = plans

    def plan(self, sql: str, keyspace: str | None) -> Plan | GateStatement:
        """The cached plan of ``sql``, or the statement the gate answers itself."""
        key = (check_sql(sql), keyspace)
        found = self._plans.get(key)
        if found is not None:
            return found
        gate = self._gate
        stmt = classify(sql)
        target = session_target(keyspace)
        planned: Plan | GateStatement
        match stmt:
            case CreateQueueStatement():  # not cached: it changes the VSchema
                cq = create_queue_from(stmt)
                ks = gate.vschema.keyspace(cq.keyspace or keyspace or "").name
                return Plan(StatementType.DDL, sql, queue_router.CreateQueuePrimitive(cq, ks, gate))
            case Use():
                planned = self._resolve_use(stmt)
            case SetTransactionMode(mode=mode):
                planned = SetTransactionMode(twopc.check_mode(mode))
            case AlterVSchema():  # not cached: it changes the VSchema
                ks = gate.vschema.keyspace(_ddl_keyspace(stmt.keyspace, keyspace, target)).name
                alter = vschema_ddl.AlterVSchemaPrimitive(stmt, ks, gate)
                return Plan(StatementType.DDL, sql, alter)
            case DropQueueStatement():
                ks = gate.vschema.keyspace(_ddl_keyspace(stmt.keyspace, keyspace, target)).name
                return Plan(StatementType.DDL, sql, queue_router.DropQueuePrimitive(stmt, ks, gate))
            case exp.Drop() if target is None and (
                    cascade := self._drop_cascade(stmt, sql, keyspace)) is not None:
                return Plan(StatementType.DDL, sql, cascade)
            case exp.Create() if target is None and (
                    ctas := self._create_as_select(stmt, keyspace)) is not None:
                return Plan(StatementType.DDL, sql, ctas)  # not cached: it may change the VSchema
            case exp.Create() if target is None and (
                    auto := self._auto_shard(stmt, sql, keyspace)) is not None:
                return Plan(StatementType.DDL, sql, auto)  # not cached: it changes the VSchema
            case exp.Expression() if target is not None:
                planned = self._targeted(stmt, sql, target)
            case exp.Expression():
                try:
                    planned = build_plan(stmt, sql, gate.vschema.with_schema(gate.tracker.schema),
                                         keyspace)
                except ShardgateError:
                    raise
                except Exception as exc:  # a bug: still a coded error for the caller
                    raise unexpected(exc, "planning") from exc
            case _:
                planned = stmt
        self._plans.put(key, planned)
        return planned

    async def plan_reading(self, sql: str, keyspace: str | None,
                           unknown: ColumnsUnknown) -> Plan | GateStatement:
        """:meth:`plan` after it raised ``unknown``: the keyspaces whose columns the
        planner asks for are read from their shards (the schema tracker), then
        ``sql`` is planned again. A keyspace that cannot be read makes the
        planner refuse the statement (coded), as without the columns."""
        reads: dict[str, int] = {}
        while True:
            n = reads.get(unknown.keyspace, 0)
            if n >= _READS_PER_KEYSPACE:  # forgotten again each time (DDL meanwhile)
                raise unknown
            reads[unknown.keyspace] = n + 1
            await self._gate.tracker.load(unknown.keyspace)
            try:
                return self.plan(sql, keyspace)
            except ColumnsUnknown as exc:
                unknown = exc

    async def plan_async(self, sql: str, keyspace: str | None) -> Plan | GateStatement:
        """:meth:`plan`, reading the columns the planner needs first (see
        :meth:`plan_reading`)."""
        try:
            return self.plan(sql, keyspace)
        except ColumnsUnknown as exc:
            return await self.plan_reading(sql, keyspace, exc)

    def _drop_cascade(self, stmt: exp.Drop, sql: str,
                      keyspace: str | None) -> vschema_ddl.DropTableCascade | None:
        """The plan of a ``DROP TABLE`` that changes a VSchema, else None (plain DDL)."""
        if str(stmt.args.get("kind", "")).upper() != "TABLE":
            return None
        tables = [t for t in stmt.find_all(exp.Table)]
        known = [(t.db or keyspace, t.name) for t in tables
                 if (t.db or keyspace) and vschema_ddl.needs_cascade(
                     self._gate.topology, t.db or keyspace or "", t.name)]
        if not known:
            return None
        if len(tables) != 1:
            raise Unsupported(
                f"DROP TABLE of several tables where {known[0][0]}.{known[0][1]} is in the "
                "VSchema: drop the tables one per statement"
            )
        ks, name = known[0]
        assert ks is not None
        return vschema_ddl.DropTableCascade(ks, name, self._gate, vschema_ddl.confirmed(sql))

    def _create_as_select(self, stmt: exp.Create,
                          keyspace: str | None) -> CreateTableAsSelect | None:
        """The plan of a ``CREATE TABLE ... AS SELECT`` the gate runs itself (into a
        sharded keyspace, or reading another keyspace: :mod:`shardgate.gate.create_select`),
        else None (the keyspace's database runs it)."""
        select = stmt.expression
        if (str(stmt.args.get("kind", "")).upper() != "TABLE" or not isinstance(select, exp.Query)
                or stmt.find(exp.TemporaryProperty)):
            return None
        schema = stmt.this if isinstance(stmt.this, exp.Schema) else None
        target = schema.this if schema is not None else stmt.this
        if not isinstance(target, exp.Table) or not (target.db or keyspace):
            return None
        vschema = self._gate.vschema
        ks = vschema.keyspace(target.db or keyspace or "")
        if not ks.sharded and not reads_other_keyspace(select, ks.name, vschema, keyspace):
            return None
        source = build_plan(select, "", vschema, keyspace).instructions
        return CreateTableAsSelect(
            ks.name, target.name, tuple(schema.expressions) if schema is not None else (),
            select, source, keyspace, bool(stmt.args.get("exists")), self._gate)

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
        if str(stmt.args.get("kind", "")).upper() != "TABLE":
            return None
        target = stmt.this.this if isinstance(stmt.this, exp.Schema) else stmt.this
        if not isinstance(target, exp.Table) or not (target.db or keyspace):
            return None
        vschema = self._gate.vschema
        ks = vschema.keyspaces.get(target.db or keyspace or "")
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
        ddl = build_plan(stmt, sql, vschema, keyspace)
        counter = auto_increment_column(stmt)
        sequence = None
        if counter is not None and ks.auto_shard_sequences is not None:
            sequence = vschema_ddl.AutoSequence(ks.auto_shard_sequences,
                                                vschema_ddl.sequence_name(target.name),
                                                counter.lower())
        return vschema_ddl.AutoShardCreate(ks.name, target.name, column, ks.auto_shard,
                                           ddl.instructions, self._gate, sequence)

    def _resolve_use(self, use: Use) -> Use:
        """``USE`` with its target checked, and a keyspace id resolved to its shard."""
        gate = self._gate
        tablet_type = use.tablet_type or TabletType.PRIMARY
        if tablet_type != TabletType.PRIMARY and not all(
                t.has_replicas for t in gate.tablets.values()):
            raise Unsupported(
                f"USE {use.keyspace}@{use.tablet_type}: this gate serves each shard from one "
                "in-process tablet; replica reads need tablet processes (`shardgate gate "
                "--topo URL` with two `shardgate tablet` processes per shard)"
            )
        if use.shard is None and use.keyspace_id is None:
            return Use(gate.vschema.keyspace(use.keyspace).name, tablet_type=tablet_type)
        ks = gate.topology.keyspace(use.keyspace)
        if use.shard is not None:
            ks.shard(use.shard)
            return Use(ks.name, shard=use.shard, tablet_type=tablet_type)
        assert use.keyspace_id is not None
        return Use(ks.name, shard=ks.shard_map.find(use.keyspace_id), tablet_type=tablet_type)

    def _targeted(self, stmt: exp.Expression, sql: str, target: Target) -> Plan:
        """A statement sent as is to the shard the session targets (no routing)."""
        ks = self._gate.topology.keyspace(target.keyspace)
        shard = target.destination
        ks.shard(shard)
        # a data-changing CTE or a locking read writes too; catalogs kept to the shard's own
        write = isinstance(stmt, exp.Insert | exp.Update | exp.Delete) or any(
            True for _ in stmt.find_all(exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Lock))
        shard_stmt = catalogs.for_shard(stmt, self._gate.tablets[(ks.name, shard)].dialect)
        route = Route(Opcode.BY_DESTINATION, ks.name, ks.sharded,
                      ShardQuery(shard_stmt), write=write, target_shards=(shard,))
        return Plan(StatementType.TARGETED, sql, route, normalize(stmt))

    def authorize(self, session: Session, sql: str) -> None:
        """PermissionDenied unless the session's caller may run ``sql``."""
        gate = self._gate
        gate.guard.authorize(session.identity, check_sql(sql), session.plan_key, gate.vschema,
                             self.dialect_of)

    def dialect_of(self, keyspace: str) -> Dialect | None:
        """The dialect of ``keyspace``'s shards (None: no such keyspace or no shard)."""
        ks = self._gate.topology.keyspaces.get(keyspace)
        if ks is None or not ks.shards:
            return None
        tablet = self._gate.tablets.get((ks.name, ks.shards[0].name))
        return tablet.dialect if tablet is not None else None

    def split_query(self, sql: str, n: int, keyspace: str | None) -> list[QuerySplit]:
        """Split a scatter SELECT into about ``n`` key-range parts covering it exactly once."""
        topology = self._gate.topology
        planned = self.plan(sql, keyspace if keyspace is not None else topology.default_keyspace)
        if not isinstance(planned, Plan) or not isinstance(planned.instructions, Route):
            raise Unsupported(
                "split_query takes a single-table SELECT without aggregates, ORDER BY or LIMIT"
            )
        shards = {
            ks.name: [(s.name, s.key_range) for s in ks.shards]
            for ks in topology.keyspaces.values()
        }
        return split_query(shards, planned.instructions, sql, n)

    def explain(self, sql: str, keyspace: str | None) -> dict[str, Any]:
        """The plan of ``sql`` as JSON-able data (Vitess planbuilder test shape)."""
        planned = self.plan(sql, keyspace)
        if not isinstance(planned, Plan):
            return {"QueryType": planned.query_type, "Original": sql}
        return planned.describe()

    async def explain_shards(
        self, sql: str, keyspace: str | None, identity: Caller
    ) -> dict[str, Any]:
        """:meth:`explain` with the shards each route reaches (see ``Gate.explain_shards``)."""
        from shardgate.engine.explain import with_target_shards

        session = self._gate.session(keyspace, identity=identity)
        self.authorize(session, sql)
        planned = await self.plan_async(sql, keyspace)
        if not isinstance(planned, Plan):
            return {"QueryType": planned.query_type, "Original": sql}
        cursor = SessionCursor(self._gate, session)
        cursor.reads = not writes(planned.instructions)  # as the gate's run routes it
        return await with_target_shards(planned.instructions, planned.describe(), cursor)


#: reads of one keyspace's columns while planning one statement (each forgotten by a
#: DDL meanwhile) before the planner's refusal is returned
_READS_PER_KEYSPACE = 3


def point_read(planned: Plan | object) -> bool:
    """Whether ``planned`` (from :meth:`Planner.plan`) is a point read
    (:attr:`~shardgate.engine.route.Route.point`: one value of a unique vindex, nothing
    to merge): a front door runs it whole, since a stream costs more round trips."""
    return isinstance(planned, Plan) and isinstance(planned.instructions, Route) and \
        planned.instructions.point


def _ddl_keyspace(written: str | None, keyspace: str | None, target: Target | None) -> str:
    """The keyspace a gate DDL statement changes: the written one, else the session's."""
    ks = written or (target.keyspace if target is not None else keyspace)
    if not ks:
        raise InvalidArgument(
            "the statement needs a keyspace: qualify the name (keyspace.name) or set a "
            "default keyspace (USE ks)"
        )
    return ks
