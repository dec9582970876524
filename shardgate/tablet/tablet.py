"""The tablet: the process-side owner of one shard's database.

Invariants:

* every open transaction is one pooled :class:`~shardgate.backends.Connection`
  held in ``_transactions`` under an id that is never reused in this process;
* a transaction id is removed before its connection is released, whether the
  commit or rollback succeeds or fails, so a failed commit never leaves a
  half-open transaction that a later statement could write into;
* statements outside a transaction run on a pooled connection in autocommit
  mode and hold nothing afterwards.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from shardgate.backends import Backend, Connection, open_backend
from shardgate.errors import FailedPrecondition
from shardgate.result import Result, Row


class Tablet:
    """Serves one shard (``keyspace/shard``) from its database."""

    def __init__(self, keyspace: str, shard: str, backend: Backend) -> None:
        self.keyspace = keyspace
        self.shard = shard
        self.backend = backend
        self._transactions: dict[int, Connection] = {}
        self._ids = itertools.count(1)

    @classmethod
    def open(cls, keyspace: str, shard: str, url: str, *, pool_size: int = 4) -> Tablet:
        return cls(keyspace, shard, open_backend(url, pool_size=pool_size))

    @property
    def dialect(self) -> str:
        return self.backend.dialect

    @property
    def placeholder(self) -> str:
        return self.backend.placeholder

    def _tx(self, transaction_id: int) -> Connection:
        try:
            return self._transactions[transaction_id]
        except KeyError:
            raise FailedPrecondition(
                f"transaction {transaction_id} is not open on {self.keyspace}/{self.shard} "
                "(it was committed, rolled back or lost): start a new one"
            ) from None

    async def execute(
        self, sql: str, params: Sequence[Any], transaction_id: int | None = None
    ) -> Result:
        if transaction_id is None:
            return await self.backend.execute(sql, params)
        return await self._tx(transaction_id).execute(sql, params)

    async def stream_execute(
        self, sql: str, params: Sequence[Any], batch_size: int = 1000
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        conn = await self.backend.acquire()
        try:
            async for batch in conn.stream(sql, params, batch_size):
                yield batch
        finally:
            await self.backend.release(conn)

    async def begin(self) -> int:
        conn = await self.backend.acquire()
        try:
            await conn.begin()
        except BaseException:
            await self.backend.release(conn)
            raise
        tid = next(self._ids)
        self._transactions[tid] = conn
        return tid

    async def commit(self, transaction_id: int) -> None:
        conn = self._transactions.pop(transaction_id, None)
        if conn is None:
            self._tx(transaction_id)  # raises the clear error
            return
        try:
            await conn.commit()
        finally:
            await self.backend.release(conn)

    async def rollback(self, transaction_id: int) -> None:
        conn = self._transactions.pop(transaction_id, None)
        if conn is None:
            return
        try:
            await conn.rollback()
        finally:
            await self.backend.release(conn)

    async def close(self) -> None:
        for tid in list(self._transactions):
            await self.rollback(tid)
        await self.backend.close()
