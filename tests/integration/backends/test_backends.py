"""The backends seam against real databases: SQLite files, PostgreSQL, MariaDB.

Every test runs once per backend kind (the ``backend_kind`` fixture) on a
brand-new database, so tests never see each other's tables.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import Any

import pytest

from shardgate.backends import Backend, open_backend
from shardgate.backends.urls import redacted
from shardgate.errors import Code, ShardgateError, Unavailable

# kind -> CREATE TABLE for the table every test uses.
ITEMS_DDL = {
    "sqlite": (
        "CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " name TEXT NOT NULL UNIQUE, qty INTEGER NOT NULL DEFAULT 0, data BLOB)"
    ),
    "postgres": (
        "CREATE TABLE items (id BIGSERIAL PRIMARY KEY,"
        " name TEXT NOT NULL UNIQUE, qty INTEGER NOT NULL DEFAULT 0, data BYTEA)"
    ),
    "mysql": (
        "CREATE TABLE items (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
        " name VARCHAR(191) NOT NULL UNIQUE, qty INTEGER NOT NULL DEFAULT 0, data BLOB)"
        " ENGINE=InnoDB"
    ),
}


def kind_of(backend: Backend) -> str:
    return backend.dialect


def insert_sql(backend: Backend, columns: str = "name, qty") -> str:
    """INSERT into items; PostgreSQL reports the new id through RETURNING."""
    p = backend.placeholder
    marks = ", ".join([p] * len(columns.split(",")))
    sql = f"INSERT INTO items ({columns}) VALUES ({marks})"
    return sql + " RETURNING id" if backend.dialect == "postgres" else sql


def q(backend: Backend, sql: str) -> str:
    """Write tests' SQL with ``?``; turn it into the backend's placeholder."""
    return sql.replace("?", backend.placeholder)


@pytest.fixture
async def items(backend: Backend) -> Backend:
    await backend.execute(ITEMS_DDL[backend.dialect])
    return backend


async def count_items(backend: Backend) -> int:
    result = await backend.execute("SELECT COUNT(*) FROM items")
    return int(result.rows[0][0])


# --------------------------------------------------------------------- basics --


async def test_insert_select_update_delete(items: Backend) -> None:
    be = items
    first = await be.execute(insert_sql(be), ("apple", 3))
    assert first.rows_affected == 1
    assert first.insert_id == 1
    second = await be.execute(insert_sql(be), ("pear", 5))
    assert second.insert_id == 2

    result = await be.execute(
        q(be, "SELECT id, name, qty FROM items WHERE qty >= ? ORDER BY id"), (1,)
    )
    assert result.fields == ["id", "name", "qty"]
    assert result.rows == [(1, "apple", 3), (2, "pear", 5)]
    assert all(type(row) is tuple for row in result.rows)
    assert result.insert_id is None

    updated = await be.execute(q(be, "UPDATE items SET qty = qty + 1 WHERE qty < ?"), (10,))
    assert updated.rows_affected == 2
    assert updated.insert_id is None
    # Rows matched, not rows changed, on every backend (MySQL's default differs).
    same = await be.execute(q(be, "UPDATE items SET qty = qty WHERE name = ?"), ("apple",))
    assert same.rows_affected == 1
    deleted = await be.execute(q(be, "DELETE FROM items WHERE name = ?"), ("apple",))
    assert deleted.rows_affected == 1
    assert (await be.execute("SELECT name, qty FROM items")).rows == [("pear", 6)]


async def test_empty_select_keeps_field_names(items: Backend) -> None:
    result = await items.execute("SELECT id, name FROM items")
    assert result.fields == ["id", "name"]
    assert result.rows == []


async def test_executemany_reports_rows_affected(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    try:
        n = await conn.executemany(
            q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"), [(f"n{i}", i) for i in range(50)]
        )
    finally:
        await be.release(conn)
    assert n == 50
    assert await count_items(be) == 50


async def test_executemany_is_atomic(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    try:
        with pytest.raises(ShardgateError) as info:
            await conn.executemany(
                q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"),
                [("a", 1), ("b", 2), ("a", 3), ("c", 4)],
            )
        assert info.value.code is Code.ALREADY_EXISTS
        assert not conn.in_transaction
    finally:
        await be.release(conn)
    assert await count_items(be) == 0


async def test_unicode_and_bytes_round_trip(items: Backend) -> None:
    be = items
    blob = bytes(range(256)) * 16 + b"\x00\xff\x00"
    name = "naïve 🦀 Ελληνικά"
    await be.execute(insert_sql(be, "name, qty, data"), (name, 1, blob))
    row = (await be.execute(q(be, "SELECT name, data FROM items WHERE name = ?"), (name,))).rows[0]
    assert row[0] == name
    assert isinstance(row[1], bytes)
    assert row[1] == blob


async def test_literal_percent_with_percent_placeholder(items: Backend) -> None:
    be = items
    await be.execute(insert_sql(be), ("50% off", 1))
    pct = "%%" if be.placeholder == "%s" else "%"
    result = await be.execute(
        q(be, f"SELECT name FROM items WHERE name LIKE '50{pct}' AND qty = ?"), (1,)
    )
    assert result.rows == [("50% off",)]


# --------------------------------------------------------------- transactions --


async def test_rollback_leaves_nothing(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    try:
        assert not conn.in_transaction
        await conn.begin()
        assert conn.in_transaction
        await conn.execute(insert_sql(be), ("ghost", 1))
        assert (await conn.execute("SELECT COUNT(*) FROM items")).rows == [(1,)]
        await conn.rollback()
        assert not conn.in_transaction
    finally:
        await be.release(conn)
    assert await count_items(be) == 0


async def test_commit_persists_and_is_invisible_before(items: Backend) -> None:
    be = items
    writer = await be.acquire()
    reader = await be.acquire()
    try:
        await writer.begin()
        await writer.execute(insert_sql(be), ("kept", 1))
        assert (await reader.execute("SELECT COUNT(*) FROM items")).rows == [(0,)]
        await writer.commit()
        assert not writer.in_transaction
        assert (await reader.execute("SELECT name FROM items")).rows == [("kept",)]
    finally:
        await be.release(reader)
        await be.release(writer)


async def test_release_rolls_back_an_open_transaction(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    await conn.begin()
    await conn.execute(insert_sql(be), ("abandoned", 1))
    await be.release(conn)
    assert await count_items(be) == 0
    again = await be.acquire()
    try:
        assert not again.in_transaction
    finally:
        await be.release(again)


async def test_in_transaction_follows_a_callers_own_begin(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    try:
        await conn.execute("BEGIN")
        assert conn.in_transaction
        await conn.execute("ROLLBACK")
        assert not conn.in_transaction
    finally:
        await be.release(conn)


async def test_two_writers_serialise_instead_of_failing(items: Backend) -> None:
    """Two read-then-write transactions on the same row both commit (no deadlock)."""
    be = items
    await be.execute(insert_sql(be), ("counter", 0))
    select = q(be, "SELECT qty FROM items WHERE name = ?")
    if be.dialect != "sqlite":
        select += " FOR UPDATE"

    async def bump() -> None:
        conn = await be.acquire()
        try:
            await conn.begin()
            qty = (await conn.execute(select, ("counter",))).rows[0][0]
            await asyncio.sleep(0.05)
            await conn.execute(
                q(be, "UPDATE items SET qty = ? WHERE name = ?"), (qty + 1, "counter")
            )
            await conn.commit()
        finally:
            await be.release(conn)

    await asyncio.gather(bump(), bump())
    assert (await be.execute(select.replace(" FOR UPDATE", ""), ("counter",))).rows == [(2,)]


# ------------------------------------------------------------------ streaming --


async def test_stream_ten_thousand_rows_in_batches(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    try:
        await conn.executemany(
            q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"),
            [(f"row{i:05d}", i) for i in range(10_000)],
        )
        sizes: list[int] = []
        seen = 0
        server_cursors: list[Any] = []
        async with aclosing(
            conn.stream(
                q(be, "SELECT id, name, qty FROM items WHERE qty >= ? ORDER BY qty"), (0,), 1000
            )
        ) as batches:
            async for fields, rows in batches:
                assert fields == ["id", "name", "qty"]
                assert rows[0][2] == seen
                sizes.append(len(rows))
                seen += len(rows)
                if be.dialect == "postgres" and len(sizes) == 1:
                    # The rows come from a server-side cursor, 1000 at a time.
                    server_cursors = (await conn.execute("SELECT name FROM pg_cursors")).rows
        assert sizes == [1000] * 10
        if be.dialect == "postgres":
            assert len(server_cursors) == 1
            assert not conn.in_transaction  # the stream's own transaction ended
        # The connection is usable again afterwards.
        assert (await conn.execute("SELECT COUNT(*) FROM items")).rows == [(10_000,)]
    finally:
        await be.release(conn)


async def test_stream_abandoned_early_leaves_a_usable_pool(items: Backend) -> None:
    be = items
    await be.execute(q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"), ("only", 1))
    conn = await be.acquire()
    try:
        await conn.executemany(
            q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"),
            [(f"r{i}", i) for i in range(3000)],
        )
        async with aclosing(conn.stream("SELECT id FROM items", (), 100)) as batches:
            async for _fields, rows in batches:
                assert len(rows) == 100
                break
    finally:
        await be.release(conn)
    assert await count_items(be) == 3001


async def test_releasing_mid_stream_discards_the_connection(items: Backend) -> None:
    be = items
    await be.execute(q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"), ("x", 1))
    conn = await be.acquire()
    await conn.executemany(
        q(be, "INSERT INTO items (name, qty) VALUES (?, ?)"), [(f"r{i}", i) for i in range(500)]
    )
    batches = conn.stream("SELECT id FROM items", (), 10)
    await anext(batches)
    await be.release(conn)  # the stream is still open: the connection is not reused
    assert await count_items(be) == 501
    await batches.aclose()  # finalised late: touches nothing, raises nothing
    assert await count_items(be) == 501


async def test_stream_inside_a_transaction_sees_its_writes(items: Backend) -> None:
    be = items
    conn = await be.acquire()
    try:
        await conn.begin()
        await conn.execute(insert_sql(be), ("uncommitted", 1))
        got = [rows async for _f, rows in conn.stream("SELECT name FROM items", (), 10)]
        assert got == [[("uncommitted",)]]
        assert conn.in_transaction
        await conn.rollback()
    finally:
        await be.release(conn)


async def test_stream_of_a_bad_statement_raises_translated(items: Backend) -> None:
    conn = await items.acquire()
    try:
        with pytest.raises(ShardgateError) as info:
            async with aclosing(conn.stream("SELECT * FROM no_such_table")) as batches:
                async for _ in batches:
                    pass
        assert info.value.code is Code.NOT_FOUND
        assert not conn.in_transaction
    finally:
        await items.release(conn)


# ------------------------------------------------------------------- errors --


async def test_error_translation(items: Backend) -> None:
    be = items
    await be.execute(insert_sql(be), ("dup", 1))
    cases = [
        (insert_sql(be), ("dup", 2), Code.ALREADY_EXISTS),
        ("SELEC name FROM items", (), Code.INVALID_ARGUMENT),
        ("SELECT name FROM no_such_table", (), Code.NOT_FOUND),
        ("SELECT no_such_column FROM items", (), Code.NOT_FOUND),
        (q(be, "SELECT name FROM items WHERE qty = ?"), (1, 2), Code.INVALID_ARGUMENT),
    ]
    for sql, params, code in cases:
        with pytest.raises(ShardgateError) as info:
            await be.execute(sql, params)
        err = info.value
        assert err.code is code, (sql, err)
        assert redacted(be.url) in err.message
        assert err.__cause__ is not None  # the driver's exception is chained
    # The pool is still healthy after all that.
    assert await count_items(be) == 1


async def test_error_inside_a_transaction_then_rollback(items: Backend) -> None:
    be = items
    await be.execute(insert_sql(be), ("dup", 1))
    conn = await be.acquire()
    try:
        await conn.begin()
        await conn.execute(insert_sql(be), ("fresh", 1))
        with pytest.raises(ShardgateError) as info:
            await conn.execute(insert_sql(be), ("dup", 1))
        assert info.value.code is Code.ALREADY_EXISTS
        assert conn.in_transaction
        await conn.rollback()
        assert not conn.in_transaction
    finally:
        await be.release(conn)
    assert (await be.execute("SELECT name FROM items")).rows == [("dup",)]


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("postgresql://postgres:pw@127.0.0.1:1/x", id="postgres"),
        pytest.param("mysql://root:pw@127.0.0.1:1/x", id="mysql"),
    ],
)
async def test_down_server_is_unavailable_quickly(url: str) -> None:
    be = open_backend(url)
    try:
        for attempt in (be.ping, be.acquire):
            started = time.monotonic()
            with pytest.raises(Unavailable) as info:
                await attempt()
            assert time.monotonic() - started < 3.5
            message = info.value.message
            assert "127.0.0.1:1/x is unreachable" in message
            assert "check it is running" in message
            assert ":pw@" not in message and ":***@" in message
    finally:
        await be.close()


async def test_unopenable_sqlite_file_is_unavailable() -> None:
    be = open_backend("sqlite:////proc/shardgate-cannot-create/x.db")
    try:
        with pytest.raises(Unavailable, match="is unreachable"):
            await be.ping()
    finally:
        await be.close()


async def test_sqlite_creates_the_directory(tmp_path: Any) -> None:
    path = tmp_path / "a" / "b" / "shard.db"
    be = open_backend(f"sqlite:///{path}")
    try:
        await be.ping()
        assert (await be.execute("PRAGMA journal_mode")).rows == [("wal",)]
    finally:
        await be.close()
    assert path.exists()


async def test_memory_sqlite_is_one_shared_database() -> None:
    be = open_backend("sqlite:///:memory:", pool_size=4)
    try:
        await be.execute("CREATE TABLE t (x INTEGER)")
        await asyncio.gather(*(be.execute("INSERT INTO t VALUES (1)") for _ in range(10)))
        assert (await be.execute("SELECT COUNT(*) FROM t")).rows == [(10,)]
    finally:
        await be.close()


# -------------------------------------------------------------- the pool --


async def test_concurrent_tasks_share_the_pool(items: Backend) -> None:
    be = items
    peak = 0
    lent = 0
    full = asyncio.Event()  # the first connections wait until the pool is all lent

    async def worker(n: int) -> None:
        nonlocal peak, lent
        for i in range(10):
            conn = await be.acquire()
            lent += 1
            peak = max(peak, lent)
            if lent == 4:
                full.set()
            try:
                await asyncio.wait_for(full.wait(), 30)
                await conn.execute(insert_sql(be), (f"w{n}-{i}", i))
                await asyncio.sleep(0)
            finally:
                lent -= 1
                await be.release(conn)

    await asyncio.gather(*(worker(n) for n in range(12)))
    assert await count_items(be) == 120
    assert peak == 4  # never more than pool_size connections lent at once


SERVER_KINDS = pytest.mark.parametrize("backend_kind", ["postgres", "mysql"], indirect=True)


@SERVER_KINDS  # an embedded database has no server session to kill
async def test_a_killed_connection_is_replaced(items: Backend, backend_kind: str) -> None:
    be = items
    conn = await be.acquire()
    session_sql = (
        "SELECT pg_backend_pid()" if backend_kind == "postgres" else "SELECT CONNECTION_ID()"
    )
    old = (await conn.execute(session_sql)).rows[0][0]
    await be.release(conn)

    killer = open_backend(be.url, pool_size=1)
    try:
        if backend_kind == "postgres":
            await killer.execute("SELECT pg_terminate_backend(%s)", (old,))
        else:
            await killer.execute(f"KILL {int(old)}")
    finally:
        await killer.close()
    await asyncio.sleep(0.2)  # let the server close the socket

    conn = await be.acquire()  # the dead idle connection is dropped, a new one opened
    try:
        new = (await conn.execute(session_sql)).rows[0][0]
        assert new != old
    finally:
        await be.release(conn)


@SERVER_KINDS
async def test_statement_on_a_killed_connection_is_unavailable_and_dropped(
    items: Backend, backend_kind: str
) -> None:
    be = items
    conn = await be.acquire()
    try:
        if backend_kind == "postgres":
            with pytest.raises(Unavailable):
                await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        else:
            with pytest.raises(Unavailable):
                await conn.execute("KILL CONNECTION_ID()")
                await conn.execute("SELECT 1")
    finally:
        await be.release(conn)
    assert await count_items(be) == 0  # a fresh connection serves the next call


SLOW_QUERY = {
    "sqlite": (
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1000000000)"
        " SELECT COUNT(*) FROM c"
    ),
    "postgres": "SELECT pg_sleep(30)",
    "mysql": "SELECT SLEEP(30)",
}


async def test_a_cancelled_statement_does_not_hold_up_the_pool(
    database_url: str, backend_kind: str
) -> None:
    be = open_backend(database_url, pool_size=1)
    try:
        slow = asyncio.create_task(be.execute(SLOW_QUERY[backend_kind]))
        await asyncio.sleep(0.3)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        started = time.monotonic()
        result = await asyncio.wait_for(be.execute("SELECT 1"), timeout=10)
        assert result.rows == [(1,)]
        assert time.monotonic() - started < 5
    finally:
        await be.close()


async def test_closed_backend_refuses_acquire(database_url: str) -> None:
    be = open_backend(database_url)
    await be.ping()
    await be.close()
    with pytest.raises(ShardgateError) as info:
        await be.acquire()
    assert info.value.code is Code.FAILED_PRECONDITION


# ---------------------------------------------------------------- queue ids --

# kind -> a statement inserting 200,000 rows whose id is left to the column default.
_MANY_DEFAULT_IDS = {
    "sqlite": "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200000)"
              " INSERT INTO q (body) SELECT n FROM s",
    "postgres": "INSERT INTO q (body) SELECT n FROM generate_series(1, 200000) AS n",
    "mysql": "INSERT INTO q (body) SELECT seq FROM seq_1_to_200000",
}


async def test_queue_event_ids_do_not_repeat_in_one_bulk_insert(backend: Backend) -> None:
    """A queue table's default id is random enough for one large INSERT ... SELECT.

    MariaDB's ``RAND()`` (the old default) repeated about 900 ids in 200,000 rows,
    so a Spark bulk enqueue failed with a duplicate key now and then.
    """
    from sqlglot import exp

    from shardgate.queues.ddl import queue_table_ddl
    from shardgate.queues.options import QueueOptions

    body = exp.ColumnDef(this=exp.to_identifier("body"), kind=exp.DataType.build("BIGINT"))
    for sql in queue_table_ddl("q", [body], QueueOptions(), backend.dialect):
        await backend.execute(sql)
    await backend.execute(_MANY_DEFAULT_IDS[backend.dialect])
    result = await backend.execute("SELECT COUNT(*), COUNT(DISTINCT id), MIN(id) FROM q")
    total, distinct, lowest = result.rows[0]
    assert (int(total), int(distinct)) == (200_000, 200_000)
    assert int(lowest) >= 0
