"""The queue benchmarks' common parts: one end-to-end harness and the pgqueuer reference.

``run_e2e``: receivers take events through ``Gate.queue_receive`` and ack each
batch (``Gate.queue_ack``) while producers enqueue; throughput is N / (time from
the first enqueue to the last ack). ``pgqueuer_rate``: the same shape with
pgqueuer on asyncpg, its recommended driver (two producers' ``Queries.enqueue``
batches, a ``QueueManager`` with its own LISTEN/NOTIFY wake-ups).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.queues.events import QueueEvent

BATCH = 128
PRODUCERS = 2
CONSUMERS = 2


async def ack_batch(gate: Gate, keyspace: str, queue: str, events: Sequence[QueueEvent]) -> None:
    """Ack a received batch: one ``Gate.queue_ack`` per shard it came from."""
    by_shard: dict[str, list[int]] = {}
    for e in events:
        by_shard.setdefault(e.shard, []).append(e.id)
    for shard, ids in by_shard.items():
        await gate.queue_ack(keyspace, queue, shard, ids)


async def run_e2e(
    gate: Gate,
    n: int,
    produce: Callable[[int], Awaitable[None]],
    *,
    keyspace: str = "app",
    queue: str = "jobs",
    settle_s: float = 0.2,
    sampler: Callable[[], Awaitable[None]] | None = None,
) -> float:
    """Events/s of ``n`` events: ``produce(k)`` for k < PRODUCERS, CONSUMERS acking receivers.

    ``settle_s``: time the receivers get to connect before the clock starts;
    ``sampler``: a task run alongside (cancelled at the end).
    """
    done = asyncio.Event()
    acked = 0

    async def consume() -> None:
        nonlocal acked
        stream = gate.queue_receive(keyspace, queue)
        try:
            async for batch in stream:
                if not batch.events:
                    continue
                await ack_batch(gate, keyspace, queue, batch.events)
                acked += len(batch.events)
                if acked >= n:
                    done.set()
                    return
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    consumers = [asyncio.create_task(consume()) for _ in range(CONSUMERS)]
    await asyncio.sleep(settle_s)
    t0 = time.perf_counter()
    side = asyncio.create_task(sampler()) if sampler is not None else None
    try:
        await asyncio.gather(*(produce(k) for k in range(PRODUCERS)))
        await done.wait()
        return n / (time.perf_counter() - t0)
    finally:
        for task in [*consumers, *([side] if side else [])]:
            task.cancel()
        await asyncio.gather(*consumers, *([side] if side else []), return_exceptions=True)


async def pgqueuer_rate(url: str, n: int) -> float:
    """Events/s of ``n`` jobs through pgqueuer on the database at ``url`` (installs its schema),
    in its recommended setup: the asyncpg driver, PRODUCERS producers on their own
    connections enqueueing batches of BATCH, one ``QueueManager`` (``batch_size=BATCH``)."""
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conns = [await asyncpg.connect(url) for _ in range(1 + PRODUCERS)]
    try:
        await Queries(AsyncpgDriver(conns[0])).install()
        qm = QueueManager(Queries(AsyncpgDriver(conns[0])))
        count = 0

        @qm.entrypoint("bench")
        async def work(job: object) -> None:
            nonlocal count
            count += 1
            if count >= n:
                qm.shutdown.set()

        producers = [Queries(AsyncpgDriver(c)) for c in conns[1:]]
        t0 = time.perf_counter()

        async def produce(k: int) -> None:
            for start in range(k * BATCH, n, BATCH * PRODUCERS):
                m = min(BATCH, n - start)
                await producers[k].enqueue(["bench"] * m, [b"x"] * m, [0] * m)

        prods = [asyncio.create_task(produce(k)) for k in range(PRODUCERS)]
        await qm.run(batch_size=BATCH)
        await asyncio.gather(*prods)
        return n / (time.perf_counter() - t0)
    finally:
        for c in conns:
            await c.close()


def table_producer(gate: Gate, n: int, queue: str = "jobs") -> Callable[[int], Awaitable[None]]:
    """``produce(k)`` for :func:`run_e2e`: producer k's share of ``n`` events into a queue
    table, BATCH per INSERT, one random user per batch (one shard, one commit), with
    bind variables (the plan is cached, as an application would do)."""

    async def produce(k: int) -> None:
        s = gate.session(identity=TRUSTED)
        rng = random.Random(k)
        for start in range(k * BATCH, n, BATCH * PRODUCERS):
            m = min(n, start + BATCH) - start
            sql = f"INSERT INTO {queue} (user_id, payload) VALUES " + ", ".join(
                f"(:u, :p{i})" for i in range(m))
            bv: dict[str, object] = {"u": rng.randrange(1 << 40)}
            bv.update({f"p{i}": f"p{start + i}" for i in range(m)})
            await gate.execute(s, sql, bv)

    return produce
