"""The Spark session every Spark benchmark uses: local[2], the shardgate sources registered.

The JVM runs with its default settings (JIT tiers, GC), as a user's would; the
tests' C1-only JIT starts faster but would slow the JVM side of both readers.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from bench._pg import ADMIN_URL, drop_database, fresh_database
except ImportError:  # run as a script
    from _pg import ADMIN_URL, drop_database, fresh_database  # type: ignore[no-redef]

from shardgate.keys import KeyRange
from shardgate.topo import Topology, write_cluster_file

#: the benchmark table: 1M rows of it make the Spark benches' reads
TABLE_DDL = ("CREATE TABLE {table} (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL, "
             "sku TEXT, price BIGINT, amount DOUBLE PRECISION)")
#: its rows, from ``spark.range(n)``
TABLE_COLUMNS = ("id", "id % 100000 AS customer_id", "concat('sku-', id % 1000) AS sku",
                 "id % 997 AS price", "id * 0.5 AS amount")

JDBC_JAR = "/usr/share/java/postgresql.jar"


def start_spark(app: str, *, jdbc: bool = False) -> Any:
    """A local[2] session named ``app``; with ``jdbc``, Debian's PostgreSQL JDBC jar on it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from shardgate.spark import register

    builder = (
        SparkSession.builder.master("local[2]").appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if jdbc:
        if not Path(JDBC_JAR).exists():
            sys.exit(f"{JDBC_JAR} is missing: apt-get install -y libpostgresql-jdbc-java")
        builder = builder.config("spark.jars", JDBC_JAR)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@dataclass
class PgKeyspace:
    """Keyspace ``bench`` over fresh PostgreSQL databases, one per shard."""

    names: list[str]
    urls: list[str]
    topo: Topology
    tmp: Path

    @property
    def cluster(self) -> Path:
        """The cluster file; :meth:`write_cluster` (re)writes it from :attr:`topo`."""
        return self.tmp / "cluster.yaml"

    def write_cluster(self) -> Path:
        write_cluster_file(self.topo, self.cluster)
        return self.cluster

    def drop(self) -> None:
        for n in self.names:
            drop_database(n)


def pg_keyspace(prefix: str, shards: int, ddl: str, tables: Sequence[str] = ("t",)) -> PgKeyspace:
    """``shards`` databases ``<prefix>_<i>``, each with ``tables`` made by ``ddl`` (a
    ``{table}`` template), sharded by ``hash`` on ``id``; the cluster file written."""
    import psycopg

    names = [f"{prefix}_{i}" for i in range(shards)]
    urls = [fresh_database(n) for n in names]
    topo = Topology.from_dict({"keyspaces": {"bench": {
        "shards": {kr.name: url for kr, url in zip(KeyRange().split(shards), urls, strict=True)},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {t: {"column_vindexes": [{"column": "id", "name": "hash"}]}
                               for t in tables}},
    }}})
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            for table in tables:
                conn.execute(ddl.format(table=table))
    ks = PgKeyspace(names, urls, topo, Path(tempfile.mkdtemp(prefix=f"{prefix}_")))
    ks.write_cluster()
    return ks


def jdbc_union(spark: Any, names: Sequence[str], table: str = "t") -> Any:
    """Spark's JDBC reader over databases ``names``: one read per database, unioned."""
    user = ADMIN_URL.split("//", 1)[1].split("@", 1)[0].split(":")[0] or "postgres"
    parts = [
        spark.read.format("jdbc").option("url", f"jdbc:postgresql://127.0.0.1:5432/{n}")
        .option("dbtable", table).option("user", user)
        .option("driver", "org.postgresql.Driver").option("fetchsize", "10000").load()
        for n in names
    ]
    union = parts[0]
    for p in parts[1:]:
        union = union.unionByName(p)
    return union
