"""The tablet's gRPC service (``shardgate tablet``): transport only.

Every RPC maps onto one :class:`~shardgate.tablet.Tablet` method. Callers are
authenticated by :class:`~shardgate.api.security.AuthInterceptor` before any
handler runs (tablets accept only gates). Transactions are the tablet's own
ids; a gate that dies leaves them open until the tablet's idle-transaction
timeout (``shardgate tablet --idle-transaction-timeout``) rolls them back. A
gate call cancelled (its deadline, a statement timeout, a lost gate) cancels
the tablet's work and the statement on the database.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc

from shardgate.api import convert, queue_convert
from shardgate.api import shardgate_pb2 as pb
from shardgate.api import shardgate_pb2_grpc as pb_grpc
from shardgate.api.handlers import Ctx, relay, streaming, unary
from shardgate.api.security import NO_SECURITY, ServerSecurity
from shardgate.api.server import listen, new_server
from shardgate.auth.listen import check_listen
from shardgate.result import Row
from shardgate.tablet import Tablet
from shardgate.tablet.queue_service import receive_batches


class TabletServicer(pb_grpc.TabletServicer):
    def __init__(self, tablet: Tablet) -> None:
        self.tablet = tablet

    async def Info(self, request: pb.TabletInfoRequest,
                   context: grpc.aio.ServicerContext) -> pb.TabletInfoResponse:
        t = self.tablet
        return pb.TabletInfoResponse(keyspace=t.keyspace, shard=t.shard, dialect=t.dialect,
                                     placeholder=t.placeholder)

    @unary(pb.ExecuteResponse)
    async def Execute(self, request: pb.TabletExecuteRequest, context: Ctx) -> pb.ExecuteResponse:
        params = [convert.from_value(v) for v in request.params]
        result = await self.tablet.execute(request.sql, params, request.transaction_id or None,
                                           convert.options_of(request))
        return convert.execute_response(0, result)

    @streaming
    async def StreamExecute(
        self, request: pb.TabletExecuteRequest, context: Ctx
    ) -> AsyncIterator[pb.StreamExecuteResponse]:
        params = [convert.from_value(v) for v in request.params]
        first = True

        def chunk(batch: tuple[list[str], list[Row]]) -> pb.StreamExecuteResponse:
            nonlocal first
            fields, rows = batch
            response = pb.StreamExecuteResponse(
                fields=[pb.Field(name=f) for f in fields] if first else [],
                rows=convert.to_rows(rows))
            first = False
            return response

        async for response in relay(self.tablet.stream_execute(request.sql, params), chunk):
            yield response

    @unary(pb.TabletTransactionResponse)
    async def Begin(
        self, request: pb.TabletTransactionRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        return pb.TabletTransactionResponse(transaction_id=await self.tablet.begin())

    @unary(pb.TabletTransactionResponse)
    async def Commit(
        self, request: pb.TabletTransactionRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        await self.tablet.commit(request.transaction_id)
        return pb.TabletTransactionResponse(transaction_id=request.transaction_id)

    @unary(pb.TabletTransactionResponse)
    async def Rollback(
        self, request: pb.TabletTransactionRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        await self.tablet.rollback(request.transaction_id)
        return pb.TabletTransactionResponse(transaction_id=request.transaction_id)

    @streaming
    async def QueueReceive(
        self, request: pb.QueueReceiveRequest, context: Ctx
    ) -> AsyncIterator[pb.QueueReceiveResponse]:
        stream = receive_batches(self.tablet.queues, request.queue, request.max_batch)
        async for response in relay(stream, queue_convert.batch_response):
            yield response

    @unary(pb.QueueAckResponse)
    async def QueueAck(self, request: pb.QueueAckRequest, context: Ctx) -> pb.QueueAckResponse:
        n = await self.tablet.queues.ack(request.queue, list(request.ids))
        return pb.QueueAckResponse(acked=n)

    @unary(pb.QueueNackResponse)
    async def QueueNack(self, request: pb.QueueNackRequest, context: Ctx) -> pb.QueueNackResponse:
        retry_at = request.retry_at_ns if request.HasField("retry_at_ns") else None
        n = await self.tablet.queues.nack(request.queue, list(request.ids), request.reason,
                                          retry_at)
        return pb.QueueNackResponse(nacked=n)

    @unary(pb.QueueStatsResponse)
    async def QueueStats(
        self, request: pb.QueueStatsRequest, context: Ctx
    ) -> pb.QueueStatsResponse:
        stats = await self.tablet.queues.stats(request.queue)
        return pb.QueueStatsResponse(stats_json=json.dumps(stats, default=str))


async def serve_tablet(
    tablet: Tablet, host: str = "127.0.0.1", port: int = 0, *,
    security: ServerSecurity | None = None, no_auth: bool = True, insecure: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """Serve ``tablet`` on ``host:port`` (0: a free port); return the server and port.

    Tablets accept only gates: give ``security`` a users file holding the
    gates' credential, or a CA that signs the gates' client certificates
    (and ``allowed_users`` to name them). Without ``security`` the tablet
    serves anyone, on loopback only (see :func:`shardgate.api.server.serve`).
    """
    security = security or NO_SECURITY
    check_listen(host, tls=security.tls is not None, auth=security.authenticates,
                 no_auth=no_auth, insecure=insecure, what="tablet")
    server = new_server(security)
    pb_grpc.add_TabletServicer_to_server(TabletServicer(tablet), server)  # type: ignore[no-untyped-call]
    bound = listen(server, host, port, security)
    await server.start()
    return server, bound
