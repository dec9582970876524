"""Holding writes during a reshard's write cut-over.

While :mod:`shardgate.workflows.reshard` switches writes, the source shards
refuse writes to the moving tables: a trigger installed by the workflow fails
each one with a message carrying :data:`~shardgate.topo.model.WRITES_FROZEN`.
A gate that meets that refusal on a statement **outside** a transaction holds
the statement instead of failing it: it re-reads the topology from the store
and replays the statement (re-planned, so it routes to the new shards once the
switch is published) until it succeeds or :data:`HOLD_S` passes. Held
statements share one reader of the store (:class:`Refresher`), so holding many
costs one poll every :data:`RETRY_S`, and are retried as soon as the gate
serves a newer topology. The refused
attempt changed nothing (the trigger aborts the statement, and an implicit
multi-shard transaction is rolled back), so the replay is safe. A statement in
an explicit transaction cannot be replayed alone: the transaction is rolled
back and the caller gets ``ABORTED`` (retry the transaction). Every write
path does so: ``Gate.execute``; ``Gate.stream_execute`` (the MySQL listener's
path) sends writes through it; ``Gate.execute_batch`` runs each statement
through it, and a batch that opened its own transaction is rolled back, held
and replayed whole (nothing of it was committed).

Invariant: a held statement runs at most once successfully: every attempt but
the last was refused by a source shard before changing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from shardgate.errors import ShardgateError
from shardgate.tablet.client import TabletClient
from shardgate.topo.model import writes_frozen as writes_frozen  # re-exported

#: the longest a statement is held across a write cut-over (seconds)
HOLD_S = 10.0
#: how often held statements look for a new topology (seconds)
RETRY_S = 0.02
#: how often a held statement is retried on an unchanged topology (seconds)
RETRY_EVERY_S = 0.25


async def wait_for_switch(refresh: Callable[[], Awaitable[None]], serving: Callable[[], int],
                          deadline: float, warm: Callable[[], None] | None = None) -> bool:
    """Wait until the gate serves a newer topology (``serving()`` is its version;
    ``refresh`` catches it up with the store, shared by all held statements) or
    :data:`RETRY_EVERY_S` passed (a cut-over that rolled back releases the
    sources without a new topology); False once ``deadline`` (monotonic) passed.
    ``warm`` (a :class:`Warmer`) is called first."""
    if warm is not None:
        warm()
    version = serving()
    retry_at = time.monotonic() + RETRY_EVERY_S
    while True:
        if time.monotonic() >= deadline:
            return False
        with contextlib.suppress(ShardgateError):  # unreachable: keep the topology we have
            await refresh()
        if serving() != version or time.monotonic() >= retry_at:
            return True
        await asyncio.sleep(RETRY_S)


class Refresher:
    """One topo store read at a time for all held statements, at most every :data:`RETRY_S`."""

    def __init__(self, poll: Callable[[], Awaitable[object]]) -> None:
        self._poll = poll
        self._lock = asyncio.Lock()
        self._last = 0.0

    async def __call__(self) -> None:
        if time.monotonic() - self._last < RETRY_S:
            return
        async with self._lock:
            if time.monotonic() - self._last < RETRY_S:
                return
            try:
                await self._poll()
            finally:
                self._last = time.monotonic()


#: connections each pending shard's tablet opens when a cut-over begins
WARM_CONNECTIONS = 4


class Warmer:
    """Opens connections to the pending shards (the targets a cut-over is about to
    serve) when a write is first held, once per topology version, in the background:
    the held statements then replay on open connections as soon as the switch is
    published, rather than each opening one then. Its failures are ignored (the
    replay opens what it needs, and reports what fails)."""

    def __init__(self, pending: Callable[[], list[TabletClient]],
                 serving: Callable[[], int]) -> None:
        self._pending = pending
        self._serving = serving
        self._version: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self) -> None:
        version = self._serving()
        if version == self._version:
            return
        self._version = version
        for tablet in self._pending():
            task = asyncio.get_running_loop().create_task(_warm(tablet))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Wait for warming still under way (the gate closes its tablets next)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _warm(tablet: TabletClient) -> None:
    with contextlib.suppress(ShardgateError):
        await asyncio.gather(*(tablet.execute("SELECT 1", [])
                               for _ in range(WARM_CONNECTIONS)))


class Hold:
    """What a gate's held statements wait on: one :class:`Refresher` reading the topo
    store (``poll``) and one :class:`Warmer` of the pending shards (``pending``) for
    all of them, and the version of the topology the gate serves (``serving``)."""

    def __init__(self, poll: Callable[[], Awaitable[object]],
                 pending: Callable[[], list[TabletClient]], serving: Callable[[], int]) -> None:
        self._refresh = Refresher(poll)
        self._warm = Warmer(pending, serving)
        self._serving = serving

    async def wait(self, deadline: float) -> bool:
        """:func:`wait_for_switch` for this gate: True to replay the held statement,
        False once ``deadline`` (monotonic) passed."""
        return await wait_for_switch(self._refresh, self._serving, deadline, self._warm)

    async def close(self) -> None:
        """Stop warming (the gate closes its tablets next)."""
        await self._warm.close()
