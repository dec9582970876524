"""Wake-ups for every write path: events the leader tablet did not write fire at once.

The queue's ``window`` is 120 s, so the managers' periodic full scan cannot
explain any delivery in these tests: before queue signals, events written
around the leader's tablet waited for it.

* A Spark bulk enqueue of 10,000 events (``df.write.format("shardgate")``):
  the first event is received soon after the commit of its shard's copy
  (measured from the database clock at the end of that transaction, the
  signal's ``signalled_ns``, to its arrival, and printed: the target is
  100 ms; the assertion allows 5 s for a loaded machine, still 24 times
  less than the 120 s window that bounds it without wake-ups); all 10,000 arrive.
* Events inserted through another gate (its tablets are not the queue
  leaders: another process, as far as the leader can tell) are received
  within the same latency as through the leader's own gate.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.bulk import copy as bulk
from shardgate.client.sync import LoopThread
from shardgate.gate import Gate
from shardgate.queues import signals
from shardgate.queues.events import QueueBatch
from shardgate.topo.file import write_cluster_file
from tests.integration.conftest import Cluster, open_cluster

QUEUE = ("CREATE QUEUE jobs (customer_id BIGINT NOT NULL, body VARCHAR(64)) "
         "SHARD BY customer_id WITH (ack_wait = 60, window = 120)")
EVENTS = 10_000
#: The issue's target from a shard's commit to its first event's arrival is 100 ms,
#: met on a quiet machine (the measured figure is printed); the assertion allows for a
#: loaded one (the test must not be flaky: 1.2 s was seen at load 11) and still fails
#: by more than an order of magnitude without wake-ups (the 120 s window).
FIRST_EVENT_TARGET_MS = 100.0
FIRST_EVENT_MS = 5000.0


@pytest.fixture
async def cluster(backend_kind: str, make_database: Callable[..., str]) -> AsyncIterator[Cluster]:
    c = await open_cluster(backend_kind, make_database)
    try:
        await c.gate.execute(c.gate.session("commerce", identity=TRUSTED), QUEUE)
        yield c
    finally:
        await c.gate.close()


class Arrivals:
    """A receiver of ``jobs`` on the cluster's gate that acks everything and notes
    when each batch arrived (ns)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.batches: list[tuple[int, QueueBatch]] = []
        self.count = 0
        self.changed = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for batch in self.gate.queue_receive("commerce", "jobs"):
            if not batch.events:
                continue
            self.batches.append((time.time_ns(), batch))
            self.count += len(batch.events)
            self.changed.set()
            by_shard: dict[str, list[int]] = {}
            for e in batch.events:
                by_shard.setdefault(e.shard, []).append(e.id)
            for shard, ids in by_shard.items():
                await self.gate.queue_ack("commerce", "jobs", shard, ids)

    async def leading(self) -> None:
        """Wait until this gate's tablets lead every shard's queues."""
        async def wait() -> None:
            while not all(s["leader"] for s in await self.gate.queue_stats("commerce", "jobs")):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(wait(), 30)

    async def wait_for(self, n: int, timeout: float) -> None:
        async def wait() -> None:
            while self.count < n:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def signalled_ns(cluster: Cluster, shard: str) -> int:
    """The database clock at the end of the last signalling transaction on ``shard``."""
    rows = bulk.query(cluster.shard_urls("commerce")[shard],
                      f"SELECT signalled_ns FROM {signals.TABLE} WHERE queue = 'jobs'")
    return int(rows[0][0])


def test_spark_bulk_enqueue_fires_at_once(cluster: Cluster, spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    write_cluster_file(cluster.topology, path)
    df = spark.range(0, EVENTS, numPartitions=2).selectExpr(
        "id AS customer_id", "concat('job', id) AS body")
    # The receiving gate runs on a loop of its own: the Spark write blocks this thread
    # (PySpark's data sources are registered for the thread that runs the session).
    with LoopThread("receiver") as loop:

        async def start() -> tuple[Gate, Arrivals]:
            gate = Gate.open(cluster.topology)
            rx = Arrivals(gate)
            await rx.leading()
            return gate, rx

        gate, rx = loop.run(start(), 60)
        try:
            (df.write.format("shardgate").option("cluster", str(path)).option("table", "jobs")
             .mode("append").save())
            loop.run(rx.wait_for(EVENTS, 120))
        finally:
            loop.run(rx.close())
            loop.run(gate.close())
    arrived, first = rx.batches[0]
    shard = first.events[0].shard
    latency_ms = (arrived - signalled_ns(cluster, shard)) / 1e6
    print(f"\n[{cluster.kind}] Spark bulk enqueue of {EVENTS} events: the first event "
          f"(shard {shard}) arrived {latency_ms:.1f} ms after its shard's commit (target "
          f"{FIRST_EVENT_TARGET_MS:g} ms; load average {os.getloadavg()[0]:.1f}); all "
          f"{rx.count} arrived")
    assert latency_ms < FIRST_EVENT_MS
    assert rx.count == EVENTS


async def test_events_through_another_gate_fire_at_once(cluster: Cluster) -> None:
    rx = Arrivals(cluster.gate)
    other = Gate.open(cluster.topology)  # its tablets are not the queue leaders
    try:
        await rx.leading()
        latency_ms = []
        for n, (via, gate) in enumerate([("the leader's own gate", cluster.gate),
                                         ("another gate", other)], start=1):
            await gate.execute(gate.session("commerce", identity=TRUSTED),
                               "INSERT INTO jobs (customer_id, body) VALUES (7, 'hello')")
            committed = time.time_ns()
            await rx.wait_for(n, 30)
            latency_ms.append((rx.batches[n - 1][0] - committed) / 1e6)
            print(f"\n[{cluster.kind}] an event inserted through {via} arrived "
                  f"{latency_ms[-1]:.1f} ms after its commit "
                  f"(load average {os.getloadavg()[0]:.1f})")
        assert latency_ms[1] < FIRST_EVENT_MS
    finally:
        await other.close()
        await rx.close()


async def test_a_gate_that_followed_create_queue_signals_its_inserts(
    backend_kind: str, make_database: Callable[..., str]
) -> None:
    """A gate open before another gate's CREATE QUEUE learns the queue from the topo
    store: its tablets (not the leaders) signal the leader of the events they insert.
    (They did not: the gate served the new VSchema, but its tablets kept no options
    for the queue, so their inserts waited for the leader's 120 s window.)"""
    c = await open_cluster(backend_kind, make_database)
    other = Gate.open(c.topology, topo=c.gate.topo)  # before the queue exists
    other.watch(interval=0.05)
    rx: Arrivals | None = None
    try:
        await c.gate.execute(c.gate.session("commerce", identity=TRUSTED), QUEUE)
        deadline = time.monotonic() + 10
        while "jobs" not in other.topology.keyspace("commerce").vschema["tables"]:
            assert time.monotonic() < deadline, "the other gate did not follow CREATE QUEUE"
            await asyncio.sleep(0.02)
        rx = Arrivals(c.gate)
        await rx.leading()
        await other.execute(other.session("commerce", identity=TRUSTED),
                            "INSERT INTO jobs (customer_id, body) VALUES (7, 'hello')")
        committed = time.time_ns()
        await rx.wait_for(1, 30)
        latency_ms = (rx.batches[0][0] - committed) / 1e6
        print(f"\n[{c.kind}] an event inserted through a gate that followed CREATE QUEUE "
              f"arrived {latency_ms:.1f} ms after its commit")
        assert latency_ms < FIRST_EVENT_MS
    finally:
        if rx is not None:
            await rx.close()
        await other.close()
        await c.gate.close()
