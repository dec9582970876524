"""Cache consistency on a real Redis: writers, readers through the read path, the invalidator."""

from __future__ import annotations

import asyncio
import random
import secrets

import pytest
import redis.asyncio as aioredis

from shardgate.auth.identity import TRUSTED
from shardgate.streams.cache import CachedReader, Invalidator, default_key
from tests.conftest import REDIS_URL, require_server
from tests.integration.conftest import Cluster
from tests.integration.streams.test_change_streams_gate import _started

KEYS = 12
WRITES = 120
READERS = 4


@pytest.fixture
async def cache_cluster(streams_cluster: Cluster) -> Cluster:
    require_server("redis")
    return streams_cluster


async def test_cache_stays_consistent(cache_cluster: Cluster) -> None:
    gate = cache_cluster.gate
    s = gate.session(identity=TRUSTED)
    prefix = f"sgtest:{secrets.token_hex(4)}:"
    r = aioredis.from_url(REDIS_URL)
    tasks: list[asyncio.Task[None]] = []
    events = gate.update_stream("commerce", heartbeat_s=0.2, identity=TRUSTED)
    try:
        for k in range(1, KEYS + 1):
            await gate.execute(
                s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:k, :k, 'x', 0)",
                {"k": k},
            )
        invalidator = Invalidator(r, key_of=default_key(prefix))
        await _started(events)  # every shard's stream is reading: nothing is missed
        inval_task = asyncio.create_task(invalidator.run(events))
        tasks.append(inval_task)
        reader = CachedReader(r, gate)
        sql = "SELECT price FROM corder WHERE customer_id = :k"

        def key(k: int) -> str:
            return f"{prefix}commerce.corder:{k}"

        stop = asyncio.Event()
        regressions: list[str] = []

        async def read_loop(n: int) -> None:
            rng = random.Random(n)
            seen: dict[int, int] = {}
            while not stop.is_set():
                k = rng.randint(1, KEYS)
                row = await reader.get(key(k), sql, {"k": k})
                assert row is not None
                price = int(row[0])
                if price < seen.get(k, -1):
                    entry = await r.get(key(k))
                    regressions.append(
                        f"reader {n} key {k}: {price} after {seen[k]} (entry {entry!r})"
                    )
                seen[k] = max(seen.get(k, -1), price)
                await asyncio.sleep(0)

        async def write_loop(n: int) -> None:
            rng = random.Random(100 + n)
            ws = gate.session(identity=TRUSTED)
            for _ in range(WRITES // 2):
                k = rng.randint(1, KEYS)
                await gate.execute(
                    ws, "UPDATE corder SET price = price + 1 WHERE customer_id = :k", {"k": k}
                )
                await asyncio.sleep(rng.random() * 0.002)

        readers = [asyncio.create_task(read_loop(n)) for n in range(READERS)]
        tasks.extend(readers)
        await asyncio.gather(write_loop(0), write_loop(1))
        # Catch-up: the invalidator has applied every update (and the inserts).
        for _ in range(600):
            if invalidator.applied >= WRITES:  # the updates (the inserts came before)
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*readers)
        inval_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inval_task

        assert invalidator.applied == WRITES, invalidator.applied
        assert not regressions, regressions[:5]
        cached_values = 0
        for k in range(1, KEYS + 1):
            db = await gate.execute(s, sql, {"k": k})
            raw = await r.get(key(k))
            if raw is not None and b'"v"' in raw:
                cached_values += 1
            assert await reader.get(key(k), sql, {"k": k}) == [db.rows[0][0]]
            raw = await r.get(key(k))
            assert raw is not None
        assert cached_values > 0
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]
        keys = [k async for k in r.scan_iter(f"{prefix}*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
