"""The MySQL listener's point reads answered with the shard's own packets.

A point read of a MariaDB/MySQL shard (one shard, outside a transaction, a tablet
in this process) is sent to the shard as is and its packets handed back to the
MySQL client without being converted to rows and back (as Vitess's #17172 asks);
everything else a statement goes through on :meth:`Gate.execute`'s point path
(authorization, routing, timeout, result limits, statistics, query log, metrics)
it goes through here too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from shardgate.engine.plan import Plan
from shardgate.engine.route import Route
from shardgate.errors import ShardgateError
from shardgate.gate.cursor import CursorGate, SessionCursor
from shardgate.gate.failures import unexpected
from shardgate.gate.planning import Planner
from shardgate.gate.recording import Recorder
from shardgate.gate.session import Session
from shardgate.result import WireResult
from shardgate.sql.inputs import check_bind_vars
from shardgate.sql.statements import GateStatement
from shardgate.tablet import TabletClient


class WireGate(CursorGate, Protocol):
    """What the wire path needs of the gate: the cursors' view and the first shard."""

    def first_shard(self, keyspace: str) -> tuple[tuple[str, str], TabletClient]: ...


async def execute_wire(
    gate: WireGate, planner: Planner, recorder: Recorder, session: Session, sql: str,
    bind_vars: Mapping[str, Any] | None = None,
    planned: Plan | GateStatement | None = None,
) -> WireResult | None:
    """:meth:`Gate.execute` for a MySQL client: a point read's answer as the MariaDB/MySQL
    shard's own packets (:class:`~shardgate.result.WireResult`), or None where the
    statement is not such a read (a transaction open, more than one shard, another
    database, a tablet in another process): the caller then runs :meth:`Gate.execute`.

    The same checks and records as :meth:`Gate.execute`'s point path: authorization,
    routing, the query timeout, the result limits, statistics, query log, metrics.
    ``planned``: the plan of ``sql`` from a caller that authorized it for ``session``
    just before (the MySQL listener, which plans every read to choose its path).
    """
    bv = check_bind_vars(bind_vars)
    if planned is None:
        planner.authorize(session, sql)
        planned = await planner.plan_async(sql, session.plan_key)
    if (type(planned) is not Plan or session.in_transaction or session.ended is not None
            or type(planned.instructions) is not Route or not planned.instructions.direct):
        return None
    prim = planned.instructions
    if not gate.first_shard(prim.keyspace)[1].gives_wire:
        return None  # (a keyspace of another database: no vindex hashed in vain)
    cursor = SessionCursor(gate, session)
    cursor.reads = True
    try:
        shard = await prim.point_shard(cursor, bv)
    except ShardgateError:
        raise
    except Exception as exc:
        raise unexpected(exc) from exc
    if shard is None:
        return None
    tablet = cursor.tablet(prim.keyspace, shard)
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
            gate.timeline.record((prim.keyspace, shard), time.perf_counter() - start,
                                 failed)
        return result

    session.busy += 1
    try:
        return await recorder.run(session, planned, run, recorder.check_result)
    finally:
        session.busy -= 1
        session.last_used = time.monotonic()
