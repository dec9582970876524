"""Segmented job store vs queue-table store vs pgqueuer, end to end, on one PostgreSQL database.

All three contenders run one after the other in the *same* database (one
shard), with the same durability for enqueue (``synchronous_commit = on``):
two producers store N events in committed batches of 128 while two workers
take them, "process" them (count) and ack them. Throughput = N / (time from
the first enqueue to the last ack).

* **segmented**: ``SegmentedQueue.store_many`` (group commit into
  ``events_jobs_<n>``), workers ``take`` (512 per batch) and ``ack``
  (append-only status rows); one random user key per event (per-key ordering
  on; keys rarely repeat, as with per-user events).
* **queue table**: ``INSERT`` batches through the gate into a ``CREATE QUEUE``
  table, the shard's manager fires, two receivers ack (as ``queue_e2e.py``).
* **pgqueuer** 1.6: ``Queries.enqueue`` batches, ``QueueManager(batch_size=128)``.

``--soak N`` instead runs the segmented store and the queue-table store
(acked events purged after 5 s) for N events each (``--soak-table M``: M for
the queue table, which is slower), producing and consuming
at full speed, and samples every few seconds the on-disk size
(``pg_total_relation_size``, tables + indexes + TOAST) and the dead tuples
(``pg_stat_user_tables.n_dead_tup``) of each store's tables; it prints the
series side by side.

Usage: ``python bench/segmented_queue.py [--events N] [--smoke] [--soak N]``
(needs ``pip install -e '.[bench]'`` for pgqueuer).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import drop_database, fresh_database
from _queues import BATCH, CONSUMERS, PRODUCERS, pgqueuer_rate, run_e2e, table_producer

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.queues.segmented.queue import SegmentedQueue
from shardgate.topo import Topology

SEG_TAKE = 512
DB = "sg_bench_segmented"


def open_gate(url: str) -> Gate:
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": {"0": url},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {
            "events": {"type": "queue",
                       "column_vindexes": [{"column": "user_id", "name": "hash"}],
                       "queue": {"storage": "segmented", "batch_size": SEG_TAKE,
                                 "cache_size": 50_000}}}}}}})
    return Gate.open(topo, pool_size=6)


async def bench_segmented(gate: Gate, n: int, *, sampler: Any = None) -> float:
    q = SegmentedQueue.from_gate(gate, "app", "events")
    await q.open()
    try:
        acked = 0
        done = asyncio.Event()

        async def consume() -> None:
            nonlocal acked
            while acked < n:
                jobs = await q.take(SEG_TAKE)
                count = await q.ack(jobs)
                acked += count
                if acked >= n:
                    done.set()

        async def produce(k: int) -> None:
            rng = random.Random(k)
            for start in range(k * BATCH, n, BATCH * PRODUCERS):
                m = min(n, start + BATCH) - start
                await q.store_many([(rng.randrange(1 << 40), f"p{start + i}") for i in range(m)])

        consumers = [asyncio.create_task(consume()) for _ in range(CONSUMERS)]
        t0 = time.perf_counter()
        samp = asyncio.create_task(sampler()) if sampler else None
        await asyncio.gather(*(produce(k) for k in range(PRODUCERS)))
        await done.wait()
        elapsed = time.perf_counter() - t0
        for c in consumers:
            c.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        if samp is not None:
            samp.cancel()
            await asyncio.gather(samp, return_exceptions=True)
        return n / elapsed
    finally:
        await q.close()


async def bench_table(gate: Gate, url: str, n: int, *, sampler: Any = None,
                      retention: float = 3600) -> float:
    await gate.execute(gate.session(identity=TRUSTED),
                       "CREATE QUEUE IF NOT EXISTS jobs (user_id BIGINT NOT NULL, "
                       "payload VARCHAR(64)) SHARD BY user_id "
                       f"WITH (batch_size = 128, ack_wait = 30, retention = {retention})")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ANALYZE jobs")
    return await run_e2e(gate, n, table_producer(gate, n), sampler=sampler)


async def bench_pgqueuer(url: str, n: int) -> float:
    return await pgqueuer_rate(url, n)


def _store_figures(url: str, like: str) -> tuple[int, int, int]:
    """(bytes on disk, dead tuples, tables) of the tables whose name is LIKE ``like``."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(relid)), 0), "
            "COALESCE(SUM(n_dead_tup), 0), COUNT(*) FROM pg_stat_user_tables "
            "WHERE relname LIKE %s", [like]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def soak(url: str, gate: Gate, n: int, n_table: int, every: float) -> None:
    series: dict[str, list[tuple[float, int, int, int]]] = {"segmented": [], "queue table": []}

    def sampler_for(name: str, like: str) -> Any:
        async def sample() -> None:
            t0 = time.perf_counter()
            while True:
                size, dead, tables = await asyncio.to_thread(_store_figures, url, like)
                series[name].append((time.perf_counter() - t0, size, dead, tables))
                await asyncio.sleep(every)
        return sample

    rate_seg = await bench_segmented(gate, n, sampler=sampler_for("segmented", "events\\_%"))
    series["segmented"].append((-1, *_store_figures(url, "events\\_%")))
    rate_tab = await bench_table(gate, url, n_table,
                                 sampler=sampler_for("queue table", "jobs"), retention=5)
    series["queue table"].append((-1, *_store_figures(url, "jobs")))
    print(f"soak: {n:,} events (segmented), {n_table:,} (queue table), sampled every "
          f"{every:g} s (last row: after the run)")
    print(f"  segmented {rate_seg:,.0f} events/s, queue table {rate_tab:,.0f} events/s")
    for name, rows in series.items():
        print(f"  {name}:")
        print(f"    {'t_s':>8} {'size_MB':>10} {'dead_tuples':>12} {'tables':>7}")
        for t, size, dead, tables in rows:
            when = "end" if t < 0 else f"{t:.0f}"
            print(f"    {when:>8} {size / 1e6:>10.1f} {dead:>12,} {tables:>7}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    parser.add_argument("--soak", type=int, default=0, metavar="N",
                        help="soak: N events per store, sizes and dead tuples over time")
    parser.add_argument("--soak-table", type=int, default=0, metavar="M",
                        help="events for the queue-table store in the soak (default: N)")
    parser.add_argument("--every", type=float, default=10.0, help="soak sampling period (s)")
    args = parser.parse_args()
    db = f"{DB}_soak" if args.soak else DB  # a soak and a bench may run side by side
    url = fresh_database(db)
    gate = open_gate(url)
    try:
        if args.soak:
            await soak(url, gate, args.soak, args.soak_table or args.soak, args.every)
            return 0
        n = 3_000 if args.smoke else args.events
        results: dict[str, float] = {}
        results["segmented"] = await bench_segmented(gate, n)
        results["queue table"] = await bench_table(gate, url, n)
        try:
            results["pgqueuer"] = await bench_pgqueuer(url, n)
        except ImportError:
            print("pgqueuer not installed (pip install -e '.[bench]'): skipped")
        print(f"end-to-end queue throughput, {n:,} events, batches of {BATCH}, "
              f"one PostgreSQL database ({DB})")
        for name, rate in results.items():
            print(f"  {name:<12} {rate:>10,.0f} events/s")
        for base in ("queue table", "pgqueuer"):
            if base in results:
                print(f"  segmented / {base} = {results['segmented'] / results[base]:.2f}x")
        return 0
    finally:
        await gate.close()
        drop_database(db)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
