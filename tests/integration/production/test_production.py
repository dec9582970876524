"""Production mode: a gate reaching tablet processes, 2 per shard, on PostgreSQL shards.

Failover under load (SIGKILL of each shard's lease holder in turn while
writers and a queue receiver run), replica reads, draining on SIGTERM, and
the tablet-side reaping of a dead gate's transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psycopg
import pytest

from shardgate.api.grpc.security import ClientSecurity
from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.api.http import HttpServer
from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, OutcomeUnknown, ShardgateError
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology
from tests.conftest import require_server
from tests.integration.tablet_procs import TabletProcesses, serve_with_processes

pytestmark = pytest.mark.postgres

VSCHEMA = {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}},
    "tables": {"w": {"column_vindexes": [{"column": "id", "name": "hash"}]}},
}
#: the issue's bound for routing to a shard's new lease holder
REROUTE_BOUND_S = 5.0


@pytest.fixture
async def pair(make_database: Callable[..., str], tmp_path: Path) -> AsyncIterator[TabletProcesses]:
    """Keyspace ``app`` (2 shards, table ``w``, queue ``jobs``), 2 tablet processes a shard."""
    require_server("postgres")
    urls = {kr.name: make_database("postgres", f"p{i}")
            for i, kr in enumerate(KeyRange(b"", b"").split(2))}
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {
        "app": {"shards": urls, "vschema": VSCHEMA}}})
    setup = Gate.open(topo)
    try:
        await setup.execute(setup.session(identity=TRUSTED),
                            "CREATE TABLE w (id BIGINT PRIMARY KEY, v VARCHAR(32))")
    finally:
        await setup.close()
    procs = await serve_with_processes(topo, tmp_path / "tablets", per_shard=2,
                                       extra=("--idle-timeout", "1.5", "--drain-timeout", "5"))
    try:
        await procs.gate.execute(
            procs.gate.session(identity=TRUSTED),
            "CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(64)) SHARD BY user_id "
            "WITH (ack_wait = 2, min_backoff = 0.2)")
        yield procs
    finally:
        await procs.close()


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url.replace("postgresql://", "postgres://", 1)) as conn:
        return list(conn.execute(sql).fetchall())


@dataclass
class Load:
    """Writers and a queue receiver running through the gate, and what they saw."""

    gate: Gate
    ok: set[int] = field(default_factory=set)
    unknown: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    jobs_ok: set[str] = field(default_factory=set)
    jobs_unknown: set[str] = field(default_factory=set)
    received: dict[str, int] = field(default_factory=dict)
    acked: set[tuple[str, int]] = field(default_factory=set)
    refired: list[tuple[str, int]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def __repr__(self) -> str:
        return (f"Load(ok={len(self.ok)}, unknown={len(self.unknown)}, "
                f"jobs_ok={len(self.jobs_ok)}, received={len(self.received)}, "
                f"acked={len(self.acked)}, errors={self.errors[:3]})")

    async def writer(self, first: int) -> None:
        s = self.gate.session("app", identity=TRUSTED)
        n = first
        while not self.stop.is_set():
            n += 1
            try:
                await self.gate.execute(s, "INSERT INTO w (id, v) VALUES (:id, 'x')", {"id": n})
                self.ok.add(n)
            except OutcomeUnknown:
                self.unknown.add(n)
            except ShardgateError as exc:
                self.errors.append(f"write {n}: {exc}")
            await asyncio.sleep(0.005)

    async def producer(self) -> None:
        s = self.gate.session("app", identity=TRUSTED)
        n = 0
        while not self.stop.is_set():
            n += 1
            body = f"job-{n}"
            try:
                await self.gate.execute(s, "INSERT INTO jobs (user_id, body) VALUES (:u, :b)",
                                        {"u": n, "b": body})
                self.jobs_ok.add(body)
            except OutcomeUnknown:
                self.jobs_unknown.add(body)
            except ShardgateError as exc:
                self.errors.append(f"enqueue {body}: {exc}")
            await asyncio.sleep(0.01)

    async def receiver(self) -> None:
        try:
            await self._receive()
        except Exception as exc:
            self.errors.append(f"receiver: {exc!r}")
            raise

    async def _receive(self) -> None:
        stream = self.gate.queue_receive("app", "jobs")
        fields: list[str] = []
        try:
            async for batch in stream:
                fields = list(batch.fields) or fields  # the first batch names them
                for e in batch.events:
                    key = (e.shard, e.id)
                    if key in self.acked:
                        self.refired.append(key)
                    body = str(e.values[fields.index("body")])
                    self.received[body] = self.received.get(body, 0) + 1
                    await self.gate.queue_ack("app", "jobs", e.shard, [e.id])
                    self.acked.add(key)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]


async def test_failover_under_load(pair: TabletProcesses) -> None:
    gate = pair.gate
    load = Load(gate)
    tasks = [asyncio.create_task(load.writer(k * 1_000_000)) for k in range(3)]
    tasks += [asyncio.create_task(load.producer()), asyncio.create_task(load.receiver())]
    reroute: dict[str, float] = {}
    try:
        await _until(lambda: len(load.ok) > 50 and len(load.received) > 10, 30, load)
        for ks, shard in sorted(pair.shards):
            old = pair.holder(ks, shard)
            before = len(load.ok)
            pair.kill(old)
            killed = time.monotonic()
            # Routed again: the gate picks the other tablet, and writes succeed again.
            await _until(lambda ks=ks, shard=shard, old=old: (
                (p := pair.fleet.pick(ks, shard)) is not None and p.record.alias != old), 30)
            reroute[shard] = time.monotonic() - killed
            await _until(lambda before=before: len(load.ok) > before + 30, 30)
        load.stop.set()
        await asyncio.gather(*tasks[:4])
        # Every job that was stored (or may have been) and not yet received arrives.
        await _until(lambda: load.jobs_ok <= set(load.received), 30)
    finally:
        load.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"re-route times after SIGKILL of the lease holder: "
          f"{ {k: round(v, 3) for k, v in reroute.items()} }; writes ok {len(load.ok)}, "
          f"outcome unknown {len(load.unknown)}; jobs {len(load.jobs_ok)}")
    assert load.errors == []
    assert max(reroute.values()) < REROUTE_BOUND_S, reroute
    # The database has every acknowledged write; outcome-unknown ones are either there or not.
    stored: set[int] = set()
    for url in (s.url for s in pair.gate.topology.keyspace("app").shards):
        stored |= {int(r[0]) for r in _rows(url, "SELECT id FROM w")}
    assert load.ok <= stored
    assert stored <= load.ok | load.unknown, "a write that failed is in the database"
    # No job lost; none delivered again after its ack.
    assert load.jobs_ok <= set(load.received)
    assert set(load.received) <= load.jobs_ok | load.jobs_unknown
    assert load.refired == []


async def test_change_stream_resumes_on_the_new_lease_holder(pair: TabletProcesses) -> None:
    """SIGKILL of each shard's lease holder while a change stream runs through the gate:
    the stream goes on from the standby that took the lease, every stored row comes
    exactly once (no gap, no repeat), and it never ends or hangs."""
    from shardgate.backends.changes.open import open_change_log

    gate = pair.gate
    shards = gate.topology.keyspace("app").shards
    for sh in shards:  # capture set up before the timed part (slot creation waits)
        log = open_change_log(sh.url, f"app/{sh.name}")
        try:
            await log.prepare()
        finally:
            await log.close()
    seen: list[int] = []
    heartbeats: set[str] = set()
    events = gate.update_stream("app", heartbeat_s=0.1, identity=TRUSTED)

    async def consume() -> None:
        async for ev in events:
            if ev.heartbeat:
                heartbeats.add(ev.shard)
            seen.extend(int(c.pk[0]) for c in ev.changes if c.table == "w" and c.op == "insert")

    load = Load(gate)
    reader = asyncio.create_task(consume())
    writer: asyncio.Task[None] | None = None
    try:
        await _until(lambda: len(heartbeats) == len(shards), 30)
        writer = asyncio.create_task(load.writer(0))
        await _until(lambda: len(seen) > 20, 30, load)
        for ks, shard in sorted(pair.shards):
            before = len(seen)
            pair.kill(pair.holder(ks, shard))
            await _until(lambda before=before: len(seen) > before + 20, 30, load)
        load.stop.set()
        await writer
        stored: set[int] = set()
        for sh in shards:
            stored |= {int(r[0]) for r in _rows(sh.url, "SELECT id FROM w")}
        await _until(lambda: stored <= set(seen), 30, load)
        assert not reader.done(), reader  # the stream neither ended nor failed
    finally:
        load.stop.set()
        for t in (reader, writer):
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in (reader, writer) if t is not None),
                             return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]
        for sh in shards:
            log = open_change_log(sh.url, f"app/{sh.name}")
            try:
                await log.drop()
            finally:
                await log.close()
    assert load.errors == []
    assert sorted(seen) == sorted(set(seen)), "a change was delivered twice"
    assert set(seen) == stored
    print(f"stream through failover: {len(seen)} rows, {len(load.unknown)} outcome unknown")


async def test_replica_reads_go_to_a_standby(pair: TabletProcesses) -> None:
    gate = pair.gate
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, "INSERT INTO w (id, v) VALUES (1, 'a')")
    await gate.execute(s, "USE app@replica")
    assert (await gate.execute(s, "SELECT v FROM w WHERE id = 1")).rows == [("a",)]
    with pytest.raises(ShardgateError) as err:
        await gate.execute(s, "INSERT INTO w (id, v) VALUES (2, 'b')")
    assert err.value.code is Code.FAILED_PRECONDITION and "primary" in err.value.message
    # The read went to the standby: the lease holders' tablets saw none of it.
    for ks, shard in pair.shards:
        assert pair.fleet.pick(ks, shard, replica=True) is not pair.fleet.pick(ks, shard)
    await gate.execute(s, "USE app@primary")
    await gate.execute(s, "INSERT INTO w (id, v) VALUES (2, 'b')")


async def test_drain_hands_the_lease_over_and_finishes_open_work(pair: TabletProcesses) -> None:
    gate = pair.gate
    shard = "-80"
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "INSERT INTO w (id, v) VALUES (1, 'in-tx')")  # 1 hashes to -80
    assert ("app", shard) in s.shard_txs
    old = pair.holder("app", shard)
    pair.procs[old].terminate()  # SIGTERM: drain
    # The standby takes the lease while the old holder finishes the open transaction.
    await _until(lambda: (p := pair.fleet.pick("app", shard)) is not None
                 and p.record.alias != old, 10)
    await gate.execute(s, "COMMIT")
    pair.procs[old].join(10)
    assert pair.procs[old].exitcode == 0
    assert (await gate.execute(gate.session("app", identity=TRUSTED),
                               "SELECT v FROM w WHERE id = 1")).rows == \
        [("in-tx",)]


async def test_a_dead_gates_transactions_are_rolled_back(pair: TabletProcesses) -> None:
    """A gate that stops sending health checks: its open transaction is rolled back."""
    gate = pair.gate
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "INSERT INTO w (id, v) VALUES (1, 'held')")  # takes a row lock
    await pair.fleet.close()  # the gate goes silent (as if it died): no more health checks
    url = next(sh.url for sh in gate.topology.keyspace("app").shards if sh.name == "-80")
    # The tablet rolls it back after --idle-timeout (1.5 s): the row lock goes with it.
    deadline = time.monotonic() + 15
    while True:
        with psycopg.connect(url.replace("postgresql://", "postgres://", 1)) as conn:
            conn.execute("SET lock_timeout = '200ms'")
            with contextlib.suppress(psycopg.errors.LockNotAvailable):
                conn.execute("INSERT INTO w (id, v) VALUES (1, 'other')")
                break
        assert time.monotonic() < deadline, "the dead gate's transaction was never rolled back"
        await asyncio.sleep(0.2)


async def test_a_hung_tablet_never_hangs_a_call(pair: TabletProcesses) -> None:
    """A lease holder that stops answering (SIGSTOP: its connections stay open, it keeps
    the lease): a write through the gate to it ends with a code, within a bound, never
    hangs. (A write of a plain table does not reach it: the gate runs it on the shard
    database itself, shardgate/gate/direct.py; a queue table's write goes to the holder.)"""
    gate = pair.gate
    old = pair.holder("app", "-80")
    pid = pair.procs[old].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        session = gate.session("app", identity=TRUSTED)
        r = await asyncio.wait_for(
            gate.execute(session, "INSERT INTO w (id, v) VALUES (1, 'x')"), 30)
        assert r.rows_affected == 1
        start = time.monotonic()
        with pytest.raises(ShardgateError) as err:  # 1 hashes to -80
            await asyncio.wait_for(gate.execute(
                session, "INSERT INTO jobs (user_id, body) VALUES (1, 'x')"), 30)
        # Sent before the gate noticed: outcome unknown; after: no serving lease holder.
        assert err.value.code in (Code.UNKNOWN, Code.UNAVAILABLE), err.value
        assert time.monotonic() - start < 15
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_segmented_queue_through_tablet_processes(pair: TabletProcesses) -> None:
    """Jobs stored through the gate (QueueEnqueue on the holder), received, acked."""
    gate = pair.gate
    await gate.execute(gate.session("app", identity=TRUSTED),
                       "CREATE QUEUE seg (user_id BIGINT NOT NULL, body TEXT) SHARD BY user_id "
                       "WITH (storage = segmented, ack_wait = 2, batch_size = 16)")
    jobs = [(k, f"u{k} #{i}") for i in range(5) for k in range(8)]
    placed = await gate.queue_enqueue("app", "seg", jobs)
    assert {shard for shard, _ in placed} == {"-80", "80-"}
    stored = dict(zip(placed, jobs, strict=True))
    acked: set[tuple[str, int]] = set()

    async def run() -> None:
        async for batch in gate.queue_receive("app", "seg"):
            for e in batch.events:
                assert stored[(e.shard, e.id)] == (int(e.values[0]), e.values[1])
                assert await gate.queue_ack("app", "seg", e.shard, [e.id]) == 1
                acked.add((e.shard, e.id))
            if acked == set(stored):
                return

    await asyncio.wait_for(run(), 30)
    stats = await gate.queue_stats("app", "seg")
    assert sum(s["depth"].get("succeeded", 0) for s in stats) == len(jobs)


async def _until(cond: Callable[[], bool], timeout: float, state: object = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"condition not met within {timeout} s: {state}"
        await asyncio.sleep(0.02)


async def test_tablets_accept_only_the_gates_credential(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    users = tmp_path / "tablet-users.json"
    users.write_text(json.dumps({"gate": [{"Password": "gate-pw"}]}))
    topo = Topology.from_dict({"keyspaces": {"u": {
        "shards": {"0": make_database("sqlite", "tsec")}, "vschema": {"sharded": False}}}})
    procs = await serve_with_processes(
        topo, tmp_path / "tablets", extra=("--users-file", str(users), "--allow-user", "gate"),
        tablet_security=ClientSecurity(user="gate", password="gate-pw"))
    try:
        s = procs.gate.session("u", identity=TRUSTED)
        assert (await procs.gate.execute(s, "SELECT 1")).rows == [(1,)]
        # the console lists the registered tablet processes with role and health
        console = HttpServer(procs.gate, "127.0.0.1", 0)
        port = await console.start()
        try:
            async with aiohttp.ClientSession() as http, \
                    http.get(f"http://127.0.0.1:{port}/api/cluster") as r:
                shard = (await r.json())["keyspaces"][0]["shards"][0]
        finally:
            await console.stop()
        assert [(t["role"], t["health"]) for t in shard["tablets"]] == [
            ("lease_holder", "serving")]
        address = procs.fleet.roster.all()[0].address
        for who in (None, ClientSecurity(user="gate", password="wrong")):
            with pytest.raises(ShardgateError) as err:
                client = await GrpcTabletClient.connect(f"grpc://{address}", timeout=5,
                                                        security=who)
                await client.execute("SELECT 1", [])
            assert err.value.code is Code.UNAUTHENTICATED, who
    finally:
        await procs.close()
