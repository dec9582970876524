"""Resharding a queue table (issue 21 item 4): a queue in a 2-shard keyspace is split
into 4 shards while producers enqueue through the gate and one receiver receives and
acks through the gate the whole time. At the end: every enqueued event was delivered
and acked; none was delivered after its ack returned; every event row is on exactly
one shard, the one its keyspace id names, acked; the receiver's one subscription never
ended (no re-subscribe); the targets' copies are queue tables (their marker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.gate import Gate
from shardgate.gate.cutover import HOLD_S
from shardgate.keys import parse_shard_name
from shardgate.queues.ddl import comment_of, detect_sql
from shardgate.queues.events import QueueEvent
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.freeze import SQLITE_MARK_DDL, sqlite_deny_trigger
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow

_VINDEX = create_vindex("hash", "hash", {})
assert isinstance(_VINDEX, SingleColumn)
HASH: SingleColumn = _VINDEX
VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}}
QUEUE = ("CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(64)) SHARD BY user_id "
         "WITH (ack_wait = 2, min_backoff = 0.2, max_backoff = 1, window = 3, "
         "collector_interval = 1)")
#: events in the queue before the reshard starts (some copied, some caught up)
BEFORE = 300


class Producers:
    """Producers enqueueing through the gate (autocommit INSERTs: held across the
    cut-over); ``bodies`` holds what committed."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.bodies: set[str] = set()
        self.stop = asyncio.Event()
        self.next = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def one(self) -> None:
        self.next += 1
        n = self.next
        await self.gate.execute(self.gate.session("app", identity=TRUSTED),
                                "INSERT INTO jobs (user_id, body) VALUES (:u, :b)",
                                {"u": n * 7919 % 100_003, "b": f"e{n}"})
        self.bodies.add(f"e{n}")

    def start(self, k: int = 2) -> None:
        async def run() -> None:
            while not self.stop.is_set():
                await self.one()
                await asyncio.sleep(0.01)
        self.tasks = [asyncio.create_task(run()) for _ in range(k)]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


class Receiver:
    """One subscription through the gate for the whole test; acks every event at once.
    Records each delivery and when each ack returned."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.deliveries: list[tuple[float, str, QueueEvent]] = []
        self.acked: dict[str, float] = {}
        self.after_ack: list[tuple[str, float, float]] = []
        self.subscriptions = 0
        self.ended: BaseException | str | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        self.subscriptions += 1
        stream = self.gate.queue_receive("app", "jobs")
        body_at: int | None = None
        try:
            async for batch in stream:
                if batch.fields:
                    body_at = batch.fields.index("body")
                assert body_at is not None
                for e in batch.events:
                    body = str(e.values[body_at])
                    now = time.monotonic()
                    self.deliveries.append((now, body, e))
                    if body in self.acked:
                        self.after_ack.append((body, self.acked[body], now))
                    await self.gate.queue_ack("app", "jobs", e.shard, [e.id])
                    self.acked.setdefault(body, time.monotonic())
            self.ended = "the stream ended"
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # recorded: the test fails on it
            self.ended = exc
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def _wait(cond: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _event_rows(shards: dict[str, str]) -> dict[int, tuple[str, str, str]]:
    """``id -> (shard, body, state)`` of every event row; each on the shard its
    keyspace id names, and on one shard only."""
    seen: dict[int, tuple[str, str, str]] = {}
    for name, url in shards.items():
        kr = parse_shard_name(name)
        backend = open_backend(url)
        try:
            rows = (await backend.execute("SELECT id, user_id, body, state FROM jobs")).rows
            marked = (await backend.execute(detect_sql(backend.dialect))).rows
        finally:
            await backend.close()
        assert [str(r[0]) for r in marked] == ["jobs"], f"{name}: not marked a queue table"
        assert comment_of(backend.dialect, str(marked[0][1])).startswith("shardgate_queue")
        for (eid, _user_id, body, state), ksid in zip(
                rows, HASH.map([r[1] for r in rows]), strict=True):
            assert kr.contains(ksid[0]), f"event {eid} is on {name}, not its shard"
            assert int(eid) not in seen, f"event {eid} is on {name} and {seen[int(eid)][0]}"
            seen[int(eid)] = (name, str(body), str(state))
    return seen


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_split_queue_two_to_four_while_producing_and_receiving(
        kind: str, make_database: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shardgate.queues.table.manager")
    shards = {name: make_database(kind, f"q{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}))
    gate = await Gate.from_topo(server)
    producers = Producers(gate)
    receiver = Receiver(gate)
    four = {n: make_database(kind, f"q4{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())), workflow="wfq")
    flow = ReshardWorkflow(server, spec, batch=50)
    try:
        await gate.execute(gate.session("app", identity=TRUSTED), QUEUE)
        for _ in range(BEFORE):
            await producers.one()
        receiver.start()
        producers.start()
        await _wait(lambda: len(receiver.acked) > 50, "nothing received before the reshard")

        await flow.create()
        assert flow.state == "running"
        assert "jobs" in flow.doc["tables"]
        await _wait(lambda: set(four) <= {s.name for s in gate.topology.keyspace("app").pending},
                    "the gate did not see the pending targets")
        reports = await flow.vdiff()
        assert [r.table for r in reports] == ["jobs"] and reports[0].matching > 0
        await flow.switch_reads()
        before = len(producers.bodies)
        out = await flow.switch_writes()
        assert flow.state == "switched" and out["frozen_s"] < HOLD_S, out
        await _wait(lambda: set(four) == {s.name for s in gate.topology.keyspace("app").shards},
                    "writes did not switch")
        await _wait(lambda: len(producers.bodies) > before + 20, "producers stalled")
        # the one subscription reads the targets now: events enqueued after the switch
        # (only the targets have them) arrive
        after_switch = len(receiver.deliveries)
        await _wait(lambda: any(e.shard in four for _, _, e in
                                receiver.deliveries[after_switch:]),
                    "no event from the targets reached the receiver")
        await flow.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending,
                    "complete did not reach the gate")
        await asyncio.sleep(0.5)
        await producers.halt()
        await _wait(lambda: producers.bodies <= set(receiver.acked),
                    "events never delivered: "
                    f"{sorted(producers.bodies - set(receiver.acked))[:10]}")
        # retries of events fired by the sources but acked on the targets would show now
        await asyncio.sleep(3.0)
    finally:
        with contextlib.suppress(Exception):
            await producers.halt()
        await receiver.close()
        await flow.close()
        await gate.close()
        await server.close()
    assert receiver.ended is None, receiver.ended
    # the sources' managers paused at the freeze (no error, no lease dropped, no storm)
    # (only the queue and tablet loggers: a PostgreSQL slot's creation warns of other
    # sessions' open transactions on the shared server, which is not the queue's doing)
    stops = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
             and r.name.startswith(("shardgate.queues", "shardgate.tablet"))]
    assert not stops, stops[:5]
    assert receiver.subscriptions == 1
    assert not receiver.after_ack, f"delivered after their ack: {receiver.after_ack[:5]}"
    assert set(receiver.acked) == producers.bodies
    rows = await _event_rows(four)
    assert sorted(b for _, b, _ in rows.values()) == sorted(producers.bodies)
    assert {st for _, _, st in rows.values()} == {"acked"}, \
        [r for r in rows.values() if r[2] != "acked"][:5]
    assert len({sh for sh, _, _ in rows.values()}) == 4


async def test_a_frozen_shard_pauses_its_manager_and_holds_acks(
        make_database: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The freeze (as a cut-over installs it) makes the manager pause: nothing fired or
    delivered, no failure, no lease dropped; an ack meeting it is held by the gate; once
    the freeze is lifted (a cut-over that rolled back) dispatch and the ack go on."""
    caplog.set_level(logging.INFO, logger="shardgate.queues.table.manager")
    url = make_database("sqlite", "frz")
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": {"-": url}, "vschema": VSCHEMA}}}))
    gate = await Gate.from_topo(server)
    backend = open_backend(url)
    receiver = Receiver(gate)
    ops = ("INSERT", "UPDATE", "DELETE")
    try:
        await gate.execute(gate.session("app", identity=TRUSTED), QUEUE)
        await gate.execute(gate.session("app", identity=TRUSTED),
                           "INSERT INTO jobs (user_id, body) VALUES (1, 'first')")
        stream = gate.queue_receive("app", "jobs")
        batch = await anext(stream)  # fields
        batch = await asyncio.wait_for(anext(stream), 10)
        first = batch.events[0]
        # freeze, then make an event due (written around the gate, as a catch-up would)
        await backend.execute(SQLITE_MARK_DDL)
        for op in ops:
            await backend.execute(sqlite_deny_trigger(f"_sg_deny_{op.lower()}_jobs", op,
                                                      "jobs"))
        ack = asyncio.create_task(gate.queue_ack("app", "jobs", first.shard, [first.id]))
        await asyncio.sleep(1.0)
        assert not ack.done(), "the ack was not held"
        # the event is fired again after its ack wait (2 s): the fire write is refused
        await asyncio.sleep(2.5)
        assert any("dispatch paused" in r.getMessage() for r in caplog.records)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        state = (await backend.execute("SELECT state, epoch FROM jobs")).rows
        assert [tuple(r) for r in state] == [("fired", 1)]
        for op in ops:
            await backend.execute(f'DROP TRIGGER "_sg_deny_{op.lower()}_jobs"')
        assert await asyncio.wait_for(ack, 10) == 1
        state = (await backend.execute("SELECT state FROM jobs")).rows
        assert [tuple(r) for r in state] == [("acked",)]
        await gate.execute(gate.session("app", identity=TRUSTED),
                           "INSERT INTO jobs (user_id, body) VALUES (2, 'second')")
        batch = await asyncio.wait_for(anext(stream), 10)
        assert [e.values[-1] for e in batch.events] == ["second"]
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await receiver.close()
        await backend.close()
        await gate.close()
        await server.close()
