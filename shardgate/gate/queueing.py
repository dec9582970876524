"""The gate's queue calls: receive, ack, enqueue, nack, stats and operator actions.

Each routes through :mod:`shardgate.queues.router` to the shards holding the
queue. What the gate adds: an ack held across a reshard's write cut-over like
a write (:mod:`shardgate.gate.cutover`), and jobs enqueued inside a session's
open transaction written in it (they commit or roll back with it).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from shardgate.errors import ShardgateError, Unavailable
from shardgate.gate import cutover
from shardgate.gate.cursor import CursorGate, SessionCursor
from shardgate.gate.session import Session
from shardgate.queues import router as queue_router
from shardgate.queues.events import QueueBatch
from shardgate.result import Result


class QueueingGate(CursorGate, queue_router.QueueDDLGate, Protocol):
    """What :class:`Queueing` needs of the gate: the router's view of it, the cursors'
    needs (a job joins a session's transaction), and where held acks wait."""

    @property
    def hold(self) -> cutover.Hold: ...


class Queueing:
    """The gate's queue calls (see the module docstring)."""

    def __init__(self, gate: QueueingGate) -> None:
        self._gate = gate

    def receive(
        self, keyspace: str, queue: str, *, shard: str | None, key_range: str | None,
        max_batch: int,
    ) -> AsyncIterator[QueueBatch]:
        """Fired events of ``queue``: the fields first, then batches (events name their shard)."""
        return queue_router.receive(self._gate, keyspace, queue, shard=shard,
                                    key_range=key_range, max_batch=max_batch)

    async def ack(self, keyspace: str, queue: str, shard: str, ids: Sequence[int]) -> int:
        """Ack events of one shard (the shard their receiver was told).

        An ack that meets a shard frozen by a reshard's write cut-over is held like a
        write (:mod:`.cutover`): replayed once the switch is published, on the shards
        that then own the events' rows (or on the same shard if the cut-over rolled
        back); an ack changes nothing when refused, and replays are idempotent."""
        held_until = time.monotonic() + cutover.HOLD_S
        while True:
            try:
                return await queue_router.ack(self._gate, keyspace, queue, shard, ids)
            except ShardgateError as exc:
                if not cutover.writes_frozen(exc):
                    raise
                if not await self._gate.hold.wait(held_until):
                    raise Unavailable(
                        f"acks stayed paused by a reshard's cut-over for {cutover.HOLD_S:g}s; "
                        "retry the ack") from exc

    async def enqueue(
        self, keyspace: str, queue: str, jobs: Sequence[tuple[Any, str | None]],
        session: Session | None,
    ) -> list[tuple[str, int]]:
        """Store ``(key, payload)`` jobs of a segmented queue; ``(shard, job_id)`` of each.

        Without ``session`` (or with one outside a transaction) the jobs are
        committed when this returns; with a session in a transaction they are
        written in it and commit or roll back with it (see ``queues.router.enqueue``).
        """
        join: queue_router.JoinTransaction | None = None
        if session is not None and session.in_transaction:
            gate = self._gate
            cursor = SessionCursor(gate, session)
            in_tx = session

            async def joined(keyspace: str, shard: str) -> queue_router.Execute:
                tablet = gate.tablets[(keyspace, shard)]
                tid = await cursor.join(keyspace, shard, tablet)

                async def execute(sql: str, params: Sequence[Any]) -> Result:
                    in_tx.shard_calls += 1
                    return await tablet.execute(sql, params, tid)

                return execute

            join = joined
        return await queue_router.enqueue(self._gate, keyspace, queue, jobs, join=join)

    async def nack(
        self, keyspace: str, queue: str, shard: str, ids: Sequence[int], reason: str,
        retry_at: int | None,
    ) -> int:
        """Record a failed attempt of segmented-queue jobs of one shard: each is retried
        after the queue's backoff (or at ``retry_at``, ns since the epoch), or aborted
        once out of attempts; how many were executing."""
        return await queue_router.nack(self._gate, keyspace, queue, shard, ids, reason, retry_at)

    async def stats(self, keyspace: str, queue: str) -> list[dict[str, Any]]:
        """Per-shard figures of ``queue``."""
        return await queue_router.stats(self._gate, keyspace, queue)

    async def admin(
        self, keyspace: str, queue: str, action: str, *, shard: str | None, ids: Sequence[int],
    ) -> int:
        """An operator's action on ``queue`` (on one shard, or all); events changed."""
        return await queue_router.admin(self._gate, keyspace, queue, action, shard=shard,
                                        ids=ids)
