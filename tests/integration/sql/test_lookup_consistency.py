"""Lookup tables stay exactly consistent with their owner tables.

A seeded random sequence of inserts, updates and deletes (some in explicit
transactions, some rolled back, some failing on a unique lookup) runs through
the gate; afterwards the owner rows and the lookup rows are read directly from
every shard database and compared: each ``lookup``/``lookup_unique`` holds
exactly one row ``value -> keyspace id`` per owner row (NULLs skipped where
``ignore_nulls``).

``consistent_lookup_unique`` is exact in the other direction only, by design
(Vitess's consistent lookup): its "pre" insert commits before the owner's
transaction so no two-phase commit is needed, and an owner transaction that
then rolls back leaves an *orphan* row, which the next writer of that value
takes over. So: every owner row has its lookup row, and every extra lookup
row is an orphan (no owner row holds that value).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from Crypto.Cipher import DES

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import Code, ShardgateError
from shardgate.keys import KeyRange
from shardgate.topo import Topology

from ..conftest import gate_for

_DES = DES.new(bytes(8), DES.MODE_ECB)

VSCHEMA = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "email_idx": {"type": "lookup_unique", "owner": "account",
                      "params": {"table": "lk.email_idx", "from": "email", "to": "ksid"}},
        "name_idx": {"type": "lookup", "owner": "account",
                     "params": {"table": "lk.name_idx", "from": "name", "to": "ksid",
                                "ignore_nulls": "true"}},
        "phone_idx": {"type": "consistent_lookup_unique", "owner": "account",
                      "params": {"table": "lk.phone_idx", "from": "phone", "to": "ksid"}},
    },
    "tables": {"account": {"column_vindexes": [
        {"column": "id", "name": "hash"},
        {"column": "email", "name": "email_idx"},
        {"column": "name", "name": "name_idx"},
        {"column": "phone", "name": "phone_idx"},
    ]}},
}

DDL = ["CREATE TABLE account (id BIGINT PRIMARY KEY, email VARCHAR(64) NOT NULL, "
       "name VARCHAR(64), phone VARCHAR(32) NOT NULL)"]
LOOKUP_DDL = [
    "CREATE TABLE email_idx (email VARCHAR(64) PRIMARY KEY, ksid VARBINARY(8) NOT NULL)",
    "CREATE TABLE name_idx (name VARCHAR(64) NOT NULL, ksid VARBINARY(8) NOT NULL, "
    "PRIMARY KEY (name, ksid))",
    "CREATE TABLE phone_idx (phone VARCHAR(32) PRIMARY KEY, ksid VARBINARY(8) NOT NULL)",
]


async def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    backend = open_backend(url)
    try:
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                for r in (await backend.execute(sql)).rows]
    finally:
        await backend.close()


def topology(kind: str) -> Callable[[Callable[..., str]], Topology]:
    def make(make_database: Callable[..., str]) -> Topology:
        shards = {kr.name: make_database(kind, f"a{i}")
                  for i, kr in enumerate(KeyRange().split(4))}
        return Topology.from_dict({"keyspaces": {
            "app": {"shards": shards, "vschema": VSCHEMA},
            "lk": {"shards": {"0": make_database(kind, "lk")}, "vschema": {"sharded": False}},
        }, "default_keyspace": "app"})
    return make


async def test_random_dml_keeps_lookups_consistent(
    backend_kind: str, tablets: str, make_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> None:
    stack = AsyncExitStack()
    gate = await stack.enter_async_context(gate_for(
        backend_kind, tablets, topology(backend_kind), make_database, request,
        shape="lookups"))
    keyspaces = gate.topology.keyspaces
    shards = {shard.name: shard.url for shard in keyspaces["app"].shards}
    lk_url = keyspaces["lk"].shards[0].url
    try:
        s = gate.session(identity=TRUSTED)
        for ddl in DDL:
            await gate.execute(s, ddl)
        for ddl in LOOKUP_DDL:
            await gate.execute(gate.session("lk", identity=TRUSTED), ddl)
        rng = random.Random(7)
        ids: set[int] = set()
        duplicates = 0
        names = ["ann", "bob", "cy", None]
        for step in range(160):
            op = rng.random()
            in_tx = rng.random() < 0.25
            if in_tx:
                await gate.execute(s, "BEGIN")
            try:
                if op < 0.45 or not ids:
                    i = rng.randrange(1, 400)
                    await gate.execute(
                        s, "INSERT INTO account (id, email, name, phone) VALUES (:i, :e, :n, :p)",
                        {"i": i, "e": f"e{rng.randrange(60)}@x", "n": rng.choice(names),
                         "p": f"p{rng.randrange(60)}"})
                elif op < 0.65:
                    i = rng.choice(sorted(ids))
                    await gate.execute(s, "UPDATE account SET email = :e, name = :n WHERE id = :i",
                                       {"e": f"e{rng.randrange(60)}@x", "n": rng.choice(names),
                                        "i": i})
                elif op < 0.75:
                    await gate.execute(s, "UPDATE account SET phone = :p WHERE id = :i",
                                       {"p": f"p{rng.randrange(60)}", "i": rng.choice(sorted(ids))})
                elif op < 0.9:
                    await gate.execute(s, "DELETE FROM account WHERE id = :i",
                                       {"i": rng.choice(sorted(ids))})
                else:
                    await gate.execute(s, "DELETE FROM account WHERE name = :n",
                                       {"n": rng.choice(names[:3])})
            except ShardgateError as exc:
                assert exc.code is Code.ALREADY_EXISTS, exc
                duplicates += 1
            if in_tx and s.in_transaction:
                await gate.execute(s, "ROLLBACK" if rng.random() < 0.3 else "COMMIT")
            # track the committed ids from the source of truth
            ids = {r[0] for r in (await gate.execute(s, "SELECT id FROM account")).rows}
            if step % 40 == 39 or step == 159:
                await check_consistent(shards, lk_url)
        assert duplicates > 0  # the sequence did exercise unique-lookup conflicts
        assert len(ids) > 10
    finally:
        await stack.aclose()


async def check_consistent(shards: dict[str, str], lk_url: str) -> None:
    owners: list[tuple[Any, ...]] = []
    for url in shards.values():
        owners += await rows(url, "SELECT id, email, name, phone FROM account")
    def ksid(i: int) -> bytes:
        return _DES.encrypt(int(i).to_bytes(8, "big"))
    want_email = sorted((e, ksid(i)) for i, e, _n, _p in owners)
    want_name = sorted((n, ksid(i)) for i, _e, n, _p in owners if n is not None)
    want_phone = {(p, ksid(i)) for i, _e, _n, p in owners}
    assert sorted(await rows(lk_url, "SELECT email, ksid FROM email_idx")) == want_email
    assert sorted(await rows(lk_url, "SELECT name, ksid FROM name_idx")) == want_name
    phones = set(await rows(lk_url, "SELECT phone, ksid FROM phone_idx"))
    assert want_phone <= phones, f"missing consistent lookup rows: {want_phone - phones}"
    owned_values = {p for p, _k in want_phone}
    orphans = phones - want_phone
    assert all(p not in owned_values for p, _k in orphans), orphans
