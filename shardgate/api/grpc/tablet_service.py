"""The tablet's gRPC service (``shardgate tablet``): transport, draining and reaping.

Every RPC maps onto one :class:`~shardgate.tablet.Tablet` method. Callers are
authenticated by :class:`~shardgate.api.grpc.security.AuthInterceptor` before any
handler runs (tablets accept only gates). Transactions are the tablet's own
ids. A gate call cancelled (its deadline, a statement timeout, a lost gate)
cancels the tablet's work and the statement on the database. What this layer
adds for a tablet in its own process:

* **Gate liveness and reaping.** ``Begin`` / ``BeginTwopc`` name the gate
  process (``gate_id``) that owns the transaction, and every gate sends
  ``Health`` with its id about twice a second. A transaction whose gate has
  not been heard from, and which itself saw no call, for ``idle_timeout``
  seconds is rolled back: a gate that died or restarted leaves no transaction
  open (and no row lock held) for longer than that. A *prepared* transaction
  is never reaped: it belongs to the two-phase commit decision
  (``shardgate twopc resolve``).
* **Draining.** :meth:`TabletServicer.drain` stops taking new work (new
  statements outside a transaction, new transactions, streams, receivers get
  ``UNAVAILABLE`` with details starting ``tablet draining``, which a gate
  knows was never run and retries on another tablet), gives the shard lease
  up, and lets calls in flight and open transactions finish up to a bound;
  then it ends the idle lanes.
* **Lanes** (``Lane``, the statement path): a gate keeps a few long-lived
  streaming calls per tablet and sends one statement at a time on each,
  instead of one unary call per statement, whose set-up costs the tablet more
  CPU than a point select's own work (a bare grpc.aio unary echo: ~240 us of
  server CPU a call; a message on an open stream: ~85 us). A failed statement
  is an answer carrying the error's code and message; the lane goes on.

Invariants: ``_owner`` and ``_used`` hold exactly the open (not prepared)
transactions begun through this service; a reaped or ended transaction is
removed from both before its connection is released. ``_idle_lanes`` holds
exactly the lane handlers waiting for their next request; a lane ends with
status OK only from there (never with a request read and unanswered), so a
gate whose request meets the end of a lane knows it was not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from shardgate.aio import cancel_and_wait
from shardgate.api.grpc import convert, queue_convert, stream_convert
from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.api.grpc import shardgate_pb2_grpc as pb_grpc
from shardgate.api.grpc.handlers import Ctx, relay, streaming, unary
from shardgate.api.grpc.security import NO_SECURITY, ServerSecurity
from shardgate.api.grpc.server import listen, new_server
from shardgate.auth.listen import check_listen
from shardgate.backends.changes import Heartbeat, LogItem
from shardgate.errors import Code, ShardgateError, Unavailable
from shardgate.result import Result, Row
from shardgate.tablet import Tablet
from shardgate.tablet.queue_service import receive_batches

log = logging.getLogger(__name__)

#: seconds a transaction may stay open with its gate silent before the tablet rolls it back
DEFAULT_IDLE_TIMEOUT_S = 60.0
#: the details prefix of a refusal while draining (the gate retries elsewhere)
DRAINING = "tablet draining"


class TabletServicer(pb_grpc.TabletServicer):
    """Serves one :class:`Tablet`; see the module docstring for reaping and draining."""

    def __init__(self, tablet: Tablet, *, idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S) -> None:
        self.tablet = tablet
        self.idle_timeout = idle_timeout
        self.draining = False
        #: gate id -> monotonic time it was last heard from
        self._gates: dict[str, float] = {}
        #: transaction id -> owning gate id; and -> monotonic time of its last call
        self._owner: dict[int, str] = {}
        self._used: dict[int, float] = {}
        self._in_flight = 0
        self._reaper: asyncio.Task[None] | None = None
        #: lane handlers waiting for their next request (see the module docstring)
        self._idle_lanes: set[asyncio.Task[Any]] = set()
        #: set once drained: lanes end at their next request boundary
        self._lanes_ending = False

    # -- bookkeeping ------------------------------------------------------------------

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise Unavailable(f"{DRAINING}: {self._name()} is shutting down; "
                              "send the statement to the shard's other tablet")

    @contextlib.contextmanager
    def _work(self, *, new: bool) -> Iterator[None]:
        """Count a call in flight; refuse ``new`` work while draining."""
        if new:
            self._refuse_if_draining()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def _name(self) -> str:
        return f"tablet {self.tablet.keyspace}/{self.tablet.shard}"

    def _touch(self, tid: int) -> None:
        if tid in self._used:
            self._used[tid] = time.monotonic()

    def _opened(self, tid: int, gate_id: str) -> None:
        self._owner[tid] = gate_id
        self._used[tid] = time.monotonic()
        if gate_id:
            self._gates[gate_id] = time.monotonic()

    def _ended(self, tid: int) -> None:
        self._owner.pop(tid, None)
        self._used.pop(tid, None)

    def start_reaper(self) -> None:
        """Start rolling back transactions of silent gates (needs a running loop)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop(),
                                                                  name="tablet-reaper")

    async def _reap_loop(self) -> None:
        interval = max(0.05, min(1.0, self.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap()
            except Exception:  # a failed rollback must not stop reaping
                log.exception("reaping idle transactions failed")

    async def reap(self) -> list[int]:
        """Roll back the transactions whose gate and own calls were silent too long."""
        now = time.monotonic()
        gone = [
            tid for tid, gate in self._owner.items()
            if now - max(self._gates.get(gate, 0.0), self._used.get(tid, 0.0)) > self.idle_timeout
        ]
        for tid in gone:
            self._ended(tid)
            log.warning("%s: rolling back transaction %d: its gate has been silent for %.0f s",
                        self._name(), tid, self.idle_timeout)
            await self.tablet.rollback(tid)
        return gone

    @property
    def open_transactions(self) -> int:
        return len(self._owner)

    async def drain(self, bound: float) -> None:
        """Stop new work, hand the lease over, wait up to ``bound`` s for work in flight."""
        self.draining = True
        await self.tablet.queues.close()  # releases the shard lease: a standby takes over
        deadline = time.monotonic() + bound
        while (self._in_flight or self._owner) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for tid in list(self._owner):
            self._ended(tid)
            await self.tablet.rollback(tid)
        self._lanes_ending = True
        for task in list(self._idle_lanes):
            task.cancel()  # caught in Lane: ends the idle lane with status OK

    async def close(self) -> None:
        task, self._reaper = self._reaper, None
        await cancel_and_wait([task])

    # -- RPCs -------------------------------------------------------------------------

    async def Info(self, request: pb.TabletInfoRequest,
                   context: grpc.aio.ServicerContext) -> pb.TabletInfoResponse:
        t = self.tablet
        return pb.TabletInfoResponse(keyspace=t.keyspace, shard=t.shard, dialect=t.dialect,
                                     placeholder=t.placeholder, supports_twopc=t.supports_twopc,
                                     collation=t.backend.collation or "",
                                     lease_holder=t.queues.leader,
                                     gives_wire=t.backend.gives_wire)

    async def Health(self, request: pb.TabletHealthRequest,
                     context: grpc.aio.ServicerContext) -> pb.TabletHealthResponse:
        if request.gate_id:
            self._gates[request.gate_id] = time.monotonic()
        return pb.TabletHealthResponse(lease_holder=self.tablet.queues.leader and not
                                       self.draining, serving=not self.draining)

    @unary(pb.ExecuteResponse)
    async def Execute(self, request: pb.TabletExecuteRequest, context: Ctx) -> pb.ExecuteResponse:
        return convert.execute_response(0, await self._execute(request), typed=True)

    async def _execute(self, request: pb.TabletExecuteRequest) -> Result:
        # _work inlined (the hot call: a generator context manager per call costs more)
        tid = request.transaction_id or None
        if tid is None:
            self._refuse_if_draining()
        else:
            self._touch(tid)
        self._in_flight += 1
        try:
            from_value = convert.from_value
            params = [from_value(v) for v in request.params]
            target = ((request.write_verb, request.write_table)
                      if request.HasField("write_verb") else None)
            result = await self.tablet.execute(request.sql, params, tid,
                                               convert.options_of(request), target=target)
            if tid is not None:
                self._touch(tid)
            return result
        finally:
            self._in_flight -= 1

    @unary(pb.TabletWireResponse)
    async def ExecuteWire(self, request: pb.TabletExecuteRequest,
                          context: Ctx) -> pb.TabletWireResponse:
        """An autocommit read's answer as the shard's MySQL packets (the gate's MySQL
        listener hands them on): no value is decoded here or encoded for gRPC."""
        return await self._execute_wire(request)

    async def _execute_wire(self, request: pb.TabletExecuteRequest) -> pb.TabletWireResponse:
        self._refuse_if_draining()
        self._in_flight += 1
        try:
            from_value = convert.from_value
            wire = await self.tablet.execute_wire(request.sql,
                                                  [from_value(v) for v in request.params])
            return pb.TabletWireResponse(columns=wire.columns, rows=wire.rows, size=wire.size)
        finally:
            self._in_flight -= 1

    async def Lane(self, request_iterator: Any, context: Ctx) -> None:
        """Answer a lane's statements in order until the gate closes it (see the module
        docstring); while draining, end it between statements once drained."""
        task = asyncio.current_task()
        assert task is not None
        idle = self._idle_lanes
        read = context.read
        write = context.write
        Response = pb.TabletLaneResponse
        lane_response = convert.lane_response
        while not self._lanes_ending:
            idle.add(task)
            try:
                request = await read()
            except asyncio.CancelledError:
                if not self._lanes_ending:
                    raise  # the gate cancelled the lane, or the server stops
                task.uncancel()
                return  # drained: no request was read, none is left unanswered
            finally:
                idle.discard(task)
            if request is grpc.aio.EOF:
                return
            try:
                if request.wire:
                    response = Response(wire=await self._execute_wire(request.execute))
                else:
                    response = lane_response(await self._execute(request.execute))
            except Exception as exc:
                response = lane_error(exc)
            await write(response)

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
                rows=convert.to_rows(rows, typed=True))
            first = False
            return response

        self._refuse_if_draining()
        async for response in relay(self.tablet.stream_execute(request.sql, params), chunk):
            yield response

    @unary(pb.TabletTransactionResponse)
    async def Begin(
        self, request: pb.TabletTransactionRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=True):
            tid = await self.tablet.begin(request.caller or None)
            self._opened(tid, request.gate_id)
            return pb.TabletTransactionResponse(transaction_id=tid)

    @unary(pb.TabletTransactionResponse)
    async def Commit(
        self, request: pb.TabletTransactionRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=False):
            self._ended(request.transaction_id)
            await self.tablet.commit(request.transaction_id)
            return pb.TabletTransactionResponse(transaction_id=request.transaction_id)

    @unary(pb.TabletTransactionResponse)
    async def Rollback(
        self, request: pb.TabletTransactionRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=False):
            self._ended(request.transaction_id)
            await self.tablet.rollback(request.transaction_id)
            return pb.TabletTransactionResponse(transaction_id=request.transaction_id)

    @unary(pb.TabletTransactionResponse)
    async def BeginTwopc(
        self, request: pb.TabletTwopcRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=True):
            tid = await self.tablet.begin_twopc(request.xid, request.caller or None)
            self._opened(tid, request.gate_id)
            return pb.TabletTransactionResponse(transaction_id=tid)

    @unary(pb.TabletTransactionResponse)
    async def Prepare(
        self, request: pb.TabletTwopcRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=False):
            # Prepared (or rolled back by a failed prepare): no longer this layer's to reap.
            self._ended(request.transaction_id)
            await self.tablet.prepare(request.transaction_id, request.xid)
            return pb.TabletTransactionResponse(transaction_id=request.transaction_id)

    @unary(pb.TabletTransactionResponse)
    async def CommitPrepared(
        self, request: pb.TabletTwopcRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=False):
            await self.tablet.commit_prepared(request.xid)
            return pb.TabletTransactionResponse()

    @unary(pb.TabletTransactionResponse)
    async def RollbackPrepared(
        self, request: pb.TabletTwopcRequest, context: Ctx
    ) -> pb.TabletTransactionResponse:
        with self._work(new=False):
            await self.tablet.rollback_prepared(request.xid)
            return pb.TabletTransactionResponse()

    @unary(pb.TabletListPreparedResponse)
    async def ListPrepared(
        self, request: pb.TabletListPreparedRequest, context: Ctx
    ) -> pb.TabletListPreparedResponse:
        with self._work(new=False):
            return pb.TabletListPreparedResponse(
                xids=await self.tablet.list_prepared(request.prefix))

    @streaming
    async def UpdateStream(
        self, request: pb.TabletUpdateStreamRequest, context: Ctx
    ) -> AsyncIterator[pb.TabletUpdateStreamResponse]:
        self._refuse_if_draining()
        stream = await self.tablet.change_stream()
        items = stream.subscribe(
            position=request.position if request.HasField("position") else None,
            timestamp=request.timestamp if request.HasField("timestamp") else None,
            heartbeat_s=request.heartbeat_seconds or None,
        )
        async for response in relay(items, log_item_response):
            yield response

    @streaming
    async def QueueReceive(
        self, request: pb.QueueReceiveRequest, context: Ctx
    ) -> AsyncIterator[pb.QueueReceiveResponse]:
        self._refuse_if_draining()
        stream = receive_batches(self.tablet.queues, request.queue, request.max_batch)
        async for response in relay(stream, queue_convert.batch_response):
            yield response

    @unary(pb.QueueAckResponse)
    async def QueueAck(self, request: pb.QueueAckRequest, context: Ctx) -> pb.QueueAckResponse:
        with self._work(new=False):
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
        with self._work(new=False):
            stats = await self.tablet.queues.stats(request.queue)
            return pb.QueueStatsResponse(stats_json=json.dumps(stats, default=str))

    @unary(pb.TabletQueueEnqueueResponse)
    async def QueueEnqueue(
        self, request: pb.TabletQueueEnqueueRequest, context: Ctx
    ) -> pb.TabletQueueEnqueueResponse:
        with self._work(new=True):
            jobs = [(j.key, j.payload if j.HasField("payload") else None) for j in request.jobs]
            ids = await self.tablet.queues.enqueue(request.queue, jobs)
            return pb.TabletQueueEnqueueResponse(ids=[int(i) for i in ids])

    @unary(pb.TabletQueueForgetResponse)
    async def QueueForget(
        self, request: pb.TabletQueueForgetRequest, context: Ctx
    ) -> pb.TabletQueueForgetResponse:
        await self.tablet.queues.forget(request.queue)
        return pb.TabletQueueForgetResponse()


def lane_error(exc: Exception) -> pb.TabletLaneResponse:
    """A lane's answer reporting ``exc`` (as a unary call's status would)."""
    if isinstance(exc, ShardgateError):
        return pb.TabletLaneResponse(error_code=exc.code.value, error_message=exc.message)
    log.exception("unexpected error in a tablet lane")
    return pb.TabletLaneResponse(error_code=Code.INTERNAL.value,
                                 error_message=f"internal error: {type(exc).__name__}: {exc}")


def log_item_response(item: LogItem) -> pb.TabletUpdateStreamResponse:
    """One change-log item (transaction or heartbeat) as a stream message."""
    if isinstance(item, Heartbeat):
        return pb.TabletUpdateStreamResponse(heartbeat=True, watermark=item.watermark,
                                             position=item.position)
    return pb.TabletUpdateStreamResponse(
        token=convert.to_token(item.token),
        changes=[stream_convert.change_message(c, typed=True) for c in item.changes])


async def serve_tablet(
    tablet: Tablet, host: str = "127.0.0.1", port: int = 0, *,
    security: ServerSecurity | None = None, no_auth: bool = True, insecure: bool = False,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
) -> tuple[grpc.aio.Server, int]:
    """Serve ``tablet`` on ``host:port`` (0: a free port); return the server and port.

    Tablets accept only gates: give ``security`` a users file holding the
    gates' credential, or a CA that signs the gates' client certificates
    (and ``allowed_users`` to name them). Without ``security`` the tablet
    serves anyone, on loopback only (see :func:`shardgate.api.grpc.server.serve`).
    Without reaping (the caller owns the tablet's lifecycle); the ``shardgate
    tablet`` process uses :func:`serve_tablet_service`.
    """
    server, bound, _ = await _start(tablet, host, port, idle_timeout, security, no_auth,
                                    insecure)
    return server, bound


async def serve_tablet_service(
    tablet: Tablet, host: str = "127.0.0.1", port: int = 0, *,
    security: ServerSecurity | None = None, no_auth: bool = True, insecure: bool = False,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
) -> tuple[grpc.aio.Server, int, TabletServicer]:
    """Like :func:`serve_tablet`, also reaping the idle transactions of silent gates.

    Returns the servicer too: drain it on SIGTERM, close it after the server.
    """
    server, bound, servicer = await _start(tablet, host, port, idle_timeout, security,
                                           no_auth, insecure)
    servicer.start_reaper()
    return server, bound, servicer


async def _start(
    tablet: Tablet, host: str, port: int, idle_timeout: float,
    security: ServerSecurity | None, no_auth: bool, insecure: bool,
) -> tuple[grpc.aio.Server, int, TabletServicer]:
    security = security or NO_SECURITY
    check_listen(host, tls=security.tls is not None, auth=security.authenticates,
                 no_auth=no_auth, insecure=insecure, what="tablet")
    server = new_server(security)
    servicer = TabletServicer(tablet, idle_timeout=idle_timeout)
    pb_grpc.add_TabletServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    bound = listen(server, host, port, security)
    await server.start()
    return server, bound, servicer
