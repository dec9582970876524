"""Issue 21's acceptance: a 2-shard keyspace split to 4 shards and merged back to 2
(new databases named ``-80``/``80-`` again) **while**, the whole time, writers insert,
update and delete rows of ``t`` through the gate, other writers maintain an owned unique
and a non-unique lookup vindex (their lookup tables in the keyspace), producers enqueue
and one receiver receives and acks queue events through the gate, and one gate change
stream consumer reads the keyspace. On SQLite, on PostgreSQL and on MariaDB.

Afterwards: VDiff clean for every table at both reshards; every committed write present
exactly once on the shard its keyspace id names (read from the shard databases); the
stream consumer saw every committed change of ``t`` in per-row commit order, with no
unmarked repeat; no queue event lost, none delivered after its ack, every event row
acked once on its shard; the receiver's one subscription never ended; no writer,
producer, receiver or consumer error but lock conflicts (``ABORTED``: a deadlock on
MariaDB, a SQLite shard locked by another multi-shard writer), which, as the issue
allows, the load retries as an application would, successfully (counted and printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.errors import Aborted
from shardgate.gate import Gate
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows import test_reshard as plain
from tests.integration.workflows import test_reshard_lookup as lookup
from tests.integration.workflows import test_reshard_queue as queue
from tests.integration.workflows.test_reshard_busy import TABLES, VSCHEMA, _final, _seed
from tests.integration.workflows.test_reshard_streams import Consumer, LoggingWriters, _received

FOUR = ("-40", "40-80", "80-c0", "c0-")
#: statements per second of all writers and producers together
WRITES_PER_S = 150
TWO = ("-80", "80-")


class RetryingGate:
    """The gate as the load's writers and producers see it: an autocommit statement
    that lost a lock conflict (``ABORTED``, rolled back whole) is sent again, as an
    application retries a deadlock; everything else is the gate's."""

    def __init__(self, gate: Gate, rate: float) -> None:
        self._gate = gate
        self.retries = 0
        self._interval = 1.0 / rate
        self._next = 0.0

    async def execute(self, session: Any, sql: str, bind_vars: Any = None) -> Any:
        # a steady rate, all writers together (the "steady rate"): an unpaced
        # writer on MariaDB reaches ~300 statements/s and starves the catch-up sharing
        # this process's event loop
        now = time.monotonic()
        self._next = max(self._next + self._interval, now)
        if self._next > now:
            await asyncio.sleep(self._next - now)
        for attempt in range(20):
            try:
                return await self._gate.execute(session, sql, bind_vars)
            except Aborted:
                if session.in_transaction or attempt == 19:
                    raise
                self.retries += 1
                await asyncio.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)


class Load:
    """Everything that runs beside the reshards, started and stopped together."""

    def __init__(self, gate: Gate, rows: plain.Model, users: lookup.Model) -> None:
        self.gate = gate
        self.app = RetryingGate(gate, WRITES_PER_S)
        app: Any = self.app
        self.producers = queue.Producers(app)
        self.rows = LoggingWriters(app, sorted(rows))
        self.users = lookup.Writers(app, users, 1)
        self.receiver = queue.Receiver(gate)
        # the stream starts now and reads both shards before the first logged write
        self.consumer = Consumer(gate, time.time(), table="t")

    def start(self) -> None:
        self.receiver.start()
        self.producers.start(k=1)
        self.rows.start()
        self.users.start()

    def progress(self) -> tuple[int, int, int]:
        return (self.rows.changes, sum(self.users.counts.values()), len(self.producers.bodies))

    async def moving(self, when: str, timeout: float = 60.0) -> None:
        """Wait until each kind of load has made progress (or fail naming which did not)."""
        before = self.progress()
        deadline = time.monotonic() + timeout
        while not all(n > b + 10 for n, b in zip(self.progress(), before, strict=True)):
            for part in (self.consumer.error, self.receiver.ended):
                assert part is None, part
            for task in (*self.rows.tasks, *self.users.tasks, *self.producers.tasks):
                if task.done():
                    task.result()  # a writer's or producer's error, as it was raised
            assert time.monotonic() < deadline, (
                f"{when}: the load stalled: (rows, users, events) {before} -> "
                f"{self.progress()}")
            await asyncio.sleep(0.05)

    async def halt(self) -> None:
        for halt in (self.rows.halt, self.users.halt, self.producers.halt):
            await halt()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.halt()
        await self.consumer.stop()
        await self.receiver.close()


async def _reshard(server: TopoServer, load: Load, name: str, sources: tuple[str, ...],
                   targets: dict[str, str]) -> dict[str, Any]:
    """One reshard, every step, the load running; returns ``switch_writes``' figures."""
    gate = load.gate
    spec = ReshardSpec(keyspace="app", sources=sources, targets=tuple(targets),
                       target_urls=tuple(sorted(targets.items())), workflow=name)
    flow = ReshardWorkflow(server, spec, batch=100)
    try:
        await flow.create()
        assert flow.state == "running"
        assert set(flow.doc["tables"]) == TABLES, flow.doc["tables"]
        reports = await flow.vdiff()
        assert {r.table for r in reports} == TABLES
        for r in reports:
            assert r.clean and r.matching > 0, r.to_doc()
        await flow.switch_reads()
        await load.moving(f"{name}: after the read switch")
        out = await flow.switch_writes()
        assert flow.state == "switched", out
        await plain._wait(
            lambda: set(targets) == {s.name for s in gate.topology.keyspace("app").shards},
            "writes did not switch")
        await load.moving(f"{name}: after the write switch")
        await flow.complete()
        await plain._wait(lambda: not gate.topology.keyspace("app").pending,
                          "complete did not reach the gate", timeout=30)
        return dict(out)
    finally:
        await flow.close()


@pytest.mark.parametrize("kind", [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
])
async def test_split_and_merge_back_while_everything_runs(kind: str, make_database: Any,
                                                          tmp_path: Path) -> None:
    shards = {n: make_database(kind, f"acc2{i}") for i, n in enumerate(TWO)}
    server = TopoServer(open_topo_store(f"sqlite:///{tmp_path / 'topo.db'}"))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}))
    gate = await Gate.from_topo(server)
    rows, users = await _seed(gate)
    load = Load(gate, rows, users)
    for _ in range(queue.BEFORE // 3):
        await load.producers.one()
    four = {n: make_database(kind, f"acc4{i}") for i, n in enumerate(FOUR)}
    two = {n: make_database(kind, f"acc2m{i}") for i, n in enumerate(TWO)}
    figures: list[dict[str, Any]] = []
    try:
        await plain._wait(lambda: len(load.consumer.position.tokens) == 2,
                          "the stream did not start", timeout=60)
        load.start()
        await queue._wait(lambda: len(load.receiver.acked) > 20,
                          "nothing received before the reshard")
        figures.append(await _reshard(server, load, "split", TWO, four))
        figures.append(await _reshard(server, load, "merge", FOUR, two))
        await load.halt()
        await queue._wait(lambda: load.producers.bodies <= set(load.receiver.acked),
                          "events never delivered: "
                          f"{sorted(load.producers.bodies - set(load.receiver.acked))[:10]}",
                          timeout=60)
        await _received(load.consumer, load.rows.history)
    finally:
        await load.close()
        await server.close()
        await gate.close()
    # the figures, in the test log
    print(f"{kind}: switch_writes {figures}; lock conflicts retried: {load.app.retries}")
    receiver, producers = load.receiver, load.producers
    assert load.consumer.error is None, load.consumer.error
    assert receiver.ended is None, receiver.ended
    assert receiver.subscriptions == 1
    assert not receiver.after_ack, f"delivered after their ack: {receiver.after_ack[:5]}"
    assert set(receiver.acked) == producers.bodies
    events = await queue._event_rows(two)
    assert sorted(b for _, b, _ in events.values()) == sorted(producers.bodies)
    assert {st for _, _, st in events.values()} == {"acked"}
    assert min(load.users.counts.values()) > 0, load.users.counts
    assert load.rows.changes > 100
    await plain.check_placement(two, _final(rows, load.rows))
    await lookup.check_placement(two, users)
