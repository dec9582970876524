"""A reshard of a busy PostgreSQL keyspace (issue 21): split 2 -> 4 while, all at once,
writers insert/update/delete rows of ``t`` through the gate, other writers maintain an
owned unique (and a non-unique) lookup vindex whose lookup tables are in the keyspace,
producers enqueue and one receiver receives and acks queue events through the gate, and
a gate ``update_stream`` consumer reads the keyspace's changes: through the copy, the
catch-up, switch reads, switch writes and complete.

The catch-up of the first ``switch_writes`` failed here once with ``INTERNAL:
replication error ... PGRES_COPY_BOTH``. Checked: no writer, producer, receiver or
consumer error; VDiff clean for every table; every row on the shard its own primary
vindex names; every queue event delivered and acked, none delivered after its ack; the
stream consumer got every change of ``t`` in per-row commit order.

The cause: the workflow keeps a source's log reader open between catch-ups; unread,
the reader's thread waited on its full hand-over queue without talking to the server,
and PostgreSQL's ``wal_sender_timeout`` (60 s) ended the replication connection (a
busy keyspace makes the phases between two catch-ups of a source last that long).
``test_an_unread_postgres_log_reader_outlives_wal_sender_timeout`` shows it in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.backends.changes import Heartbeat, Transaction
from shardgate.backends.changes.open import open_change_log
from shardgate.gate import Gate
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows import test_reshard as plain
from tests.integration.workflows import test_reshard_lookup as lookup
from tests.integration.workflows import test_reshard_queue as queue
from tests.integration.workflows.test_reshard_streams import Consumer, LoggingWriters, _received

ROWS = 400
USERS = 200
EVENTS = 100
WAL_SENDER_TIMEOUT_MS = 3000
VSCHEMA: dict[str, Any] = {
    "sharded": True,
    "vindexes": {**lookup.VSCHEMA["vindexes"], **plain.VSCHEMA["vindexes"]},
    "tables": {**lookup.VSCHEMA["tables"], **plain.VSCHEMA["tables"]},
}
TABLES = {"t", "jobs", *lookup.TABLES}


async def _seed(gate: Gate) -> tuple[plain.Model, lookup.Model]:
    s = gate.session("app", identity=TRUSTED)
    for sql in (plain.DDL, *lookup.DDL, queue.QUEUE):
        await gate.execute(s, sql)
    rows: plain.Model = {}
    for start in range(1, ROWS + 1, 200):
        ids = range(start, min(start + 200, ROWS + 1))
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                           + ", ".join(f"({i}, 'v{i}', 0)" for i in ids))
        rows.update({i: (f"v{i}", 0) for i in ids})
    users: lookup.Model = {}
    for i in range(1, USERS + 1):
        email, tag = f"u{i}@example.com", f"t{i % lookup.TAGS}"
        await gate.execute(s, "INSERT INTO `user` (id, email, tag, n) VALUES (:i, :e, :t, 0)",
                           {"i": i, "e": email, "t": tag})
        users[i] = (email, tag, 0)
    return rows, users


def _final(rows: plain.Model, writers: LoggingWriters) -> plain.Model:
    """``t`` as the logged writes left it (they never change ``n``)."""
    out = dict(rows)
    for i, states in writers.history.items():
        op, v = states[-1]
        if op == "d":
            out.pop(i, None)
        else:
            assert v is not None
            out[i] = (v, 0)
    return out


@pytest.mark.postgres
async def test_split_a_busy_keyspace_on_postgres(make_database: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    kind = "postgres"
    # the server ends a replication client silent for wal_sender_timeout (60 s by
    # default): 3 s here (this process's connections), so that the workflow's pauses
    # between two catch-ups of a source outlast it on any machine
    monkeypatch.setenv("PGOPTIONS", f"-c wal_sender_timeout={WAL_SENDER_TIMEOUT_MS}")
    shards = {name: make_database(kind, f"busy{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}))
    gate = await Gate.from_topo(server)
    rows, users = await _seed(gate)
    producers = queue.Producers(gate)
    for _ in range(EVENTS):
        await producers.one()
    row_writers = LoggingWriters(gate, sorted(rows))
    # one writer of each kind (two of ``t``): the catch-up, sharing this process and
    # its two cores with every writer and reader here, keeps up with them
    user_writers = lookup.Writers(gate, users, 1)
    receiver = queue.Receiver(gate)
    # the stream starts now and reads both shards before the first logged write
    consumer = Consumer(gate, time.time(), table="t")
    four = {n: make_database(kind, f"busy4{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())), workflow="busy")
    flow = ReshardWorkflow(server, spec, batch=100)
    try:
        await plain._wait(lambda: len(consumer.position.tokens) == 2,
                          "the stream did not start", timeout=60)
        receiver.start()
        producers.start(k=1)
        row_writers.start()
        user_writers.start()
        await queue._wait(lambda: len(receiver.acked) > 20, "nothing received before the reshard")

        await flow.create()
        assert flow.state == "running"
        assert set(flow.doc["tables"]) == TABLES, flow.doc["tables"]
        reports = await flow.vdiff()
        assert {r.table for r in reports} == TABLES
        for r in reports:
            assert r.clean and r.matching > 0, r.to_doc()
        await flow.switch_reads()
        await plain._wait(lambda: row_writers.changes > 50 and consumer.changes > 20,
                          "no changes yet", timeout=30)
        # reads served by the targets a while before the write switch, the keyspace busy:
        # the workflow's log readers, open since the last catch-up, are not read meanwhile
        await asyncio.sleep(3 * WAL_SENDER_TIMEOUT_MS / 1000)
        before = (row_writers.changes, dict(user_writers.counts), len(producers.bodies))
        out = await flow.switch_writes()
        assert flow.state == "switched", out
        print(f"switch_writes: {out}")  # the figures, in the test log
        await plain._wait(
            lambda: set(four) == {s.name for s in gate.topology.keyspace("app").shards},
            "writes did not switch")
        await plain._wait(
            lambda: row_writers.changes > before[0] + 30
            and all(user_writers.counts[k] > before[1][k] + 3 for k in before[1])
            and len(producers.bodies) > before[2] + 20,
            "writers stalled after the switch", timeout=30)
        # the stream hops while the sources are pending (docs/change-streams.md): it has
        # read every source to its final position once it reads every target
        await plain._wait(lambda: set(four) <= consumer.shards, "the stream did not hop",
                          timeout=30)
        await flow.complete()
        await plain._wait(lambda: not gate.topology.keyspace("app").pending,
                          "complete did not reach the gate", timeout=30)
        await row_writers.halt()
        await user_writers.halt()
        await producers.halt()
        await queue._wait(lambda: producers.bodies <= set(receiver.acked),
                          "events never delivered: "
                          f"{sorted(producers.bodies - set(receiver.acked))[:10]}", timeout=60)
        await _received(consumer, row_writers.history)
        assert set(four) <= consumer.shards, consumer.shards  # it hopped to the targets
        # retries of events fired by the sources but acked on the targets would show now
        await asyncio.sleep(3.0)
    finally:
        for halt in (row_writers.halt, user_writers.halt, producers.halt):
            with contextlib.suppress(Exception):
                await halt()
        await consumer.stop()
        await receiver.close()
        await flow.close()
        await server.close()
        await gate.close()
    assert consumer.error is None, consumer.error
    assert receiver.ended is None, receiver.ended
    assert receiver.subscriptions == 1
    assert not receiver.after_ack, f"delivered after their ack: {receiver.after_ack[:5]}"
    assert set(receiver.acked) == producers.bodies
    events = await queue._event_rows(four)
    assert sorted(b for _, b, _ in events.values()) == sorted(producers.bodies)
    assert {st for _, _, st in events.values()} == {"acked"}
    assert min(user_writers.counts.values()) > 0, user_writers.counts
    assert user_writers.slowest < 5.0 and row_writers.changes > 100
    await plain.check_placement(four, _final(rows, row_writers))
    await lookup.check_placement(four, users)


@pytest.mark.postgres
async def test_an_unread_postgres_log_reader_outlives_wal_sender_timeout(
        make_database: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log reader left unread (its hand-over queue full) for several times the
    server's ``wal_sender_timeout`` (3 s here, for this process's connections) still
    delivers every transaction committed meanwhile, in order, once read again."""
    url = make_database("postgres", "keep")
    backend = open_backend(url)
    log = open_change_log(url, "app/-")
    monkeypatch.setenv("PGOPTIONS", f"-c wal_sender_timeout={WAL_SENDER_TIMEOUT_MS}")
    reader = None
    try:
        await backend.execute("CREATE TABLE k (id BIGINT PRIMARY KEY, v INT NOT NULL)")
        await log.prepare()
        reader = aiter(log.read(await log.current_position(), heartbeat_s=0.02))
        assert isinstance(await anext(reader), Heartbeat)
        # unread for 4 timeouts: heartbeats and transactions fill the hand-over queue
        for i in range(100):
            await backend.execute(f"INSERT INTO k (id, v) VALUES ({i}, {i})")
        await asyncio.sleep(4 * WAL_SENDER_TIMEOUT_MS / 1000)
        got: list[int] = []
        while len(got) < 100:
            item = await asyncio.wait_for(anext(reader), 10)
            if isinstance(item, Transaction):
                got.extend(int(c.pk[0]) for c in item.changes)
        assert got == list(range(100))
        # and it still follows the log
        await backend.execute("INSERT INTO k (id, v) VALUES (100, 100)")
        item = await asyncio.wait_for(anext(reader), 10)
        while not isinstance(item, Transaction):
            item = await asyncio.wait_for(anext(reader), 10)
        assert [c.pk for c in item.changes] == [(100,)]
    finally:
        if reader is not None:
            await reader.aclose()  # type: ignore[attr-defined]
        await log.close()
        with contextlib.suppress(Exception):
            await log.drop()
        await backend.close()
