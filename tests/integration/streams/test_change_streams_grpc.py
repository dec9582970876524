"""UpdateStream and the event-token execute options over real gRPC servers (gate and tablet).

The embedded cluster (4 SQLite shards) behind a grpc.aio server on 127.0.0.1;
the client is :class:`GateClient` / :class:`GrpcTabletClient`, as a user's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.api.grpc.tablet_service import serve_tablet
from shardgate.errors import Code, ShardgateError
from shardgate.event_token import EventToken, is_fresher
from shardgate.gate import Gate
from shardgate.result import ExecuteOptions
from shardgate.streams.merge import StreamEvent, StreamPosition
from shardgate.topo.embedded import embedded_topology
from tests.integration.doors.test_grpc import set_up_embedded

INSERT = "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:i, :i, 'x', :p)"


@pytest.fixture
async def gate_and_target(tmp_path: Path) -> AsyncIterator[tuple[Gate, str]]:
    gate = Gate.open(embedded_topology(tmp_path))
    try:
        await set_up_embedded(gate)
        for client in gate.tablets.values():  # capture on before the test writes
            await client.tablet.change_stream()  # type: ignore[attr-defined]
        server, port = await serve(gate, "127.0.0.1", 0)
        try:
            yield gate, f"grpc://127.0.0.1:{port}"
        finally:
            await server.stop(None)
    finally:
        await gate.close()


async def _take(
    events: AsyncIterator[StreamEvent], rows: int, position: StreamPosition, timeout: float = 20
) -> list[tuple[int, str]]:
    """(order_id, op) of the next ``rows`` row changes; advances ``position`` per event."""
    got: list[tuple[int, str]] = []

    async def run() -> None:
        async for ev in events:
            got.extend((int(r.pk[0]), r.op) for r in ev.rows())
            position.advance(ev)
            if len(got) >= rows:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def test_update_stream_over_grpc_delivers_and_resumes(
    gate_and_target: tuple[Gate, str],
) -> None:
    _, target = gate_and_target
    began = time.time() - 1
    async with GateClient(target, keyspace="commerce", timeout=30) as client:
        for i in range(1, 9):
            await client.execute(INSERT, {"i": i, "p": i})
        await client.execute("UPDATE corder SET price = 100 WHERE order_id = 3")
        await client.execute("DELETE FROM corder WHERE order_id = 4")

        position = StreamPosition(since=began)
        first = client.update_stream("commerce", start=began, heartbeat_s=0.2)
        got = await _take(first, 3, position)
        await first.aclose()
        # Resume from the saved position: exactly the rest, nothing twice.
        rest = client.update_stream("commerce", start=position.serialize(), heartbeat_s=0.2)
        got += await _take(rest, 10 - len(got), position)
        await rest.aclose()
    assert sorted(got) == sorted(
        [(i, "insert") for i in range(1, 9)] + [(3, "update"), (4, "delete")]
    )


async def test_update_stream_errors_over_grpc(gate_and_target: tuple[Gate, str]) -> None:
    _, target = gate_and_target
    async with GateClient(target, keyspace="commerce", timeout=30) as client:
        with pytest.raises(ShardgateError) as info:
            async for _ in client.update_stream("commerce", start="sp1.not-a-position"):
                break
        assert info.value.code is Code.INVALID_ARGUMENT
        with pytest.raises(ShardgateError) as info:
            async for _ in client.update_stream("nosuchkeyspace"):
                break
        assert info.value.code is Code.NOT_FOUND


async def test_event_token_options_over_grpc(gate_and_target: tuple[Gate, str]) -> None:
    _, target = gate_and_target
    async with GateClient(target, keyspace="commerce", timeout=30) as client:
        stream = client.update_stream("commerce", heartbeat_s=0.2)
        first = asyncio.ensure_future(stream.__anext__())  # subscribed before the write
        await asyncio.sleep(0.3)
        await client.execute(INSERT, {"i": 7, "p": 1})
        change = await first
        while not change.changes:
            change = await stream.__anext__()
        await stream.aclose()

        res = await client.execute(
            "SELECT price FROM corder WHERE customer_id = 7",
            options=ExecuteOptions(include_event_token=True, compare_event_token=change.token),
        )
        assert res.rows == [(1,)]
        assert res.event_token is not None and res.event_token.shard == change.token.shard
        assert is_fresher(res.event_token, change.token) and res.fresher is True

        future = EventToken(change.token.timestamp + 3600, change.token.shard, "0")
        res = await client.execute(
            "SELECT price FROM corder WHERE customer_id = 7",
            options=ExecuteOptions(compare_event_token=future),
        )
        assert res.fresher is False and res.event_token is None
        plain = await client.execute("SELECT price FROM corder WHERE customer_id = 7")
        assert plain.event_token is None and plain.fresher is None


async def test_event_token_options_on_a_tablet_over_grpc(
    gate_and_target: tuple[Gate, str],
) -> None:
    gate, _ = gate_and_target
    local = gate.tablets[("commerce", "-40")]
    server, port = await serve_tablet(local.tablet)  # type: ignore[attr-defined]
    remote = await GrpcTabletClient.connect(f"grpc://127.0.0.1:{port}")
    try:
        ph = remote.placeholder
        await remote.execute(
            f"INSERT INTO corder (order_id, customer_id, sku, price) VALUES ({ph}, {ph}, 'x', 5)",
            [901, 901],
        )
        # The token comes back only when exact: not while the log reader is still
        # catching up with the insert (then it is None and a reader asks again).
        deadline = time.monotonic() + 10
        while True:
            res = await remote.execute(
                f"SELECT price FROM corder WHERE order_id = {ph}", [901],
                options=ExecuteOptions(include_event_token=True),
            )
            assert res.rows == [(5,)]
            if res.event_token is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert res.event_token is not None and res.event_token.shard == "commerce/-40"
        res = await remote.execute(
            f"SELECT price FROM corder WHERE order_id = {ph}", [901],
            options=ExecuteOptions(compare_event_token=res.event_token),
        )
        assert res.fresher is True
    finally:
        await remote.close()
        await server.stop(None)
