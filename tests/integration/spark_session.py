"""Start the test suite's one local Spark session (see the ``spark`` fixture)."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import pytest

from tests.conftest import in_ci

JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: MariaDB Connector/J (Debian's libmariadb-java)
MARIADB_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"


def _unavailable(reason: str) -> None:
    message = f"Spark is not available ({reason}); install the 'spark' extra and Java 17"
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


_session: Any = None


def start_spark() -> Any:
    """The run's local Spark session, started on first call (see ``pytest_collection_finish``
    in ``tests/integration/conftest.py`` for why that is early)."""
    global _session
    if _session is None:
        _session = _start()
    return _session


def _start() -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        _unavailable(str(exc))
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _unavailable("no java on PATH and no JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shardgate.spark import register

    builder = SparkSession.builder
    if os.path.exists(MARIADB_JDBC_JAR):  # the MySQL listener's JDBC test reads through it
        builder = builder.config("spark.jars", MARIADB_JDBC_JAR)
    session = (
        builder.master("local[2,2]")
        .appName("shardgate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", JVM_FLAGS)
        .config("spark.executor.extraJavaOptions", JVM_FLAGS)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
