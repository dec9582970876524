"""The gate's gRPC service (``grpc.aio``): transport only.

Every RPC unpacks its request, calls the matching :class:`~shardgate.gate.Gate`
method and packs the answer; there is no SQL logic here. What this module
owns is the session table and the error mapping:

* **Sessions.** The servicer keeps the gate's :class:`~shardgate.gate.Session`
  objects by id. ``session_id == 0`` creates one (in the request's keyspace or
  the topology's default); an unknown id is ``NOT_FOUND`` ("session expired,
  start a new one"), never silently a fresh session, since that would lose
  the client's open transaction without telling it. Calls on one session run
  one at a time (a per-session lock), as the gate's sessions require.
  ``CloseSession`` rolls back the session's open transaction and forgets it.
* **Errors.** A :class:`~shardgate.errors.ShardgateError` becomes the gRPC status
  of the same name, its message the status details. Anything else is a bug:
  it is logged with its traceback and sent as ``INTERNAL``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from shardgate.api import convert, queue_convert, stream_convert
from shardgate.api import shardgate_pb2 as pb
from shardgate.api import shardgate_pb2_grpc as pb_grpc
from shardgate.api.handlers import Ctx, relay, streaming, unary
from shardgate.errors import NotFound, ShardgateError, Unavailable
from shardgate.gate import Gate, Session

log = logging.getLogger(__name__)

#: Largest message either side accepts (results are sent whole by Execute).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

@dataclass
class _Entry:
    session: Session
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class GateServicer(pb_grpc.GateServicer):
    """The ``shardgate.v1.Gate`` service over one :class:`Gate`."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.sessions: dict[int, _Entry] = {}

    def _entry(self, session_id: int, keyspace: str | None) -> _Entry:
        if session_id == 0:
            session = self.gate.session(keyspace)
            entry = self.sessions[session.id] = _Entry(session)
            return entry
        found = self.sessions.get(session_id)
        if found is None:
            raise NotFound(f"session {session_id} expired, start a new one (send session_id 0)")
        return found

    @unary(pb.ExecuteResponse)
    async def Execute(self, request: pb.ExecuteRequest, context: Ctx) -> pb.ExecuteResponse:
        """Run one statement in the request's session."""
        entry = self._entry(request.session_id, _keyspace(request))
        bind_vars = convert.from_bind_vars(request.bind_vars)
        async with entry.lock:
            result = await self.gate.execute(entry.session, request.sql, bind_vars,
                                             options=convert.options_of(request))
        return convert.execute_response(entry.session.id, result, entry.session.in_transaction)

    @unary(pb.ExecuteBatchResponse)
    async def ExecuteBatch(
        self, request: pb.ExecuteBatchRequest, context: Ctx
    ) -> pb.ExecuteBatchResponse:
        """Run several statements; each gets its result or its error."""
        entry = self._entry(request.session_id, _keyspace(request))
        queries = [(q.sql, convert.from_bind_vars(q.bind_vars)) for q in request.queries]
        async with entry.lock:
            outcomes = await self.gate.execute_batch(
                entry.session, queries, as_transaction=request.as_transaction
            )
        results = []
        for out in outcomes:
            if isinstance(out, ShardgateError):
                results.append(pb.BatchResult(
                    error=pb.QueryError(code=out.code.value, message=out.message)))
            else:
                results.append(pb.BatchResult(
                    result=convert.execute_response(entry.session.id, out)))
        return pb.ExecuteBatchResponse(session_id=entry.session.id, results=results)

    @streaming
    async def StreamExecute(
        self, request: pb.StreamExecuteRequest, context: Ctx
    ) -> AsyncIterator[pb.StreamExecuteResponse]:
        """Run one statement and stream its result chunks."""
        entry = self._entry(request.session_id, _keyspace(request))
        bind_vars = convert.from_bind_vars(request.bind_vars)
        async with entry.lock:
            chunks = self.gate.stream_execute(entry.session, request.sql, bind_vars)
            sid = entry.session.id
            async for response in relay(chunks, lambda c: convert.stream_response(sid, c)):
                yield response

    @unary(pb.ExplainPlanResponse)
    async def ExplainPlan(
        self, request: pb.ExplainPlanRequest, context: Ctx
    ) -> pb.ExplainPlanResponse:
        """The plan of a statement as JSON, in the session's (or given) keyspace."""
        if request.session_id:
            keyspace = self._entry(request.session_id, None).session.keyspace
        else:
            keyspace = self.gate.session(_keyspace(request)).keyspace
        plan = await self.gate.explain_shards(request.sql, keyspace)
        return pb.ExplainPlanResponse(plan_json=json.dumps(plan, default=str))

    @unary(pb.GetVSchemaResponse)
    async def GetVSchema(
        self, request: pb.GetVSchemaRequest, context: Ctx
    ) -> pb.GetVSchemaResponse:
        """The VSchema of every keyspace the gate serves, as JSON."""
        doc = {ks.name: ks.vschema for ks in self.gate.topology.keyspaces.values()}
        return pb.GetVSchemaResponse(vschema_json=json.dumps(doc, default=str))

    @unary(pb.CloseSessionResponse)
    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: Ctx
    ) -> pb.CloseSessionResponse:
        """Roll back the session's open transaction and forget it."""
        entry = self.sessions.pop(request.session_id, None)
        if entry is not None:
            async with entry.lock:
                if entry.session.in_transaction:
                    await self.gate.rollback(entry.session)
        return pb.CloseSessionResponse()

    @streaming
    async def QueueReceive(
        self, request: pb.QueueReceiveRequest, context: Ctx
    ) -> AsyncIterator[pb.QueueReceiveResponse]:
        """Stream fired events of a queue: the fields first, then batches."""
        stream = self.gate.queue_receive(
            request.keyspace, request.queue,
            shard=request.shard if request.HasField("shard") else None,
            key_range=request.key_range if request.HasField("key_range") else None,
            max_batch=request.max_batch)
        async for response in relay(stream, queue_convert.batch_response):
            yield response

    @streaming
    async def UpdateStream(
        self, request: pb.UpdateStreamRequest, context: Ctx
    ) -> AsyncIterator[pb.UpdateStreamResponse]:
        """Stream the change stream of a keyspace or key range."""
        start: float | str | None = None
        if request.HasField("start_position"):
            start = request.start_position
        elif request.HasField("start_timestamp"):
            start = request.start_timestamp
        stream = self.gate.update_stream(
            request.keyspace,
            request.key_range if request.HasField("key_range") else None,
            start,
            heartbeat_s=request.heartbeat_seconds or 1.0,
        )
        async for response in relay(stream, stream_convert.event_response):
            yield response

    @unary(pb.QueueAckResponse)
    async def QueueAck(self, request: pb.QueueAckRequest, context: Ctx) -> pb.QueueAckResponse:
        """Ack events of one shard; returns once the ack is committed."""
        n = await self.gate.queue_ack(request.keyspace, request.queue, request.shard,
                                      list(request.ids))
        return pb.QueueAckResponse(acked=n)

    @unary(pb.QueueStatsResponse)
    async def QueueStats(
        self, request: pb.QueueStatsRequest, context: Ctx
    ) -> pb.QueueStatsResponse:
        """Per-shard figures of a queue, as JSON."""
        stats = await self.gate.queue_stats(request.keyspace, request.queue)
        return pb.QueueStatsResponse(stats_json=json.dumps(stats, default=str))


def _keyspace(
    request: pb.ExecuteRequest | pb.StreamExecuteRequest | pb.ExplainPlanRequest,
) -> str | None:
    return request.keyspace if request.HasField("keyspace") else None


async def serve(gate: Gate, host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.aio.Server, int]:
    """Start serving ``gate`` on ``host:port`` (0: a free port); return the server and port.

    The caller owns both: ``await server.stop(grace)`` then ``await gate.close()``.
    """
    server = new_server()
    pb_grpc.add_GateServicer_to_server(GateServicer(gate), server)  # type: ignore[no-untyped-call]
    bound = listen(server, host, port)
    await server.start()
    return server, bound


def new_server() -> grpc.aio.Server:
    """A gRPC server with shardgate's options.

    No SO_REUSEPORT: a second process on a busy port must fail, not share it.
    """
    return grpc.aio.server(options=[*GRPC_OPTIONS, ("grpc.so_reuseport", 0)])


def listen(server: grpc.aio.Server, host: str, port: int) -> int:
    """Bind ``server`` to ``host:port`` (0: a free port) and return the port.

    A port already taken is one clear ``UNAVAILABLE`` error, found before gRPC
    tries (gRPC would print its own C++ log line to stderr first).
    """
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if port:
        _check_free(host, port, address)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise Unavailable(f"cannot listen on {address}: {exc}; is the port in use?") from exc
    if bound == 0:
        raise Unavailable(f"cannot listen on {address}; is the port in use?")
    return int(bound)


def _check_free(host: str, port: int, address: str) -> None:
    try:
        family, kind, proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )[0]
    except OSError as exc:
        raise Unavailable(f"cannot listen on {address}: {exc.strerror or exc}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            raise Unavailable(
                f"cannot listen on {address}: {reason}; another process (a running "
                "`shardgate up`?) holds it: stop that one or pass --port N"
            ) from None
