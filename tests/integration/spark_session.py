"""Start the test suite's one local Spark session (see the ``spark`` fixture)."""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
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

#: ``PYSPARK_PYTHON`` for the session's Python workers: the interpreter, with the PySpark
#: zips taken off the ``PYTHONPATH`` Spark gives it (see :func:`worker_python`)
_WORKER_PYTHON = """#!/bin/sh
p=
IFS=:
for e in $PYTHONPATH; do
    case "$e" in */pyspark/python/lib/*.zip) ;; *) p="${p:+$p:}$e" ;; esac
done
PYTHONPATH=$p
export PYTHONPATH
exec %s "$@"
"""


def worker_python(python: str) -> str:
    """A launcher of ``python`` for Spark's Python workers that imports PySpark from
    site-packages, not from ``pyspark/python/lib/pyspark.zip``.

    Spark puts that zip first on every Python worker's ``PYTHONPATH`` (``SPARK_HOME`` is the
    pip-installed package). A zip holds no ``.pyc`` and ``zipimport`` writes none, so every
    worker the JVM starts compiled PySpark from source: ``import
    pyspark.sql.streaming.python_streaming_source_runner`` took 0.9 CPU-s from the zip and
    0.3 from site-packages (the same files: the zip is the installed package's copy). The
    streaming source's runner (one per query start) must connect back to the JVM within a
    fixed 10 s (``PythonWorkerFactory.createSimpleWorker``); at a load average of 20 on
    2 cores the compile alone took longer, hence "Python worker failed to connect back".
    This makes that 3x rarer, not impossible: at a load of 30 the site-packages import
    too can take more than 10 s (seen once in a run of the Spark tests at load 23-35).
    """
    directory = tempfile.mkdtemp(prefix="sg-spark-python-")
    atexit.register(shutil.rmtree, directory, True)
    launcher = Path(directory) / "python"
    launcher.write_text(_WORKER_PYTHON % shlex.quote(python))
    launcher.chmod(0o755)
    return str(launcher)


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
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shardgate.spark import register

    builder = SparkSession.builder
    if os.path.exists(MARIADB_JDBC_JAR):  # the MySQL listener's JDBC test reads through it
        builder = builder.config("spark.jars", MARIADB_JDBC_JAR)
    # the SparkContext takes its workers' interpreter from the environment when it starts;
    # the run's other subprocesses keep the plain one
    os.environ["PYSPARK_PYTHON"] = worker_python(python)
    try:
        session = _build(builder)
    finally:
        os.environ["PYSPARK_PYTHON"] = python
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def _build(builder: Any) -> Any:
    return (
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
