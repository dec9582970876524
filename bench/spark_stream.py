"""Spark streaming sources: ``shardgate_changes`` and ``shardgate_queue`` vs plain Python.

Four PostgreSQL databases are the shards ``-40 40-80 80-c0 c0-`` of keyspace
``bench``. In one Spark session (``local[2]``):

* **Change stream.** Capture is prepared, ``--rows`` rows are written by the
  shardgate writer (one bulk insert per shard), then read back from the logs
  by ``availableNow`` queries on ``shardgate_changes`` (``noop`` sink; after a
  warm-up query), in one batch (JSON images, and typed ``images=struct``
  images of the one table) and with ``maxEventsPerTrigger`` = rows / 4,
  against the reference: the same log ranges read by ``ChangeLog.read`` in
  one Python process, the four shards concurrently.
* **Queue.** ``--events`` events are bulk-enqueued by the writer (events/s),
  then received and acked by an ``availableNow`` query on ``shardgate_queue``
  (``noop`` sink; done when every event is acked), against the reference: an
  in-process gate's ``queue_receive`` + ``queue_ack`` loop over a second
  queue holding the same events.

Prints seconds and events/s of each and the ratio shardgate/reference (the
Spark side pays for its micro-batch overhead; the goal is the same order of
magnitude).

    python bench/spark_stream.py [--rows 200000] [--events 50000] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

try:
    from bench._spark import pg_keyspace, start_spark
except ImportError:  # run as a script
    from _spark import pg_keyspace, start_spark  # type: ignore[no-redef]

from shardgate.backends.change_log import open_change_log
from shardgate.backends.changes import Transaction
from shardgate.topo import Topology

SHARDS = 4
QUEUE_OPTS = "WITH (ack_wait = 60, batch_size = 256, window = 5)"


def run_query(spark: Any, reader: Any, tmp: Path, name: str) -> float:
    start = time.perf_counter()
    q = (reader.load().writeStream.format("noop")
         .option("checkpointLocation", str(tmp / f"ckpt-{name}"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    return time.perf_counter() - start


async def positions(topo: Topology, *, oldest: bool) -> dict[str, str]:
    out = {}
    for s in topo.keyspace("bench").shards:
        log = open_change_log(s.url, f"bench/{s.name}")
        try:
            await log.prepare()
            out[s.name] = await (log.oldest_position() if oldest else log.current_position())
        finally:
            await log.close()
    return out


async def raw_changes(topo: Topology, start: dict[str, str], end: dict[str, str]) -> int:
    from shardgate.spark.changes_source import read_range

    async def one(name: str, url: str) -> int:
        log = open_change_log(url, f"bench/{name}")
        n = 0
        try:
            async for tx in read_range(log, start[name], end[name], idle_timeout=60):
                assert isinstance(tx, Transaction)
                n += len(tx.changes)
        finally:
            await log.close()
        return n

    counts = await asyncio.gather(*(one(s.name, s.url) for s in topo.keyspace("bench").shards))
    return sum(counts)


async def raw_queue(topo: Topology, queue: str, n: int) -> float:
    from shardgate.gate import Gate

    gate = Gate.open(topo)
    got = 0
    start = time.perf_counter()
    try:
        stream = gate.queue_receive("bench", queue)
        async for batch in stream:
            by_shard: dict[str, list[int]] = {}
            for e in batch.events:
                by_shard.setdefault(e.shard, []).append(e.id)
            await asyncio.gather(*(gate.queue_ack("bench", queue, s, ids)
                                   for s, ids in by_shard.items()))
            got += len(batch.events)
            if got >= n:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return time.perf_counter() - start
    finally:
        await gate.close()


async def acked(topo: Topology, queue: str) -> int:
    from shardgate.backends import bulk

    return sum(int(bulk.query(s.url, f"SELECT count(*) FROM {queue} WHERE state = 'acked'")[0][0])
               for s in topo.keyspace("bench").shards)


async def create_queues(topo: Topology) -> None:
    from shardgate.gate import Gate

    gate = Gate.open(topo)
    try:
        s = gate.session("bench")
        for q in ("jobs", "jobs_ref"):
            await gate.execute(s, f"CREATE QUEUE {q} (customer_id BIGINT NOT NULL, body TEXT) "
                                  f"SHARD BY customer_id {QUEUE_OPTS}")
        # CREATE QUEUE saved the queues in the gate's topo store: copy them back
        topo.keyspaces["bench"].vschema = gate.topology.keyspace("bench").vschema
    finally:
        await gate.close()


def main(rows: int, events: int) -> None:
    ks = pg_keyspace("sg_bench_stream", SHARDS,
                     "CREATE TABLE {table} (id BIGINT PRIMARY KEY, sku TEXT, price BIGINT)")
    topo, tmp = ks.topo, ks.tmp
    asyncio.run(create_queues(topo))  # adds the queues to topo's VSchema
    cluster = ks.write_cluster()
    spark = start_spark("shardgate-bench-stream")
    try:
        def write(frame: Any, table: str) -> float:
            start = time.perf_counter()
            (frame.write.format("shardgate").option("cluster", str(cluster))
             .option("keyspace", "bench").option("table", table).mode("append").save())
            return time.perf_counter() - start

        # -- change stream ------------------------------------------------------------
        begin = asyncio.run(positions(topo, oldest=False))
        write(spark.range(0, rows, numPartitions=2).selectExpr(
            "id", "concat('sku-', id % 1000) AS sku", "id % 997 AS price"), "t")
        end = asyncio.run(positions(topo, oldest=False))
        t0 = time.perf_counter()
        n_raw = asyncio.run(raw_changes(topo, begin, end))
        raw_s = time.perf_counter() - t0
        import json

        def changes(**opts: str) -> Any:
            r = (spark.readStream.format("shardgate_changes").option("cluster", str(cluster))
                 .option("keyspace", "bench"))
            for k, v in opts.items():
                r = r.option(k, v)
            return r

        # Warm up (the JVM's first streaming query, the Python workers): nothing to read.
        run_query(spark, changes(starting="latest"), tmp, "warm")
        sg_one = run_query(spark, changes(starting=json.dumps(begin)), tmp, "changes-one")
        sg_typed = run_query(spark, changes(starting=json.dumps(begin), tables="t",
                                            images="struct"), tmp, "changes-typed")
        sg_s = run_query(spark, changes(starting=json.dumps(begin),
                                        maxEventsPerTrigger=str(max(1, rows // 4))),
                         tmp, "changes")
        assert n_raw == rows, (n_raw, rows)

        # -- queue --------------------------------------------------------------------
        ev = spark.range(0, events, numPartitions=2).selectExpr(
            "id AS customer_id", "concat('job-', id) AS body")
        enq_s = write(ev, "jobs")
        write(ev, "jobs_ref")
        ref_q = asyncio.run(raw_queue(topo, "jobs_ref", events))
        qreader = (spark.readStream.format("shardgate_queue").option("cluster", str(cluster))
                   .option("keyspace", "bench").option("queue", "jobs")
                   .option("maxEventsPerTrigger", str(max(1, events // 4))))
        sg_q = run_query(spark, qreader, tmp, "queue")
        done = asyncio.run(acked(topo, "jobs"))

        print(f"{'what':<44}{'seconds':>10}{'events/s':>12}")
        print(f"{'changes: ChangeLog.read, 4 shards (reference)':<44}{raw_s:>10.2f}"
              f"{rows / raw_s:>12.0f}")
        print(f"{'changes: shardgate_changes, one batch':<44}{sg_one:>10.2f}"
              f"{rows / sg_one:>12.0f}")
        print(f"{'changes: shardgate_changes, typed images':<44}{sg_typed:>10.2f}"
              f"{rows / sg_typed:>12.0f}")
        print(f"{'changes: shardgate_changes, 4 batches':<44}{sg_s:>10.2f}{rows / sg_s:>12.0f}")
        print(f"ratio shardgate_changes/reference: {raw_s / sg_one:.2f}x one batch, "
              f"{raw_s / sg_typed:.2f}x typed images, "
              f"{raw_s / sg_s:.2f}x with maxEventsPerTrigger ({rows} row changes)")
        print(f"{'queue: bulk enqueue (writer)':<44}{enq_s:>10.2f}{events / enq_s:>12.0f}")
        print(f"{'queue: gate receive+ack (reference)':<44}{ref_q:>10.2f}{events / ref_q:>12.0f}")
        print(f"{'queue: shardgate_queue availableNow':<44}{sg_q:>10.2f}{events / sg_q:>12.0f}")
        print(f"ratio shardgate_queue/reference: {ref_q / sg_q:.2f}x ({done}/{events} acked)")
    finally:
        spark.stop()
        ks.drop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    main(5_000 if args.smoke else args.rows, 2_000 if args.smoke else args.events)
