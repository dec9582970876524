"""The asyncio gRPC client of the gate (the counterpart of Vitess's ``vtgateconn``).

One :class:`GateClient` is one gate session: it sends ``session_id = 0`` first
and then the id each response returns, so ``BEGIN`` / ``USE`` carry over from
one call to the next. Errors from the server come back as the
:class:`~shardgate.errors.ShardgateError` subclass of their code (see
:func:`~shardgate.errors.error_for_code`); a server that cannot be reached is
:class:`~shardgate.errors.Unavailable`. A call that carried a COMMIT (``COMMIT``,
``execute_batch(..., as_transaction=True)``, a write outside a transaction,
which commits on its own) and broke after it was sent
(the gate died or the connection broke before the answer: no status of the
gate's own) is :class:`~shardgate.errors.CommitOutcomeUnknown` (code
``UNKNOWN``), never ``UNAVAILABLE``: the transaction may be committed, and
retrying it blindly could write it twice (see docs/clients.md).

Create and use a client on one event loop (gRPC channels belong to the loop
they were created on)::

    async with GateClient("grpc://127.0.0.1:15991") as gc:
        result = await gc.execute("select * from customer where customer_id = :id", {"id": 1})
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc

from shardgate.api.grpc import convert, queue_convert
from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.api.grpc.failover import FailoverStub, GateList, reached_nothing, split_targets
from shardgate.api.grpc.handlers import ORIGIN_KEY
from shardgate.api.grpc.security import ClientSecurity
from shardgate.api.grpc.session_stream import SessionStream
from shardgate.errors import (
    COMMIT_OUTCOME_UNKNOWN,
    Code,
    CommitOutcomeUnknown,
    InvalidArgument,
    ShardgateError,
    error_for_code,
)
from shardgate.queues.events import QueueBatch, QueueEvent
from shardgate.result import ExecuteOptions, Result
from shardgate.sql.inputs import check_sql

if TYPE_CHECKING:  # the inbox and stream calls load their conversions when called: a
    # CLI call (``shardgate sql``) does not load the inbox store, the stream merge
    # and, below them, the topology and VSchema modules
    from shardgate.queues.inbox.model import InboxOptions, Message, Pointer
    from shardgate.queues.inbox.store import InboxRead, MaintainReport
    from shardgate.streams.merge import StreamEvent

#: Seconds CloseSession may take when the client closes.
CLOSE_TIMEOUT_S = 5.0

_SCHEME = "grpc://"
#: a target that speaks TLS (verified with the system's roots unless a CA is given)
TLS_SCHEME = "grpcs://"


def parse_target(target: str) -> str:
    """``grpc://host:port``, ``grpcs://host:port`` or ``host:port`` as the ``host:port``
    gRPC dials."""
    address = target
    for scheme in (_SCHEME, TLS_SCHEME):
        if target.startswith(scheme):
            address = target[len(scheme) :]
    if "://" in address or ":" not in address:
        raise InvalidArgument(
            f"bad gate target {target!r}: expected grpc://host:port, e.g. grpc://127.0.0.1:15991"
        )
    return address.rstrip("/")


#: what to do when no gate answers (the CLI's and the library's users alike)
GATE_HINT = (
    "start one with `shardgate up` (the embedded cluster) or `shardgate gate --cluster FILE`, "
    "or point at a running gate with --target grpc://HOST:PORT"
)


def error_from_rpc(
    exc: grpc.aio.AioRpcError, target: str | None = None, *, hint: str = GATE_HINT
) -> ShardgateError:
    """The shardgate error a failed RPC reports (gRPC codes map by name).

    A call that reached no server at all (``target`` refused or unreachable)
    says which address was tried and ``hint``, not gRPC's channel internals.
    """
    status: grpc.StatusCode = exc.code()
    try:
        code = Code(status.name)
    except ValueError:
        code = Code.UNKNOWN
    details: str = exc.details() or status.name
    if target is not None and code is Code.UNAVAILABLE and "handshake" in details.lower():
        reason = details.split("handshake failed", 1)[-1].strip(" :")
        return error_for_code(code, (
            f"TLS handshake with {target} failed ({reason}): check the CA that verifies the "
            "server (--tls-ca, SHARDGATE_TLS_CA) and the client certificate"))
    if target is not None and code is Code.UNAVAILABLE and _unreachable(details):
        reason = details.rsplit(":", 1)[-1].strip().lower() or "unreachable"
        if reason == "socket closed":
            hint = ("the server closed the connection: a TLS server does that to plaintext "
                    "clients (use grpcs:// or --tls-ca) and to clients without the certificate "
                    "it requires (--tls-cert/--tls-key); otherwise " + hint)
        return error_for_code(code, f"nothing answers at {target} ({reason}): {hint}")
    return error_for_code(code, details)


#: codes the transport itself reports when a connection breaks or a deadline passes
TRANSPORT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                             grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                             grpc.StatusCode.INTERNAL})


def lost_after_sending(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call may have reached the server and run there: the transport
    broke (no status of the service's own, see :data:`~shardgate.api.grpc.handlers.ORIGIN_KEY`)
    or the deadline passed after the request went out, rather than the server
    answering with an error or no connection being made at all."""
    if any(key == ORIGIN_KEY for key, _ in (exc.trailing_metadata() or ())):
        return False
    code = exc.code()
    if code not in TRANSPORT_CODES:
        return False
    details = (exc.details() or "").lower()
    return not (code is grpc.StatusCode.UNAVAILABLE
                and (_unreachable(details) or "handshake" in details))


#: a statement that commits: COMMIT (MySQL's COMMIT WORK too), after leading comments
_COMMIT = re.compile(r"^\s*(?:(?:/\*.*?\*/|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$))\s*)*commit\b",
                     re.I | re.S)


def commits(sql: str) -> bool:
    """Whether ``sql`` is a COMMIT."""
    return _COMMIT.match(sql) is not None


#: statements that only read or set session state: sending them again changes nothing
_NO_WRITE = re.compile(
    r"^\s*(?:(?:/\*.*?\*/|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$))\s*)*\(?\s*"
    r"(?:select|show|describe|desc|explain|use|set|begin|start|rollback|savepoint|release|"
    r"values|table)\b", re.I | re.S)


def writes(sql: str) -> bool:
    """Whether ``sql`` may change data (anything but a read or session statement): outside
    a transaction it commits on its own. ``SELECT`` counts as a read."""
    return _NO_WRITE.match(sql) is None


def with_user(
    security: ClientSecurity | None, user: str | None, password: str | None
) -> ClientSecurity:
    """``security`` with ``user`` / ``password`` when given."""
    security = security or ClientSecurity()
    if user is None:
        return security
    return dataclasses.replace(security, user=user, password=password)


def _unreachable(details: str) -> bool:
    return reached_nothing(details)


class GateClient:
    """A gate session over gRPC.

    ``keyspace`` is the session's default keyspace (None: the topology's
    default); ``timeout`` is the deadline of each call in seconds (None: no
    deadline). ``user`` / ``password`` authenticate every call; ``security``
    adds TLS files (see :class:`~shardgate.api.grpc.security.ClientSecurity`; a
    ``grpcs://`` target speaks TLS). Close the client (or use ``async with``)
    to end the session and the channel.

    ``target`` may name several gates, ``grpc://gate1:15991,gate2:15991``: the
    client uses one at a time and moves to the next when one is gone (see
    :mod:`shardgate.api.grpc.failover` for what is retried and what is not).

    With one gate, :meth:`execute` sends its statements on a *session stream*
    (the gate's ``Session`` call, opened on first use and kept open: a message
    on it costs the gate a third of a unary call's CPU); a statement sent while
    another is in flight on the same client, and the other methods, use unary
    calls, which the gate orders with the session's lock. A statement whose
    stream did not end in its answer (timed out, cancelled, broken) closes the
    stream; the next statement opens another. Errors are the same as over
    ``Execute``'s unary calls.
    """

    def __init__(
        self, target: str, *, keyspace: str | None = None, timeout: float | None = None,
        user: str | None = None, password: str | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.target = target
        self.keyspace = keyspace
        self.timeout = timeout
        #: The server's id of this session; 0 until the first call returns.
        self.session_id = 0
        #: whether the session had a transaction open after the last Execute answered
        self.in_transaction = False
        targets = split_targets(target, (_SCHEME, TLS_SCHEME))
        self._gates = GateList(targets, with_user(security, user, password),
                               tls=target.startswith(TLS_SCHEME), address_of=parse_target)
        self._stub: Any = (self._gates.stub() if len(targets) == 1
                           else FailoverStub(self._gates, self, self._rerunnable))
        #: statements go on a session stream (one gate only: a list of gates moves
        #: between them call by call, see failover); it carries the credential itself
        #: (the channel's interceptors add it to the other calls, not to such streams)
        self._stream = (SessionStream(self._stub, with_user(security, user, password)
                                      .metadata() or None, target)
                        if len(targets) == 1 else None)

    def _rerunnable(self, method: str, request: Any) -> bool:
        """Whether a call lost after it was sent may run again on another gate: a
        statement that does not write, outside a transaction."""
        return method == "Execute" and not self.in_transaction and not writes(request.sql)

    async def __aenter__(self) -> GateClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def execute(
        self,
        sql: str,
        bind_vars: Mapping[str, Any] | None = None,
        *,
        options: ExecuteOptions | None = None,
    ) -> Result:
        """Run one statement in this session and return its whole result.

        ``options``: ``include_event_token`` / ``compare_event_token`` (see
        :class:`shardgate.result.ExecuteOptions`); the answers come back in
        ``Result.event_token`` and ``Result.fresher``.
        """
        request = pb.ExecuteRequest(
            session_id=self.session_id,
            keyspace=self.keyspace,
            sql=check_sql(sql),
            bind_vars=convert.to_bind_vars(bind_vars),
            **convert.option_fields(options),
        )
        stream = self._stream
        if stream is not None and not stream.busy:
            return await self._execute_on_stream(stream, request, sql)
        try:
            response: pb.ExecuteResponse = await self._stub.Execute(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._failed(exc, commit=self._commits(sql)) from None
        self.session_id = response.session_id
        self.in_transaction = response.in_transaction
        return convert.to_result(response)

    async def _execute_on_stream(self, stream: SessionStream, request: pb.ExecuteRequest,
                                 sql: str) -> Result:
        """Send ``request`` on the session stream and return its answer's result, or
        raise its error (see :mod:`~shardgate.api.grpc.session_stream`)."""
        response = await stream.send(
            request, self.timeout, lambda exc: self._failed(exc, commit=self._commits(sql)),
            lambda: self._timed_out(sql))
        if response.session_id:  # (none: the session was not found, the id stays)
            self.session_id = response.session_id
            self.in_transaction = response.in_transaction
        if response.error_code:
            try:
                code = Code(response.error_code)
            except ValueError:
                code = Code.UNKNOWN
            raise error_for_code(code, response.error_message)
        return convert.to_result(response)

    def _commits(self, sql: str) -> bool:
        """Whether ``sql`` commits: a COMMIT, or a write outside a transaction."""
        return commits(sql) or (not self.in_transaction and writes(sql))

    def _timed_out(self, sql: str) -> ShardgateError:
        """The error of a statement whose answer did not come within ``timeout``."""
        if self._commits(sql):
            return CommitOutcomeUnknown(
                f"{COMMIT_OUTCOME_UNKNOWN}: the gate at {self.target} did not answer within "
                f"{self.timeout:g} s after the statement was sent (a COMMIT, or a write "
                "outside a transaction, which commits on its own); it may or may not be "
                "committed. Read its rows back (or an idempotency key written with them) "
                "before running it again: retrying blindly can write it twice")
        return error_for_code(Code.DEADLINE_EXCEEDED,
                              f"Deadline Exceeded: no answer within {self.timeout:g} s")

    async def execute_batch(
        self,
        statements: Sequence[tuple[str, Mapping[str, Any] | None]],
        *,
        as_transaction: bool = False,
    ) -> list[Result | ShardgateError]:
        """Run several statements in one call; each gets its result or its error."""
        request = pb.ExecuteBatchRequest(
            session_id=self.session_id,
            keyspace=self.keyspace,
            queries=[pb.BoundQuery(sql=check_sql(sql), bind_vars=convert.to_bind_vars(bv))
                     for sql, bv in statements],
            as_transaction=as_transaction,
        )
        try:
            response: pb.ExecuteBatchResponse = await self._stub.ExecuteBatch(
                request, timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            commit = as_transaction or any(commits(sql) for sql, _ in statements)
            raise self._failed(exc, commit=commit) from None
        self.session_id = response.session_id
        out: list[Result | ShardgateError] = []
        for r in response.results:
            if r.HasField("error"):
                out.append(error_for_code(Code(r.error.code), r.error.message))
            else:
                out.append(convert.to_result(r.result))
        return out

    def _failed(self, exc: grpc.aio.AioRpcError, *, commit: bool) -> ShardgateError:
        """The error of a failed Execute / ExecuteBatch; ``commit``: the call carried a
        COMMIT (or a write outside a transaction, which commits on its own), so a call
        lost after it was sent is :class:`CommitOutcomeUnknown`."""
        if commit and lost_after_sending(exc):
            details = exc.details() or exc.code().name
            return CommitOutcomeUnknown(
                f"{COMMIT_OUTCOME_UNKNOWN}: the call to the gate at {self.target} broke after "
                "its COMMIT was sent (a COMMIT, or a write outside a transaction, which "
                f"commits on its own) ({exc.code().name}: {details}); it may or may not be "
                "committed. Read its rows back (or an idempotency key written with them) "
                "before running it again: retrying blindly can write it twice")
        return error_from_rpc(exc, self.target)

    async def stream_execute(
        self, sql: str, bind_vars: Mapping[str, Any] | None = None
    ) -> AsyncGenerator[Result, None]:
        """Run one statement and yield its result in chunks (the first has the fields).

        Leaving the loop early cancels the call (``aclose()`` it to do so at once).
        """
        request = pb.StreamExecuteRequest(
            session_id=self.session_id,
            keyspace=self.keyspace,
            sql=check_sql(sql),
            bind_vars=convert.to_bind_vars(bind_vars),
        )
        call = self._stub.StreamExecute(request, timeout=self.timeout)
        try:
            async for response in call:
                self.session_id = response.session_id
                yield convert.to_result(response)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        finally:
            call.cancel()  # no-op once the stream is done; stops the server if abandoned

    async def explain(self, sql: str) -> dict[str, Any]:
        """The plan of ``sql`` in this session's keyspace, as JSON data."""
        request = pb.ExplainPlanRequest(session_id=self.session_id, keyspace=self.keyspace,
                                         sql=check_sql(sql))
        try:
            response: pb.ExplainPlanResponse = await self._stub.ExplainPlan(
                request, timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        plan: dict[str, Any] = json.loads(response.plan_json)
        return plan

    async def vschema(self) -> dict[str, Any]:
        """The VSchema of every keyspace the gate serves: ``{keyspace: vschema}``."""
        try:
            response: pb.GetVSchemaResponse = await self._stub.GetVSchema(
                pb.GetVSchemaRequest(), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        doc: dict[str, Any] = json.loads(response.vschema_json)
        return doc

    async def receive(
        self, queue: str, *, keyspace: str | None = None, shard: str | None = None,
        key_range: str | None = None, max_batch: int = 0,
    ) -> AsyncGenerator[QueueBatch, None]:
        """Fired events of ``queue``, batch by batch (the fields come in ``batch.fields``).

        ``async for batch in client.receive("jobs"): ...; await client.ack(batch)``.
        Leaving the loop ends the subscription; unacked events fire again.
        """
        ks = keyspace or self.keyspace or ""
        request = pb.QueueReceiveRequest(keyspace=ks, queue=queue, shard=shard,
                                         key_range=key_range, max_batch=max_batch)
        moves = 0  # gates tried since the last answer: with several, each gets one try
        while True:
            call = self._stub.QueueReceive(request)
            fields: list[str] = []
            try:
                async for response in call:
                    moves = 0
                    batch = queue_convert.batch_of(ks, queue, response)
                    if not batch.events:
                        fields = batch.fields
                        continue
                    batch.fields = fields
                    yield batch
                return
            except grpc.aio.AioRpcError as exc:
                # several gates: a subscription lost with its gate (or ended by a
                # draining one) moves to the next gate; unacked events fire again
                others = len(self._gates.targets) - 1
                if others and moves < others and exc.code() is grpc.StatusCode.UNAVAILABLE:
                    moves += 1
                    self._gates.move_on(self)
                    continue
                raise error_from_rpc(exc, self.target) from None
            finally:
                call.cancel()

    async def ack(
        self, batch_or_events: QueueBatch | Sequence[QueueEvent], *, queue: str | None = None,
        keyspace: str | None = None,
    ) -> int:
        """Ack events (a received batch, or events of ``queue``); one call per shard."""
        ks, queue, by_shard = self._events_by_shard(batch_or_events, queue, keyspace, "ack")
        total = 0
        for shard, ids in by_shard.items():
            request = pb.QueueAckRequest(keyspace=ks, queue=queue, shard=shard, ids=ids)
            try:
                response: pb.QueueAckResponse = await self._stub.QueueAck(
                    request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc, self.target) from None
            total += response.acked
        return total

    async def nack(
        self, batch_or_events: QueueBatch | Sequence[QueueEvent], reason: str, *,
        retry_at: float | None = None, queue: str | None = None, keyspace: str | None = None,
    ) -> int:
        """Record a failed attempt of segmented-queue events (a received batch, or events
        of ``queue``): each is retried after the queue's backoff, or not before
        ``retry_at`` (seconds since the epoch), or aborted once out of attempts.
        Returns how many were still executing; one call per shard."""
        ks, queue, by_shard = self._events_by_shard(batch_or_events, queue, keyspace, "nack")
        at = None if retry_at is None else int(retry_at * 1e9)
        total = 0
        for shard, ids in by_shard.items():
            request = pb.QueueNackRequest(keyspace=ks, queue=queue, shard=shard, ids=ids,
                                          reason=reason, retry_at_ns=at)
            try:
                response: pb.QueueNackResponse = await self._stub.QueueNack(
                    request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc, self.target) from None
            total += response.nacked
        return total

    def _events_by_shard(
        self, batch_or_events: QueueBatch | Sequence[QueueEvent], queue: str | None,
        keyspace: str | None, verb: str,
    ) -> tuple[str, str, dict[str, list[int]]]:
        if isinstance(batch_or_events, QueueBatch):
            events: Sequence[QueueEvent] = batch_or_events.events
            queue = queue or batch_or_events.queue
            keyspace = keyspace or batch_or_events.keyspace
        else:
            events = batch_or_events
        if queue is None:
            raise InvalidArgument(f"{verb} needs the queue name with a list of events")
        by_shard: dict[str, list[int]] = {}
        for e in events:
            by_shard.setdefault(e.shard, []).append(e.id)
        return keyspace or self.keyspace or "", queue, by_shard

    async def enqueue(
        self, queue: str, key: Any, payload: str | None, *, keyspace: str | None = None
    ) -> tuple[str, int]:
        """Store one job of a segmented queue; its ``(shard, job_id)`` (see enqueue_many)."""
        return (await self.enqueue_many(queue, [(key, payload)], keyspace=keyspace))[0]

    async def enqueue_many(
        self, queue: str, jobs: Sequence[tuple[Any, str | None]], *,
        keyspace: str | None = None,
    ) -> list[tuple[str, int]]:
        """Store ``(key, payload)`` jobs of a segmented queue in one call; their
        ``(shard, job_id)`` in order.

        In this session's transaction (after ``BEGIN``) the jobs commit or roll
        back with it; otherwise they are committed when this returns.
        """
        request = pb.QueueEnqueueRequest(session_id=self.session_id,
                                         keyspace=keyspace or self.keyspace or "", queue=queue,
                                         jobs=queue_convert.jobs_of(jobs))
        try:
            response: pb.QueueEnqueueResponse = await self._stub.QueueEnqueue(
                request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        if response.session_id:
            self.session_id = response.session_id
        return [(j.shard, j.id) for j in response.jobs]

    async def queue_stats(self, queue: str, *, keyspace: str | None = None) -> list[Any]:
        """Per-shard figures of ``queue``."""
        request = pb.QueueStatsRequest(keyspace=keyspace or self.keyspace or "", queue=queue)
        try:
            response: pb.QueueStatsResponse = await self._stub.QueueStats(
                request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        stats: list[Any] = json.loads(response.stats_json)
        return stats

    # -- inboxes ---------------------------------------------------------------------

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None

    def _ks(self, keyspace: str | None) -> str:
        return keyspace or self.keyspace or ""

    async def inbox_create(
        self, name: str, options: InboxOptions | Mapping[str, Any] | None = None, *,
        keyspace: str | None = None,
    ) -> MaintainReport:
        """Create inbox ``name`` with ``options`` (stored with it; None: the defaults, or
        the stored ones if it exists). ``FAILED_PRECONDITION`` if it exists with others."""
        from shardgate.api.grpc import inbox_convert

        request = pb.InboxCreateRequest(keyspace=self._ks(keyspace), name=name,
                                        options_json=inbox_convert.options_json(options))
        return inbox_convert.report_of(await self._call(self._stub.InboxCreate, request))

    async def inbox_maintain(self, name: str, *, keyspace: str | None = None) -> MaintainReport:
        """Create buckets ahead and drop expired ones (run it periodically)."""
        from shardgate.api.grpc import inbox_convert

        request = pb.InboxMaintainRequest(keyspace=self._ks(keyspace), name=name)
        return inbox_convert.report_of(await self._call(self._stub.InboxMaintain, request))

    async def inbox_append(
        self, name: str, user: Any, body: str | None, *, ts: int | None = None,
        keyspace: str | None = None,
    ) -> Message:
        """Append one message to ``user``'s inbox; in this session's transaction after
        ``BEGIN`` (committed or rolled back with it), else committed at once."""
        from shardgate.api.grpc import inbox_convert

        request = pb.InboxAppendRequest(session_id=self.session_id,
                                        keyspace=self._ks(keyspace), name=name,
                                        user=convert.to_value(user), body=body, ts=ts)
        response: pb.InboxAppendResponse = await self._call(self._stub.InboxAppend, request)
        if response.session_id:
            self.session_id = response.session_id
        return inbox_convert.message_of(response.message)

    async def inbox_read(
        self, name: str, user: Any, *, after: Pointer | str | None = None,
        consumer: str | None = None, limit: int = 100, keyspace: str | None = None,
    ) -> InboxRead:
        """Up to ``limit`` messages of ``user`` after the pointer ``after``, or after
        ``consumer``'s committed pointer (neither: from the oldest retained)."""
        from shardgate.api.grpc import inbox_convert

        if after is not None and consumer is not None:
            raise InvalidArgument("inbox read: give a pointer or a consumer, not both")
        if not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"inbox read limit {limit!r}: give a positive number")
        request = pb.InboxReadRequest(
            keyspace=self._ks(keyspace), name=name, user=convert.to_value(user),
            after=after if after is None or isinstance(after, str) else after.encode(),
            consumer=consumer, limit=limit)
        return inbox_convert.read_of(await self._call(self._stub.InboxRead, request))

    async def inbox_commit(
        self, name: str, user: Any, consumer: str, pointer: Pointer | str, *,
        keyspace: str | None = None,
    ) -> None:
        """Advance ``consumer``'s pointer for ``user`` to ``pointer`` (a read's pointer)."""
        text = pointer if isinstance(pointer, str) else pointer.encode()
        request = pb.InboxCommitRequest(keyspace=self._ks(keyspace), name=name,
                                        user=convert.to_value(user), consumer=consumer,
                                        pointer=text)
        await self._call(self._stub.InboxCommit, request)

    async def inbox_committed(
        self, name: str, user: Any, consumer: str, *, keyspace: str | None = None
    ) -> Pointer | None:
        """``consumer``'s committed pointer for ``user``, or None."""
        from shardgate.queues.inbox.model import Pointer

        request = pb.InboxCommittedRequest(keyspace=self._ks(keyspace), name=name,
                                           user=convert.to_value(user), consumer=consumer)
        response: pb.InboxCommittedResponse = await self._call(self._stub.InboxCommitted,
                                                               request)
        return Pointer.decode(response.pointer) if response.HasField("pointer") else None

    async def inbox_list(self, *, keyspace: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "options"}]`` of the keyspace's inboxes."""
        request = pb.InboxListRequest(keyspace=self._ks(keyspace))
        response: pb.InboxListResponse = await self._call(self._stub.InboxList, request)
        out: list[dict[str, Any]] = json.loads(response.inboxes_json)
        return out

    async def inbox_stats(
        self, name: str, *, counts: bool = False, keyspace: str | None = None
    ) -> dict[str, Any]:
        """The inbox's stored options and buckets; with ``counts``, the messages per
        bucket and the pointers too (exact counts, reading every bucket)."""
        request = pb.InboxStatsRequest(keyspace=self._ks(keyspace), name=name, counts=counts)
        response: pb.InboxStatsResponse = await self._call(self._stub.InboxStats, request)
        out: dict[str, Any] = json.loads(response.stats_json)
        return out

    async def update_stream(
        self, keyspace: str | None = None, key_range: str | None = None,
        start: float | str | None = None, *, heartbeat_s: float = 1.0,
    ) -> AsyncGenerator[StreamEvent, None]:
        """The change stream (see :meth:`shardgate.gate.Gate.update_stream`).

        ``start``: None (now), a timestamp, or a serialized ``StreamPosition``.
        """
        from shardgate.api.grpc import stream_convert

        request = pb.UpdateStreamRequest(
            keyspace=keyspace or self.keyspace or "", key_range=key_range,
            start_timestamp=start if isinstance(start, float | int) else None,
            start_position=start if isinstance(start, str) else None,
            heartbeat_seconds=heartbeat_s,
        )
        call = self._stub.UpdateStream(request)
        try:
            async for response in call:
                yield stream_convert.event_of(response)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        """End the session (rolling back an open transaction) and close the channel.

        Best effort towards the server: a server that is gone has no session left.
        """
        if self._stream is not None:
            self._stream.close()
        try:
            if self.session_id:
                request = pb.CloseSessionRequest(session_id=self.session_id)
                await self._stub.CloseSession(request, timeout=CLOSE_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            pass
        finally:
            self.session_id = 0
            self.in_transaction = False
            await self._gates.close()
