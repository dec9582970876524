"""Spark reads of a sharded table: shardgate's reader vs Spark's JDBC reader.

Four PostgreSQL databases are the shards ``-40 40-80 80-c0 c0-`` of keyspace
``bench``; table ``t`` (``hash`` on ``id``) gets ``--rows`` rows written by the
shardgate writer (reported as writer rows/s). Then, in the same Spark session
(``local[2]``), the whole table is read and materialized (``noop`` sink) by:

* the shardgate reader, one split per shard (Arrow batches from ADBC, rows kept
  by keyspace id);
* Spark's JDBC reader, one read per shard database, unioned (Debian's
  ``libpostgresql-jdbc-java``, ``.option("driver", "org.postgresql.Driver")``).

Prints rows/s of each (medians of ``--rounds`` interleaved timed reads) and
the ratio shardgate/JDBC (goal: >= 1.0). The dump job's snapshot and catch-up
rates are measured by ``bench/spark_dump.py``.

    python bench/spark_read.py [--rows 1000000] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

try:
        from bench._spark import TABLE_COLUMNS, TABLE_DDL, jdbc_union, pg_keyspace, start_spark
except ImportError:  # run as a script
        from _spark import TABLE_COLUMNS, TABLE_DDL, jdbc_union, pg_keyspace, start_spark  # type: ignore[no-redef]


SHARDS = 4
#: untimed reads of each path first: the JVM's JIT compiles both paths' code
#: over the first few reads (the first read of either is 1.5-2x slower)
WARMUP = 3


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(rows: int, rounds: int, warmup: int = WARMUP) -> None:
    import psycopg

    ks = pg_keyspace("sg_bench_spark", SHARDS, TABLE_DDL, ("t", "warm"))
    names, urls, cluster = ks.names, ks.urls, ks.cluster
    spark = start_spark("shardgate-bench", jdbc=True)
    try:
        df = spark.range(0, rows, numPartitions=2).selectExpr(*TABLE_COLUMNS)

        def write(frame: Any, table: str) -> None:
            (frame.write.format("shardgate").option("cluster", str(cluster))
             .option("keyspace", "bench").option("table", table).mode("append").save())

        write(df.limit(1000), "warm")  # warm up: Python workers, imports
        w = timed(lambda: write(df, "t"))
        for url in urls:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE t")

        def shardgate_read() -> None:
            (spark.read.format("shardgate").option("cluster", str(cluster))
             .option("keyspace", "bench").option("table", "t").load()
             .write.format("noop").mode("overwrite").save())

        def jdbc_read() -> None:
            jdbc_union(spark, names).write.format("noop").mode("overwrite").save()

        for _ in range(warmup):  # both paths to steady state: Python workers, JIT, JDBC
            shardgate_read()
            jdbc_read()
        sgs: list[float] = []
        jds: list[float] = []
        for _ in range(rounds):  # interleaved: load from elsewhere hits both alike
            sgs.append(timed(shardgate_read))
            jds.append(timed(jdbc_read))
        sg, jd = statistics.median(sgs), statistics.median(jds)
        print(f"{'what':<28}{'seconds':>10}{'rows/s':>14}")
        print(f"{'writer (4 PG shards)':<28}{w:>10.2f}{rows / w:>14.0f}")
        print(f"{'shardgate reader':<28}{sg:>10.2f}{rows / sg:>14.0f}")
        print(f"{'Spark JDBC reader (union)':<28}{jd:>10.2f}{rows / jd:>14.0f}")
        print(f"ratio shardgate/JDBC: {jd / sg:.2f}x (medians of {rounds} interleaved rounds; "
              f"per round: {', '.join(f'{j / g:.2f}' for g, j in zip(sgs, jds, strict=True))})")
    finally:
        spark.stop()
        ks.drop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run (10k rows, no warm-up: checks that the bench runs), for CI")
    args = ap.parse_args()
    if args.smoke:
        main(10_000, 1, 0)
    else:
        main(args.rows, args.rounds)
