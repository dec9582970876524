"""Draining a gate before it stops (SIGTERM to ``shardgate gate`` / ``shardgate up``).

A gate that stops while clients use it must not fail a statement with anything
but the retry contract's codes (``docs/production.md``, "Rolling restart and
upgrade"). :class:`GateDrain` does that in three steps, driven by the serving
process (:meth:`GateDrain.run`, then the server's ``stop``):

1. **Refuse new work.** From :meth:`GateDrain.start` on, a call is admitted only
   if it goes on with a transaction: its ``session_id`` names a session of the
   caller with a transaction open (or one the drain ended, so that its next
   statement is answered ``ABORTED``), or it is ``CloseSession``. Every other
   call is refused ``UNAVAILABLE`` with details starting ``gate draining``
   (:data:`DRAINING`): nothing of it ran, so any client sends it again; a
   client naming several gates moves to the next one at once
   (:mod:`shardgate.api.grpc.failover`). Receiver and change streams
   (``QueueReceive``, ``UpdateStream``) open at the start end with the same
   status (unacked events fire again; a change stream resumes from its last
   position). Session streams end between statements once their session has
   no transaction (see :mod:`shardgate.api.grpc.server`).
2. **Let transactions finish, and clients move away**, up to the drain timeout:
   the drain waits until no transaction is open and no call has come for
   :data:`QUIET_S` (every client still sending here has been refused once and
   gone to another gate). A server that stops cancels the calls that reached it
   but were not yet handed to a handler, and a client cannot tell whether such a
   call ran (a write is ``COMMIT_OUTCOME_UNKNOWN``): stopping only once calls have
   stopped coming closes that window for clients naming several gates.
3. **End the rest**: each still open is rolled back once the statement in
   flight on it (if any) is answered; its next statement (other than
   ``ROLLBACK``) is answered ``ABORTED``, which the retry contract covers. Then
   the server stops with a short grace for the statements still in flight
   (none of them in a transaction).

Invariants: before :meth:`GateDrain.start` every call is admitted and the
only cost on a call is one attribute test (``active``); once started, the
drain never ends (a gate is drained once, then stops); an admitted call is
never cut short by the drain except a receiver or change stream, which holds
no transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import grpc

from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.api.grpc.handlers import ORIGIN_KEY
from shardgate.api.grpc.security import caller
from shardgate.errors import NotFound, Unavailable

if TYPE_CHECKING:  # clients import this module (DRAINING): they do not load the gate
    from shardgate.gate import Gate

log = logging.getLogger(__name__)

#: the details prefix of a refusal while a gate drains (nothing was run: send it again)
DRAINING = "gate draining"
#: why the drain rolled back a transaction (its next statement is ABORTED with this)
ENDED = ("the gate is shutting down (drained) and its drain timeout passed before the "
         "transaction ended")
#: methods checked by the servicer itself (``GateServicer._session``): not wrapped
CHECKED_BY_SERVICER = frozenset({"Execute", "Session"})
#: methods always admitted: ending a session rolls its transaction back
ALWAYS_ADMITTED = frozenset({"CloseSession"})
#: long-lived streams ended when the drain starts (they hold no transaction)
ENDED_AT_START = frozenset({"QueueReceive", "UpdateStream"})
#: seconds without a call (and without an open transaction) that end a drain
QUIET_S = 0.5
_POLL_S = 0.02
_ORIGIN = ((ORIGIN_KEY, "shardgate"),)


@dataclass
class DrainReport:
    """What a drain took and found."""

    #: seconds from the start until no transaction was open (or the timeout)
    seconds: float
    #: transactions open when the drain started
    open_at_start: int
    #: transactions the drain rolled back after its timeout
    ended: int
    #: calls refused while draining
    refused: int


class GateDrain:
    """The drain of one gate's gRPC service; see the module docstring."""

    def __init__(self, gate: Gate, where: str = "this gate") -> None:
        self.gate = gate
        #: the gate as clients name it (in refusals)
        self.where = where
        #: the drain has started: new work is refused
        self.active = False
        #: called once when the drain starts (the servicer ends its idle session streams)
        self.on_start: list[Callable[[], None]] = []
        #: the handler tasks of open receiver and change streams
        self._streams: set[asyncio.Task[Any]] = set()
        #: monotonic time of the last call while draining (admitted or refused)
        self._last_call = 0.0
        self.refused = 0

    def refusal(self) -> Unavailable:
        """The error of a call refused while draining (counted)."""
        self.refused += 1
        self._last_call = time.monotonic()
        return Unavailable(self._message())

    def admit(self, session_id: int, owner: str | None) -> None:
        """Refuse (``UNAVAILABLE`` :data:`DRAINING`) a call of ``owner``'s session
        ``session_id`` (0: a new one) unless it goes on with a transaction."""
        self._last_call = time.monotonic()
        if session_id:
            try:
                session = self.gate.find_session(session_id, owner)
            except NotFound:
                raise self.refusal() from None
            if session.in_transaction or session.ended is not None:
                return
        raise self.refusal()

    def _message(self) -> str:
        return (f"{DRAINING}: {self.where} is shutting down; the call was not run: send it "
                "again (to another gate, or once this one is back)")

    def _refuse(self, request: Any) -> bool:
        session_id = getattr(request, "session_id", 0)
        try:
            self.admit(session_id, caller().user)
        except Unavailable:
            return True
        return False

    def start(self) -> None:
        """Refuse new work from now on; end receiver and change streams."""
        if self.active:
            return
        self.active = True
        self._last_call = time.monotonic()
        for hook in self.on_start:
            hook()
        for task in list(self._streams):
            task.cancel()  # caught in the stream's wrapper: ends UNAVAILABLE

    async def run(self, timeout: float) -> DrainReport:
        """Start, wait up to ``timeout`` seconds for open transactions to end and calls
        to stop coming (:data:`QUIET_S`), then roll back the transactions left (after
        the statement in flight on each is answered)."""
        began = time.monotonic()
        sessions = self.gate.sessions
        at_start = sessions.open_transactions()
        self.start()
        deadline = began + timeout
        while (sessions.open_transactions() or time.monotonic() - self._last_call < QUIET_S) \
                and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        waited = time.monotonic() - began
        ended = await sessions.end_transactions(ENDED)
        if ended:
            log.warning("gate drain: rolled back %d open transaction(s) after %.1f s",
                        ended, timeout)
        return DrainReport(waited, at_start, ended, self.refused)

    # -- wrapping the servicer's handlers --------------------------------------------

    def guard(self, servicer: Any) -> Any:
        """``servicer`` as registered with the server: its handlers but those of
        :data:`CHECKED_BY_SERVICER` ask :meth:`admit` first while draining."""
        methods: dict[str, Any] = {}
        for method in pb.DESCRIPTOR.services_by_name["Gate"].methods:
            behavior = getattr(servicer, method.name)
            if method.name in CHECKED_BY_SERVICER | ALWAYS_ADMITTED:
                methods[method.name] = behavior
            elif method.server_streaming and not method.client_streaming:
                methods[method.name] = self._stream(behavior,
                                                    ends=method.name in ENDED_AT_START)
            elif not method.server_streaming and not method.client_streaming:
                methods[method.name] = self._unary(behavior)
            else:  # a new bidirectional method must decide how it drains
                raise TypeError(f"Gate.{method.name}: no drain rule for its kind of call")
        return SimpleNamespace(**methods)

    def _unary(self, behavior: Callable[[Any, Any], Awaitable[Any]]
               ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self.active and self._refuse(request):
                await context.abort(grpc.StatusCode.UNAVAILABLE, self._message(),
                                    trailing_metadata=_ORIGIN)
            return await behavior(request, context)

        return unary

    def _stream(self, behavior: Callable[[Any, Any], AsyncIterator[Any]], *, ends: bool
                ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if self.active and self._refuse(request):
                await context.abort(grpc.StatusCode.UNAVAILABLE, self._message(),
                                    trailing_metadata=_ORIGIN)
            task = asyncio.current_task()
            if not ends or task is None:
                async for item in behavior(request, context):
                    yield item
                return
            self._streams.add(task)
            try:
                async for item in behavior(request, context):
                    yield item
            except asyncio.CancelledError:
                if not self.active:
                    raise  # the client went away, or the server stops now
                task.uncancel()
                context.set_code(grpc.StatusCode.UNAVAILABLE)
                context.set_details(self._message())
                context.set_trailing_metadata(_ORIGIN)
            finally:
                self._streams.discard(task)

        return stream
