"""Prepared statements (COM_STMT_PREPARE / COM_STMT_EXECUTE) through the MySQL listener,
over a two-shard MariaDB keyspace, with mysql-connector's prepared cursor.

What the listener must do that mysql-mimic alone did not: escape string
parameters, read DECIMAL, DATE, DATETIME and TIME parameters, send bytes that
are not text as bytes, and announce a SELECT's result columns in the prepare
answer (libmariadb reads an execute's rows only when it did: sysbench's
workloads run through it in ``test_sysbench.py``, which also covers executes
without new-params-bound-flag). The rows are read back as text (a scatter
read, PyMySQL), where a TIME of more than a day or below zero must be MySQL's
``30:00:07`` / ``-01:00:00.000500``, not Python's ``1 day, 6:00:07``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import mysql.connector
import pymysql
import pytest
from mysql.connector.constants import ClientFlag

from shardgate.api.mysql import serve_mysql
from shardgate.gate import Gate
from shardgate.topo import Topology

pytestmark = pytest.mark.mysql


@pytest.fixture
async def port(make_database: Callable[..., str]) -> AsyncIterator[int]:
    urls = [make_database("mysql", f"prep{i}") for i in range(2)]
    gate = Gate.open(Topology.from_dict({"default_keyspace": "prep", "keyspaces": {"prep": {
        "shards": {"-80": urls[0], "80-": urls[1]},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}}), pool_size=2)
    listener, bound = await serve_mysql(gate, "127.0.0.1", 0)

    def create() -> None:
        conn = pymysql.connect(host="127.0.0.1", port=bound, user="app", database="prep")
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, c VARCHAR(40),"
                            " b VARBINARY(8), d DECIMAL(10, 3), day DATE, ts DATETIME(6),"
                            " dur TIME(6))")
        finally:
            conn.close()

    try:
        await asyncio.wait_for(asyncio.to_thread(create), 120)
        yield bound
    finally:
        await listener.stop()
        await gate.close()


def _prepared(port: int) -> Any:
    conn = mysql.connector.connect(host="127.0.0.1", port=port, user="app", database="prep",
                                   autocommit=True, auth_plugin="mysql_native_password",
                                   use_pure=True)
    assert conn._client_flags & ClientFlag.CLIENT_QUERY_ATTRIBUTES
    return conn


ROWS: list[tuple[Any, ...]] = [
    (1, "it's", b"\x00\xff'\\", Decimal("-12.500"), datetime.date(2026, 2, 3),
     datetime.datetime(2026, 2, 3, 4, 5, 6, 789000), datetime.timedelta(hours=30, seconds=7)),
    (2, "back\\slash \\1 \\\\", b"", Decimal("0.001"), None, None, None),
    (3, "nul\x00 nl\n cr\r ctrl-z\x1a \"q\"", None, None, None, None, None),
]


async def test_parameters_reach_the_shards_as_sent(port: int) -> None:
    def client() -> tuple[list[Any], list[Any]]:
        conn = _prepared(port)
        try:
            cur = conn.cursor(prepared=True)
            for row in ROWS:
                cur.execute("INSERT INTO t (id, c, b, d, day, ts, dur) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?)", row)
                assert cur.rowcount == 1
            got = []
            for row in ROWS:  # read back by each value, prepared
                cur.execute("SELECT id FROM t WHERE c = ? AND id = ?", (row[1], row[0]))
                got.append(cur.fetchall())
            cur.execute("SELECT id, d FROM t WHERE d > ? ORDER BY id", (Decimal("-13"),))
            got.append(cur.fetchall())
            cur.execute("SELECT id FROM t WHERE ts = ? AND day = ?", ROWS[0][5:3:-1])
            got.append(cur.fetchall())
        finally:
            conn.close()
        plain = pymysql.connect(host="127.0.0.1", port=port, user="app", database="prep",
                                autocommit=True)
        try:
            with plain.cursor() as c:
                # (a negative TIME as text: mysql-connector's binary TIME of a negative
                # timedelta is off by its days, whatever the server)
                c.execute("INSERT INTO t (id, dur) VALUES (4, '-01:00:00.000500')")
                c.execute("SELECT id, c, b, d, day, ts, dur FROM t ORDER BY id")
                stored = list(c.fetchall())
        finally:
            plain.close()
        return got, stored

    got, stored = await asyncio.wait_for(asyncio.to_thread(client), 120)
    assert [[tuple(r) for r in rows] for rows in got] == [
        [(1,)], [(2,)], [(3,)], [(1, Decimal("-12.500")), (2, Decimal("0.001"))], [(1,)]]
    assert stored == [*(tuple(r) for r in ROWS),
                      (4, None, None, None, None, None,
                       -datetime.timedelta(hours=1, microseconds=500))]


async def test_prepare_announces_a_selects_columns(port: int) -> None:
    def client() -> tuple[list[str], list[str], int]:
        conn = _prepared(port)
        try:
            read = conn.cmd_stmt_prepare(b"SELECT c, SUM(id) AS n FROM t WHERE id BETWEEN ? "
                                         b"AND ? GROUP BY c ORDER BY c")
            write = conn.cmd_stmt_prepare(b"UPDATE t SET c = ? WHERE id = ?")
            return ([c[0] for c in read["columns"]], [c[0] for c in write["columns"]],
                    len(write["parameters"]))
        finally:
            conn.close()

    read, write, params = await asyncio.wait_for(asyncio.to_thread(client), 120)
    assert read == ["c", "n"]
    assert write == [] and params == 2


async def test_an_execute_reuses_the_bound_types(port: int) -> None:
    """COM_STMT_EXECUTE with new-params-bound-flag 0 (what libmariadb sends on a second
    execute of the same binding), framed by hand: the types of the first execute apply."""

    def client() -> list[Any]:
        conn = _prepared(port)
        try:
            conn.cmd_query("INSERT INTO t (id, c) VALUES (7, 'seven'), (8, 'eight')")
            stmt = conn.cmd_stmt_prepare(b"SELECT c FROM t WHERE id = ?")
            sid = stmt["statement_id"].to_bytes(4, "little")
            out = []
            # flags 0, iteration count 1, parameter count 1 (the client negotiated query
            # attributes), null bitmap, new-params-bound-flag, [LONGLONG and an empty
            # name], the value
            head = sid + b"\x00\x01\x00\x00\x00\x01\x00"
            for body in (head + b"\x01\x08\x00\x00" + (7).to_bytes(8, "little"),
                         head + b"\x00" + (8).to_bytes(8, "little")):
                packet = conn._send_cmd(23, packet=None, argument=body)  # COM_STMT_EXECUTE
                _, columns, _ = conn._handle_binary_result(packet)
                conn.unread_result = True  # (as mysql-connector's prepared cursor sets it)
                out.append(conn.get_rows(binary=True, columns=columns)[0])
            return out
        finally:
            conn.close()

    rows = await asyncio.wait_for(asyncio.to_thread(client), 120)
    assert [[tuple(r) for r in batch] for batch in rows] == [[("seven",)], [("eight",)]]
