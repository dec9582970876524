"""Steady-state queue throughput on one PostgreSQL server: shardgate vs pgqueuer vs raw SKIP LOCKED.

Every contender does the whole path with the same durability (enqueue
committed with the server's default ``synchronous_commit = on``): two
producers enqueue committed batches of 128 while two consumers take events,
"process" them (count) and ack/complete them. The producers keep the backlog
(enqueued, not yet processed) at a target: small (2,048, "quiet"), or 60,000
(the backlog case, filled before the clock starts). Throughput is the events
processed during a measured span (``--seconds``, 10 s by default) after a
warm-up; the bench process's CPU time per event is printed beside it (all
contenders run in this process; the database server's CPU is not counted).

Contenders, each printed with its configuration:

* **shardgate 1 / 4 shards**: ``INSERT`` batches through an in-process gate
  (bind variables, one random user per batch: one shard, one commit) into a
  queue table; the shard managers fire them; two receivers
  (``Gate.queue_receive``) ack each batch (``Gate.queue_ack``).
* **pgqueuer** (its recommended setup: the asyncpg driver): two producers, each
  on its own asyncpg connection, ``Queries.enqueue`` batches of 128; two
  ``QueueManager`` workers (``batch_size=128``, LISTEN/NOTIFY wake-ups).
* **raw claim-then-ack**: psycopg, two producers (``INSERT ... SELECT unnest(%s)``)
  and two consumer loops, each claiming with ``UPDATE ... WHERE id IN (SELECT id ...
  FOR UPDATE SKIP LOCKED LIMIT 128) RETURNING`` and then acking with ``DELETE ...
  WHERE id = ANY(%s)`` (two statements, as a queue that hands events out must).

Rounds are interleaved (every contender once per round, the order rotated) and
the medians printed; the cases are quiet, the 60k backlog, and quiet with
three CPU-burning processes beside. The machine's load average is printed.

Usage: ``python bench/queue_e2e.py [--rounds R] [--seconds S] [--smoke]`` (needs
``pip install -e '.[bench]'`` for pgqueuer and asyncpg; ``make bench`` does it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import app_keyspace, drop_database, fresh_database
from _queues import BATCH, CONSUMERS, PRODUCERS, ack_batch

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate

Produce = Callable[[int, int], Awaitable[None]]  # (producer k, events m)
Consume = Callable[[Callable[[int], None]], Awaitable[None]]  # (on_processed) -> loops


@dataclass
class Setup:
    """A contender ready to run: its producer and consumer loops."""

    produce: Produce
    consumers: list[Consume]
    fill: Callable[[int], Awaitable[None]]


@dataclass
class Sample:
    rate: float
    cpu_us: float


@dataclass
class Counts:
    produced: int = 0
    processed: int = 0
    room: asyncio.Event = field(default_factory=asyncio.Event)


async def measure(s: Setup, backlog: int, warmup: float, seconds: float) -> Sample:
    """Run ``s`` with the backlog held at ``backlog``; events/s and CPU µs per event."""
    if backlog > 2 * BATCH * PRODUCERS:
        await s.fill(backlog)
    c = Counts(produced=backlog if backlog > 2 * BATCH * PRODUCERS else 0)

    def processed(n: int) -> None:
        c.processed += n
        c.room.set()

    async def producer(k: int) -> None:
        while True:
            if c.produced - c.processed >= backlog:
                c.room.clear()
                await c.room.wait()
                continue
            c.produced += BATCH
            await s.produce(k, BATCH)

    tasks = [asyncio.create_task(producer(k)) for k in range(PRODUCERS)]
    tasks += [asyncio.create_task(consume(processed)) for consume in s.consumers]
    try:
        await asyncio.sleep(warmup)
        n0, cpu0, t0 = c.processed, time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        n1, cpu1, t1 = c.processed, time.process_time(), time.perf_counter()
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    n = max(n1 - n0, 1)
    return Sample(n / (t1 - t0), (cpu1 - cpu0) / n * 1e6)


# -- shardgate ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def shardgate_setup(shards: int) -> AsyncIterator[Setup]:
    topo, names = app_keyspace(f"sg_bench_qe2e{shards}", shards)
    gate = Gate.open(topo, pool_size=6)
    try:
        await gate.execute(gate.session(identity=TRUSTED),
                           "CREATE QUEUE jobs (user_id BIGINT NOT NULL, "
                           "payload VARCHAR(64)) SHARD BY user_id "
                           "WITH (batch_size = 128, ack_wait = 30)")
        for shard in topo.keyspace("app").shards:  # an analysed table, as in production
            with psycopg.connect(shard.url, autocommit=True) as conn:
                conn.execute("ANALYZE jobs")
        sessions = [gate.session(identity=TRUSTED) for _ in range(PRODUCERS)]
        rng = random.Random(7)
        sqls: dict[int, str] = {}

        async def produce(k: int, m: int) -> None:
            sql = sqls.get(m)
            if sql is None:
                sql = sqls[m] = "INSERT INTO jobs (user_id, payload) VALUES " + ", ".join(
                    f"(:u, :p{i})" for i in range(m))
            bv: dict[str, object] = {"u": rng.randrange(1 << 40)}
            bv.update({f"p{i}": "x" for i in range(m)})
            await gate.execute(sessions[k], sql, bv)

        async def fill(n: int) -> None:
            for _ in range(0, n, 1000):
                await produce(0, 1000)

        async def consume(processed: Callable[[int], None]) -> None:
            stream = gate.queue_receive("app", "jobs")
            try:
                async for batch in stream:
                    if batch.events:
                        await ack_batch(gate, "app", "jobs", batch.events)
                        processed(len(batch.events))
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

        yield Setup(produce, [consume] * CONSUMERS, fill)
    finally:
        await gate.close()
        for name in names:
            drop_database(name)


# -- pgqueuer -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def pgqueuer_setup() -> AsyncIterator[Setup]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    url = fresh_database("sg_bench_qe2e_pgqueuer")
    conns: list[Any] = []
    try:
        admin = await asyncpg.connect(url)
        conns.append(admin)
        await Queries(AsyncpgDriver(admin)).install()
        producers = []
        for _ in range(PRODUCERS):
            conn = await asyncpg.connect(url)
            conns.append(conn)
            producers.append(Queries(AsyncpgDriver(conn)))

        async def produce(k: int, m: int) -> None:
            await producers[k].enqueue(["bench"] * m, [b"x"] * m, [0] * m)

        async def fill(n: int) -> None:
            for _ in range(0, n, 1000):
                await produce(0, 1000)

        async def consume(processed: Callable[[int], None]) -> None:
            conn = await asyncpg.connect(url)
            conns.append(conn)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("bench")
            async def work(job: object) -> None:
                processed(1)

            try:
                await qm.run(batch_size=BATCH)
            finally:
                qm.shutdown.set()

        yield Setup(produce, [consume] * CONSUMERS, fill)
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
        drop_database("sg_bench_qe2e_pgqueuer")


# -- raw claim-then-ack ---------------------------------------------------------------------

RAW_CLAIM = ("UPDATE jobs SET state = 'claimed' WHERE id IN (SELECT id FROM jobs"
             " WHERE state = 'ready' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 128)"
             " RETURNING id, payload")
RAW_ACK = "DELETE FROM jobs WHERE id = ANY(%s)"


@contextlib.asynccontextmanager
async def raw_setup() -> AsyncIterator[Setup]:
    url = fresh_database("sg_bench_qe2e_raw")
    conns: list[psycopg.AsyncConnection[Any]] = []
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute("CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY,"
                            " state TEXT NOT NULL DEFAULT 'ready', payload TEXT)")
            await c.execute("CREATE INDEX jobs_ready ON jobs (id) WHERE state = 'ready'")
        for _ in range(PRODUCERS):
            conns.append(await psycopg.AsyncConnection.connect(url, autocommit=True))

        async def produce(k: int, m: int) -> None:
            await conns[k].execute("INSERT INTO jobs (payload) SELECT unnest(%s::text[])",
                                   [["x"] * m])

        async def fill(n: int) -> None:
            for _ in range(0, n, 1000):
                await produce(0, 1000)
            await conns[0].execute("ANALYZE jobs")

        async def consume(processed: Callable[[int], None]) -> None:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            conns.append(conn)
            while True:
                cur = await conn.execute(RAW_CLAIM)
                rows = await cur.fetchall()
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                await conn.execute(RAW_ACK, [[r[0] for r in rows]])
                processed(len(rows))

        yield Setup(produce, [consume] * CONSUMERS, fill)
    finally:
        for conn in conns:
            await conn.close()
        drop_database("sg_bench_qe2e_raw")


# -- the driver ------------------------------------------------------------------------------

CONTENDERS: dict[str, tuple[Callable[[], contextlib.AbstractAsyncContextManager[Setup]], str]] = {
    "shardgate 1 shard": (lambda: shardgate_setup(1),
                          "in-process gate, INSERT 128 rows/statement, 2 receivers acking"),
    "shardgate 4 shards": (lambda: shardgate_setup(4), "same, 4 databases on this server"),
    "pgqueuer": (pgqueuer_setup, "pgqueuer (asyncpg), 2 producers x enqueue(128), "
                                  "2 QueueManagers batch_size=128"),
    "raw claim-then-ack": (raw_setup, "psycopg, UPDATE..SKIP LOCKED LIMIT 128 RETURNING, "
                                      "then DELETE id = ANY, 2 loops"),
}


def _burn() -> None:
    while True:
        pass


@contextlib.contextmanager
def burners(n: int) -> Any:
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured span per run")
    parser.add_argument("--backlog", type=int, default=60_000)
    parser.add_argument("--only", default="", help="comma-separated contender names")
    parser.add_argument("--cases", default="quiet,backlog,burners")
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    rounds, seconds, warmup, backlog = args.rounds, args.seconds, 1.0, args.backlog
    if args.smoke:
        rounds, seconds, warmup, backlog = 1, 1.0, 0.3, 5_000
    names = [n for n in CONTENDERS if not args.only or n in args.only.split(",")]
    cases = {"quiet": (2 * BATCH * PRODUCERS * 4, 0), "backlog": (backlog, 0),
             "burners": (2 * BATCH * PRODUCERS * 4, 3)}
    cases = {k: v for k, v in cases.items() if k in args.cases.split(",")}
    print(f"queue steady state, one PostgreSQL server; {rounds} interleaved rounds of "
          f"{seconds:g} s per contender (warm-up {warmup:g} s); load average "
          f"{os.getloadavg()[0]:.2f} at start")
    for name in names:
        print(f"  {name:<20} {CONTENDERS[name][1]}")
    samples: dict[tuple[str, str], list[Sample]] = {}
    for case, (target, burn) in cases.items():
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                with burners(burn):
                    async with CONTENDERS[name][0]() as setup:
                        sample = await measure(setup, target, warmup, seconds)
                samples.setdefault((case, name), []).append(sample)
                print(f"    [{case} round {r + 1}] {name:<20} {sample.rate:>9,.0f} events/s"
                      f"  {sample.cpu_us:6.0f} µs CPU/event", flush=True)
    print(f"medians (load average {os.getloadavg()[0]:.2f} at the end):")
    med: dict[tuple[str, str], float] = {}
    for case, (target, burn) in cases.items():
        print(f"  {case}: backlog {target:,}" + (f", {burn} CPU burners" if burn else ""))
        for name in names:
            got = samples[(case, name)]
            rate = med[(case, name)] = statistics.median(s.rate for s in got)
            cpu = statistics.median(s.cpu_us for s in got)
            print(f"    {name:<20} {rate:>9,.0f} events/s  {cpu:6.0f} µs CPU/event (bench process)")
        for ref in ("pgqueuer", "raw claim-then-ack"):
            if (case, ref) in med and (case, "shardgate 1 shard") in med:
                print(f"    shardgate 1 shard / {ref} = "
                      f"{med[(case, 'shardgate 1 shard')] / med[(case, ref)]:.2f}x")
        if (case, "shardgate 4 shards") in med and (case, "shardgate 1 shard") in med:
            print(f"    shardgate 4 shards / 1 shard = "
                  f"{med[(case, 'shardgate 4 shards')] / med[(case, 'shardgate 1 shard')]:.2f}x")
    for case in cases:
        if case != "quiet" and ("quiet", "shardgate 1 shard") in med and \
                (case, "shardgate 1 shard") in med:
            print(f"  shardgate 1 shard, {case} / quiet = "
                  f"{med[(case, 'shardgate 1 shard')] / med[('quiet', 'shardgate 1 shard')]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
