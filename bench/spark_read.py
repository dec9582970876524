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
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._pg import ADMIN_URL, drop_database, fresh_database
    from bench._spark import start_spark
except ImportError:  # run as a script
    from _pg import ADMIN_URL, drop_database, fresh_database  # type: ignore[no-redef]
    from _spark import start_spark  # type: ignore[no-redef]

from shardgate.keys import KeyRange
from shardgate.topo import Topology, write_cluster_file

SHARDS = 4
#: untimed reads of each path first: the JVM's JIT compiles both paths' code
#: over the first few reads (the first read of either is 1.5-2x slower)
WARMUP = 3


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(rows: int, rounds: int) -> None:
    names = [f"sg_bench_spark_{i}" for i in range(SHARDS)]
    urls = [fresh_database(n) for n in names]
    ranges = KeyRange().split(SHARDS)
    topo = Topology.from_dict({"keyspaces": {"bench": {
        "shards": {kr.name: url for kr, url in zip(ranges, urls, strict=True)},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {t: {"column_vindexes": [{"column": "id", "name": "hash"}]}
                               for t in ("t", "warm")}},
    }}})
    import psycopg

    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            for table in ("t", "warm"):
                conn.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, customer_id BIGINT "
                             "NOT NULL, sku TEXT, price BIGINT, amount DOUBLE PRECISION)")
    tmp = Path(tempfile.mkdtemp(prefix="sg_bench_spark_"))
    cluster = tmp / "cluster.yaml"
    write_cluster_file(topo, cluster)
    spark = start_spark("shardgate-bench", jdbc=True)
    try:
        df = spark.range(0, rows, numPartitions=2).selectExpr(
            "id", "id % 100000 AS customer_id", "concat('sku-', id % 1000) AS sku",
            "id % 997 AS price", "id * 0.5 AS amount")

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

        user = ADMIN_URL.split("//", 1)[1].split("@", 1)[0].split(":")[0] or "postgres"

        def jdbc_read() -> None:
            parts = [
                spark.read.format("jdbc")
                .option("url", f"jdbc:postgresql://127.0.0.1:5432/{n}")
                .option("dbtable", "t").option("user", user)
                .option("driver", "org.postgresql.Driver").option("fetchsize", "10000")
                .load()
                for n in names
            ]
            union = parts[0]
            for p in parts[1:]:
                union = union.unionByName(p)
            union.write.format("noop").mode("overwrite").save()

        for _ in range(WARMUP):  # both paths to steady state: Python workers, JIT, JDBC
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
        for n in names:
            drop_database(n)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    ap.add_argument("--smoke", action="store_true", help="a short run (10k rows), for CI")
    args = ap.parse_args()
    main(10_000 if args.smoke else args.rows, 1 if args.smoke else args.rounds)
