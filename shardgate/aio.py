"""Small asyncio helpers shared by the stateful parts (lease, streams, queue managers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any] | None],
    *,
    swallow: tuple[type[BaseException], ...] = (),
) -> None:
    """Cancel ``tasks`` (None entries skipped), then wait until each has ended.

    A task ending in ``CancelledError``, or in one of ``swallow``, ends quietly;
    any other exception of a task is raised here.
    """
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    for t in live:
        with contextlib.suppress(asyncio.CancelledError, *swallow):
            await t
