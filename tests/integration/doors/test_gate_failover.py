"""A client naming several gates (``grpc://gate1,gate2``) moves to the next when one is gone
(issue 35 item 4): statements within a second, a queue receiver's subscription too.

Three gates in this process over one topology (a shared topo store, SQLite shards),
each served on its own port; a gate "dies" by its gRPC server stopping (connections
closed, the port refuses) and, for queues, the gate closing (its shard lease freed).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.client.queues import QueueReceiver
from shardgate.errors import InvalidArgument, Unavailable
from shardgate.gate import Gate
from shardgate.topo.embedded import embedded_topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import MemoryTopoStore


@dataclass
class Gates:
    gates: list[Gate]
    servers: list[grpc.aio.Server]
    ports: list[int]
    stopped: set[int] = field(default_factory=set)

    @property
    def target(self) -> str:
        return "grpc://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    async def kill(self, i: int) -> None:
        """Gate ``i`` is gone: its port refuses, its connections are closed."""
        self.stopped.add(i)
        await self.servers[i].stop(None)


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Gates]:
    topology = embedded_topology(tmp_path)
    topo = TopoServer(MemoryTopoStore.seeded(topology))
    gates = [Gate.open(topology, topo=topo) for _ in range(3)]
    for g in gates:
        g.watch(interval=0.05)
    await gates[0].execute(
        gates[0].session("commerce", identity=TRUSTED),
        "CREATE QUEUE jobs (customer_id BIGINT NOT NULL, body VARCHAR(64)) "
        "SHARD BY customer_id WITH (ack_wait = 5)")
    deadline = time.monotonic() + 10
    while not all("jobs" in g.topology.keyspace("commerce").vschema["tables"] for g in gates):
        assert time.monotonic() < deadline, "the other gates did not see CREATE QUEUE"
        await asyncio.sleep(0.02)  # each gate follows the shared store (its watcher)
    served = [await serve(g, "127.0.0.1", 0) for g in gates]
    out = Gates(gates, [s for s, _ in served], [p for _, p in served])
    try:
        yield out
    finally:
        for i, server in enumerate(out.servers):
            if i not in out.stopped:
                await server.stop(None)
        for g in gates:
            await g.close()


async def test_statements_move_to_the_next_gate_within_a_second(three: Gates) -> None:
    async with GateClient(three.target, keyspace="commerce", timeout=10) as client:
        assert (await client.execute("SELECT 1")).rows == [(1,)]
        await three.kill(0)
        start = time.monotonic()
        assert (await client.execute("SELECT 2")).rows == [(2,)]  # on gate 2, not an error
        took = time.monotonic() - start
        print(f"failover to the next gate: {took * 1000:.1f} ms")
        assert took < 1.0

        # a transaction does not move: the gate that had it is gone, the call says so
        await client.execute("BEGIN")
        await client.execute("INSERT INTO jobs (customer_id, body) VALUES (900, 'x')")
        await three.kill(1)
        with pytest.raises(Unavailable) as err:
            await client.execute("INSERT INTO jobs (customer_id, body) VALUES (901, 'z')")
        if "open transaction" not in err.value.message:  # lost in flight: the next call says
            with pytest.raises(Unavailable, match="open transaction"):
                await client.execute("SELECT 1")
        assert not client.in_transaction
        assert (await client.execute(  # gate 3, a new session: the insert is not there
            "SELECT COUNT(*) FROM jobs WHERE customer_id IN (900, 901)")).rows == [(0,)]

        await three.kill(2)  # no gate left: UNAVAILABLE naming the targets
        with pytest.raises(Unavailable, match="nothing answers"):
            await client.execute("SELECT 3")


def test_a_bad_target_list_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="grpc://host:port"):
        GateClient("grpc://127.0.0.1:1,,127.0.0.1:2")
    with pytest.raises(InvalidArgument, match="bad gate target"):
        GateClient("grpc://127.0.0.1:1,nohost")


async def _enqueue(gate: Gate, n: int, first: int) -> None:
    s = gate.session("commerce", identity=TRUSTED)
    for i in range(first, first + n):
        await gate.execute(s, "INSERT INTO jobs (customer_id, body) VALUES (:c, :b)",
                           {"c": i, "b": f"job {i}"})


async def test_a_queue_receiver_moves_to_the_next_gate(three: Gates) -> None:
    """The sync receiver keeps receiving through gate 2 after gate 1 dies; nothing is lost."""
    got: list[tuple[float, str]] = []
    done = threading.Event()

    def consume() -> None:
        with QueueReceiver(three.target, keyspace="commerce", timeout=10) as rx:
            for batch in rx.receive("jobs"):
                body = [f.lower() for f in batch.fields].index("body")
                got.extend((time.monotonic(), e.values[body]) for e in batch.events)
                rx.ack(batch)
                if len({b for _, b in got}) >= 10 or done.is_set():
                    return

    consumer = asyncio.create_task(asyncio.to_thread(consume))
    try:
        await _enqueue(three.gates[0], 5, 0)
        deadline = time.monotonic() + 30
        while len(got) < 5:
            assert time.monotonic() < deadline, f"got {got}"
            await asyncio.sleep(0.02)
        await three.kill(0)
        await three.gates[0].close()  # its tablet's shard lease goes with it
        killed = time.monotonic()
        await _enqueue(three.gates[1], 5, 5)
        await asyncio.wait_for(consumer, 30)
    finally:
        done.set()
    bodies = {b for _, b in got}
    assert bodies == {f"job {i}" for i in range(10)}
    after = [t - killed for t, b in got if int(b.split()[1]) >= 5]
    print(f"receiver fed through the next gate {min(after):.2f} s after the kill "
          f"(median {statistics.median(after):.2f} s)")
