"""What the gate streams: a statement's result in chunks, and change streams.

A scatter SELECT outside a transaction streams shard by shard with bounded
memory (:func:`stream_execute`); every other statement runs as ``execute``
runs it (writes are held across a reshard's cut-over there) and yields one
chunk. A change stream (:func:`update_stream`) merges the shards' streams of a
keyspace or key range (:mod:`shardgate.streams.merge`), leaves out the changes
of tables its reader may not read, and is listed among the gate's stream
consumers while it is read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from shardgate.auth.guard import Guard
from shardgate.auth.identity import Caller, Identity
from shardgate.engine.plan import Plan
from shardgate.engine.readswitch import ReadSwitch
from shardgate.engine.route import Route
from shardgate.errors import ShardgateError
from shardgate.gate.cursor import CursorGate, SessionCursor
from shardgate.gate.failures import unexpected
from shardgate.gate.querylog import StreamConsumers
from shardgate.gate.session import Session
from shardgate.gate.sessions import SessionTable
from shardgate.gate.stream_access import check_stream_reader, readable_events
from shardgate.gate.transactions import writes
from shardgate.keys import KeyRange
from shardgate.result import Result
from shardgate.sql.inputs import check_bind_vars
from shardgate.sql.statements import GateStatement
from shardgate.streams.merge import StartPoint, StreamEvent, StreamGate
from shardgate.streams.merge import update_stream as merged_stream
from shardgate.vschema import VSchema


class StreamingGate(CursorGate, StreamGate, Protocol):
    """What streaming needs of the gate."""

    @property
    def vschema(self) -> VSchema: ...

    @property
    def guard(self) -> Guard: ...

    @property
    def sessions(self) -> SessionTable: ...

    @property
    def streams(self) -> StreamConsumers: ...

    def authorize(self, session: Session, sql: str) -> None: ...

    async def plan_async(self, sql: str, keyspace: str | None) -> Plan | GateStatement: ...


async def stream_execute(
    gate: StreamingGate, session: Session, sql: str, bind_vars: Mapping[str, Any] | None
) -> AsyncIterator[Result]:
    """:meth:`shardgate.gate.Gate.stream_execute` (see there)."""
    bv = check_bind_vars(bind_vars)
    gate.authorize(session, sql)
    planned = await gate.plan_async(sql, session.plan_key)
    instructions = planned.instructions if isinstance(planned, Plan) else None
    if isinstance(instructions, ReadSwitch) and not session.in_transaction:
        instructions = instructions.reads  # a read outside a transaction
    if (
        not isinstance(planned, Plan)
        or session.in_transaction
        or not isinstance(instructions, Route)
        or writes(instructions)  # held across a cut-over, as execute holds it
    ):
        yield await gate.execute(session, sql, bv)
        return
    with gate.sessions.using(session):
        await gate.sessions.check_ended(session, planned)
        try:
            async for chunk in instructions.stream(SessionCursor(gate, session), bv):
                yield chunk
        except ShardgateError:
            raise
        except Exception as exc:
            raise unexpected(exc) from exc


def update_stream(
    gate: StreamingGate, keyspace: str, key_range: KeyRange | str | None, start: StartPoint,
    heartbeat_s: float, identity: Caller,
) -> AsyncIterator[StreamEvent]:
    """The change stream of a keyspace or key range (see :mod:`shardgate.streams.merge`).

    While it is being read it is listed in the gate's ``streams`` (the console's
    consumers, their position and lag). ``identity`` is the reader: with a
    table ACL, each change of a table an :class:`Identity` may not read is left
    out (see :mod:`shardgate.gate.stream_access`), PERMISSION_DENIED at once
    when it may read no table of the keyspace; TRUSTED (in-process code only; a
    transport always passes its caller) reads every table. Required, as for a
    session: no stream is read without saying who reads it.
    """
    who = identity if isinstance(identity, Identity) else None
    tables = gate.vschema.keyspace(keyspace).tables
    acl = check_stream_reader(gate.guard, who, keyspace, tables)
    events = merged_stream(gate, keyspace, key_range, start, heartbeat_s=heartbeat_s)
    if acl is not None and who is not None:
        events = readable_events(events, acl, who, keyspace)
    return gate.streams.follow(
        keyspace, str(key_range) if key_range is not None else None, events)
