"""Inbox store latency at 1M users: shardgate on 4 PostgreSQL shards vs a Redis-list inbox.

Both hold one inbox per user with one message each (1M users by default),
then run the same operations on random users, one at a time, and report
p50/p99 latency per operation:

* **append**: one message to one user's inbox, committed
  (shardgate: ``InboxStore.append`` outside a transaction, an ``INSERT`` through
  the gate into the day's bucket, fsync'd commit; Redis: ``RPUSH``);
* **read**: the messages after the user's committed pointer, up to 10
  (shardgate: ``read_committed``, the pointer row then one bucket scan;
  Redis: ``HGET`` the pointer then ``LRANGE``);
* **commit**: store the consumer's new pointer (shardgate: ``UPDATE``/``INSERT``
  of the pointer row; Redis: ``HSET``).

The Redis inbox is the usual list-per-user design: in memory, no fsync
(the machine's Redis runs without an append-only file), no retention by
whole buckets, no transaction with business rows; it is the latency floor,
not an equivalent. A third column sends the same statements straight to one
PostgreSQL shard with psycopg (no gate): the database's own floor, fsync
included. The rows are loaded with ``InboxStore.bulk_load`` (COPY) and Redis
pipelines; loading time is printed too.

Usage: ``python bench/inbox.py [--users N] [--ops N] [--smoke]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import app_keyspace, drop_database

from shardgate.gate import Gate
from shardgate.queues.inbox.store import InboxStore

REDIS_URL = "redis://127.0.0.1:6379/0"
SHARDS = 4
LOAD_BATCH = 250_000
READ_LIMIT = 10


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


async def timed(n: int, op: Callable[[int], Awaitable[object]]) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await op(i)
        out.append((time.perf_counter() - t) * 1e6)
    return out


async def bench_shardgate(users: int, ops: int, rnd: random.Random) -> dict[str, list[float]]:
    topo, names = app_keyspace("sg_bench_inbox", SHARDS)
    gate = Gate.open(topo, pool_size=4)
    try:
        store = InboxStore(gate, "app", "inbox")
        await store.create()
        now = store.now()
        t = time.perf_counter()
        for lo in range(0, users, LOAD_BATCH):
            batch = [(u, now - rnd.randrange(3_600_000_000), "welcome")
                     for u in range(lo, min(users, lo + LOAD_BATCH))]
            await store.bulk_load(batch)
        bucket = store.buckets()[0].table
        for shard in topo.keyspace("app").shards:  # analysed tables, as in production
            await gate.tablets[("app", shard.name)].execute(f"ANALYZE {bucket}", [])
        print(f"  shardgate: loaded {users:,} users in {time.perf_counter() - t:.1f} s")
        picks = [rnd.randrange(users) for _ in range(ops)]
        pointers: dict[int, object] = {}

        async def append(i: int) -> None:
            await store.append(picks[i], "hello")

        async def read(i: int) -> None:
            r = await store.read_committed(picks[i], "app", limit=READ_LIMIT)
            pointers[i] = r.pointer

        async def commit(i: int) -> None:
            p = pointers[i]
            assert p is not None
            await store.commit(picks[i], "app", p)  # type: ignore[arg-type]

        await timed(min(200, ops), append)  # warm the pools and plan cache
        out = {"append": await timed(ops, append), "read": await timed(ops, read),
               "commit": await timed(ops, commit)}
        raw = await bench_raw(topo.keyspace("app").shards[0].url, bucket, ops, rnd)
        return out | {f"raw {k}": v for k, v in raw.items()}
    finally:
        await gate.close()
        for name in names:
            drop_database(name)


async def bench_raw(url: str, bucket: str, ops: int, rnd: random.Random) -> dict[str, list[float]]:
    """The same statements sent straight to one shard with psycopg (no gate): the floor."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        picks = [rnd.randrange(2**40) for _ in range(ops)]

        async def append(i: int) -> None:
            await conn.execute(f"INSERT INTO {bucket} (user_id, ts, msg_id, body) "
                               "VALUES (%s, %s, %s, %s)", (picks[i], i, i, "hello"))

        async def read(i: int) -> None:
            await conn.execute("SELECT ts, msg_id, recent FROM inbox_pointers "
                               "WHERE user_id = %s AND consumer = %s", (picks[i], "app"))
            await conn.execute(f"SELECT ts, msg_id, body FROM {bucket} WHERE user_id = %s "
                               "AND ts >= %s ORDER BY ts, msg_id LIMIT 16", (picks[i], 0))

        async def commit(i: int) -> None:
            await conn.execute("INSERT INTO inbox_pointers (user_id, consumer, ts, msg_id, "
                               "recent, updated_at) VALUES (%s, 'app', %s, %s, '', 0)",
                               (picks[i], i, i))

        return {"append": await timed(ops, append), "read": await timed(ops, read),
                "commit": await timed(ops, commit)}


async def bench_redis(users: int, ops: int, rnd: random.Random) -> dict[str, list[float]]:
    import redis.asyncio as aredis

    prefix = f"sgbench:{secrets.token_hex(4)}"
    sync = redis.Redis.from_url(REDIS_URL)
    r = aredis.Redis.from_url(REDIS_URL)
    try:
        t = time.perf_counter()
        for lo in range(0, users, 10_000):
            pipe = sync.pipeline(transaction=False)
            for u in range(lo, min(users, lo + 10_000)):
                pipe.rpush(f"{prefix}:inbox:{u}", "welcome")
            pipe.execute()
        print(f"  redis:     loaded {users:,} users in {time.perf_counter() - t:.1f} s")
        picks = [rnd.randrange(users) for _ in range(ops)]
        nexts: dict[int, int] = {}

        async def append(i: int) -> None:
            await r.rpush(f"{prefix}:inbox:{picks[i]}", "hello")

        async def read(i: int) -> None:
            u = picks[i]
            ptr = await r.hget(f"{prefix}:ptr:{u}", "app")
            start = int(ptr) if ptr is not None else 0
            got = await r.lrange(f"{prefix}:inbox:{u}", start, start + READ_LIMIT - 1)
            nexts[i] = start + len(got)

        async def commit(i: int) -> None:
            await r.hset(f"{prefix}:ptr:{picks[i]}", "app", nexts[i])

        await timed(min(200, ops), append)
        return {"append": await timed(ops, append), "read": await timed(ops, read),
                "commit": await timed(ops, commit)}
    finally:
        await r.aclose()
        for pattern in (f"{prefix}:inbox:*", f"{prefix}:ptr:*"):
            batch = []
            for key in sync.scan_iter(match=pattern, count=10_000):
                batch.append(key)
                if len(batch) >= 10_000:
                    sync.unlink(*batch)
                    batch = []
            if batch:
                sync.unlink(*batch)
        sync.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=3_000)
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    users, ops = (10_000, 300) if args.smoke else (args.users, args.ops)
    print(f"inbox latency, {users:,} users on {SHARDS} PostgreSQL shards vs Redis lists, "
          f"{ops:,} operations each, one at a time")
    sg = await bench_shardgate(users, ops, random.Random(1))
    rd = await bench_redis(users, ops, random.Random(1))
    print(f"  {'operation':<8} {'shardgate p50':>14} {'p99':>9} {'redis p50':>10} {'p99':>9}"
          f" {'p50 ratio':>10} {'p99 ratio':>10}   {'raw pg p50':>10} {'p99':>9}")
    for op in ("append", "read", "commit"):
        s50, s99, r50, r99 = pct(sg[op], 0.5), pct(sg[op], 0.99), pct(rd[op], 0.5), \
            pct(rd[op], 0.99)
        p50, p99 = pct(sg[f"raw {op}"], 0.5), pct(sg[f"raw {op}"], 0.99)
        print(f"  {op:<8} {s50:>11,.0f} µs {s99:>6,.0f} µs {r50:>7,.0f} µs {r99:>6,.0f} µs"
              f" {s50 / r50:>9.1f}x {s99 / r99:>9.1f}x   {p50:>7,.0f} µs {p99:>6,.0f} µs")
    print("  raw pg: the same statements sent to one shard with psycopg, no gate (the floor);"
          " commit there is a plain INSERT")
    print(f"  (means: shardgate append {statistics.fmean(sg['append']):,.0f} µs, "
          f"read {statistics.fmean(sg['read']):,.0f} µs)")


if __name__ == "__main__":
    asyncio.run(main())
