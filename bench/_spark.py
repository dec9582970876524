"""The Spark session every Spark benchmark uses: local[2], the shardgate sources registered.

The JVM runs with its default settings (JIT tiers, GC), as a user's would; the
tests' C1-only JIT starts faster but would slow the JVM side of both readers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

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
