"""A gate client's list of gates (``grpc://gate1:15991,gate2:15991``) and moving on when
one is gone.

:class:`GateList` holds the addresses and one channel per gate, opened when
first used; :class:`FailoverStub` stands in for the gRPC stub of a
:class:`~shardgate.api.grpc.client.GateClient` named with more than one gate.

Invariants:

* **One gate at a time.** Every call goes to the current gate. The client moves
  to the next one (in list order, wrapping) only when a call fails in the
  transport with ``UNAVAILABLE`` (nothing answered, or the connection broke: no
  status of the gate's own) or a draining gate refused it (``UNAVAILABLE``
  ``gate draining``: not run, so it is sent to the next gate at once), never
  because a gate answered with another error.
* **Nothing runs twice.** A unary call is retried on the next gate only if it
  reached no gate at all (connecting failed), or it is one that may run twice
  (:data:`IDEMPOTENT`: acks, reads of metadata; and what the client calls
  ``rerunnable``: a statement that does not write, outside a transaction); any
  other call lost after it was sent is reported as with one gate
  (``CommitOutcomeUnknown`` for a commit) and the next call goes to the next gate.
* **A session does not move.** Moving starts a new session (``session_id`` 0) on
  the next gate. A transaction open on the gone gate stays there (its tablets
  roll it back): the first call of the session after the move (the one that
  found the gate gone, or the next) fails with ``UNAVAILABLE`` saying so, so no
  statement of the transaction runs outside it on the next gate.
* Streams (``QueueReceive``) re-subscribe on the next gate themselves
  (:meth:`GateClient.receive`): a subscription holds no session, and events not
  acked fire again after their ack wait, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from shardgate.api.grpc import shardgate_pb2_grpc as pb_grpc
from shardgate.api.grpc.gate_drain import DRAINING
from shardgate.api.grpc.handlers import ORIGIN_KEY
from shardgate.api.grpc.security import GRPC_OPTIONS, ClientSecurity, open_channel
from shardgate.errors import InvalidArgument, Unavailable

#: the gate's streaming methods: the stub hands them out unwrapped
STREAMING = frozenset({"StreamExecute", "QueueReceive", "UpdateStream"})
#: methods never retried on another gate (ending a session that stayed behind)
NOT_RETRIED = frozenset({"CloseSession"})
#: calls outside sessions that may run twice: retried on the next gate even when lost
#: after they were sent (acking an acked event acks nothing more)
IDEMPOTENT = frozenset({"QueueAck", "QueueStats", "GetVSchema", "ExplainPlan",
                        "InboxCommitted", "InboxList", "InboxStats"})


def split_targets(target: str, schemes: tuple[str, ...]) -> list[str]:
    """``grpc://a:1,b:2`` -> ``["grpc://a:1", "grpc://b:2"]`` (the scheme is written once)."""
    scheme = next((s for s in schemes if target.startswith(s)), "")
    parts = [p.strip() for p in target[len(scheme):].split(",")]
    if any(not p for p in parts):
        raise InvalidArgument(
            f"bad gate target {target!r}: expected grpc://host:port[,host:port...], e.g. "
            "grpc://10.0.0.3:15991,10.0.0.4:15991")
    return [scheme + p for p in parts]


def reached_nothing(details: str) -> bool:
    """Whether a failed call's details say no server was reached (nothing was sent)."""
    low = details.lower()
    return "failed to connect" in low or "connection refused" in low or "dns resolution" in low


def gate_draining(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call was refused by a draining gate (``UNAVAILABLE`` of the
    gate's own, details ``gate draining``: nothing of it ran; see
    :mod:`shardgate.api.grpc.gate_drain`)."""
    return (exc.code() is grpc.StatusCode.UNAVAILABLE
            and (exc.details() or "").startswith(DRAINING))


def gate_gone(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call says its gate is gone: ``UNAVAILABLE`` from the transport
    (nothing answered, or the connection broke), not a status of the gate's own."""
    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    return not any(key == ORIGIN_KEY for key, _ in (exc.trailing_metadata() or ()))


class _Client(Protocol):
    session_id: int
    in_transaction: bool


class GateList:
    """The gates a client may use, the current one first; channels opened on first use."""

    def __init__(self, targets: list[str], security: ClientSecurity, *, tls: bool,
                 address_of: Callable[[str], str]) -> None:
        self.targets = targets
        self.at = 0
        #: the gate that went away with the session's open transaction (not yet reported)
        self.lost_transaction: str | None = None
        self._security = security
        self._tls = tls
        self._address_of = address_of
        for t in targets:  # a bad entry is refused at once, not when first used
            address_of(t)
        self._stubs: dict[int, Any] = {}
        self._channels: list[grpc.aio.Channel] = []

    @property
    def current(self) -> str:
        """The target the next call goes to."""
        return self.targets[self.at]

    def stub(self) -> Any:
        """The gRPC stub of the current gate."""
        if self.at not in self._stubs:
            channel = open_channel(self._address_of(self.current), self._security,
                                   GRPC_OPTIONS, tls=self._tls)
            self._channels.append(channel)
            self._stubs[self.at] = pb_grpc.GateStub(channel)  # type: ignore[no-untyped-call]
        return self._stubs[self.at]

    def move_on(self, client: _Client) -> None:
        """Make the next gate current; ``client`` starts a new session there. An open
        transaction is remembered as lost (``client.in_transaction`` stays true until it
        is reported: the failed call's own error still knows it ran in one)."""
        if client.in_transaction:
            self.lost_transaction = self.current
        self.at = (self.at + 1) % len(self.targets)
        client.session_id = 0

    async def close(self) -> None:
        """Close every channel opened."""
        channels, self._channels = self._channels, []
        self._stubs.clear()
        for channel in channels:
            await channel.close()


class FailoverStub:
    """A ``GateStub`` look-alike whose unary calls follow the invariants of the module."""

    def __init__(self, gates: GateList, client: _Client,
                 rerunnable: Callable[[str, Any], bool] = lambda name, request: False) -> None:
        self._gates = gates
        self._client = client
        self._rerunnable = rerunnable

    def __getattr__(self, name: str) -> Any:
        if name in STREAMING:
            return getattr(self._gates.stub(), name)
        return lambda request, **kwargs: self._call(name, request, kwargs)

    async def _call(self, name: str, request: Any, kwargs: dict[str, Any]) -> Any:
        gates = self._gates
        in_session = "session_id" in type(request).DESCRIPTOR.fields_by_name
        for attempt in range(len(gates.targets)):
            if in_session and name not in NOT_RETRIED:
                self._report_lost_transaction()
            try:
                return await getattr(gates.stub(), name)(request, **kwargs)
            except grpc.aio.AioRpcError as exc:
                draining = gate_draining(exc)
                if name in NOT_RETRIED or not (draining or gate_gone(exc)):
                    raise
                again = (draining or reached_nothing(exc.details() or "") or name in IDEMPOTENT
                         or self._rerunnable(name, request))  # before the move resets state
                gates.move_on(self._client)
                if not again or attempt == len(gates.targets) - 1:
                    raise
                if in_session:
                    request.session_id = 0  # a new session on the next gate
        raise AssertionError("unreachable")

    def _report_lost_transaction(self) -> None:
        gone, self._gates.lost_transaction = self._gates.lost_transaction, None
        if gone is not None:
            self._client.in_transaction = False
            raise Unavailable(
                f"the gate at {gone} is gone, with this session's open transaction (its "
                f"tablets roll it back; after COMMIT_OUTCOME_UNKNOWN, read the rows back "
                f"first); calls go to {self._gates.current} now, in a new session: run the "
                "transaction again")
