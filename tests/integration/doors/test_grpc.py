"""The gate over gRPC: a real grpc.aio server on 127.0.0.1 and GateClient, on SQLite shards."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.errors import (
    AlreadyExists,
    Code,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from shardgate.gate import Gate
from shardgate.topo.embedded import COMMERCE_DDL, LOOKUP_DDL, SEQUENCE_ROWS, embedded_topology


@dataclass
class Served:
    gate: Gate
    target: str


async def set_up_embedded(gate: Gate) -> None:
    """Tables of the default cluster and its sequence rows."""
    s = gate.session("commerce", identity=TRUSTED)
    for ddl in COMMERCE_DDL:
        await gate.execute(s, ddl)
    ls = gate.session("lookup", identity=TRUSTED)
    for ddl in LOOKUP_DDL:
        await gate.execute(ls, ddl)
    for seq in SEQUENCE_ROWS:
        await gate.execute(ls, f"INSERT INTO {seq} (id, next_id, cache) VALUES (0, 1, 1000)")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    gate = Gate.open(embedded_topology(tmp_path))
    try:
        await set_up_embedded(gate)
        server, port = await serve(gate, "127.0.0.1", 0)
        try:
            yield Served(gate, f"grpc://127.0.0.1:{port}")
        finally:
            await server.stop(None)
    finally:
        await gate.close()


@pytest.fixture
async def client(served: Served) -> AsyncIterator[GateClient]:
    async with GateClient(served.target, timeout=30) as c:
        yield c


async def insert_customers(c: GateClient, n: int, prefix: str = "u") -> None:
    for i in range(n):
        await c.execute(
            "INSERT INTO customer (email, name) VALUES (:e, :n)",
            {"e": f"{prefix}{i}@x", "n": f"user {i}"},
        )


async def test_execute_with_bind_vars_and_sequence_ids(client: GateClient) -> None:
    r = await client.execute(
        "INSERT INTO customer (email, name) VALUES (:e, :n)", {"e": "a@x", "n": "A"}
    )
    assert (r.rows_affected, r.insert_id) == (1, 1)
    assert client.session_id != 0
    r = await client.execute("INSERT INTO customer (email, name) VALUES ('b@x', NULL)")
    assert r.insert_id == 2
    r = await client.execute(
        "SELECT customer_id, email, name FROM customer WHERE customer_id = :id", {"id": 2}
    )
    assert r.fields == ["customer_id", "email", "name"]
    assert r.rows == [(2, "b@x", None)]
    assert r.insert_id is None
    r = await client.execute("SELECT customer_id FROM customer WHERE email = :e", {"e": "a@x"})
    assert r.rows == [(1,)]


async def test_binary_values_survive(client: GateClient) -> None:
    await client.execute(
        "INSERT INTO corder (customer_id, sku, price) VALUES (:c, :s, :p)",
        {"c": 5, "s": b"\x00\xffsku", "p": 2**62},
    )
    r = await client.execute("SELECT sku, price FROM corder WHERE customer_id = 5")
    assert r.rows == [(b"\x00\xffsku", 2**62)]


async def test_stream_execute_of_a_scatter(client: GateClient) -> None:
    await insert_customers(client, 24)
    chunks = [c async for c in client.stream_execute("SELECT customer_id FROM customer")]
    assert len(chunks) > 1  # one per shard with rows: it really streamed
    assert chunks[0].fields == ["customer_id"]
    assert all(c.fields == [] for c in chunks[1:])
    ids = sorted(row[0] for c in chunks for row in c.rows)
    assert ids == list(range(1, 25))


async def test_abandoned_stream_leaves_the_session_usable(client: GateClient) -> None:
    await insert_customers(client, 12)
    stream = client.stream_execute("SELECT customer_id FROM customer")
    async for _ in stream:
        break
    await stream.aclose()
    r = await client.execute("SELECT customer_id FROM customer WHERE customer_id = 3")
    assert r.rows == [(3,)]


async def test_rollback_leaves_nothing(served: Served, client: GateClient) -> None:
    await client.execute("BEGIN")
    await client.execute("INSERT INTO customer (email, name) VALUES ('tx@x', 'T')")
    inside = await client.execute("SELECT email FROM customer WHERE email = 'tx@x'")
    assert inside.rows == [("tx@x",)]
    await client.execute("ROLLBACK")
    r = await client.execute("SELECT email FROM customer WHERE email = 'tx@x'")
    assert r.rows == []
    async with GateClient(served.target, keyspace="lookup") as other:
        r = await other.execute("SELECT email FROM customer_email_idx")
        assert r.rows == []


async def test_commit_is_seen_by_another_session(served: Served, client: GateClient) -> None:
    await client.execute("BEGIN")
    await client.execute("INSERT INTO customer (email, name) VALUES ('c@x', 'C')")
    await client.execute("COMMIT")
    async with GateClient(served.target) as other:
        r = await other.execute("SELECT name FROM customer WHERE email = 'c@x'")
        assert r.rows == [("C",)]


async def test_sessions_keep_their_keyspace(served: Served) -> None:
    async with GateClient(served.target) as c:
        await c.execute("USE lookup")
        r = await c.execute("SELECT next_id FROM customer_seq WHERE id = 0")
        assert r.fields == ["next_id"]
    async with GateClient(served.target, keyspace="lookup") as c:
        plan = await c.explain("SELECT * FROM customer_email_idx")
        assert plan["Instructions"]["Keyspace"]["Name"] == "lookup"


async def test_closing_a_client_rolls_back_its_transaction(served: Served) -> None:
    c = GateClient(served.target)
    await c.execute("BEGIN")
    await c.execute("INSERT INTO customer (customer_id, email, name) VALUES (77, 'z@x', 'Z')")
    await c.close()
    async with GateClient(served.target) as other:
        r = await other.execute("SELECT * FROM customer WHERE customer_id = 77")
        assert r.rows == []
        # the shard is not left locked by the abandoned transaction
        await other.execute(
            "INSERT INTO customer (customer_id, email, name) VALUES (77, 'z@x', 'Z')"
        )


async def test_explain(client: GateClient) -> None:
    plan = await client.explain("SELECT * FROM customer WHERE customer_id = 1")
    assert plan["Instructions"]["Variant"] == "EqualUnique"
    assert plan["Instructions"]["Vindex"] == "hash"


async def test_error_codes_arrive_intact(client: GateClient) -> None:
    with pytest.raises(InvalidArgument) as bad_sql:
        await client.execute("SELECT * FROM customer WHERE")
    assert bad_sql.value.code is Code.INVALID_ARGUMENT
    assert "syntax error" in bad_sql.value.message

    with pytest.raises(NotFound) as unknown:
        await client.execute("SELECT * FROM no_such_table")
    assert unknown.value.code is Code.NOT_FOUND
    assert "no_such_table" in unknown.value.message

    await client.execute("INSERT INTO customer (email, name) VALUES ('d@x', 'D')")
    with pytest.raises(AlreadyExists):
        await client.execute("INSERT INTO customer (email, name) VALUES ('d@x', 'again')")

    with pytest.raises(NotFound):
        await client.explain("SELECT * FROM no_such_table")
    # the session is still usable after errors
    r = await client.execute("SELECT name FROM customer WHERE email = 'd@x'")
    assert r.rows == [("D",)]


async def test_errors_in_streams_arrive_intact(client: GateClient) -> None:
    with pytest.raises(NotFound):
        async for _ in client.stream_execute("SELECT * FROM no_such_table"):
            pass


async def test_unknown_keyspace_and_session(served: Served) -> None:
    async with GateClient(served.target, keyspace="nope") as c:
        with pytest.raises(NotFound, match="nope"):
            await c.execute("SELECT 1")
    async with GateClient(served.target) as c:
        c.session_id = 987654321
        with pytest.raises(NotFound, match="session 987654321 expired, start a new one"):
            await c.execute("SELECT * FROM customer WHERE customer_id = 1")


async def test_bad_target_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        GateClient("http://127.0.0.1:1")


async def test_server_gone_is_unavailable(tmp_path: Path) -> None:
    gate = Gate.open(embedded_topology(tmp_path))
    try:
        server, port = await serve(gate, "127.0.0.1", 0)
        async with GateClient(f"grpc://127.0.0.1:{port}", timeout=10) as c:
            await c.execute("USE commerce")
            await server.stop(None)
            with pytest.raises(Unavailable) as gone:
                await c.execute("USE commerce")
            assert gone.value.code is Code.UNAVAILABLE
            with pytest.raises(Unavailable):
                async for _ in c.stream_execute("USE commerce"):
                    pass
    finally:
        await gate.close()


async def test_busy_port_is_refused(served: Served) -> None:
    port = int(served.target.rsplit(":", 1)[1])
    with pytest.raises(Unavailable, match="cannot listen"):
        await serve(served.gate, "127.0.0.1", port)


async def test_execute_batch_over_grpc(client: GateClient) -> None:
    out = await client.execute_batch([
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (:o, 1, 2)", {"o": 501}),
        ("SELECT nosuchcolumn FROM nosuchtable", None),
        ("SELECT order_id FROM corder WHERE customer_id = 1", None),
    ])
    assert not isinstance(out[0], Exception) and out[0].rows_affected == 1
    assert isinstance(out[1], NotFound)
    assert not isinstance(out[2], Exception) and out[2].rows == [(501,)]
    out = await client.execute_batch([
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (502, 2, 2)", None),
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (501, 1, 2)", None),
    ], as_transaction=True)
    assert isinstance(out[1], AlreadyExists)
    r = await client.execute("SELECT order_id FROM corder ORDER BY order_id")
    assert r.rows == [(501,)]
