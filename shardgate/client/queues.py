"""A synchronous queue receiver over gRPC: the thin edge on the asyncio client.

::

    with QueueReceiver("grpc://127.0.0.1:15991", keyspace="app") as rx:
        for batch in rx.receive("jobs"):
            handle(batch.events)
            rx.ack(batch)

Leaving the loop ends the subscription; events not acked fire again after
their ack wait, so a receiver that disappears loses nothing. The target may
name several gates (``grpc://gate1:15991,gate2:15991``): the subscription moves
to the next one when its gate is gone (:mod:`shardgate.api.grpc.failover`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ClientSecurity
from shardgate.client.sync import LoopThread
from shardgate.queues.events import QueueBatch, QueueEvent


def client_thread(
    name: str, target: str, *, keyspace: str | None, timeout: float | None,
    user: str | None = None, password: str | None = None,
    security: ClientSecurity | None = None,
) -> tuple[LoopThread, GateClient]:
    """A private loop thread and a :class:`GateClient` created on it (the thread is
    closed again if the client cannot be made)."""
    loop = LoopThread(name)

    async def make() -> GateClient:
        return GateClient(target, keyspace=keyspace, timeout=timeout, user=user,
                          password=password, security=security)

    try:
        return loop, loop.run(make())
    except BaseException:
        loop.close()
        raise


class QueueReceiver:
    """Receive, ack and nack queue events, and enqueue segmented-queue jobs,
    synchronously (one private event loop thread)."""

    def __init__(
        self, target: str, *, keyspace: str | None = None, timeout: float | None = None,
        user: str | None = None, password: str | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self._loop, self._client = client_thread(
            "shardgate-queue", target, keyspace=keyspace, timeout=timeout, user=user,
            password=password, security=security)

    def receive(
        self,
        queue: str,
        *,
        keyspace: str | None = None,
        shard: str | None = None,
        key_range: str | None = None,
        max_batch: int = 0,
    ) -> Iterator[QueueBatch]:
        """Fired events of ``queue``, batch by batch, until the caller stops iterating."""
        stream = self._client.receive(
            queue, keyspace=keyspace, shard=shard, key_range=key_range, max_batch=max_batch
        )
        try:
            while True:
                try:
                    batch = self._loop.run(stream.__anext__())
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            self._loop.run(stream.aclose())

    def ack(
        self,
        batch_or_events: QueueBatch | Sequence[QueueEvent],
        *,
        queue: str | None = None,
        keyspace: str | None = None,
    ) -> int:
        """Ack a received batch (or events of ``queue``); returns how many were acked."""
        return self._loop.run(self._client.ack(batch_or_events, queue=queue, keyspace=keyspace))

    def nack(
        self,
        batch_or_events: QueueBatch | Sequence[QueueEvent],
        reason: str,
        *,
        retry_at: float | None = None,
        queue: str | None = None,
        keyspace: str | None = None,
    ) -> int:
        """Record a failed attempt of segmented-queue events (retried after the backoff,
        or not before ``retry_at`` seconds since the epoch); how many were executing."""
        return self._loop.run(self._client.nack(batch_or_events, reason, retry_at=retry_at,
                                                queue=queue, keyspace=keyspace))

    def enqueue(self, queue: str, key: Any, payload: str | None, *,
                keyspace: str | None = None) -> tuple[str, int]:
        """Store one job of a segmented queue; its ``(shard, job_id)`` once committed."""
        return self._loop.run(self._client.enqueue(queue, key, payload, keyspace=keyspace))

    def enqueue_many(self, queue: str, jobs: Sequence[tuple[Any, str | None]], *,
                     keyspace: str | None = None) -> list[tuple[str, int]]:
        """Store ``(key, payload)`` jobs of a segmented queue; their ``(shard, job_id)``."""
        return self._loop.run(self._client.enqueue_many(queue, jobs, keyspace=keyspace))

    def stats(self, queue: str, *, keyspace: str | None = None) -> list[Any]:
        """Per-shard figures of ``queue``."""
        return self._loop.run(self._client.queue_stats(queue, keyspace=keyspace))

    def close(self) -> None:
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.close()

    def __enter__(self) -> QueueReceiver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


#: The same client under the name a producer looks for.
QueueClient = QueueReceiver
