"""Pinned tables, routing rules, require_explicit_routing, authoritative columns and a
``lookup_hash_unique`` vindex on real shards (SQLite files, PostgreSQL, MariaDB).

Placement is read directly from each shard's database: a pinned table's rows sit on
the one shard whose key range holds the pin, and nowhere else; the lookup table
holds the uint64 the row's ``hash`` keyspace id unhashes to (the id itself).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology

from ..conftest import gate_for

APP_VSCHEMA = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "email_idx": {"type": "lookup_hash_unique", "owner": "users",
                      "params": {"table": "lk.email_idx", "from": "email", "to": "uid"}},
    },
    "tables": {
        "users": {"columnVindexes": [{"column": "id", "name": "hash"},
                                     {"column": "email", "name": "email_idx"}],
                  "columns": [{"name": "id"}, {"name": "email"}],
                  "columnListAuthoritative": True},
        "settings": {"pinned": "c0"},
    },
}


async def direct(url: str, sql: str) -> list[tuple[Any, ...]]:
    backend = open_backend(url)
    try:
        return list((await backend.execute(sql)).rows)
    finally:
        await backend.close()


def topology(kind: str) -> Callable[[Callable[..., str]], Topology]:
    def make(make_database: Callable[..., str]) -> Topology:
        shards = {kr.name: make_database(kind, f"a{i}")
                  for i, kr in enumerate(KeyRange().split(4))}
        return Topology.from_dict({
            "default_keyspace": "app",
            "keyspaces": {
                "app": {"shards": shards, "vschema": APP_VSCHEMA},
                "lk": {"shards": {"0": make_database(kind, "lk")},
                       "vschema": {"sharded": False, "requireExplicitRouting": True}},
            },
            "routing_rules": {"rules": [
                {"from_table": "app.old_users", "to_tables": ["app.users"]},
                {"from_table": "app.gone", "to_tables": []}]},
        })
    return make


@pytest.fixture
async def gate_topo(
    backend_kind: str, tablets: str, make_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[Gate, Topology]]:
    async with gate_for(backend_kind, tablets, topology(backend_kind), make_database,
                        request, shape="features") as gate:
        s = gate.session(identity=TRUSTED)
        await gate.execute(s, "CREATE TABLE users (id BIGINT PRIMARY KEY, email VARCHAR(64))")
        await gate.execute(s, "CREATE TABLE settings (k VARCHAR(32) PRIMARY KEY, v VARCHAR(32))")
        await gate.execute(gate.session("lk", identity=TRUSTED),
                           "CREATE TABLE email_idx (email VARCHAR(64) PRIMARY KEY, uid BIGINT)")
        yield gate, gate.topology


async def test_pinned_rows_live_on_the_shard_of_the_pin(
    gate_topo: tuple[Gate, Topology],
) -> None:
    gate, topo = gate_topo
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO settings (k, v) VALUES ('a', '1'), ('b', '2')")
    await gate.execute(s, "UPDATE settings SET v = '3' WHERE k = 'b'")
    placed = {sh.name: await direct(sh.url, "SELECT k, v FROM settings ORDER BY k")
              for sh in topo.keyspace("app").shards}
    assert placed == {"-40": [], "40-80": [], "80-c0": [], "c0-": [("a", "1"), ("b", "3")]}
    r = await gate.execute(s, "SELECT v FROM settings WHERE k = 'b'")
    assert r.rows == [("3",)]
    await gate.execute(s, "DELETE FROM settings WHERE k = 'a'")
    assert await direct(topo.keyspace("app").shard("c0-").url, "SELECT k FROM settings") == [
        ("b",)
    ]


async def test_lookup_hash_rules_and_authoritative_columns(
    gate_topo: tuple[Gate, Topology],
) -> None:
    gate, topo = gate_topo
    s = gate.session(identity=TRUSTED)
    # No column list: the VSchema's authoritative columns (id, email) are used.
    await gate.execute(s, "INSERT INTO users VALUES (1, 'a@x'), (2, 'b@x'), (77, 'c@x')")
    lk_url = topo.keyspace("lk").shard("0").url
    # lookup_hash_unique stores the number the hash keyspace id unhashes to: the id.
    assert await direct(lk_url, "SELECT email, uid FROM email_idx ORDER BY email") == [
        ("a@x", 1), ("b@x", 2), ("c@x", 77)
    ]
    r = await gate.execute(s, "SELECT id FROM users WHERE email = 'c@x'")
    assert r.rows == [(77,)]
    plan = gate.plan("SELECT id FROM users WHERE email = 'c@x'", "app")
    assert not isinstance(plan, str)
    assert plan.instructions.describe()["Variant"] == "EqualUnique"
    # Routing rule: old_users is users; gone is disabled.
    r = await gate.execute(s, "SELECT old_users.id FROM old_users WHERE old_users.id = 2")
    assert r.rows == [(2,)]
    with pytest.raises(ShardgateError) as err:
        await gate.execute(s, "SELECT * FROM gone")
    assert err.value.code is Code.FAILED_PRECONDITION
    # lk requires explicit routing: email_idx is not found unqualified from app...
    with pytest.raises(ShardgateError) as err:
        await gate.execute(s, "SELECT * FROM email_idx")
    assert err.value.code is Code.NOT_FOUND
    # ...but is qualified.
    r = await gate.execute(s, "SELECT COUNT(*) FROM lk.email_idx")
    assert r.rows == [(3,)]
