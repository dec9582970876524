"""A log reader running in a thread of its own, handing batches to the event loop.

The replication clients (psycopg2's replication protocol, ``mysql-replication``)
block; each read runs them in one dedicated thread. The thread reads and
decodes as much as is available, then hands one list of items to the event
loop through a bounded queue (back-pressure: the thread waits while the
consumer is behind). Readers hand over at once when the consumer is idle
(latency) and gather bigger lists while it is busy (fewer wake-ups of the
loop, less GIL ping-pong: throughput). Closing the consumer side sets ``stop``; the thread
notices within ``POLL_S`` and closes its connections itself.

A consumer may leave a reader unread for long (the reshard workflow keeps its
log readers open between catch-ups): while it waits, the thread calls the
reader's ``keepalive`` every ``KEEPALIVE_S``, so a server that ends silent
replication clients (PostgreSQL's ``wal_sender_timeout``) keeps the connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable

from shardgate.backends.changes import DEFAULT_HEARTBEAT_S, ChangeLog, LogItem
from shardgate.errors import Code, ShardgateError

POLL_S = 0.1
QUEUE_BATCHES = 64
#: while a hand-over waits for the consumer: how often the reader's keepalive runs
KEEPALIVE_S = 0.5


class Handoff:
    """The thread side: ``put(batch)`` blocks while the queue is full, unless stopping."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[list[LogItem] | BaseException | None] = asyncio.Queue()
        self.slots = threading.Semaphore(QUEUE_BATCHES)
        self.stop = threading.Event()
        #: batches handed over and not yet taken (a hint: read without a lock)
        self.outstanding = 0
        #: called in the thread every ``KEEPALIVE_S`` while ``put`` waits for room
        self.keepalive: Callable[[], None] | None = None

    def idle(self) -> bool:
        """True when the consumer has taken every batch (hand over now, do not gather)."""
        return self.outstanding == 0

    def put(self, item: list[LogItem] | BaseException | None) -> bool:
        """Hand ``item`` over; False when the consumer has gone (stop reading)."""
        last = time.monotonic()
        while not self.slots.acquire(timeout=POLL_S):
            if self.stop.is_set():
                return False
            if self.keepalive is not None and time.monotonic() - last >= KEEPALIVE_S:
                self.keepalive()
                last = time.monotonic()
        if self.stop.is_set():
            return False
        self.outstanding += 1
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed
            return False
        return True


async def run_in_thread(
    name: str, body: Callable[[Handoff], None], translate: Callable[[BaseException], BaseException]
) -> AsyncIterator[LogItem]:
    """Run ``body(handoff)`` in a thread and yield the items it hands over.

    An exception in the thread is translated and raised here; ``body``
    returning ends the iteration.
    """
    handoff = Handoff(asyncio.get_running_loop())

    def main() -> None:
        try:
            body(handoff)
            handoff.keepalive = None  # the body closed its connection
            handoff.put(None)
        except BaseException as exc:  # reported to the consumer
            handoff.keepalive = None
            handoff.put(translate(exc))

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    try:
        while True:
            got = await handoff.queue.get()
            handoff.outstanding -= 1
            handoff.slots.release()
            if got is None:
                return
            if isinstance(got, BaseException):
                raise got
            for item in got:
                yield item
    finally:
        handoff.stop.set()
        while not handoff.queue.empty():
            handoff.queue.get_nowait()
        await asyncio.get_running_loop().run_in_executor(None, thread.join)


class ThreadedChangeLog(ChangeLog):
    """A change log read by a blocking replication client in a thread of its own.

    :meth:`read` refuses a start older than :meth:`oldest_position` with
    ``OUT_OF_RANGE`` (never silently later: PostgreSQL would move it forward),
    then runs :meth:`_stream` in a thread that hands items over through a
    :class:`Handoff`; driver errors reach the reader translated by
    :meth:`_translator`.
    """

    #: the thread's name prefix and what the log is called in errors
    thread_name = "log"
    log_name = "log"

    @abstractmethod
    def _stream(self, handoff: Handoff, start: str, heartbeat_s: float) -> None:
        """Follow the log from ``start`` until ``handoff.stop`` is set (blocking)."""

    @abstractmethod
    def _translator(self) -> Callable[[BaseException], BaseException]: ...

    @staticmethod
    @abstractmethod
    def _order(position: str) -> tuple[int, ...]:
        """Sort key of a position of this log."""

    def read(
        self, start: str | None, *, heartbeat_s: float = DEFAULT_HEARTBEAT_S
    ) -> AsyncIterator[LogItem]:
        return self._read(start, heartbeat_s)

    async def _read(self, start: str | None, heartbeat_s: float) -> AsyncIterator[LogItem]:
        oldest = await self.oldest_position()
        if start is None:
            start = await self.current_position()
        if self._order(start) < self._order(oldest):
            raise ShardgateError(
                f"position {start} of {self.shard} is no longer in the {self.log_name} (it "
                f"starts at {oldest}): restart from a newer token or a recent timestamp",
                code=Code.OUT_OF_RANGE,
            )
        begin = start
        items = run_in_thread(
            f"{self.thread_name} {self.shard}",
            lambda handoff: self._stream(handoff, begin, heartbeat_s),
            self._translator(),
        )
        try:
            async for item in items:
                yield item
        finally:
            await items.aclose()  # type: ignore[attr-defined]
