"""Queue receivers over a real gRPC gate: the async client and the synchronous one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.client.queues import QueueReceiver
from shardgate.gate import Gate
from shardgate.topo.embedded import embedded_topology
from tests.integration.conftest import close_cluster, open_cluster_on


@pytest.fixture
async def served(
    tablets: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Gate, str]]:
    cluster = None
    if tablets == "processes":
        cluster = await open_cluster_on(request.getfixturevalue("commerce_tablets"))
        gate = cluster.gate
    else:
        gate = Gate.open(embedded_topology(tmp_path))
    try:
        await gate.execute(
            gate.session("commerce", identity=TRUSTED),
            "CREATE QUEUE jobs (customer_id BIGINT NOT NULL, body VARCHAR(64)) "
            "SHARD BY customer_id WITH (ack_wait = 5)",
        )
        server, port = await serve(gate, "127.0.0.1", 0)
        try:
            yield gate, f"grpc://127.0.0.1:{port}"
        finally:
            await server.stop(None)
    finally:
        if cluster is not None:
            await close_cluster(cluster)
        else:
            await gate.close()


async def enqueue(gate: Gate, n: int) -> None:
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    for i in range(n):
        await gate.execute(s, "INSERT INTO jobs (customer_id, body) VALUES (:c, :b)",
                           {"c": i, "b": f"job {i}"})
    await gate.execute(s, "COMMIT")


async def test_async_receive_and_ack(served: tuple[Gate, str]) -> None:
    gate, target = served
    await enqueue(gate, 12)
    got: list[str] = []
    async with GateClient(target, keyspace="commerce") as client:

        async def run() -> None:
            async for batch in client.receive("jobs"):
                body = [f.lower() for f in batch.fields].index("body")
                got.extend(e.values[body] for e in batch.events)
                await client.ack(batch)
                if len(got) >= 12:
                    return

        await asyncio.wait_for(run(), 30)
    assert sorted(got) == sorted(f"job {i}" for i in range(12))
    r = await gate.execute(gate.session("commerce", identity=TRUSTED),
                           "SELECT COUNT(*) FROM jobs WHERE state = 'acked'")
    assert r.rows == [(12,)]


async def test_sync_receiver(served: tuple[Gate, str]) -> None:
    gate, target = served
    await enqueue(gate, 8)

    def consume() -> list[str]:
        out: list[str] = []
        with QueueReceiver(target, keyspace="commerce", timeout=30) as rx:
            for batch in rx.receive("jobs"):
                body = [f.lower() for f in batch.fields].index("body")
                out.extend(e.values[body] for e in batch.events)
                assert rx.ack(batch) == len(batch.events)
                if len(out) >= 8:
                    break
        return out

    got = await asyncio.wait_for(asyncio.to_thread(consume), 60)
    assert sorted(got) == sorted(f"job {i}" for i in range(8))
    r = await gate.execute(gate.session("commerce", identity=TRUSTED),
                           "SELECT COUNT(*) FROM jobs WHERE state = 'acked'")
    assert r.rows == [(8,)]
