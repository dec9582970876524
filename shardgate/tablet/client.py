"""How the gate reaches a tablet: one interface, in-process or over gRPC.

The planner and executor only see :class:`TabletClient`; whether the tablet
lives in this process (``shardgate up``) or behind gRPC is the topology's
business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any

from shardgate.result import Result, Row
from shardgate.tablet.tablet import Tablet


class TabletClient(ABC):
    """The gate's handle on one shard."""

    keyspace: str
    shard: str
    dialect: str
    placeholder: str

    @abstractmethod
    async def execute(
        self, sql: str, params: Sequence[Any], transaction_id: int | None = None
    ) -> Result: ...

    @abstractmethod
    def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]: ...

    @abstractmethod
    async def begin(self) -> int: ...

    @abstractmethod
    async def commit(self, transaction_id: int) -> None: ...

    @abstractmethod
    async def rollback(self, transaction_id: int) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...


class LocalTabletClient(TabletClient):
    """A tablet in this process: direct calls, no serialisation."""

    def __init__(self, tablet: Tablet) -> None:
        self.tablet = tablet
        self.keyspace = tablet.keyspace
        self.shard = tablet.shard
        self.dialect = tablet.dialect
        self.placeholder = tablet.placeholder

    async def execute(
        self, sql: str, params: Sequence[Any], transaction_id: int | None = None
    ) -> Result:
        return await self.tablet.execute(sql, params, transaction_id)

    def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        return self.tablet.stream_execute(sql, params)

    async def begin(self) -> int:
        return await self.tablet.begin()

    async def commit(self, transaction_id: int) -> None:
        await self.tablet.commit(transaction_id)

    async def rollback(self, transaction_id: int) -> None:
        await self.tablet.rollback(transaction_id)

    async def close(self) -> None:
        await self.tablet.close()
