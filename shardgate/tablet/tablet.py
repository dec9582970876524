"""The tablet: the process-side owner of one shard's database.

Invariants:

* every open transaction is one pooled :class:`~shardgate.backends.Connection`
  held in ``_transactions`` under an id that is never reused in this process;
* a transaction id is removed before its connection is released, whether the
  commit or rollback succeeds or fails, so a failed commit never leaves a
  half-open transaction that a later statement could write into;
* statements outside a transaction run on a pooled connection in autocommit
  mode and hold nothing afterwards.
* a prepared (two-phase) transaction is ended only by ``commit_prepared`` or
  ``rollback_prepared``, never by ``rollback`` or ``close``: it belongs to the
  coordinator's decision (:mod:`shardgate.gate.twopc`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from shardgate.backends import Backend, Connection, open_backend
from shardgate.backends.change_log import open_change_log
from shardgate.errors import FailedPrecondition, ShardgateError
from shardgate.event_token import is_fresher
from shardgate.result import ExecuteOptions, Result, Row
from shardgate.tablet import metrics
from shardgate.tablet.queue_service import QueueService, QueueWrite
from shardgate.tablet.stream import TabletStream

#: how long an ``include_event_token`` read waits for the log reader to catch up
EXACT_TOKEN_WAIT_S = 1.0


class Tablet:
    """Serves one shard (``keyspace/shard``) from its database."""

    def __init__(self, keyspace: str, shard: str, backend: Backend) -> None:
        self.keyspace = keyspace
        self.shard = shard
        self.backend = backend
        self._transactions: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self._changes: TabletStream | None = None
        #: xid -> id of a prepared transaction whose session this tablet still holds
        self._prepared: dict[str, int] = {}
        #: the shard's queues (lease, managers, receivers)
        self.queues = QueueService(keyspace, shard, backend)
        #: queue tables each open transaction wrote, to wake their managers on commit
        self._tx_queues: dict[int, list[QueueWrite]] = {}
        metrics.COLLECTOR.tablets.add(self)

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
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
    ) -> Result:
        start = time.perf_counter()
        labels = (self.keyspace, self.shard, self.dialect)
        try:
            result = await self._execute(sql, params, transaction_id, options)
        except ShardgateError as exc:
            metrics.ERRORS.labels("Execute", *labels, exc.code.value).inc()
            raise
        metrics.QUERIES.labels("Execute", *labels).observe(time.perf_counter() - start)
        return result

    async def _execute(
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
    ) -> Result:
        if options is not None and (
            options.include_event_token or options.compare_event_token is not None
        ):
            # The last seen token, read just before the query: the data is at least as fresh.
            stream = await self.change_stream()
            token = stream.last_token
            result = await self._execute(sql, params, transaction_id)
            if options.include_event_token and transaction_id is None:
                # Returned only when exact: no change of this shard committed between the
                # token and the query (the reader has read past the log end as of after
                # the query and its last token did not move). Equal tokens, equal data.
                end = await self.backend.execute(stream.log.position_sql, [])
                position = str(end.rows[0][0] or "") if end.rows else ""
                exact = (
                    bool(position)
                    and await stream.wait_for(position, EXACT_TOKEN_WAIT_S)
                    and stream.last_token == token
                )
                result.event_token = token if exact else None
            if options.compare_event_token is not None:
                result.fresher = is_fresher(token, options.compare_event_token)
            return result
        touched = self.queues.touched(sql)
        if transaction_id is None:
            result = await self.backend.execute(sql, params)
            if touched is not None:
                self.queues.committed([touched])
            return result
        result = await self._tx(transaction_id).execute(sql, params)
        if touched is not None:
            self._tx_queues.setdefault(transaction_id, []).append(touched)
        return result

    async def change_stream(self) -> TabletStream:
        """This shard's change stream, its log reader started on first use."""
        if self._changes is None:
            self._changes = TabletStream(
                open_change_log(self.backend.url, f"{self.keyspace}/{self.shard}")
            )
        await self._changes.start()
        return self._changes

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
        touched = self._tx_queues.pop(transaction_id, None)
        try:
            await conn.commit()
        finally:
            await self.backend.release(conn)
        if touched:
            self.queues.committed(touched)

    async def rollback(self, transaction_id: int) -> None:
        conn = self._transactions.pop(transaction_id, None)
        self._tx_queues.pop(transaction_id, None)
        if conn is None:
            return
        try:
            await conn.rollback()
        finally:
            await self.backend.release(conn)

    # -- two-phase commit (see shardgate.gate.twopc) ---------------------------------

    @property
    def supports_twopc(self) -> bool:
        return self.backend.supports_twopc

    async def begin_twopc(self, xid: str) -> int:
        """Like :meth:`begin`, for a transaction that may be prepared as ``xid``."""
        conn = await self.backend.acquire()
        try:
            await conn.begin_twopc(xid)
        except BaseException:
            await self.backend.release(conn)
            raise
        tid = next(self._ids)
        self._transactions[tid] = conn
        return tid

    async def prepare(self, transaction_id: int, xid: str) -> None:
        """Phase one. If it fails the transaction is rolled back and forgotten.

        A prepared transaction keeps its session (MariaDB lets only that session
        end it while it lives) until :meth:`commit_prepared` or
        :meth:`rollback_prepared`; it is never rolled back implicitly.
        """
        conn = self._tx(transaction_id)
        try:
            await conn.prepare(xid)
        except BaseException:
            self._transactions.pop(transaction_id, None)
            await self.backend.release(conn)  # rolls back whatever is left
            raise
        self._prepared[xid] = transaction_id

    async def commit_prepared(self, xid: str) -> None:
        """Commit a prepared transaction: ours, or one a dead gate left behind."""
        await self._end_prepared(xid, commit=True)

    async def rollback_prepared(self, xid: str) -> None:
        """Roll back a prepared transaction: ours, or one a dead gate left behind."""
        await self._end_prepared(xid, commit=False)

    async def _end_prepared(self, xid: str, *, commit: bool) -> None:
        tid = self._prepared.pop(xid, None)
        held = self._transactions.pop(tid, None) if tid is not None else None
        conn = held if held is not None else await self.backend.acquire()
        touched = self._tx_queues.pop(tid, None) if tid is not None else None
        try:
            if commit:
                await conn.commit_prepared(xid)
            else:
                await conn.rollback_prepared(xid)
        finally:
            await self.backend.release(conn)
        if commit and touched:
            self.queues.committed(touched)

    async def list_prepared(self, prefix: str) -> list[str]:
        """Xids starting with ``prefix`` prepared in this shard's database."""
        conn = await self.backend.acquire()
        try:
            return await conn.list_prepared(prefix)
        finally:
            await self.backend.release(conn)

    async def close(self) -> None:
        await self.queues.close()
        changes, self._changes = self._changes, None
        if changes is not None:
            await changes.close()
        held = set(self._prepared.values())  # prepared: left to the commit decision
        for tid in list(self._transactions):
            if tid not in held:
                await self.rollback(tid)
        await self.backend.close()
