"""The bulk readers' PostgreSQL connection pool, on a real server."""

from __future__ import annotations

import os
from collections.abc import Callable

import psycopg
import pytest

from shardgate.backends.bulk import copy as bulk

pytestmark = pytest.mark.postgres


def _pid(reader: bulk.ShardReader) -> int:
    batches = list(reader.arrow_batches("SELECT pg_backend_pid() AS pid"))
    return int(batches[0].column(0)[0].as_py())


@pytest.fixture
def url(make_database: Callable[..., str]) -> str:
    u = make_database("postgres", "pool")
    with psycopg.connect(u, autocommit=True) as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 50000) g")
    bulk.POOL.clear()
    return u


def test_a_finished_read_leaves_its_connection_for_the_next(url: str) -> None:
    with bulk.ShardReader(url) as r:
        first = _pid(r)
    with bulk.ShardReader(url) as r:
        assert _pid(r) == first
    # Two readers at once cannot share: the second opens its own.
    with bulk.ShardReader(url) as a, bulk.ShardReader(url) as b:
        assert _pid(a) != _pid(b)


def test_an_abandoned_read_or_an_open_snapshot_is_not_reused_dirty(url: str) -> None:
    with bulk.ShardReader(url) as r:
        first = _pid(r)
        it = r.arrow_batches("SELECT id FROM t")
        next(it)  # stop in the middle of the result
        it.close()
    with bulk.ShardReader(url) as r:
        assert _pid(r) != first  # the half-read connection was closed, not pooled
    with bulk.ShardReader(url) as r:
        snap_pid = _pid(r)
        r.snapshot()
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("INSERT INTO t VALUES (0)")  # after the snapshot
        assert sum(b.num_rows for b in r.arrow_batches("SELECT id FROM t")) == 50000
    with bulk.ShardReader(url) as r:  # rolled back on close, then pooled
        assert _pid(r) == snap_pid
        rows = list(r.arrow_batches(
            "SELECT count(*) AS n, current_setting('transaction_isolation') AS iso FROM t"))
        assert rows[0].column(0)[0].as_py() == 50001  # out of the old snapshot
        assert rows[0].column(1)[0].as_py() == "read committed"


def test_a_connection_killed_while_pooled_is_replaced(url: str) -> None:
    with bulk.ShardReader(url) as r:
        first = _pid(r)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    with bulk.ShardReader(url) as r:
        assert _pid(r) != first
        assert sum(b.num_rows for b in r.arrow_batches("SELECT id FROM t")) == 50000


def test_a_forked_child_does_not_use_its_parents_connections(url: str) -> None:
    with bulk.ShardReader(url) as r:
        parent = _pid(r)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            with bulk.ShardReader(url) as r:
                code = 0 if _pid(r) != parent else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(child, 0)
    assert got == b"\x00"
    with bulk.ShardReader(url) as r:
        assert _pid(r) == parent  # the parent's connection survived the child
