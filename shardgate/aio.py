"""Small asyncio helpers shared by the stateful parts (lease, streams, queue managers).

Python 3.11's ``asyncio.wait_for`` loses a cancellation: when the awaited
future completes in the same loop iteration as the task is cancelled, it
returns the result and the ``CancelledError`` is gone (fixed in 3.12). A
stream loop waiting with a short timeout then never stops: ``task.cancel()``
followed by ``await task`` hangs. :func:`wait_for` here is built on
``asyncio.timeout``, which does not lose it; ``asyncio.wait_for`` is banned in
the package (ruff ``banned-api``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """``await aw`` for at most ``timeout`` seconds (``TimeoutError`` after).

    Unlike ``asyncio.wait_for`` on Python 3.11, a cancellation of the calling
    task is never swallowed, even when ``aw`` completes at the same moment.
    """
    async with asyncio.timeout(timeout):
        return await aw


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any] | None],
    *,
    swallow: tuple[type[BaseException], ...] = (),
) -> None:
    """Cancel ``tasks`` (None entries skipped), then wait until each has ended.

    A task ending in ``CancelledError``, or in one of ``swallow``, ends quietly;
    any other exception of a task is raised here. A cancellation of the
    *calling* task while it waits is not swallowed: it propagates (the tasks
    were cancelled already and end on their own).
    """
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    if not live:
        return
    await asyncio.wait(live)
    for t in live:
        if t.cancelled():
            continue
        exc = t.exception()
        if exc is not None and not isinstance(exc, swallow):
            raise exc
