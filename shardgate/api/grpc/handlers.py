"""What every gRPC handler of the gate and tablet services does around its body.

* :func:`unary`: a failure becomes the call's status (the gRPC code named like
  the shardgate code, the message as details) and an empty response;
* :func:`streaming`: the same for a server-streaming handler; the body's
  generator is closed when the call ends early (client gone, cancelled);
* :func:`relay`: yields converted items of an async stream and closes it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from shardgate.errors import Code, ShardgateError

log = logging.getLogger(__name__)

S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
T = TypeVar("T")
Ctx: TypeAlias = "grpc.aio.ServicerContext"

#: shardgate code -> gRPC status code; the names are the same by design.
STATUS_BY_CODE: dict[Code, grpc.StatusCode] = {c: grpc.StatusCode[c.value] for c in Code}


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and details that report ``exc`` to the client."""
    if isinstance(exc, ShardgateError):
        return STATUS_BY_CODE[exc.code], exc.message
    return grpc.StatusCode.INTERNAL, unexpected(exc)


def unexpected(exc: Exception) -> str:
    """Log ``exc`` (a bug: not a ShardgateError) with its traceback; the message that
    reports it to the client as ``INTERNAL``."""
    log.exception("unexpected error in a shardgate service")
    return f"internal error: {type(exc).__name__}: {exc}"


#: trailing metadata key marking a status the service itself set (not the transport)
ORIGIN_KEY = "sg-origin"


def fail(context: Ctx, exc: Exception) -> None:
    """Report ``exc`` as the status of the call, marked as the service's own.

    The mark (``sg-origin`` trailing metadata) lets a caller tell an error the
    server sent from one the transport made up (a connection that broke),
    which matters for whether a statement may have run.
    """
    code, details = status_of(exc)
    context.set_code(code)
    context.set_details(details)
    context.set_trailing_metadata(((ORIGIN_KEY, "shardgate"),))


UnaryBody = Callable[[S, Req, Ctx], Awaitable[Resp]]
StreamBody = Callable[[S, Req, Ctx], AsyncIterator[Resp]]


def unary(
    empty: Callable[[], Resp],
) -> Callable[[UnaryBody[S, Req, Resp]], UnaryBody[S, Req, Resp]]:
    """Decorate a unary handler: errors become the status, with ``empty()`` as response."""

    def wrap(body: UnaryBody[S, Req, Resp]) -> UnaryBody[S, Req, Resp]:
        @functools.wraps(body)
        async def handler(self: S, request: Req, context: Ctx) -> Resp:
            try:
                return await body(self, request, context)
            except Exception as exc:
                fail(context, exc)
                return empty()

        return handler

    return wrap


def streaming(body: StreamBody[S, Req, Resp]) -> StreamBody[S, Req, Resp]:
    """Decorate a server-streaming handler: errors become the status."""

    @functools.wraps(body)
    async def handler(self: S, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        items = body(self, request, context)
        try:
            async for item in items:
                yield item
        except Exception as exc:
            fail(context, exc)
        finally:
            if isinstance(items, AsyncGenerator):
                await items.aclose()

    return handler


async def relay(stream: AsyncIterator[T], convert: Callable[[T], Any]) -> AsyncIterator[Any]:
    """``convert(item)`` for every item of ``stream``; the stream is closed at the end."""
    try:
        async for item in stream:
            yield convert(item)
    finally:
        if isinstance(stream, AsyncGenerator):
            await stream.aclose()
