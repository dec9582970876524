"""A client's session stream: the gate's ``Session`` call, one statement at a time.

:class:`~shardgate.api.grpc.client.GateClient` sends its statements here when it
talks to one gate. The call is opened on first use and kept open (a message on it
costs the gate a third of a unary call's CPU). Invariants:

* at most one statement is in flight (``busy``); the client sends a second one in
  flight as a unary ``Execute``, which the gate orders with the session's lock;
* a statement whose call did not end in its answer (timed out, cancelled, broken,
  ended by a stopping gate) closes the call; the next statement opens another;
* the gate answers a failed statement in a message, so a status on the call itself
  is the interceptor's (``UNAUTHENTICATED``) or the transport's: the connection broke
  (``UNAVAILABLE``), or, for a statement that commits, the caller's
  ``CommitOutcomeUnknown``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.errors import CommitOutcomeUnknown, ShardgateError, Unavailable

#: how a failed call becomes the statement's error (the client's Execute rules)
Failure = Callable[[grpc.aio.AioRpcError], ShardgateError]


class SessionStream:
    """The open ``Session`` call of one client (see the module docstring)."""

    def __init__(self, stub: Any, metadata: Any, target: str) -> None:
        self._stub = stub
        self._metadata = metadata
        self._target = target
        #: the open call (None: opened by the next statement)
        self._call: Any = None
        #: a statement is in flight on the call
        self.busy = False

    async def send(self, request: pb.ExecuteRequest, timeout: float | None, failed: Failure,
                   timed_out: Callable[[], ShardgateError]) -> pb.ExecuteResponse:
        """Send ``request`` and return the gate's answer, or raise the call's failure:
        ``failed(exc)`` for a status, ``timed_out()`` past ``timeout`` seconds."""
        self.busy = True
        try:
            call = self._call
            if call is None or call.done():
                call = self._call = self._stub.Session(metadata=self._metadata)
            try:
                async with asyncio.timeout(timeout):
                    await call.write(request)
                    response = await call.read()
            except grpc.aio.AioRpcError as exc:
                self.close()
                raise self._broke(exc, failed) from None
            except asyncio.InvalidStateError:  # the call ended before the write
                self.close()
                code = await call.code()
                if code is grpc.StatusCode.OK:  # a stopping gate ended it: not run
                    raise self._ended() from None
                raise failed(_Status(code, await call.details())) from None
            except TimeoutError:
                self.close()
                raise timed_out() from None
            except BaseException:  # cancelled: the gate cancels the statement with the call
                self.close()
                raise
            if response is grpc.aio.EOF:  # ended between statements: this one was not run
                self.close()
                raise self._ended()
            return response  # type: ignore[no-any-return]
        finally:
            self.busy = False

    def close(self) -> None:
        """Cancel the open call, if any (the gate ends the statement it runs)."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _broke(self, exc: grpc.aio.AioRpcError, failed: Failure) -> ShardgateError:
        error = failed(exc)
        if exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                              grpc.StatusCode.CANCELLED) or isinstance(error, CommitOutcomeUnknown):
            return error
        return Unavailable(f"the session stream to the gate at {self._target} broke "
                           f"({exc.code().name}: {exc.details() or ''})")

    def _ended(self) -> ShardgateError:
        return Unavailable(f"the gate at {self._target} closed the session stream (it is "
                           "stopping); the statement was not run")


class _Status(grpc.aio.AioRpcError):  # type: ignore[misc]
    """A call's final status as the error the client's rules read."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
