"""Segmented queues served by the tablets vs queue tables, both through the gate, on PostgreSQL.

The same end-to-end path for both storage modes, with the same durability (jobs
committed with the server's default ``synchronous_commit = on``): producers store
N jobs in batches of 128 (a random key per job, so a batch is one write per shard
and a segmented queue's per-key order does not serialise it), two in-process receivers
(``Gate.queue_receive``) take them and ack every batch (``Gate.queue_ack``).
Throughput = N / (time from the first store to the last ack).

* **segmented (served)**: ``CREATE QUEUE ... WITH (storage = segmented)``,
  ``Gate.queue_enqueue``; the tablets' segmented consumers hand jobs out.
* **queue table** (the reference): ``CREATE QUEUE`` and ``INSERT`` batches through
  the gate; the tablets' queue managers fire them (``bench/queue_e2e.py``'s path).

Usage: ``python bench/segmented_served.py [--events N] [--shards 1,4] [--smoke]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import app_keyspace, drop_database
from _queues import BATCH, CONSUMERS, PRODUCERS, run_e2e

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate


async def bench(n: int, shards: int, segmented: bool) -> float:
    tag = "seg" if segmented else "tab"
    topo, names = app_keyspace(f"sg_bench_served_{tag}{shards}", shards)
    gate = Gate.open(topo, pool_size=6)
    try:
        if segmented:
            await gate.execute(gate.session(identity=TRUSTED),
                               "CREATE QUEUE jobs (user_id BIGINT NOT NULL, "
                               "payload TEXT) SHARD BY user_id WITH (storage = segmented, "
                               "batch_size = 128, ack_wait = 30)")
        else:
            await gate.execute(gate.session(identity=TRUSTED),
                               "CREATE QUEUE jobs (user_id BIGINT NOT NULL, "
                               "payload VARCHAR(64)) SHARD BY user_id "
                               "WITH (batch_size = 128, ack_wait = 30)")
            for shard in topo.keyspace("app").shards:  # an analysed table, as in production
                with psycopg.connect(shard.url, autocommit=True) as c:
                    c.execute("ANALYZE jobs")
        async def produce(k: int) -> None:
            s = gate.session(identity=TRUSTED)
            rng = random.Random(k)
            for start in range(k * BATCH, n, BATCH * PRODUCERS):
                m = min(n, start + BATCH) - start
                uids = [rng.randrange(1 << 40) for _ in range(m)]
                if segmented:
                    await gate.queue_enqueue("app", "jobs",
                                             [(u, f"p{start + i}") for i, u in enumerate(uids)])
                    continue
                sql = "INSERT INTO jobs (user_id, payload) VALUES " + ", ".join(
                    f"(:u{i}, :p{i})" for i in range(m))
                bv: dict[str, object] = {f"u{i}": u for i, u in enumerate(uids)}
                bv.update({f"p{i}": f"p{start + i}" for i in range(m)})
                await gate.execute(s, sql, bv)

        # receivers connected, consumers hold their locks
        return await run_e2e(gate, n, produce, settle_s=1.0)
    finally:
        await gate.close()
        for name in names:
            drop_database(name)


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--shards", default="1,4", help="comma-separated shard counts")
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    n = 2_000 if args.smoke else args.events
    print(f"end-to-end through the gate, {n} jobs, batches of {BATCH}, {PRODUCERS} producers, "
          f"{CONSUMERS} receivers, PostgreSQL")
    print(f"{'shards':>6}  {'segmented (served)':>20}  {'queue table':>14}  {'ratio':>6}")
    for shards in (int(s) for s in args.shards.split(",")):
        seg = await bench(n, shards, segmented=True)
        tab = await bench(n, shards, segmented=False)
        print(f"{shards:>6}  {seg:>15,.0f} /s  {tab:>9,.0f} /s  {seg / tab:>5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
