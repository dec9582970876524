"""The dump job on 4 PostgreSQL shards: snapshot rows/s and catch-up rate, with references.

Four PostgreSQL databases are the shards ``-40 40-80 80-c0 c0-`` of keyspace
``bench``; table ``t`` (``hash`` on ``id``) gets ``--rows`` rows (shardgate's
Spark writer). Then, in one Spark session (``local[2]``):

1. **snapshot**: ``DumpJob`` (first run) reads every shard in its snapshot
   transaction and commits the Delta table; reference: Spark's JDBC reader,
   one read per shard unioned, written as Parquet (the same bytes to disk,
   without a consistent snapshot, positions or a Delta commit). Both are warmed
   up first (untimed runs: JVM JIT, JDBC, Python workers), then timed in
   ``--rounds`` interleaved rounds (each DumpJob snapshot into a fresh lake);
   medians;
2. **catch-up**: ``--changes`` row changes are committed on the shards
   (updates of every row in turn, 1,000 rows per transaction, and 10 % deletes),
   then the reference reads them through the gate's change stream alone (from
   the lake's positions to the log ends, no apply), then ``DumpJob`` (a rerun)
   applies them to the lake. Rates are change events per second.

Prints both side by side with the ratios, and checks that the lake equals the
tables afterwards (row count, sum of prices).

    python bench/spark_dump.py [--rows 1000000] [--changes 200000] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

try:
    from bench._spark import (
        JDBC_JAR,
        TABLE_COLUMNS,
        TABLE_DDL,
        jdbc_union,
        pg_keyspace,
        start_spark,
    )
except ImportError:  # run as a script
    from _spark import (  # type: ignore[no-redef]
        JDBC_JAR,
        TABLE_COLUMNS,
        TABLE_DDL,
        jdbc_union,
        pg_keyspace,
        start_spark,
    )

from shardgate.auth.identity import TRUSTED
from shardgate.topo import Topology

SHARDS = 4
TX_ROWS = 1000
#: untimed runs of each snapshot path before the timed rounds (as spark_read.py)
WARMUP = 2


def jdbc_snapshot(spark: Any, names: list[str], out: Path) -> float:
    """Seconds for Spark JDBC (one read per shard, unioned) -> Parquet."""
    union = jdbc_union(spark, names)
    began = time.perf_counter()
    union.write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - began


def make_changes(urls: list[str], changes: int, rows: int) -> int:
    """Commit about ``changes`` row changes spread over the shards; the number made."""
    import psycopg

    per_shard = changes // len(urls)
    made = 0
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM t ORDER BY id").fetchall()]
            if not ids:
                continue
            done = 0
            i = 0
            while done < per_shard:
                chunk = ids[i % len(ids): i % len(ids) + TX_ROWS][: per_shard - done]
                i += len(chunk)
                if len(chunk) >= 10 and (i // TX_ROWS) % 10 == 9:
                    cur = conn.execute("DELETE FROM t WHERE id = ANY(%s)",
                                       (chunk[: len(chunk) // 2],))
                else:
                    cur = conn.execute("UPDATE t SET price = price + 1 WHERE id = ANY(%s)",
                                       (chunk,))
                done += max(1, cur.rowcount)
                made += cur.rowcount
    return made


async def stream_only(topo: Topology, lake: str) -> tuple[int, float]:
    """Change events of ``t`` read through the gate stream from the lake's positions to the
    log ends (no apply): the catch-up reference. Returns (events, seconds)."""
    from shardgate.backends.bulk import copy as bulk
    from shardgate.backends.changes.open import open_change_log
    from shardgate.event_token import position_key
    from shardgate.gate import Gate
    from shardgate.spark.jobs.lake import LakeTable
    from shardgate.streams.merge import StreamPosition

    lt = LakeTable(lake, ["id"])
    positions = lt.open("shardgate dump of bench.t")
    assert positions is not None
    targets = {}
    for s in topo.keyspace("bench").shards:
        q = f"bench/{s.name}"
        log = open_change_log(s.url, q)
        sql = log.position_sql
        await log.close()
        targets[q] = position_key(str(bulk.query(s.url, sql)[0][0]))
    gate = Gate.open(topo)
    events = 0
    began = time.perf_counter()
    try:
        reached: set[str] = set()
        stream = gate.update_stream("bench", None, StreamPosition(dict(positions.tokens)),
                                    heartbeat_s=0.2, identity=TRUSTED)
        async for ev in stream:
            events += sum(1 for c in ev.changes if c.table == "t")
            if position_key(ev.token.position) >= targets[ev.token.shard]:
                reached.add(ev.token.shard)
            if len(reached) == len(targets):
                break
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await gate.close()
    return events, time.perf_counter() - began


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(rows: int, changes: int, batch_rows: int, rounds: int, warmup: int) -> None:
    import psycopg

    from shardgate.spark.jobs import DumpJob, read_table

    ks = pg_keyspace("sg_bench_dump", SHARDS, TABLE_DDL)
    names, urls, topo, tmp, cluster = ks.names, ks.urls, ks.topo, ks.tmp, ks.cluster
    lake = str(tmp / "lake")
    spark = start_spark("shardgate-bench-dump", jdbc=Path(JDBC_JAR).exists())
    try:
        df = spark.range(0, rows, numPartitions=2).selectExpr(*TABLE_COLUMNS)
        (df.write.format("shardgate").option("cluster", str(cluster)).option("keyspace", "bench")
         .option("table", "t").mode("append").save())
        for url in urls:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE t")
        has_jdbc = Path(JDBC_JAR).exists()

        def dump(path: str) -> Any:
            return DumpJob(topo, "bench", "t", path, spark=spark, batch_rows=batch_rows,
                           progress=progress).run_sync()

        for w in range(warmup):  # both paths to steady state: JIT, JDBC, Python workers
            if has_jdbc:
                jdbc_snapshot(spark, names, tmp / f"jdbc_warm{w}")
            dump(str(tmp / f"lake_warm{w}"))
        jds: list[float] = []
        snaps: list[Any] = []
        for r in range(rounds):  # interleaved: load from elsewhere hits both alike
            if has_jdbc:
                jds.append(jdbc_snapshot(spark, names, tmp / f"jdbc{r}"))
            lake = str(tmp / f"lake{r}")
            snaps.append(dump(lake))
        snap_s = statistics.median(s.snapshot_s for s in snaps)
        snap_rate = statistics.median(s.snapshot_rows_per_s for s in snaps)
        jd = statistics.median(jds) if jds else 0.0
        made = make_changes(urls, changes, rows)
        ref_events, ref_s = asyncio.run(stream_only(topo, lake))
        catch = DumpJob(topo, "bench", "t", lake, batch_rows=batch_rows,
                        progress=progress).run_sync()

        total = sum(psycopg.connect(u, autocommit=True).execute(
            "SELECT count(*) FROM t").fetchone()[0] for u in urls)
        lake_df = read_table(spark, lake)
        assert lake_df.count() == total, "the lake does not match the tables"

        print(f"{'what':<44}{'seconds':>9}{'rate/s':>12}")
        print(f"medians of {rounds} interleaved rounds after {warmup} untimed warm-up runs each")
        print(f"{'snapshot: DumpJob (rows)':<44}{snap_s:>9.2f}{snap_rate:>12.0f}")
        if jd:
            print(f"{'snapshot ref: Spark JDBC -> Parquet (rows)':<44}{jd:>9.2f}"
                  f"{rows / jd:>12.0f}")
        print(f"{'catch-up: DumpJob apply (change events)':<44}{catch.catchup_s:>9.2f}"
              f"{catch.catchup_events_per_s:>12.0f}")
        print(f"{'catch-up ref: gate stream only (events)':<44}{ref_s:>9.2f}"
              f"{ref_events / ref_s:>12.0f}")
        if jd:
            print(f"ratio snapshot DumpJob/JDBC: {snap_rate / (rows / jd):.2f}x (per round: "
                  + ", ".join(f"{s.snapshot_rows_per_s / (rows / j):.2f}"
                              for s, j in zip(snaps, jds, strict=True)) + ")")
        print(f"ratio catch-up apply/stream: "
              f"{catch.catchup_events_per_s / (ref_events / ref_s):.2f}x "
              f"({catch.change_events} events, {made} rows changed, {catch.merges} merges of "
              f"<= {batch_rows} rows)")
    finally:
        spark.stop()
        ks.drop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=100_000, help="change rows per MERGE")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed snapshot rounds")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run (20k rows, no warm-up: checks that the bench runs), for CI")
    args = ap.parse_args()
    if args.smoke:
        main(20_000, 10_000, 5_000, 1, 0)
    else:
        main(args.rows, args.changes, args.batch_rows, args.rounds, WARMUP)
