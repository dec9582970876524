"""MariaDB's query pool (asyncmy on the event loop) against a real MariaDB server.

Each test runs a first statement (its connect reads the collation on the
connection pool), then checks the query pool itself: the same answers as the
connection pool, its connections reused, dropped after a client-side
failure, a cancelled statement stopped on the server, and the result limits.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import time
from collections.abc import AsyncIterator, Callable

import pymysql
import pytest

from shardgate.backends import open_backend
from shardgate.backends.mysql import MySQLBackend
from shardgate.errors import AlreadyExists, Code, InvalidArgument, ShardgateError
from shardgate.result import ResultLimits

pytestmark = pytest.mark.mysql


@pytest.fixture
async def mysql(make_database: Callable[..., str]) -> AsyncIterator[MySQLBackend]:
    be = open_backend(make_database("mysql", "querypool"), pool_size=2)
    assert isinstance(be, MySQLBackend)
    try:
        await be.execute("CREATE TABLE t (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(20),"
                         " b VARBINARY(8), d DECIMAL(10, 3), ts DATETIME(3), f DOUBLE, j JSON,"
                         " n INT)")
        assert be._queries is not None and be._collation_read
        yield be
    finally:
        await be.close()


SLOW = "SELECT BENCHMARK(20000000000, MD5('shardgate'))"


def _server_ids(be: MySQLBackend) -> set[int]:
    assert be._queries is not None
    return {c.thread_id() for c in be._queries._idle}


async def test_statements_run_on_the_query_pool_with_the_connection_pools_answers(
    mysql: MySQLBackend,
) -> None:
    ins = await mysql.execute(
        "INSERT INTO t (v, b, d, ts, f, j, n) VALUES (%s, %s, %s, %s, %s, %s, %s), "
        "(%s, %s, %s, %s, %s, %s, %s)",
        ["é", b"\x00\xff'", decimal.Decimal("1.250"), datetime.datetime(2026, 1, 2, 3, 4, 5,
                                                                         6000),
         0.1, '{"a": [1, 2]}', None,
         "x%y", b"", decimal.Decimal("-2"), None, -1e300, "null", 7])
    assert (ins.rows_affected, ins.insert_id) == (2, 1)
    assert _server_ids(mysql), "the statement ran on the query pool"
    select = "SELECT id, v, b, d, ts, f, j, n FROM t ORDER BY id"
    on_queries = await mysql.execute(select)
    conn = await mysql.acquire()
    try:
        on_connection = await conn.execute(select)
    finally:
        await mysql.release(conn)
    assert on_queries.fields == on_connection.fields
    assert on_queries.rows == on_connection.rows
    assert [type(v) for v in on_queries.rows[0]] == [type(v) for v in on_connection.rows[0]]
    assert on_queries.rows[0][2] == b"\x00\xff'"
    # rows matched, not changed (CLIENT_FOUND_ROWS), as on the connection pool
    upd = await mysql.execute("UPDATE t SET n = 7 WHERE id IN (1, 2)")
    assert upd.rows_affected == 2


async def test_a_connection_is_reused_and_kept_after_a_server_error(mysql: MySQLBackend) -> None:
    await mysql.execute("SELECT 1")
    before = _server_ids(mysql)
    with pytest.raises(InvalidArgument):
        await mysql.execute("SELEC 1")
    await mysql.execute("INSERT INTO t (id) VALUES (5)")
    with pytest.raises(AlreadyExists):
        await mysql.execute("INSERT INTO t (id) VALUES (5)")
    assert (await mysql.execute("SELECT COUNT(*) FROM t")).rows == [(1,)]
    assert _server_ids(mysql) == before


async def test_a_connection_the_server_closed_is_replaced(
    mysql: MySQLBackend, make_database: Callable[..., str]
) -> None:
    await mysql.execute("SELECT 1")
    (old,) = _server_ids(mysql)
    admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        admin.cursor().execute(f"KILL {old}")
    finally:
        admin.close()
    await asyncio.sleep(0.1)  # the server's EOF reaches the idle connection's protocol
    assert (await mysql.execute("SELECT 2")).rows == [(2,)]
    assert old not in _server_ids(mysql)


async def test_a_cancelled_statement_stops_on_the_server_and_frees_its_slot(
    mysql: MySQLBackend,
) -> None:
    await mysql.execute("SELECT 1")
    # BENCHMARK, unlike SLEEP, never looks at the client's socket: only KILL stops it
    slow = asyncio.create_task(mysql.execute(SLOW))
    await asyncio.sleep(0.3)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow

    def sleeping() -> bool:
        admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        try:
            with admin.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                            "WHERE INFO = %s", (SLOW,))
                return bool(cur.fetchone()[0])
        finally:
            admin.close()

    deadline = time.monotonic() + 5
    while sleeping():
        assert time.monotonic() < deadline, "the cancelled statement still runs on the server"
        await asyncio.sleep(0.1)
    # both slots free (pool_size 2): two statements at once do not wait for a timeout
    started = time.monotonic()
    both = await asyncio.gather(mysql.execute("SELECT SLEEP(0.2)"),
                                mysql.execute("SELECT SLEEP(0.2)"))
    assert [r.rows for r in both] == [[(0,)], [(0,)]]
    assert time.monotonic() - started < 3


async def test_a_read_past_the_limits_is_refused_and_its_connection_dropped(
    mysql: MySQLBackend,
) -> None:
    await mysql.execute("INSERT INTO t (id) SELECT seq FROM seq_1_to_5000")
    (before,) = _server_ids(mysql)
    with pytest.raises(ShardgateError) as info:
        await mysql.execute("SELECT id FROM t", (), ResultLimits(max_rows=1500))
    assert info.value.code is Code.RESOURCE_EXHAUSTED
    assert before not in _server_ids(mysql)
    within = await mysql.execute("SELECT id FROM t ORDER BY id", (), ResultLimits(max_rows=5000))
    assert [r[0] for r in within.rows] == list(range(1, 5001))
