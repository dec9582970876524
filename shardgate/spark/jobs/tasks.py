"""Helpers of the jobs: one Spark task per shard; table schemas read in the driver."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardgate.backends.bulk import arrow
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.urls import parse_url
from shardgate.errors import Code, NotFound, ShardgateError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

_CODES = "|".join(c.value for c in Code)
_ERROR = re.compile(rf"shardgate\.errors\.\w+: ({_CODES}): ([^\n]*)")


def run_tasks(
    spark: SparkSession,
    specs: Sequence[dict[str, Any]],
    task: Callable[[dict[str, Any]], dict[str, Any]],
    what: str,
) -> list[dict[str, Any]]:
    """``task(spec)`` for every spec, one Spark task each; their results in spec order.

    A task that fails (after Spark's retries) fails the call with the task's
    own ``ShardgateError`` code and message when there is one (found in the
    Python traceback Spark forwards), ``INTERNAL`` otherwise.
    """
    sc = spark.sparkContext
    sc.setJobDescription(f"shardgate {what}")
    try:
        return sc.parallelize(list(specs), max(1, len(specs))).map(task).collect()
    except Exception as exc:
        text = str(exc)
        m = _ERROR.search(text)
        if m is not None:
            raise ShardgateError(f"{what} task failed: {m.group(2)}",
                                 code=Code(m.group(1))) from exc
        last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), repr(exc))
        raise ShardgateError(f"{what} task failed: {last.strip()[:500]}",
                             code=Code.INTERNAL) from exc


def table_schema(url: str, table: str) -> pa.Schema:
    """The Arrow schema of ``table``, safe to call in a process that holds the shard open.

    SQLite: the declared types through the standard library's ``sqlite3``, never
    through the ADBC driver: a second copy of the SQLite library in a process
    that has the file open through ``sqlite3`` (the driver's gate) drops that
    connection's POSIX locks when it closes its own descriptor, which corrupts
    the database under concurrent writers. Other backends: :func:`bulk.table_schema`.
    """
    import pyarrow as pa

    if parse_url(url).kind != "sqlite":
        return bulk.table_schema(url, table)
    lit = "'" + table.replace("'", "''") + "'"
    info = bulk.query(url, f"SELECT name, type FROM pragma_table_info({lit})")
    if not info:
        raise NotFound(f"table {table!r} does not exist on {parse_url(url).safe}")
    return pa.schema([pa.field(str(n), arrow.sqlite_type(str(t or ""))) for n, t in info])
