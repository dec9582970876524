"""The tablet's gRPC service (``shardgate tablet``): transport only.

Every RPC maps onto one :class:`~shardgate.tablet.Tablet` method. Transactions
are the tablet's own ids; a gate that dies leaves them open until the
connection's tablet process stops (as with an in-process tablet).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from shardgate.api import convert, queue_convert
from shardgate.api import shardgate_pb2 as pb
from shardgate.api import shardgate_pb2_grpc as pb_grpc
from shardgate.api.server import GRPC_OPTIONS, _fail
from shardgate.errors import Unavailable
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

    async def Execute(self, request: pb.TabletExecuteRequest,
                      context: grpc.aio.ServicerContext) -> pb.ExecuteResponse:
        try:
            params = [convert.from_value(v) for v in request.params]
            result = await self.tablet.execute(request.sql, params,
                                               request.transaction_id or None,
                                               convert.options_of(request))
            return convert.execute_response(0, result)
        except Exception as exc:
            _fail(context, exc)
            return pb.ExecuteResponse()

    async def StreamExecute(self, request: pb.TabletExecuteRequest,
                            context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[pb.StreamExecuteResponse]:
        try:
            params = [convert.from_value(v) for v in request.params]
            stream = self.tablet.stream_execute(request.sql, params)
            try:
                first = True
                async for fields, rows in stream:
                    yield pb.StreamExecuteResponse(
                        fields=[pb.Field(name=f) for f in fields] if first else [],
                        rows=convert.to_rows(rows))
                    first = False
            finally:
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()
        except Exception as exc:
            _fail(context, exc)

    async def Begin(self, request: pb.TabletTransactionRequest,
                    context: grpc.aio.ServicerContext) -> pb.TabletTransactionResponse:
        try:
            return pb.TabletTransactionResponse(transaction_id=await self.tablet.begin())
        except Exception as exc:
            _fail(context, exc)
            return pb.TabletTransactionResponse()

    async def Commit(self, request: pb.TabletTransactionRequest,
                     context: grpc.aio.ServicerContext) -> pb.TabletTransactionResponse:
        try:
            await self.tablet.commit(request.transaction_id)
            return pb.TabletTransactionResponse(transaction_id=request.transaction_id)
        except Exception as exc:
            _fail(context, exc)
            return pb.TabletTransactionResponse()

    async def Rollback(self, request: pb.TabletTransactionRequest,
                       context: grpc.aio.ServicerContext) -> pb.TabletTransactionResponse:
        try:
            await self.tablet.rollback(request.transaction_id)
            return pb.TabletTransactionResponse(transaction_id=request.transaction_id)
        except Exception as exc:
            _fail(context, exc)
            return pb.TabletTransactionResponse()

    async def QueueReceive(self, request: pb.QueueReceiveRequest,
                           context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[pb.QueueReceiveResponse]:
        try:
            stream = receive_batches(self.tablet.queues, request.queue, request.max_batch)
            try:
                async for batch in stream:
                    yield queue_convert.batch_response(batch)
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
        except Exception as exc:
            _fail(context, exc)

    async def QueueAck(self, request: pb.QueueAckRequest,
                       context: grpc.aio.ServicerContext) -> pb.QueueAckResponse:
        try:
            n = await self.tablet.queues.ack(request.queue, list(request.ids))
            return pb.QueueAckResponse(acked=n)
        except Exception as exc:
            _fail(context, exc)
            return pb.QueueAckResponse()

    async def QueueStats(self, request: pb.QueueStatsRequest,
                         context: grpc.aio.ServicerContext) -> pb.QueueStatsResponse:
        try:
            stats = await self.tablet.queues.stats(request.queue)
            return pb.QueueStatsResponse(stats_json=json.dumps(stats, default=str))
        except Exception as exc:
            _fail(context, exc)
            return pb.QueueStatsResponse()


async def serve_tablet(tablet: Tablet, host: str = "127.0.0.1",
                       port: int = 0) -> tuple[grpc.aio.Server, int]:
    """Serve ``tablet`` on ``host:port`` (0: a free port); return the server and port."""
    server = grpc.aio.server(options=[*GRPC_OPTIONS, ("grpc.so_reuseport", 0)])
    pb_grpc.add_TabletServicer_to_server(TabletServicer(tablet), server)  # type: ignore[no-untyped-call]
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise Unavailable(f"cannot listen on {address}: {exc}; is the port in use?") from exc
    if bound == 0:
        raise Unavailable(f"cannot listen on {address}; is the port in use?")
    await server.start()
    return server, bound
