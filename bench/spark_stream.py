"""Spark streaming sources: ``shardgate_changes`` and ``shardgate_queue`` vs plain Python.

Four PostgreSQL databases are the shards ``-40 40-80 80-c0 c0-`` of keyspace
``bench``. In one Spark session (``local[2]``):

* **Change stream.** Capture is prepared, ``--rows`` rows are written by the
  shardgate writer (one bulk insert per shard), then read back from the logs
  by ``availableNow`` queries on ``shardgate_changes`` (``noop`` sink): in one
  batch (JSON images; one partition per shard, and with ``partitions=2``: the
  session's two task slots, each reading two shards concurrently), in one
  batch with typed ``images=struct`` images of the one table, and with
  ``maxEventsPerTrigger`` = rows / 4; against the
  reference: the same log ranges read by ``ChangeLog.read`` in one Python
  process, the four shards concurrently. Two warm-up queries first: one that
  reads nothing (the JVM's first streaming query) and one that reads the
  range (it starts the executors' Python workers, as a running stream has).
* **Queue.** After a warm-up (a query over 1,000 events starts the executors'
  Python workers, as a running stream has them), ``--events`` events are
  bulk-enqueued by the writer (events/s)
  into each of two queues, then received and acked by an ``availableNow``
  query on ``shardgate_queue`` (``noop`` sink; done when every event is
  acked), against the reference: an in-process gate's ``queue_receive`` +
  ``queue_ack`` loop over the second queue (timed from subscribing to the last ack:
  without opening or closing the gate). Beside them, the floor of any Python
  streaming source: an ``availableNow`` query of a source with nothing to read
  (Spark's query start and stop, the reader's Python process, one trigger).

``--rounds`` interleaved rounds (each runs the reference and every query
once, in turn); printed: the median seconds and events/s of each and the
ratio of the medians shardgate/reference, both for the query's wall time
(from ``start()`` to the end of ``awaitTermination()``: the query's start,
planner process included, and stop) and for its batches only (the sum of
Spark's ``triggerExecution`` of the batches that read rows: what a running
stream pays per row).

    python bench/spark_stream.py [--rows 200000] [--events 50000] [--rounds 3] [--smoke]

``--smoke`` (CI) runs 5,000 rows and 2,000 events, one round, without the warm-up queries.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

try:
    from bench._spark import pg_keyspace, start_spark
except ImportError:  # run as a script
    from _spark import pg_keyspace, start_spark  # type: ignore[no-redef]

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from shardgate.auth.identity import TRUSTED
from shardgate.backends.changes import Transaction
from shardgate.backends.changes.open import open_change_log
from shardgate.topo import Topology

SHARDS = 4
QUEUE_OPTS = "WITH (ack_wait = 60, batch_size = 256, window = 5)"


def run_query(spark: Any, reader: Any, tmp: Path, name: str) -> tuple[float, float]:
    """Run an ``availableNow`` query of ``reader`` into ``noop``; its wall seconds (query
    start to end) and the seconds of its batches that read rows (Spark's
    ``triggerExecution``: without the query's start and stop)."""
    start = time.perf_counter()
    q = (reader.load().writeStream.format("noop")
         .option("checkpointLocation", str(tmp / f"ckpt-{name}"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    wall = time.perf_counter() - start
    batches = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress
                  if p["numInputRows"]) / 1000
    return wall, batches


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
    from shardgate.backends.bulk import copy as bulk

    return sum(int(bulk.query(s.url, f"SELECT count(*) FROM {queue} WHERE state = 'acked'")[0][0])
               for s in topo.keyspace("bench").shards)


async def create_queues(topo: Topology) -> None:
    from shardgate.gate import Gate

    gate = Gate.open(topo)
    try:
        s = gate.session("bench", identity=TRUSTED)
        for q in ("jobs", "jobs_ref"):
            await gate.execute(s, f"CREATE QUEUE {q} (customer_id BIGINT NOT NULL, body TEXT) "
                                  f"SHARD BY customer_id {QUEUE_OPTS}")
        # CREATE QUEUE saved the queues in the gate's topo store: copy them back
        topo.keyspaces["bench"].vschema = gate.topology.keyspace("bench").vschema
    finally:
        await gate.close()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class NothingSource(DataSource):
    """The floor of any Python streaming source: an ``availableNow`` query of a source
    with nothing to read costs Spark's query start and stop, the streaming reader's
    Python process and one trigger, and nothing else."""

    @classmethod
    def name(cls) -> str:
        return "bench_nothing"

    def schema(self) -> str:
        return "x long"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NothingReader()


class NothingReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return start

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter([])


def line(what: str, xs: list[float], n: int) -> None:
    m = median(xs)
    print(f"{what:<64}{m:>10.2f}{n / m:>12.0f}")


def change_stream(spark: Any, topo: Topology, cluster: Path, tmp: Path, rows: int,
                  rounds: int, write: Callable[[Any, str], float], warm: bool = True) -> None:
    """``shardgate_changes`` against ``ChangeLog.read`` of the same log ranges."""
    runs = itertools.count()
    begin = asyncio.run(positions(topo, oldest=False))
    write(spark.range(0, rows, numPartitions=2).selectExpr(
        "id", "concat('sku-', id % 1000) AS sku", "id % 997 AS price"), "t")
    end = asyncio.run(positions(topo, oldest=False))

    def changes(**opts: str) -> Any:
        r = (spark.readStream.format("shardgate_changes").option("cluster", str(cluster))
             .option("keyspace", "bench"))
        for k, v in opts.items():
            r = r.option(k, v)
        return r

    def sg(**opts: str) -> tuple[float, float]:
        return run_query(spark, changes(starting=json.dumps(begin), **opts), tmp,
                         f"changes-{next(runs)}")

    if warm:  # the JVM's first streaming query, and one that reads (it starts the
        # executors' Python workers, which a running stream has)
        run_query(spark, changes(starting="latest"), tmp, "warm")
        sg()
    kinds: dict[str, dict[str, str]] = {
        "one batch": {},
        "one batch, partitions=2": {"partitions": "2"},  # local[2]: two task slots
        "typed images": {"tables": "t", "images": "struct"},
        "4 batches": {"maxEventsPerTrigger": str(max(1, rows // 4))},
    }
    raw: list[float] = []
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    batch: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):  # interleaved: each round runs every reader once
        t0 = time.perf_counter()
        n_raw = asyncio.run(raw_changes(topo, begin, end))
        raw.append(time.perf_counter() - t0)
        assert n_raw == rows, (n_raw, rows)
        for kind, opts in kinds.items():
            w, b = sg(**opts)
            wall[kind].append(w)
            batch[kind].append(b)
    print(f"median of {rounds} interleaved round(s); {rows} row changes")
    print(f"{'what':<64}{'seconds':>10}{'events/s':>12}")
    line("changes: ChangeLog.read, 4 shards (reference)", raw, rows)
    for kind in kinds:
        line(f"changes: shardgate_changes, {kind}", wall[kind], rows)
        line(f"changes: shardgate_changes, {kind}, batches only", batch[kind], rows)
    print("ratio shardgate_changes/reference (query wall time): " + ", ".join(
        f"{median(raw) / median(wall[k]):.2f}x {k}" for k in kinds))
    print("ratio shardgate_changes/reference (batches only, without the query's start "
          "and stop): " + ", ".join(f"{median(raw) / median(batch[k]):.2f}x {k}"
                                    for k in kinds))


def queue(spark: Any, topo: Topology, cluster: Path, tmp: Path, events: int, rounds: int,
          write: Callable[[Any, str], float], warm: bool = True) -> None:
    """``shardgate_queue`` against an in-process gate's receive + ack of as many events."""
    ev = spark.range(0, events, numPartitions=2).selectExpr(
        "id AS customer_id", "concat('job-', id) AS body")
    enq: list[float] = []
    ref_q: list[float] = []
    sg_q: list[float] = []
    sg_qb: list[float] = []
    floor: list[float] = []
    spark.dataSource.register(NothingSource)

    def sg_queue(name: str) -> tuple[float, float]:
        qreader = (spark.readStream.format("shardgate_queue").option("cluster", str(cluster))
                   .option("keyspace", "bench").option("queue", "jobs")
                   .option("maxEventsPerTrigger", str(max(1, events // 4))))
        return run_query(spark, qreader, tmp, name)

    warm_events = 1000 if warm else 0
    if warm:  # as a running stream is: the executors' Python workers started by a query
        # that reads (the change-stream half does the same), and the reference's imports
        write(spark.range(0, warm_events, numPartitions=2).selectExpr(
            "id AS customer_id", "concat('warm-', id) AS body"), "jobs")
        sg_queue("queue-warm")
        write(spark.range(0, warm_events, numPartitions=2).selectExpr(
            "id AS customer_id", "concat('warm-', id) AS body"), "jobs_ref")
        asyncio.run(raw_queue(topo, "jobs_ref", warm_events))
    for r in range(rounds):
        enq.append(write(ev, "jobs"))
        write(ev, "jobs_ref")
        ref_q.append(asyncio.run(raw_queue(topo, "jobs_ref", events)))
        w, b = sg_queue(f"queue-{r}")
        sg_q.append(w)
        sg_qb.append(b)
        floor.append(run_query(spark, spark.readStream.format("bench_nothing"), tmp,
                               f"nothing-{r}")[0])
    done = asyncio.run(acked(topo, "jobs")) - warm_events
    print(f"median of {rounds} interleaved round(s); {events} events")
    print(f"{'what':<64}{'seconds':>10}{'events/s':>12}")
    line("queue: bulk enqueue (writer)", enq, events)
    line("queue: gate receive+ack (reference)", ref_q, events)
    line("queue: shardgate_queue availableNow", sg_q, events)
    line("queue: shardgate_queue availableNow, batches only", sg_qb, events)
    print(f"{'floor: availableNow query of a Python source with nothing to read':<64}"
          f"{median(floor):>10.2f}")
    print(f"ratio shardgate_queue/reference: {median(ref_q) / median(sg_q):.2f}x query wall "
          f"time, {median(ref_q) / median(sg_qb):.2f}x batches only "
          f"({done}/{events * rounds} acked)")


def main(rows: int, events: int, rounds: int, prefix: str,
         parts: Sequence[str] = ("changes", "queue"), warm: bool = True) -> None:
    ks = pg_keyspace(prefix, SHARDS,
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

        if "changes" in parts:
            change_stream(spark, topo, cluster, tmp, rows, rounds, write, warm)
        if "queue" in parts:
            queue(spark, topo, cluster, tmp, events, rounds, write, warm)
    finally:
        spark.stop()
        ks.drop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    ap.add_argument("--prefix", default="sg_bench_stream",
                    help="the shard databases' name prefix (dropped and created)")
    ap.add_argument("--only", choices=["changes", "queue"], help="run one half only")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run, no warm-up queries (checks that the bench runs), for CI")
    args = ap.parse_args()
    main(5_000 if args.smoke else args.rows, 2_000 if args.smoke else args.events,
         1 if args.smoke else args.rounds, args.prefix,
         (args.only,) if args.only else ("changes", "queue"), warm=not args.smoke)
