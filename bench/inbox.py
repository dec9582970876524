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
not an equivalent. A third column runs the same operations with the very
statements the gate sent to the shards (recorded from one shardgate operation
of each kind, dialect rewrites included: the pointer UPDATE, then its INSERT
when no row was there; the pointer SELECT, then the bucket scan), straight to
each user's shard with psycopg (no gate): the database's own floor, fsync
included. The rows are loaded with ``InboxStore.bulk_load`` (COPY) and Redis
pipelines; loading time is printed too.

Usage: ``python bench/inbox.py [--users N] [--ops N] [--smoke]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import app_keyspace, drop_database

from shardgate.gate import Gate
from shardgate.queues.inbox.store import InboxStore

REDIS_URL = "redis://127.0.0.1:6379/0"
#: the shard statements the raw column runs (filled by bench_shardgate)
sg_statements: dict[str, str] = {}
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
        statements = await record_statements(gate, store)
        raw = await bench_raw(gate, statements, ops, rnd, users)
        sg_statements.update(statements)
        return out | {f"raw {k}": v for k, v in raw.items()}
    finally:
        await gate.close()
        for name in names:
            drop_database(name)


async def record_statements(gate: Gate, store: InboxStore) -> dict[str, str]:
    """The shard statements of one append, read and first commit, as the gate sent them."""
    seen: list[str] = []
    reals = {}
    for key, tablet in gate.tablets.items():
        reals[key] = real = tablet.execute

        async def spy(sql: str, params: Any, *args: Any, real: Any = real, **kw: Any) -> Any:
            if "information_schema" not in sql:
                seen.append(sql)
            return await real(sql, params, *args, **kw)

        tablet.execute = spy  # type: ignore[method-assign]
    try:
        user = 2**41 + 1  # a user of its own: its first commit inserts the pointer row
        await store.append(user, "hello")
        got = await store.read_committed(user, "rec", limit=READ_LIMIT)
        await store.commit(user, "rec", got.pointer)  # type: ignore[arg-type]
    finally:
        for key, tablet in gate.tablets.items():
            tablet.execute = reals[key]  # type: ignore[method-assign]
    # A read scans every day bucket its window spans: near midnight, yesterday's too.
    # The bench's raw side runs the scan of the bucket the append went to.
    bucket = re.match(r"INSERT INTO (\w+) ", seen[0])
    assert bucket is not None, seen
    seen = [q for q in seen if not q.startswith("SELECT ts, msg_id, body FROM ")
            or q.startswith(f"SELECT ts, msg_id, body FROM {bucket.group(1)} ")]
    assert len(seen) == 5, seen
    return dict(zip(("append", "pointer", "scan", "update", "insert"), seen, strict=True))


async def bench_raw(gate: Gate, stmts: dict[str, str], ops: int, rnd: random.Random,
                    users: int) -> dict[str, list[float]]:
    """The statements the gate sends (``stmts``), straight to each user's shard with
    psycopg (no gate): the floor. Same logic as the store: the pointer UPDATE, then
    the INSERT when it changed no row; the pointer SELECT, then the bucket scan."""
    import psycopg

    shards = gate.topology.keyspace("app").shards
    smap = gate.topology.keyspace("app").shard_map
    vindex: Any = gate.vschema.keyspace("app").vindexes["hash"]
    conns = {s.name: await psycopg.AsyncConnection.connect(s.url, autocommit=True)
             for s in shards}
    try:
        picks = [rnd.randrange(users) for _ in range(ops)]
        conn_of = [conns[smap.find(vindex.map([u])[0][0])] for u in picks]
        pointers: dict[int, tuple[int, int]] = {}
        base = 2**62

        async def append(i: int) -> None:
            await conn_of[i].execute(stmts["append"],
                                     (picks[i], time.time_ns() // 1000, base + i, "hello"))

        async def read(i: int) -> None:
            conn = conn_of[i]
            cur = await conn.execute(stmts["pointer"], (picks[i], "raw"))
            row = await cur.fetchone()
            cur = await conn.execute(stmts["scan"], (picks[i], 0 if row is None else row[0]))
            rows = await cur.fetchall()
            pointers[i] = (int(rows[-1][0]), int(rows[-1][1])) if rows else (0, 0)

        async def commit(i: int) -> None:
            ts, msg_id = pointers[i]
            now, recent = time.time_ns() // 1000, f"{ts}.{msg_id}"
            cur = await conn_of[i].execute(stmts["update"],
                                           (ts, msg_id, recent, now, picks[i], "raw"))
            if cur.rowcount == 0:
                await conn_of[i].execute(stmts["insert"],
                                         (picks[i], "raw", ts, msg_id, recent, now))

        return {"append": await timed(ops, append), "read": await timed(ops, read),
                "commit": await timed(ops, commit)}
    finally:
        for conn in conns.values():
            await conn.close()


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
    print("  raw pg: the statements the gate sent, straight to each user's shard with psycopg,"
          " no gate (the floor):")
    for name, text in sg_statements.items():
        print(f"    {name:<8} {text}")
    print(f"  (means: shardgate append {statistics.fmean(sg['append']):,.0f} µs, "
          f"read {statistics.fmean(sg['read']):,.0f} µs)")


if __name__ == "__main__":
    asyncio.run(main())
