"""``CREATE TABLE ... AS SELECT`` run by the gate: into an auto-sharded keyspace and
across keyspaces, on SQLite, PostgreSQL and MariaDB shards."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from contextlib import AsyncExitStack

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.topo import Topology

from ..conftest import gate_for


def topology(kind: str, make_database: Callable[..., str]) -> Topology:
    return Topology.from_dict({"default_keyspace": "main", "keyspaces": {
        "main": {"shards": {"-80": make_database(kind, "ctas_a"),
                            "80-": make_database(kind, "ctas_b")},
                 "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                             "auto_shard": {"vindex": "hash"}, "tables": {}}},
        "other": {"shards": {"0": make_database(kind, "ctas_o")},
                  "vschema": {"sharded": False, "tables": {}}}}})


async def shard_counts(g: Gate, table: str) -> list[int]:
    counts = []
    for shard in ("-80", "80-"):
        s = g.session(identity=TRUSTED)
        await g.execute(s, f"USE `main:{shard}`")
        counts.append((await g.execute(s, f"SELECT COUNT(*) FROM {table}")).rows[0][0])
    return counts


async def test_create_table_as_select(backend_kind: str, tablets: str,
                                      make_database: Callable[..., str],
                                      request: pytest.FixtureRequest) -> None:
    stack = AsyncExitStack()
    g = await stack.enter_async_context(gate_for(
        backend_kind, tablets, lambda make: topology(backend_kind, make), make_database,
        request, shape="ctas"))
    try:
        s = g.session("main", identity=TRUSTED)
        await g.execute(s, "CREATE TABLE src (id INT PRIMARY KEY, name VARCHAR(50), "
                           "price DECIMAL(10, 2))")
        for i in range(1, 21):
            await g.execute(s, "INSERT INTO src (id, name, price) VALUES (:i, :n, :p)",
                            {"i": i, "n": f"n{i}", "p": i + 0.25})
        # into the sharded keyspace: auto_shard on its first column, rows routed
        await g.execute(s, "CREATE TABLE dest AS SELECT id, name FROM src WHERE id > :m",
                        {"m": 4})
        dest = g.vschema.keyspace("main").tables["dest"].primary
        assert dest is not None and dest.columns == ("id",)
        rows = (await g.execute(s, "SELECT id, name FROM dest ORDER BY id")).rows
        assert rows == [(i, f"n{i}") for i in range(5, 21)]
        counts = await shard_counts(g, "dest")
        assert sum(counts) == 16 and min(counts) > 0
        # the declared types came along (the catalog reports them in MySQL's terms)
        [info] = await g.catalog("main", "dest")
        types = {c.name: c.data_type for c in info.columns}
        assert types["id"] in ("int", "integer", "bigint") and "char" in types["name"]
        # from the sharded keyspace into the unsharded one, with computed columns
        await g.execute(s, "CREATE TABLE other.summary AS SELECT COUNT(*) AS n, "
                           "SUM(price) AS total, MAX(name) AS top FROM src")
        rows = (await g.execute(s, "SELECT n, total, top FROM other.summary")).rows
        assert [(int(n), decimal.Decimal(str(t)), top) for n, t, top in rows] == [
            (20, decimal.Decimal("215.00"), "n9")]
        # IF NOT EXISTS: nothing more
        await g.execute(s, "CREATE TABLE IF NOT EXISTS dest AS SELECT id, name FROM src")
        assert (await g.execute(s, "SELECT COUNT(*) FROM dest")).rows == [(16,)]
        # into the unsharded keyspace from the session's (unqualified source)
        await g.execute(s, "CREATE TABLE other.few AS SELECT id, name FROM src WHERE id < 3")
        assert (await g.execute(s, "SELECT id, name FROM other.few ORDER BY id")).rows == [
            (1, "n1"), (2, "n2")]
        # explicit definitions, and a sharded table from the unsharded keyspace
        await g.execute(s, "CREATE TABLE other.base (k INT, label VARCHAR(10))")
        await g.execute(s, "INSERT INTO other.base (k, label) VALUES (1, 'a'), (2, 'b')")
        await g.execute(s, "CREATE TABLE copied (k BIGINT PRIMARY KEY, note TEXT) "
                           "AS SELECT k, label FROM other.base")
        assert (await g.execute(s, "SELECT k, note, label FROM copied ORDER BY k")).rows == [
            (1, None, "a"), (2, None, "b")]
        # a row that cannot be routed: the table is not left behind
        await g.execute(s, "CREATE TABLE other.holes (k INT)")
        await g.execute(s, "INSERT INTO other.holes (k) VALUES (NULL)")
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, "CREATE TABLE nulls AS SELECT k FROM other.holes")
        assert err.value.code is Code.INVALID_ARGUMENT
        assert "nulls" not in g.vschema.keyspace("main").tables
        assert await g.catalog("main", "nulls") == []
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, "CREATE TABLE twice AS SELECT id, id FROM src")
        assert err.value.code is Code.INVALID_ARGUMENT and "twice" in err.value.message
    finally:
        await stack.aclose()


def test_types_from_values() -> None:
    from shardgate.gate.create_select import type_of_values

    def t(values: list[object]) -> str:
        return type_of_values(values).sql(dialect="mysql")

    assert t([1, None, 2]) == "BIGINT"
    assert t([1, 2.5]) == "DOUBLE"
    assert t([decimal.Decimal("1.25"), 3]) == "DECIMAL(65, 2)"
    assert t(["a", None]) == "VARCHAR(255)"
    assert t(["x" * 300]) == "LONGTEXT"
    assert t([b"\x00"]) == "LONGBLOB"
    assert t([datetime.datetime(2024, 1, 2, 3, 4, 5)]) == "DATETIME"
    assert t([datetime.datetime(2024, 1, 2, 3, 4, 5, 6)]) == "DATETIME(6)"
    assert t([datetime.date(2024, 1, 2)]) == "DATE"
    assert t([None, None]) == "TEXT"
    assert t([True]) == "BOOLEAN"
