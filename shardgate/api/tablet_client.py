"""A :class:`~shardgate.tablet.TabletClient` for a tablet in another process (gRPC)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from shardgate.api import convert, queue_convert
from shardgate.api import shardgate_pb2 as pb
from shardgate.api import shardgate_pb2_grpc as pb_grpc
from shardgate.api.client import TLS_SCHEME, error_from_rpc, parse_target
from shardgate.api.security import ClientSecurity, open_channel
from shardgate.api.server import GRPC_OPTIONS
from shardgate.queues.events import QueueBatch
from shardgate.queues.options import QueueOptions
from shardgate.result import ExecuteOptions, Result, Row
from shardgate.tablet.client import TabletClient

#: what to do when no tablet answers
_TABLET_HINT = "start it with `shardgate tablet --keyspace K --shard S ...` or check its address"


class GrpcTabletClient(TabletClient):
    """Reaches one ``shardgate tablet`` process. Create it with :meth:`connect`.

    ``security`` is the gate's credential for tablets (a user and password the
    tablet's users file knows, or a client certificate its CA signed).
    """

    def __init__(self, target: str, keyspace: str, shard: str, dialect: str,
                 placeholder: str, *, timeout: float | None = None,
                 security: ClientSecurity | None = None) -> None:
        self.target = target
        self.keyspace = keyspace
        self.shard = shard
        self.dialect = dialect
        self.placeholder = placeholder
        self.timeout = timeout
        self._channel = open_channel(parse_target(target), security, GRPC_OPTIONS,
                                     tls=target.startswith(TLS_SCHEME))
        self._stub = pb_grpc.TabletStub(self._channel)  # type: ignore[no-untyped-call]

    @classmethod
    async def connect(cls, target: str, *, timeout: float | None = 10.0,
                      security: ClientSecurity | None = None) -> GrpcTabletClient:
        """Ask the tablet who it is (keyspace, shard, dialect) and return a client."""
        probe = cls(target, "", "", "", "", timeout=timeout, security=security)
        try:
            info: pb.TabletInfoResponse = await probe._stub.Info(pb.TabletInfoRequest(),
                                                                 timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            await probe.close()
            raise error_from_rpc(exc, target, hint=_TABLET_HINT) from None
        probe.keyspace, probe.shard = info.keyspace, info.shard
        probe.dialect, probe.placeholder = info.dialect, info.placeholder
        return probe

    async def execute(self, sql: str, params: Sequence[Any],
                      transaction_id: int | None = None,
                      options: ExecuteOptions | None = None) -> Result:
        request = pb.TabletExecuteRequest(sql=sql, params=[convert.to_value(p) for p in params],
                                          transaction_id=transaction_id or 0,
                                          **convert.option_fields(options))
        try:
            response = await self._stub.Execute(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        return convert.to_result(response)

    async def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        request = pb.TabletExecuteRequest(sql=sql, params=[convert.to_value(p) for p in params])
        call = self._stub.StreamExecute(request)
        fields: list[str] = []
        try:
            async for response in call:
                res = convert.to_result(response)
                fields = res.fields or fields
                yield fields, res.rows
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        finally:
            call.cancel()

    async def _tx(self, method: Any, tid: int) -> int:
        try:
            response = await method(pb.TabletTransactionRequest(transaction_id=tid),
                                    timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        return int(response.transaction_id)

    async def begin(self) -> int:
        return await self._tx(self._stub.Begin, 0)

    async def commit(self, transaction_id: int) -> None:
        await self._tx(self._stub.Commit, transaction_id)

    async def rollback(self, transaction_id: int) -> None:
        await self._tx(self._stub.Rollback, transaction_id)

    async def queue_receive(
        self, queue: str, max_batch: int = 0
    ) -> AsyncIterator[QueueBatch]:
        call = self._stub.QueueReceive(pb.QueueReceiveRequest(queue=queue, max_batch=max_batch))
        try:
            async for response in call:
                yield queue_convert.batch_of(self.keyspace, queue, response)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        finally:
            call.cancel()

    async def queue_ack(self, queue: str, ids: Sequence[int]) -> int:
        try:
            response = await self._stub.QueueAck(pb.QueueAckRequest(queue=queue, ids=list(ids)),
                                                 timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        return int(response.acked)

    async def queue_nack(self, queue: str, ids: Sequence[int], reason: str,
                         retry_at: int | None = None) -> int:
        request = pb.QueueNackRequest(queue=queue, ids=list(ids), reason=reason,
                                      retry_at_ns=retry_at)
        try:
            response = await self._stub.QueueNack(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        return int(response.nacked)

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        import json

        try:
            response = await self._stub.QueueStats(pb.QueueStatsRequest(queue=queue),
                                                   timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target, hint=_TABLET_HINT) from None
        stats: dict[str, Any] = json.loads(response.stats_json)
        return stats

    async def queue_configure(self, queues: Mapping[str, QueueOptions]) -> None:
        # A tablet process finds new queue tables by their comment marker
        # when a receiver first asks for them.
        return None

    async def close(self) -> None:
        await self._channel.close()
