"""Point reads answered with the MariaDB shard's own packets (Gate.execute_wire), on a
real two-shard MariaDB keyspace behind the MySQL listener.

What a client reads on that path must equal what the general path (a
transaction's read, a scatter read) gives for the same rows; the column
definitions are the shard's (real types), with the keyspace as their schema;
and the gate's checks still apply: table ACLs, result limits, statistics.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import mysql.connector
import pymysql
import pytest

from shardgate.api.mysql import serve_mysql
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED, Identity
from shardgate.errors import Code, PermissionDenied, ShardgateError
from shardgate.gate import Gate
from shardgate.gate.limits import GateLimits
from shardgate.result import ResultLimits, WireResult
from shardgate.topo import Topology

pytestmark = pytest.mark.mysql

POINT = "SELECT id, k, v, b, d, ts, f, j, n FROM t WHERE k = %s ORDER BY id"


def _topology(urls: list[str]) -> Topology:
    return Topology.from_dict({"default_keyspace": "wire", "keyspaces": {"wire": {
        "shards": {"-80": urls[0], "80-": urls[1]},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "k", "name": "hash"}]}}},
    }}})


async def _open(make_database: Callable[..., str], limits: GateLimits | None = None) -> Gate:
    urls = [make_database("mysql", f"wire{i}") for i in range(2)]
    gate = Gate.open(_topology(urls), pool_size=2, limits=limits)
    s = gate.session("wire", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE t (id BIGINT PRIMARY KEY, k BIGINT, v VARCHAR(20),"
                          " b VARBINARY(8), d DECIMAL(10, 3), ts DATETIME(3), f DOUBLE,"
                          " j JSON, n INT)")
    rows: list[tuple[Any, ...]] = [
        (1, 7, "é ü", b"\x00\xff'", decimal.Decimal("1.250"),
         datetime.datetime(2026, 1, 2, 3, 4, 5, 6000), 0.1, '{"a": [1, 2]}', None),
        (2, 7, "x%y", b"", decimal.Decimal("-2"), None, -1e300, "null", 7),
        (3, 8, None, None, None, None, None, None, None),
    ] + [(10 + i, 9, f"r{i}", None, None, None, None, None, i) for i in range(30)]
    for row in rows:
        await gate.execute(s, "INSERT INTO t (id, k, v, b, d, ts, f, j, n) VALUES "
                              "(:id, :k, :v, :b, :d, :ts, :f, :j, :n)",
                           dict(zip(("id", "k", "v", "b", "d", "ts", "f", "j", "n"), row,
                                    strict=True)))
    return gate


@pytest.fixture
async def gate(make_database: Callable[..., str]) -> AsyncIterator[Gate]:
    g = await _open(make_database)
    try:
        yield g
    finally:
        await g.close()


@pytest.fixture
async def port(gate: Gate) -> AsyncIterator[int]:
    listener, bound = await serve_mysql(gate, "127.0.0.1", 0)
    try:
        yield bound
    finally:
        await listener.stop()


def _connect(port: int) -> Any:
    return pymysql.connect(host="127.0.0.1", port=port, user="app", database="wire",
                           autocommit=True)


async def test_execute_wire_answers_point_reads_of_mariadb_shards_only(gate: Gate) -> None:
    s = gate.session("wire", identity=TRUSTED)
    wire = await gate.execute_wire(s, "SELECT id, v FROM t WHERE k = :k ORDER BY id", {"k": 7})
    assert isinstance(wire, WireResult) and len(wire.columns) == 2 and len(wire.rows) == 2
    # not a point read: the caller runs execute()
    assert await gate.execute_wire(s, "SELECT id FROM t WHERE n = 7") is None
    await gate.execute(s, "BEGIN")
    assert await gate.execute_wire(s, "SELECT id FROM t WHERE k = :k", {"k": 7}) is None
    await gate.execute(s, "ROLLBACK")
    (stats,) = [q for q in gate.query_stats() if "order by" in q.query.lower()]
    assert (stats.count, stats.rows, stats.shard_calls, stats.errors) == (1, 2, 1, 0)


async def test_clients_read_the_same_values_as_on_the_general_path(gate: Gate, port: int) -> None:
    def read() -> tuple[Any, ...]:
        conn = _connect(port)
        try:
            cur = conn.cursor()
            wire = []
            for k in (7, 8):
                cur.execute(POINT, (k,))
                wire += list(cur.fetchall())
            wire_description = cur.description
            cur.execute("BEGIN")  # inside a transaction: the general path
            general = []
            for k in (7, 8):
                cur.execute(POINT, (k,))
                general += list(cur.fetchall())
            cur.execute("ROLLBACK")
            cur.execute("SELECT id, k, v, b, d, ts, f, j, n FROM t WHERE k IN (7, 8) "
                        "ORDER BY id")  # a scatter read: the general path too
            scatter = list(cur.fetchall())
            return wire, general, scatter, wire_description
        finally:
            conn.close()

    wire, general, scatter, description = await asyncio.to_thread(read)
    assert wire == general == scatter
    assert wire[0][2] == "é ü" and wire[0][3] == b"\x00\xff'"
    assert wire[0][4] == decimal.Decimal("1.250") and wire[1][6] == -1e300
    assert wire[0][5] == datetime.datetime(2026, 1, 2, 3, 4, 5, 6000)
    # the shard's own column definitions: VARCHAR(20) in utf8mb4 is 80 bytes, DATETIME 12
    types = {d[0]: (d[1], d[3]) for d in description}
    assert types["v"] == (pymysql.constants.FIELD_TYPE.VAR_STRING, 80)
    assert types["ts"][0] == pymysql.constants.FIELD_TYPE.DATETIME


async def test_column_definitions_name_the_keyspace_not_the_shard_database(
    gate: Gate, port: int
) -> None:
    def read() -> list[tuple[str, str, str, str]]:
        conn = _connect(port)
        try:
            cur = conn.cursor()
            cur.execute("SELECT v AS value, k FROM t WHERE k = 8")
            cur.fetchall()
            # PyMySQL keeps each column definition's fields (nothing public has them)
            return [(f.db, f.table_name, f.org_table, f.name)
                    for f in cur._result.fields]
        finally:
            conn.close()

    assert await asyncio.to_thread(read) == [(b"wire", "t", "t", "value"),
                                             (b"wire", "t", "t", "k")]


async def test_prepared_statements_keep_the_binary_protocol(gate: Gate, port: int) -> None:
    def read() -> list[Any]:
        conn = mysql.connector.connect(host="127.0.0.1", port=port, user="app",
                                       database="wire", autocommit=True)
        try:
            cur = conn.cursor(prepared=True)
            cur.execute("SELECT id, v, d FROM t WHERE k = %s ORDER BY id", (7,))
            return list(cur.fetchall())
        finally:
            conn.close()

    rows = await asyncio.to_thread(read)
    assert [tuple(r) for r in rows] == [(1, "é ü", decimal.Decimal("1.250")),
                                       (2, "x%y", decimal.Decimal("-2.000"))]


async def test_table_acls_apply_to_wire_reads(gate: Gate) -> None:
    gate.guard = Guard(TableACL.from_mapping({"table_groups": [
        {"name": "all", "table_names_or_prefixes": ["%"], "readers": ["bob"],
         "writers": [], "admins": []}]}))
    s = gate.session("wire", identity=TRUSTED)
    s.identity = Identity("mallory")
    with pytest.raises(PermissionDenied):
        await gate.execute_wire(s, "SELECT v FROM t WHERE k = 8")
    s.identity = Identity("bob")
    assert await gate.execute_wire(s, "SELECT v FROM t WHERE k = 8") is not None


async def test_result_limits_apply_to_wire_reads(make_database: Callable[..., str]) -> None:
    gate = await _open(make_database, GateLimits(result_limits=ResultLimits(max_rows=20)))
    listener, port = await serve_mysql(gate, "127.0.0.1", 0)
    try:
        s = gate.session("wire", identity=TRUSTED)
        with pytest.raises(ShardgateError) as info:
            await gate.execute_wire(s, "SELECT id FROM t WHERE k = 9")  # 30 rows
        assert info.value.code is Code.RESOURCE_EXHAUSTED

        def read() -> tuple[int, list[Any]]:
            conn = _connect(port)
            try:
                cur = conn.cursor()
                with pytest.raises(pymysql.err.MySQLError) as err:
                    cur.execute("SELECT id FROM t WHERE k = 9")
                cur.execute("SELECT id FROM t WHERE k = 7 ORDER BY id")  # still serving
                return err.value.args[0], list(cur.fetchall())
            finally:
                conn.close()

        errno, rows = await asyncio.to_thread(read)
        assert errno != 0 and rows == [(1,), (2,)]
    finally:
        await listener.stop()
        await gate.close()


async def test_a_wire_read_past_the_query_timeout_is_stopped_on_the_shard(gate: Gate) -> None:
    s = gate.session("wire", identity=TRUSTED)
    await gate.execute(s, "SET query_timeout_ms = 300")
    slow = "SELECT BENCHMARK(20000000000, MD5(v)) FROM t WHERE k = 8"
    with pytest.raises(ShardgateError) as info:
        await gate.execute_wire(s, slow)
    assert info.value.code is Code.DEADLINE_EXCEEDED

    def running() -> int:
        admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        try:
            with admin.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                            "WHERE INFO LIKE 'SELECT BENCHMARK(20000000000%%'")
                return int(cur.fetchone()[0])
        finally:
            admin.close()

    for _ in range(50):
        if await asyncio.to_thread(running) == 0:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the timed-out statement still runs on the shard")
    await gate.execute(s, "SET query_timeout_ms = 0")
    assert await gate.execute_wire(s, "SELECT v FROM t WHERE k = 8") is not None


async def test_wire_reads_through_tablet_processes(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    """Production mode (``shardgate gate``: tablets in processes of their own): the
    tablet answers ExecuteWire with the shard's packets, the gate hands them on, and
    the client reads what the general path gives."""
    from tests.integration.tablet_procs import serve_with_processes

    urls = [make_database("mysql", f"wirep{i}") for i in range(2)]
    procs = await serve_with_processes(_topology(urls), tmp_path / "procs")
    try:
        gate = procs.gate
        s = gate.session("wire", identity=TRUSTED)
        await gate.execute(s, "CREATE TABLE t (id BIGINT PRIMARY KEY, k BIGINT, v VARCHAR(20),"
                              " d DECIMAL(10, 3))")
        for i, (k, v) in enumerate([(7, "é ü"), (7, "x%y"), (8, None)], start=1):
            await gate.execute(s, "INSERT INTO t (id, k, v, d) VALUES (:i, :k, :v, :d)",
                               {"i": i, "k": k, "v": v, "d": decimal.Decimal(i) / 4})
        tablet = gate.tablets[("wire", "-80")]
        assert tablet.gives_wire and gate.tablets[("wire", "80-")].gives_wire
        wire = await gate.execute_wire(s, "SELECT id, v FROM t WHERE k = :k ORDER BY id",
                                       {"k": 7})
        assert wire is not None and len(wire.rows) == 2
        listener, port = await serve_mysql(gate, "127.0.0.1", 0)
        try:
            def read() -> tuple[list[Any], list[Any], Any]:
                conn = _connect(port)
                try:
                    cur = conn.cursor()
                    cur.execute("SELECT id, k, v, d FROM t WHERE k = %s ORDER BY id", (7,))
                    point, description = list(cur.fetchall()), cur.description
                    cur.execute("SELECT id, k, v, d FROM t WHERE k IN (7) OR v IS NULL "
                                "ORDER BY id")
                    return point, list(cur.fetchall()), description
                finally:
                    conn.close()

            point, scatter, description = await asyncio.to_thread(read)
        finally:
            await listener.stop()
        assert point == scatter[:2] and len(scatter) == 3
        assert point[0][2] == "é ü" and point[1][3] == decimal.Decimal("0.500")
        assert description[2][1] == pymysql.constants.FIELD_TYPE.VAR_STRING  # the shard's
    finally:
        await procs.close()
