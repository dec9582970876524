"""GateClient's session stream (issue 31): statements on one long-lived ``Session`` call give
the same answers, errors and ACL refusals as unary ``Execute`` calls; a real grpc.aio server
on 127.0.0.1 in front of a gate on SQLite shards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ServerSecurity
from shardgate.api.grpc.server import serve
from shardgate.auth import StaticUsers
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED
from shardgate.errors import ShardgateError, Unauthenticated, Unavailable
from shardgate.gate import Gate
from shardgate.topo.embedded import embedded_topology

from .test_grpc import set_up_embedded

USERS = {"alice": [{"Password": "alice-pw"}], "bob": [{"Password": "bob-pw"}]}
ACL = {"table_groups": [
    {"name": "orders", "table_names_or_prefixes": ["corder"], "writers": ["alice"]},
    {"name": "the rest", "table_names_or_prefixes": ["%"], "readers": ["bob"],
     "writers": ["alice"]},
]}

#: statements answered with results and with errors, in one session, in order
STATEMENTS = [
    "INSERT INTO customer (customer_id, email, name) VALUES (1, 'a@x', 'a')",
    "SELECT customer_id, email FROM customer WHERE customer_id = 1",
    "SELECT nope FROM customer WHERE customer_id = 1",
    "INSERT INTO customer (customer_id, email, name) VALUES (1, 'a@x', 'a')",
    "SELEKT 1",
    "BEGIN",
    "INSERT INTO customer (customer_id, email, name) VALUES (2, 'b@x', 'b')",
    "SELECT count(*) FROM customer",
    "ROLLBACK",
    "SELECT count(*) FROM customer",
    "USE nosuchkeyspace",
    "SELECT count(*) FROM corder",
]


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[Gate]:
    g = Gate.open(embedded_topology(tmp_path))
    try:
        await set_up_embedded(g)
        yield g
    finally:
        await g.close()


async def _answers(client: GateClient, gate: Gate) -> list[tuple[object, ...]]:
    """Each statement's outcome (rows / affected, or the error's class, code, message)
    and the session's transaction state after it."""
    out: list[tuple[object, ...]] = []
    for sql in STATEMENTS:
        try:
            r = await client.execute(sql)
            outcome: tuple[object, ...] = ("ok", [tuple(row) for row in r.rows],
                                           r.rows_affected)
        except ShardgateError as exc:
            outcome = ("error", type(exc).__name__, exc.code, exc.message)
        out.append((sql, outcome, client.in_transaction))
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, "DELETE FROM customer")
    return out


async def test_stream_answers_as_unary_execute(gate: Gate) -> None:
    server, port = await serve(gate, "127.0.0.1", 0)
    try:
        target = f"grpc://127.0.0.1:{port}"
        async with GateClient(target, keyspace="commerce", timeout=30) as streamed:
            on_stream = await _answers(streamed, gate)
            assert streamed._stream is not None
            assert streamed._stream._call is not None  # the statements went on the stream
        async with GateClient(target, keyspace="commerce", timeout=30) as unary:
            unary._stream = None  # the unary Execute path, for comparison
            on_unary = await _answers(unary, gate)
        assert on_stream == on_unary
        assert [o[1][0] for o in on_stream].count("error") == 4
    finally:
        await server.stop(None)


async def test_concurrent_statements_of_one_client(gate: Gate) -> None:
    server, port = await serve(gate, "127.0.0.1", 0)
    try:
        async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="commerce",
                              timeout=30) as c:
            await c.execute("INSERT INTO customer (customer_id, email, name) "
                            "VALUES (7, 'g@x', 'g')")
            results = await asyncio.gather(*(
                c.execute("SELECT customer_id FROM customer WHERE customer_id = :i", {"i": 7})
                for _ in range(8)))
            assert [[tuple(row) for row in r.rows] for r in results] == [[(7,)]] * 8
            # the stream is still in step: the next answer is this statement's
            r = await c.execute("SELECT email FROM customer WHERE customer_id = 7")
            assert [tuple(row) for row in r.rows] == [("g@x",)]
    finally:
        await server.stop(None)


async def test_stream_checks_each_statement(gate: Gate) -> None:
    gate.guard = Guard(TableACL.from_mapping(ACL))
    server, port = await serve(gate, "127.0.0.1", 0, no_auth=False,
                               security=ServerSecurity(users=StaticUsers.from_mapping(USERS)))
    target = f"grpc://127.0.0.1:{port}"
    try:
        async with GateClient(target, keyspace="commerce", user="alice", password="alice-pw",
                              timeout=30) as alice:
            await alice.execute("INSERT INTO corder (order_id, customer_id, sku, price) "
                                "VALUES (1, 1, 'secret', 5)")
        async with GateClient(target, keyspace="commerce", user="bob", password="bob-pw",
                              timeout=30) as bob:
            assert (await bob.execute("SELECT count(*) FROM customer")).rows[0][0] == 0
            for sql in ("SELECT * FROM corder", "INSERT INTO customer (customer_id, email, "
                        "name) VALUES (9, 'x', 'y')"):
                with pytest.raises(ShardgateError) as refused:
                    await bob.execute(sql)
                assert refused.value.code.name == "PERMISSION_DENIED"
            # the same stream goes on answering what bob may do
            assert (await bob.execute("SELECT count(*) FROM customer")).rows[0][0] == 0
            assert bob._stream is not None and bob._stream._call is not None
        async with GateClient(target, keyspace="commerce", user="bob", password="nope",
                              timeout=30) as wrong:
            with pytest.raises(Unauthenticated):
                await wrong.execute("SELECT count(*) FROM customer")
    finally:
        await server.stop(None)


async def test_stopping_gate_ends_idle_streams_at_once(gate: Gate) -> None:
    server, port = await serve(gate, "127.0.0.1", 0)
    async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="commerce", timeout=30) as c:
        await c.execute("SELECT count(*) FROM customer")
        started = time.monotonic()
        await server.stop(5.0)  # an idle session stream does not hold the grace period
        assert time.monotonic() - started < 3.0
        with pytest.raises(Unavailable):
            await c.execute("SELECT count(*) FROM customer")
