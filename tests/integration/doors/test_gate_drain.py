"""A draining gate (SIGTERM to ``shardgate gate``; :mod:`shardgate.api.grpc.gate_drain`).

Two gates in this process over one topology (a shared topo store, SQLite shards),
each served over gRPC with its :class:`GateDrain`; gate 1 drains. Clients name gate
1 alone (session streams, no other gate to go to) or both gates (unary calls that
move on). What a client sees must be one of the retry contract's answers
(docs/production.md): statements of an open transaction go on and commit; new work
is refused ``UNAVAILABLE`` "gate draining" (not run) or goes to the other gate; a
transaction still open at the drain timeout is rolled back and its next statement
is ``ABORTED``; a queue receiver's stream ends ``UNAVAILABLE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.gate_drain import DRAINING, GateDrain
from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.errors import Aborted, Unavailable
from shardgate.gate import Gate
from shardgate.topo.embedded import COMMERCE_DDL, embedded_topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import MemoryTopoStore


@dataclass
class Two:
    gates: list[Gate]
    drains: list[GateDrain]
    servers: list[grpc.aio.Server]
    ports: list[int]

    def target(self, *which: int) -> str:
        return "grpc://" + ",".join(f"127.0.0.1:{self.ports[i]}" for i in which)

    async def orders(self, *ids: int) -> set[int]:
        """The ``corder`` rows among ``ids`` (read through gate 2)."""
        g = self.gates[1]
        found = await g.execute(g.session("commerce", identity=TRUSTED),
                                "SELECT order_id FROM corder WHERE order_id IN ::ids",
                                {"ids": list(ids)})
        return {int(r[0]) for r in found.rows}


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[Two]:
    topology = embedded_topology(tmp_path)
    topo = TopoServer(MemoryTopoStore.seeded(topology))
    gates = [Gate.open(topology, topo=topo) for _ in range(2)]
    for g in gates:
        g.watch(interval=0.05)
    setup = gates[0].session("commerce", identity=TRUSTED)
    for ddl in COMMERCE_DDL:
        await gates[0].execute(setup, ddl)
    await gates[0].execute(
        setup, "CREATE QUEUE jobs (customer_id BIGINT NOT NULL, body VARCHAR(64)) "
        "SHARD BY customer_id WITH (ack_wait = 30)")
    deadline = time.monotonic() + 10
    while not all("jobs" in g.topology.keyspace("commerce").vschema["tables"] for g in gates):
        assert time.monotonic() < deadline, "the other gate did not see CREATE QUEUE"
        await asyncio.sleep(0.02)
    drains = [GateDrain(g, f"gate {i + 1}") for i, g in enumerate(gates)]
    served = [await serve(g, "127.0.0.1", 0, drain=d) for g, d in zip(gates, drains, strict=True)]
    out = Two(gates, drains, [s for s, _ in served], [p for _, p in served])
    try:
        yield out
    finally:
        for server in out.servers:
            await server.stop(None)
        for g in gates:
            await g.close()


def _insert(order: int) -> tuple[str, dict[str, int]]:
    return ("INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:o, :c, 'x', 1)",
            {"o": order, "c": order})


async def test_open_transactions_finish_and_new_work_is_refused(two: Two) -> None:
    async with GateClient(two.target(0), keyspace="commerce", timeout=10) as alone, \
            GateClient(two.target(0, 1), keyspace="commerce", timeout=10) as both, \
            GateClient(two.target(0), keyspace="commerce", timeout=10) as idle:
        assert (await idle.execute("SELECT 1")).rows == [(1,)]  # a session, no transaction
        # (a SQLite shard takes one writer at a time: the second transaction writes later)
        await alone.execute("BEGIN")
        await alone.execute(*_insert(100))
        await both.execute("BEGIN")
        await both.execute("SELECT 1")
        drained = asyncio.create_task(two.drains[0].run(10.0))
        await asyncio.sleep(0.1)
        assert not drained.done()  # two transactions are open

        # new work on gate 1: refused, not run (a new session, and one without a transaction)
        async with GateClient(two.target(0), keyspace="commerce", timeout=10) as new:
            with pytest.raises(Unavailable, match=DRAINING):
                await new.execute(*_insert(300))
        with pytest.raises(Unavailable):  # its session stream ended between statements
            await idle.execute(*_insert(301))
        with pytest.raises(Unavailable, match=DRAINING):
            await idle.vschema()

        # the open transactions go on, on gate 1, and commit
        await alone.execute(*_insert(101))
        await alone.execute("COMMIT")
        for order in (200, 201):
            await both.execute(*_insert(order))
        assert both.in_transaction
        await both.execute("COMMIT")
        report = await asyncio.wait_for(drained, 5)
        assert (report.open_at_start, report.ended) == (2, 0)
        assert report.seconds < 5

        # after its transaction, the client naming both gates goes on on gate 2, unharmed
        await both.execute(*_insert(202))
        assert both._gates.current == two.target(1)
        with pytest.raises(Unavailable, match=DRAINING):  # gate 1 alone: still refused
            await alone.execute(*_insert(102))
    assert await two.orders(100, 101, 200, 201, 202, 102, 300, 301) == {100, 101, 200, 201, 202}


async def test_transactions_open_at_the_timeout_are_rolled_back_aborted(two: Two) -> None:
    async with GateClient(two.target(0), keyspace="commerce", timeout=10) as alone, \
            GateClient(two.target(0, 1), keyspace="commerce", timeout=10) as both:
        await alone.execute("BEGIN")
        await alone.execute(*_insert(400))
        await both.execute("BEGIN")
        await both.execute("SELECT 1")
        began = time.monotonic()
        report = await two.drains[0].run(0.3)
        assert time.monotonic() - began < 2
        assert (report.open_at_start, report.ended) == (2, 2)
        for client, first in ((alone, 400), (both, 500)):
            with pytest.raises(Aborted, match="shutting down"):
                await client.execute(*_insert(first + 1))
        # the retry contract: ROLLBACK (its error ignored), the transaction again
        with pytest.raises(Unavailable, match=DRAINING):
            await alone.execute("ROLLBACK")
        with contextlib.suppress(Unavailable):  # refused by gate 1; on gate 2 at most
            await both.execute("ROLLBACK")    # "gone, with the open transaction"
        await both.execute("BEGIN")
        await both.execute(*_insert(502))
        await both.execute("COMMIT")
    assert await two.orders(400, 401, 501, 502) == {502}


async def test_queue_receivers_end_unavailable_and_move_on(two: Two) -> None:
    async with GateClient(two.target(0), keyspace="commerce", timeout=10) as alone, \
            GateClient(two.target(0, 1), keyspace="commerce", timeout=10) as both:
        streams = [alone.receive("jobs"), both.receive("jobs")]
        waiting = [asyncio.ensure_future(anext(s)) for s in streams]
        try:
            await asyncio.sleep(0.3)  # both subscribed on gate 1 (no event to receive)
            assert not any(w.done() for w in waiting)
            two.drains[0].start()
            with pytest.raises(Unavailable, match=DRAINING):
                await asyncio.wait_for(waiting[0], 10)
            # naming both gates, the receiver subscribes again on gate 2 and waits there
            deadline = time.monotonic() + 5
            while both._gates.current != two.target(1):
                assert time.monotonic() < deadline, "the receiver did not move to gate 2"
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            assert not waiting[1].done()
        finally:
            waiting[1].cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            for stream in streams:
                await stream.aclose()
