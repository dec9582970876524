"""A receiver's subscription to a queue on one shard: what every store's server feeds.

The queue table's managers (:mod:`shardgate.queues.table.manager`) and the
segmented consumers served by a tablet (:mod:`shardgate.queues.segmented.served`)
both hand batches of events to :class:`Receiver` objects, which the tablet's
queue service (:mod:`shardgate.tablet.queue_service`) subscribes and ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shardgate.queues.events import QueueEvent

#: Batches a receiver may have waiting before it counts as busy.
RECEIVER_QUEUE_DEPTH = 2


class Receiver:
    """One subscription of a receiver to a queue on this shard."""

    def __init__(self, max_batch: int = 0) -> None:
        self.max_batch = max_batch
        self.batches: asyncio.Queue[list[QueueEvent] | None] = asyncio.Queue()
        #: ids handed to this receiver and not acked yet
        self.in_flight: set[int] = set()
        self.closed = False
        #: called when a batch is taken (the manager may send more)
        self.waker: Callable[[], None] | None = None

    @property
    def busy(self) -> bool:
        return self.closed or self.batches.qsize() >= RECEIVER_QUEUE_DEPTH

    @property
    def free_slots(self) -> int:
        """Batches this receiver may still be handed before it counts as busy."""
        return 0 if self.closed else max(0, RECEIVER_QUEUE_DEPTH - self.batches.qsize())

    async def get(self) -> list[QueueEvent] | None:
        """The next batch (None when the subscription ended), without events acked since."""
        while True:
            batch = await self.batches.get()
            if batch is None:
                return None
            if self.waker is not None:
                self.waker()
            live = [e for e in batch if e.id in self.in_flight]
            if live:
                return live

    def end(self) -> None:
        self.closed = True
        self.batches.put_nowait(None)
