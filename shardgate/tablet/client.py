"""How the gate reaches a tablet: one interface, in-process or over gRPC.

The planner and executor only see :class:`TabletClient`; whether the tablet
lives in this process (``shardgate up``) or behind gRPC is the topology's
business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from shardgate.backends.changes import LogItem
from shardgate.errors import FailedPrecondition, Unsupported
from shardgate.queues.events import QueueBatch
from shardgate.queues.options import QueueOptions
from shardgate.result import ExecuteOptions, Result, Row, WireResult
from shardgate.sql.classify import WriteTarget
from shardgate.sql.dialects import Dialect
from shardgate.tablet.queue_service import receive_batches
from shardgate.tablet.tablet import Tablet


class TabletClient(ABC):
    """The gate's handle on one shard."""

    keyspace: str
    shard: str
    dialect: Dialect
    placeholder: str
    #: whether the shard can prepare transactions (PostgreSQL, MariaDB)
    supports_twopc: bool = False
    #: whether :meth:`queue_forget` can stop a queue here (DROP QUEUE)
    forgets_queues: bool = False

    @property
    def gives_wire(self) -> bool:
        """Whether :meth:`execute_wire` can answer (else it returns None)."""
        return False

    @property
    def collation(self) -> str | None:
        """The shard database's default collation, when known (MariaDB and PostgreSQL tablets)."""
        return None

    @abstractmethod
    async def execute(
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
        *,
        target: WriteTarget | None = None,
    ) -> Result:
        """Run ``sql``; ``target`` is what it writes as its sender classified it (the
        tablet then reads no SQL text for it; None: not classified, the tablet reads
        the statement's head)."""

    async def execute_wire(self, sql: str, params: Sequence[Any]) -> WireResult:
        """An autocommit read's answer as MySQL protocol packets, for a MySQL client
        (:meth:`Tablet.execute_wire`); only where :attr:`gives_wire` (not another
        database, nor a tablet in another process: its answer crosses gRPC parsed)."""
        raise Unsupported(f"{type(self).__name__} does not answer with MySQL packets")

    def update_stream(
        self,
        *,
        position: str | None = None,
        timestamp: float | None = None,
        heartbeat_s: float | None = None,
    ) -> AsyncIterator[LogItem]:
        """The shard's change stream (see :meth:`TabletStream.subscribe`)."""
        raise Unsupported(f"{type(self).__name__} does not serve change streams")

    @abstractmethod
    def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]: ...

    @abstractmethod
    async def begin(self, caller: str | None = None) -> int:
        """Open a transaction for ``caller`` (the user the gate serves, counted against
        the tablet's per-user cap; None: the gate's own work); its id."""

    @abstractmethod
    async def commit(self, transaction_id: int) -> None: ...

    @abstractmethod
    async def rollback(self, transaction_id: int) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def queue_admin(self, queue: str, action: str, ids: Sequence[int] = ()) -> int:
        """An operator's action on a queue (see ``QueueService.admin``)."""
        raise Unsupported(f"{type(self).__name__} does not take queue actions")

    def describe(self) -> dict[str, Any]:
        """What the console shows of this tablet: how it is reached, its lease."""
        return {"kind": type(self).__name__}

    # Two-phase commit, where ``supports_twopc``; see :class:`Tablet` for contracts.

    async def begin_twopc(self, xid: str, caller: str | None = None) -> int:
        raise _no_twopc(self)

    async def prepare(self, transaction_id: int, xid: str) -> None:
        raise _no_twopc(self)

    async def commit_prepared(self, xid: str) -> None:
        raise _no_twopc(self)

    async def rollback_prepared(self, xid: str) -> None:
        raise _no_twopc(self)

    async def list_prepared(self, prefix: str) -> list[str]:
        raise _no_twopc(self)

    # Queues (see shardgate.tablet.queue_service): receive, ack, stats, configure.

    def queue_receive(self, queue: str, max_batch: int = 0) -> AsyncIterator[QueueBatch]:
        """The first batch carries the fields, later ones events; ends if the tablet stops."""
        raise Unsupported(f"{type(self).__name__} does not serve queues")

    async def queue_ack(self, queue: str, ids: Sequence[int]) -> int:
        raise Unsupported(f"{type(self).__name__} does not serve queues")

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        raise Unsupported(f"{type(self).__name__} does not serve queues")

    async def queue_nack(self, queue: str, ids: Sequence[int], reason: str,
                         retry_at: int | None = None) -> int:
        """Record a failed attempt of segmented-queue jobs ``ids``; how many were executing."""
        raise Unsupported(f"{type(self).__name__} does not serve queues")

    async def queue_configure(self, queues: Mapping[str, QueueOptions]) -> None:
        """Declare queue tables; tablets also find them by their comment marker."""
        return None

    async def queue_forget(self, queue: str) -> None:
        """Stop serving ``queue`` before its tables are dropped (DROP QUEUE)."""
        raise Unsupported(
            f"DROP QUEUE through {type(self).__name__}: this tablet cannot be told to stop "
            "serving a queue; drop it through a gate with in-process tablets (shardgate up)"
        )
    async def queue_enqueue(self, queue: str, jobs: Sequence[tuple[str, str | None]]) -> list[int]:
        """Store ``(key, payload)`` jobs of a segmented queue; their ids once committed."""
        raise Unsupported(f"{type(self).__name__} does not serve segmented queues")

    #: whether the shard has tablets other than the lease holder (``@replica`` reads)
    has_replicas: bool = False

    def for_tablet_type(self, tablet_type: str) -> TabletClient:
        """The client that serves reads of ``tablet_type`` (``replica``); self by default."""
        return self


def _no_twopc(client: TabletClient) -> FailedPrecondition:
    return FailedPrecondition(
        f"shard {client.keyspace}/{client.shard} cannot prepare transactions through "
        f"{type(client).__name__}: use transaction_mode 'best_effort'"
    )


class LocalTabletClient(TabletClient):
    """A tablet in this process: direct calls, no serialisation."""

    def __init__(self, tablet: Tablet) -> None:
        self.tablet = tablet
        self.keyspace = tablet.keyspace
        self.shard = tablet.shard
        self.dialect = tablet.dialect
        self.placeholder = tablet.placeholder
        self.supports_twopc = tablet.supports_twopc
        self.forgets_queues = True

    async def queue_admin(self, queue: str, action: str, ids: Sequence[int] = ()) -> int:
        return await self.tablet.queues.admin(queue, action, ids)

    def describe(self) -> dict[str, Any]:
        stream = self.tablet._changes
        token = stream.last_token if stream is not None else None
        return {"kind": "in-process", "lease_holder": self.tablet.queues.leader,
                "health": "serving", "position": token.position if token is not None else "",
                "open_transactions": len(self.tablet._transactions)}

    @property
    def collation(self) -> str | None:
        return self.tablet.backend.collation

    async def execute(
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
        *,
        target: WriteTarget | None = None,
    ) -> Result:
        return await self.tablet.execute(sql, params, transaction_id, options, target=target)

    @property
    def gives_wire(self) -> bool:
        return self.tablet.backend.gives_wire

    async def execute_wire(self, sql: str, params: Sequence[Any]) -> WireResult:
        return await self.tablet.execute_wire(sql, params)

    async def update_stream(
        self,
        *,
        position: str | None = None,
        timestamp: float | None = None,
        heartbeat_s: float | None = None,
    ) -> AsyncIterator[LogItem]:
        stream = await self.tablet.change_stream()
        items = stream.subscribe(position=position, timestamp=timestamp, heartbeat_s=heartbeat_s)
        try:
            async for item in items:
                yield item
        finally:
            await items.aclose()  # type: ignore[attr-defined]

    def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        return self.tablet.stream_execute(sql, params)

    async def begin(self, caller: str | None = None) -> int:
        return await self.tablet.begin(caller)

    async def commit(self, transaction_id: int) -> None:
        await self.tablet.commit(transaction_id)

    async def rollback(self, transaction_id: int) -> None:
        await self.tablet.rollback(transaction_id)

    async def begin_twopc(self, xid: str, caller: str | None = None) -> int:
        return await self.tablet.begin_twopc(xid, caller)

    async def prepare(self, transaction_id: int, xid: str) -> None:
        await self.tablet.prepare(transaction_id, xid)

    async def commit_prepared(self, xid: str) -> None:
        await self.tablet.commit_prepared(xid)

    async def rollback_prepared(self, xid: str) -> None:
        await self.tablet.rollback_prepared(xid)

    async def list_prepared(self, prefix: str) -> list[str]:
        return await self.tablet.list_prepared(prefix)

    def queue_receive(self, queue: str, max_batch: int = 0) -> AsyncIterator[QueueBatch]:
        return receive_batches(self.tablet.queues, queue, max_batch)

    async def queue_ack(self, queue: str, ids: Sequence[int]) -> int:
        return await self.tablet.queues.ack(queue, ids)

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        return await self.tablet.queues.stats(queue)

    async def queue_nack(self, queue: str, ids: Sequence[int], reason: str,
                         retry_at: int | None = None) -> int:
        return await self.tablet.queues.nack(queue, ids, reason, retry_at)

    async def queue_configure(self, queues: Mapping[str, QueueOptions]) -> None:
        self.tablet.queues.configure(queues)

    async def queue_forget(self, queue: str) -> None:
        await self.tablet.queues.forget(queue)
    async def queue_enqueue(self, queue: str, jobs: Sequence[tuple[str, str | None]]) -> list[int]:
        return [int(i) for i in await self.tablet.queues.enqueue(queue, jobs)]

    async def close(self) -> None:
        await self.tablet.close()
