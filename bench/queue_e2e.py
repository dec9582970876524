"""End-to-end queue throughput on one PostgreSQL server: shardgate vs pgqueuer vs raw SKIP LOCKED.

Every contender does the whole path with the same durability (enqueue
committed with the server's default ``synchronous_commit = on``): a producer
enqueues N events in committed batches of 128 while consumers take them,
"process" them (count) and ack/complete them. Throughput = N / (time from the
first enqueue to the last ack).

* **shardgate**: ``INSERT`` batches through the gate into a queue table, the
  shard's manager fires them, two in-process receivers (``Gate.queue_receive``)
  ack each batch (``Gate.queue_ack``); run with 1 and 4 shards (4 databases).
* **pgqueuer** 1.6: ``Queries.enqueue`` batches, a ``QueueManager`` with
  ``batch_size=128`` (its own LISTEN/NOTIFY wake-ups).
* **raw**: ``INSERT`` batches and two loops of ``DELETE ... WHERE id IN (SELECT id
  ... FOR UPDATE SKIP LOCKED LIMIT 128) RETURNING`` (claim and complete in one
  transaction).

Usage: ``python bench/queue_e2e.py [--events N] [--smoke]`` (needs
``pip install -e '.[bench]'`` for pgqueuer; ``make bench`` does it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import app_keyspace, drop_database, fresh_database
from _queues import BATCH, CONSUMERS, pgqueuer_rate, run_e2e, table_producer

from shardgate.gate import Gate


async def bench_shardgate(n: int, shards: int) -> float:
    topo, names = app_keyspace(f"sg_bench_q{shards}", shards)
    gate = Gate.open(topo, pool_size=6)
    try:
        await gate.execute(gate.session(), "CREATE QUEUE jobs (user_id BIGINT NOT NULL, "
                           "payload VARCHAR(64)) SHARD BY user_id "
                           "WITH (batch_size = 128, ack_wait = 30)")
        for shard in topo.keyspace("app").shards:  # an analysed table, as in production
            with psycopg.connect(shard.url, autocommit=True) as c:
                c.execute("ANALYZE jobs")
        return await run_e2e(gate, n, table_producer(gate, n))
    finally:
        await gate.close()
        for name in names:
            drop_database(name)


async def bench_pgqueuer(n: int) -> float:
    url = fresh_database("sg_bench_pgqueuer")
    try:
        return await pgqueuer_rate(url, n)
    finally:
        drop_database("sg_bench_pgqueuer")


async def bench_raw(n: int) -> float:
    url = fresh_database("sg_bench_raw")
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute("CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, payload TEXT)")
        done = 0

        async def produce() -> None:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
                for start in range(0, n, BATCH):
                    k = min(BATCH, n - start)
                    async with c.transaction():
                        await c.cursor().executemany(
                            "INSERT INTO jobs (payload) VALUES (%s)", [("x",)] * k)

        async def consume() -> None:
            nonlocal done
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
                while done < n:
                    cur = await c.execute(
                        "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs ORDER BY id "
                        f"FOR UPDATE SKIP LOCKED LIMIT {BATCH}) RETURNING id")
                    rows = await cur.fetchall()
                    done += len(rows)
                    if not rows:
                        await asyncio.sleep(0.001)

        t0 = time.perf_counter()
        await asyncio.gather(produce(), *(consume() for _ in range(CONSUMERS)))
        return n / (time.perf_counter() - t0)
    finally:
        drop_database("sg_bench_raw")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    n = 2_000 if args.smoke else args.events
    results: dict[str, float] = {}
    results["shardgate 1 shard"] = await bench_shardgate(n, 1)
    results["shardgate 4 shards"] = await bench_shardgate(n, 4)
    try:
        results["pgqueuer"] = await bench_pgqueuer(n)
    except ImportError:
        print("pgqueuer not installed (pip install -e '.[bench]'): skipped")
    results["raw SKIP LOCKED"] = await bench_raw(n)
    print(f"end-to-end queue throughput, {n} events, batches of {BATCH}, one PostgreSQL")
    for name, rate in results.items():
        print(f"  {name:<20} {rate:>10,.0f} events/s")
    base = results.get("pgqueuer")
    if base:
        for name in ("shardgate 1 shard", "shardgate 4 shards", "raw SKIP LOCKED"):
            print(f"  {name} / pgqueuer = {results[name] / base:.2f}x")
    print(f"  shardgate 4 shards / 1 shard = "
          f"{results['shardgate 4 shards'] / results['shardgate 1 shard']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
