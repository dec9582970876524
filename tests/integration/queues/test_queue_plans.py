"""The queue store's statements take the index each is written for, under churn.

A queue table lives under constant churn: most of its rows are acked history, and
its statistics are often older than its contents. The statements a queue manager
runs must not depend on fresh statistics to pick their index:

* a write by primary key (fire, fail, ack) reads the primary key only. Before, the
  fire write's ``state IN (...)`` let PostgreSQL's generic plan AND in a scan of a
  whole state index: 76,000 entries per fire in the queue bench;
* each scan reads its own state's partial index (new events, retries, the purge),
  never the other states' entries.

The plans are read with PostgreSQL's generic plan forced (what a prepared statement
settles on after five runs) on a table analyzed while empty and then filled (the
stale statistics of a busy queue), and with SQLite's ``EXPLAIN QUERY PLAN``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from shardgate.queues.ddl import queue_table_ddl
from shardgate.queues.options import QueueOptions
from shardgate.queues.table.store import QueueStore
from shardgate.result import Result

ROWS = 20_000  # 19,000 acked, 500 fired, 500 to be fired


class Recorder:
    """A connection that keeps each statement the store runs (and answers nothing)."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, list[Any]]] = []

    async def execute(self, text: str, params: Sequence[Any] = ()) -> Result:
        self.statements.append((text, list(params)))
        return Result()


async def statements(dialect: str) -> dict[str, tuple[str, list[Any]]]:
    """Each store statement the manager runs on its hot path, with sample arguments."""
    store = QueueStore("jobs", dialect, "%s" if dialect == "postgres" else "?")
    store.user_columns = ["payload"]
    runs: dict[str, Callable[[Any], Any]] = {
        "scan_new": lambda c: store.scan_new(c, 1_000, 2_000, 128),
        "scan_fired": lambda c: store.scan_fired(c, 2_000, 128),
        "fire": lambda c: store.fire(c, list(range(1, 257)), 3_000),
        "fail": lambda c: store.fail(c, [1, 2, 3]),
        "ack": lambda c: store.ack(c, list(range(1, 129)), 3_000),
        "purge": lambda c: store.purge(c, 2_000),
    }
    out = {}
    for name, run in runs.items():
        rec = Recorder()
        await run(rec)
        [out[name]] = rec.statements
    return out


#: the index each statement must read, and the indexes it may read at all ("pk": the
#: primary key's, which the purge reads to find the rows its subquery chose)
EXPECTED = {"scan_new": ("sg_due", {"sg_due"}), "scan_fired": ("sg_next", {"sg_next"}),
            "purge": ("sg_acked", {"sg_acked", "pk"}), "fire": ("pk", {"pk"}),
            "fail": ("pk", {"pk"}), "ack": ("pk", {"pk"})}


def _fill_sql(dialect: str) -> list[str]:
    series = ("generate_series(1, {n})" if dialect == "postgres" else
              "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n})"
              " SELECT i FROM s)")
    src = series.format(n=ROWS)
    col = "generate_series" if dialect == "postgres" else "i"
    return [
        f"INSERT INTO jobs (id, time_scheduled, time_next, state, payload)"
        f" SELECT {col}, {col}, {col}, CASE WHEN {col} <= 19000 THEN 'acked'"
        f" WHEN {col} <= 19500 THEN 'fired' ELSE 'to_be_fired' END, 'x' FROM {src}"
        + ("" if dialect == "postgres" else " AS g"),
    ]


async def test_postgres_generic_plans_read_only_their_index(
        make_database: Callable[..., str]) -> None:
    url = make_database("postgres", "qplans")
    with psycopg.connect(url, autocommit=True) as conn:
        for stmt in queue_table_ddl("jobs", _payload(), QueueOptions(), "postgres"):
            conn.execute(stmt)
        # statistics of the empty table, then the churn they do not know about
        conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        conn.execute("ANALYZE jobs")
        for stmt in _fill_sql("postgres"):
            conn.execute(stmt)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for name, (text, params) in (await statements("postgres")).items():
            pieces = text.split("%s")
            numbered = pieces[0] + "".join(f"${i}{p}" for i, p in enumerate(pieces[1:], 1))
            conn.execute(f"PREPARE q_{name} AS {numbered}")
            args = sql.SQL(", ").join(sql.Literal(p) for p in params)
            explain = sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(f"q_{name}"), args)
            plan = "\n".join(r[0] for r in conn.execute(explain).fetchall())
            _check(name, plan)


async def test_sqlite_plans_read_only_their_index(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "q.db")
    try:
        for stmt in queue_table_ddl("jobs", _payload(), QueueOptions(), "sqlite"):
            conn.execute(stmt)
        for stmt in _fill_sql("sqlite"):
            conn.execute(stmt)
        conn.execute("ANALYZE")
        for name, (text, params) in (await statements("sqlite")).items():
            rows = conn.execute(f"EXPLAIN QUERY PLAN {text}", params).fetchall()
            _check(name, "\n".join(str(r[-1]) for r in rows))
    finally:
        conn.close()


def _payload() -> list[Any]:
    from sqlglot import exp
    return [exp.ColumnDef(this=exp.to_identifier("payload"),
                          kind=exp.DataType.build("VARCHAR(64)"))]


def _check(name: str, plan: str) -> None:
    want, allowed = EXPECTED[name]
    plan = re.sub(r"sqlite_autoindex_jobs_\d+", "jobs_pk", plan).replace("jobs_pkey", "jobs_pk")
    used = set(re.findall(r"jobs_(pk|sg_\w+)", plan))
    assert want in used, f"{name} does not read {want}:\n{plan}"
    assert used <= allowed, f"{name} reads {sorted(used - allowed)} too:\n{plan}"
