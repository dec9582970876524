"""A blocking inbox client: an :class:`~shardgate.queues.inbox.InboxStore` on a private loop.

For synchronous programs (scripts, WSGI apps, workers without asyncio)::

    with SyncInbox(load_cluster_file("cluster.yaml"), "app", "notes") as inbox:
        inbox.append(42, "hello")
        got = inbox.read_committed(42, "phone")
        inbox.commit(42, "phone", got.pointer)

It opens its own in-process gate on a :class:`~shardgate.client.sync.LoopThread`
and forwards each call to the asyncio store there. Appends run in their own
transaction; to append inside a business transaction, use the async store
with the gate session of that transaction.

:class:`RemoteInbox` has the same calls against a running gate over gRPC
(the asyncio ones are ``GateClient.inbox_*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from shardgate.client.queues import client_thread
from shardgate.client.sync import LoopThread
from shardgate.gate import Gate
from shardgate.queues.inbox.model import Bucket, InboxOptions, Message, Pointer
from shardgate.queues.inbox.store import InboxRead, InboxStore, MaintainReport
from shardgate.topo.model import Topology


class SyncInbox:
    """One inbox, blocking calls (see the module docstring). Close it when done."""

    def __init__(
        self,
        topology: Topology,
        keyspace: str,
        name: str,
        options: InboxOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
        pool_size: int = 4,
    ) -> None:
        self._loop = LoopThread("shardgate-inbox")
        try:
            async def open_store() -> tuple[Gate, InboxStore]:
                gate = Gate.open(topology, pool_size=pool_size)
                return gate, InboxStore(gate, keyspace, name, options, clock=clock)

            self._gate, self.store = self._loop.run(open_store())
        except BaseException:
            self._loop.close()
            raise

    def create(self) -> MaintainReport:
        return self._loop.run(self.store.create())

    def maintain(self, now: int | None = None) -> MaintainReport:
        return self._loop.run(self.store.maintain(now))

    def buckets(self) -> list[Bucket]:
        self._loop.run(self.store.open())
        return self.store.buckets()

    def append(self, user: Any, body: str | None, *, ts: int | None = None) -> Message:
        return self._loop.run(self.store.append(user, body, ts=ts))

    def bulk_load(self, messages: Sequence[tuple[Any, int, str | None]]) -> int:
        return self._loop.run(self.store.bulk_load(messages))

    def read(self, user: Any, *, after: Pointer | str | None = None,
             limit: int = 100) -> InboxRead:
        return self._loop.run(self.store.read(user, after=after, limit=limit))

    def read_committed(self, user: Any, consumer: str, *, limit: int = 100) -> InboxRead:
        return self._loop.run(self.store.read_committed(user, consumer, limit=limit))

    def commit(self, user: Any, consumer: str, pointer: Pointer | str) -> None:
        self._loop.run(self.store.commit(user, consumer, pointer))

    def committed(self, user: Any, consumer: str) -> Pointer | None:
        return self._loop.run(self.store.committed(user, consumer))

    def close(self) -> None:
        """Close the gate's connections and stop the loop thread (idempotent)."""
        if not self._loop.loop.is_closed():
            try:
                self._loop.run(self._gate.close())
            finally:
                self._loop.close()

    def __enter__(self) -> SyncInbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RemoteInbox:
    """One inbox of a running gate over gRPC, blocking calls (no database access here).

    ::

        with RemoteInbox("grpc://127.0.0.1:15991", "app", "notes") as inbox:
            inbox.append(42, "hello")
            got = inbox.read_committed(42, "phone")
            inbox.commit(42, "phone", got.pointer)

    The gate opens the inbox with the options stored with it; pass
    ``options`` only to :meth:`create`. Appends commit on their own; for an
    append inside a gate transaction, use ``GateClient.inbox_append`` after
    ``BEGIN`` on that client's session.
    """

    def __init__(self, target: str, keyspace: str, name: str, *,
                 timeout: float | None = None) -> None:
        self.keyspace = keyspace
        self.name = name
        self._loop, self._client = client_thread("shardgate-remote-inbox", target,
                                                 keyspace=keyspace, timeout=timeout)

    def create(self, options: InboxOptions | None = None) -> MaintainReport:
        return self._loop.run(self._client.inbox_create(self.name, options))

    def maintain(self) -> MaintainReport:
        return self._loop.run(self._client.inbox_maintain(self.name))

    def append(self, user: Any, body: str | None, *, ts: int | None = None) -> Message:
        return self._loop.run(self._client.inbox_append(self.name, user, body, ts=ts))

    def read(self, user: Any, *, after: Pointer | str | None = None,
             limit: int = 100) -> InboxRead:
        return self._loop.run(self._client.inbox_read(self.name, user, after=after, limit=limit))

    def read_committed(self, user: Any, consumer: str, *, limit: int = 100) -> InboxRead:
        return self._loop.run(self._client.inbox_read(self.name, user, consumer=consumer,
                                                      limit=limit))

    def commit(self, user: Any, consumer: str, pointer: Pointer | str) -> None:
        self._loop.run(self._client.inbox_commit(self.name, user, consumer, pointer))

    def committed(self, user: Any, consumer: str) -> Pointer | None:
        return self._loop.run(self._client.inbox_committed(self.name, user, consumer))

    def stats(self, *, counts: bool = False) -> dict[str, Any]:
        return self._loop.run(self._client.inbox_stats(self.name, counts=counts))

    def close(self) -> None:
        """Close the channel and stop the loop thread (idempotent)."""
        if not self._loop.loop.is_closed():
            try:
                self._loop.run(self._client.close())
            finally:
                self._loop.close()

    def __enter__(self) -> RemoteInbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
