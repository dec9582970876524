"""Queues end to end in one process, on every backend: enqueue, fire, receive, ack."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.queues.events import QueueEvent
from shardgate.queues.table.manager import followup_id
from shardgate.queues.table.window import SCAN_SLACK_NS
from shardgate.tablet import LocalTabletClient, Tablet
from shardgate.topo import Topology
from tests.conftest import require_server
from tests.integration.conftest import gate_for

VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}}


def app_topology(kind: str, make_database: Callable[..., str], shards: int = 2) -> Topology:
    urls = {kr.name: make_database(kind, f"q{i}")
            for i, kr in enumerate(KeyRange(b"", b"").split(shards))}
    return Topology.from_dict({"default_keyspace": "app", "keyspaces": {
        "app": {"shards": urls, "vschema": {**VSCHEMA, "tables": {}}}}})


async def open_gate(kind: str, make_database: Callable[..., str], shards: int = 2,
                    pool_size: int = 4) -> Gate:
    return Gate.open(app_topology(kind, make_database, shards), pool_size=pool_size)


@pytest.fixture
async def gate(
    backend_kind: str, tablets: str, make_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> AsyncIterator[Gate]:
    async with gate_for(backend_kind, tablets, lambda make: app_topology(backend_kind, make),
                        make_database, request, shape="app", pool_size=4) as g:
        yield g


async def create(gate: Gate, options: str = "ack_wait = 0.4, min_backoff = 0.1") -> None:
    await gate.execute(
        gate.session(identity=TRUSTED),
        "CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(64), grp BIGINT) "
        f"SHARD BY user_id WITH ({options})",
    )


async def receive(gate: Gate, n: int, *, timeout: float = 10, ack: bool = True,
                  received: list[QueueEvent] | None = None) -> list[QueueEvent]:
    got: list[QueueEvent] = [] if received is None else received

    async def run() -> None:
        stream = gate.queue_receive("app", "jobs")
        try:
            async for batch in stream:
                for e in batch.events:
                    got.append(e)
                    if ack:
                        await gate.queue_ack("app", "jobs", e.shard, [e.id])
                if len(got) >= n:
                    return
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    await asyncio.wait_for(run(), timeout)
    return got


async def insert(gate: Gate, rows: list[tuple[int, str]], *, tx: bool = True,
                 extra: str = "") -> None:
    s = gate.session(identity=TRUSTED)
    values = ", ".join(f"({u}, '{b}'{extra})" for u, b in rows)
    cols = "user_id, body" + (", grp" if extra else "")
    if tx:
        await gate.execute(s, "begin")
    await gate.execute(s, f"INSERT INTO jobs ({cols}) VALUES {values}")
    if tx:
        await gate.execute(s, "commit")


async def states(gate: Gate) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in await gate.queue_stats("app", "jobs"):
        for k, v in st["depth"].items():
            out[k] = out.get(k, 0) + v
    return out


async def wait_for_condition(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"condition not met within {timeout}s"
        await asyncio.sleep(0.02)


async def test_transactional_enqueue_fire_and_ack(gate: Gate) -> None:
    await create(gate)
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE account (user_id BIGINT PRIMARY KEY, n INT)")
    gate.topology.keyspace("app").vschema["tables"]["account"] = {
        "column_vindexes": [{"column": "user_id", "name": "hash"}]}
    gate.rebuild_vschema()
    # committed together with a business row
    await gate.execute(s, "begin")
    await gate.execute(s, "INSERT INTO account (user_id, n) VALUES (1, 1)")
    await gate.execute(s, "INSERT INTO jobs (user_id, body) VALUES (1, 'kept')")
    await gate.execute(s, "commit")
    # rolled back together: never fires
    await gate.execute(s, "begin")
    await gate.execute(s, "INSERT INTO account (user_id, n) VALUES (2, 1)")
    await gate.execute(s, "INSERT INTO jobs (user_id, body) VALUES (2, 'lost')")
    await gate.execute(s, "rollback")
    await insert(gate, [(3, "x"), (4, "y")])
    got = await receive(gate, 3)
    assert sorted(e.values[1] for e in got) == ["kept", "x", "y"]
    assert all(e.epoch == 1 for e in got)
    await asyncio.sleep(0.6)  # past the ack wait: acked events never fire again
    assert (await states(gate))["acked"] == 3
    assert (await gate.execute(s, "SELECT count(*) FROM account")).rows[0][0] == 1


async def test_unacked_event_fires_again_with_backoff_then_fails(gate: Gate) -> None:
    await create(gate, "ack_wait = 0.3, min_backoff = 0.1, max_backoff = 0.2, max_attempts = 3")
    await insert(gate, [(1, "retry")], tx=False)
    got = await receive(gate, 3, ack=False, timeout=10)
    assert [e.epoch for e in got] == [1, 2, 3]
    assert len({e.id for e in got}) == 1
    deadline = time.monotonic() + 5
    while (await states(gate))["failed"] != 1:
        assert time.monotonic() < deadline, "the event did not become failed"
        async with contextlib.aclosing(gate.queue_receive("app", "jobs")) as stream:  # type: ignore[type-var]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(anext(stream), 0.5)
                await asyncio.wait_for(anext(stream), 0.5)
    # inspectable, and requeued by hand
    s = gate.session(identity=TRUSTED)
    r = await gate.execute(s, "SELECT state, epoch FROM jobs WHERE user_id = 1")
    assert r.rows == [("failed", 3)]


async def test_scheduled_events_never_fire_early(gate: Gate) -> None:
    await create(gate)
    at = time.time_ns() + 700_000_000
    s = gate.session(identity=TRUSTED)
    await gate.execute(
        s, "INSERT INTO jobs (user_id, body, time_scheduled) VALUES (1, 'later', :t), "
        "(2, 'now', :n)", {"t": at, "n": time.time_ns()})
    got = await receive(gate, 2)
    fired_at = {e.values[1]: time.time_ns() for e in got}
    assert got[-1].values[1] == "later"
    assert fired_at["later"] >= at


async def test_scheduled_lateness_under_load(gate: Gate) -> None:
    """500 events scheduled over 1.5 s while 1000 immediate ones flow: none early."""
    await create(gate, "batch_size = 64")
    s = gate.session(identity=TRUSTED)
    base = time.time_ns() + 300_000_000
    sched = {i: base + (i * 3_000_000) for i in range(500)}
    rows = ", ".join(f"({i}, 's{i}', {t})" for i, t in sched.items())
    await gate.execute(s, f"INSERT INTO jobs (user_id, body, time_scheduled) VALUES {rows}")
    await insert(gate, [(1000 + i, f"n{i}") for i in range(1000)])
    lateness: list[int] = []

    async def run() -> None:
        n = 0
        async with contextlib.aclosing(gate.queue_receive("app", "jobs")) as stream:  # type: ignore[type-var]
            async for batch in stream:
                now = time.time_ns()
                for e in batch.events:
                    if e.values[1].startswith("s"):
                        lateness.append(now - e.time_scheduled)
                by_shard: dict[str, list[int]] = {}
                for e in batch.events:
                    by_shard.setdefault(e.shard, []).append(e.id)
                for shard, ids in by_shard.items():
                    await gate.queue_ack("app", "jobs", shard, ids)
                n += len(batch.events)
                if n >= 1500:
                    return

    await asyncio.wait_for(run(), 30)
    lateness.sort()
    p50, p99 = lateness[len(lateness) // 2], lateness[int(len(lateness) * 0.99)]
    print(f"\nscheduled lateness under load: p50 {p50 / 1e6:.1f} ms, p99 {p99 / 1e6:.1f} ms")
    assert min(lateness) >= 0, "an event fired before its time"


async def test_ack_in_sql_and_disconnected_receiver_loses_nothing(gate: Gate) -> None:
    await create(gate, "ack_wait = 30")
    await insert(gate, [(i, f"e{i}") for i in range(1, 11)])
    first = await receive(gate, 1, ack=False)  # leaves with 10 events handed to it
    # the events of the departed receiver are due again at once, not after ack_wait
    # (30 s; the 15 s bound leaves room for a loaded machine and tablet processes)
    got = await receive(gate, 10, ack=False, timeout=15)
    assert {e.id for e in first} <= {e.id for e in got}
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "begin")
    for e in got:
        await gate.execute(s, "UPDATE jobs SET state = 'acked' WHERE id = :id", {"id": e.id})
    await gate.execute(s, "commit")
    assert (await states(gate))["acked"] == 10


async def test_limits_hold(gate: Gate) -> None:
    await create(gate, "ack_wait = 5, max_in_flight = 7, batch_size = 4")
    await insert(gate, [(i, "x") for i in range(40)])
    got = await receive(gate, 7, ack=False, timeout=5)
    await asyncio.sleep(0.3)
    # per shard: at most 7 in flight (2 shards)
    stats = await gate.queue_stats("app", "jobs")
    assert all(st["in_flight"] <= 7 for st in stats)
    assert len(got) <= 14


async def test_max_per_second(gate: Gate) -> None:
    await create(gate, "max_per_second = 20, batch_size = 5")
    await insert(gate, [(1, "x")] * 1 + [(2, "y")] * 0)
    await insert(gate, [(1, f"x{i}") for i in range(30)])  # user 1: one shard
    t0 = time.monotonic()
    await receive(gate, 31, timeout=10)
    elapsed = time.monotonic() - t0
    # 31 events at 20/s with a burst of 5: at least (31 - 5) / 20 s
    assert elapsed >= (31 - 5) / 20 * 0.9


async def test_per_key_ordering_under_failures(gate: Gate) -> None:
    await create(gate, "ack_wait = 0.3, min_backoff = 0.05, max_backoff = 0.1, "
                       "ordering_key = user_id")
    for i in range(6):
        await insert(gate, [(1, f"a{i}"), (2, f"b{i}")])
    seen: list[QueueEvent] = []
    order: dict[int, list[str]] = {1: [], 2: []}
    dropped: set[int] = set()

    async def run() -> None:
        async with contextlib.aclosing(gate.queue_receive("app", "jobs")) as stream:  # type: ignore[type-var]
            async for batch in stream:
                for e in batch.events:
                    seen.append(e)
                    if e.epoch == 1 and len(dropped) < 3 and e.id not in dropped:
                        dropped.add(e.id)  # inject a failure: no ack, it fires again
                        continue
                    order[e.values[0]].append(e.values[1])
                    await gate.queue_ack("app", "jobs", e.shard, [e.id])
                if sum(len(v) for v in order.values()) == 12:
                    return

    await asyncio.wait_for(run(), 15)
    assert order[1] == [f"a{i}" for i in range(6)]
    assert order[2] == [f"b{i}" for i in range(6)]


async def test_drop_queue_stops_it_and_frees_the_name(gate: Gate) -> None:
    """DROP QUEUE (through tablet processes too: every tablet of a shard is told to stop
    serving it); a receiver open across it ends with NOT_FOUND instead of waiting forever;
    a queue of the same name created afterwards starts from nothing."""
    await create(gate)
    await insert(gate, [(1, "a"), (2, "b")])
    assert len(await receive(gate, 2)) == 2
    await insert(gate, [(3, "left")])
    receiver = gate.queue_receive("app", "jobs")
    first = await asyncio.wait_for(receiver.__anext__(), 10)  # the fields: it is subscribed
    assert first.fields
    await gate.execute(gate.session(identity=TRUSTED), "DROP QUEUE jobs")

    async def drain() -> None:
        async for _batch in receiver:
            pass

    with pytest.raises(ShardgateError) as ended:
        await asyncio.wait_for(drain(), 10)
    assert ended.value.code is Code.NOT_FOUND and "dropped" in str(ended.value), ended.value
    assert "jobs" not in gate.vschema.keyspace("app").tables
    with pytest.raises(ShardgateError):
        await gate.execute(gate.session(identity=TRUSTED), "SELECT COUNT(*) FROM jobs")
    await create(gate)
    await insert(gate, [(4, "new")])
    got = await receive(gate, 1)
    assert [e.values[1] for e in got] == ["new"]


async def test_group_follow_up_fires_when_all_acked(gate: Gate) -> None:
    await create(gate, "group_key = grp")
    await insert(gate, [(5, "g1"), (5, "g2"), (5, "g3")], extra=", 77")
    got = await receive(gate, 4, timeout=10)
    assert len(got) == 4
    assert got[-1].id == followup_id("jobs", 77)
    await asyncio.sleep(0.3)
    assert (await states(gate))["acked"] == 4  # one follow-up only


async def test_lease_only_holder_dispatches(backend_kind: str,
                                            make_database: Callable[..., str]) -> None:
    url = make_database(backend_kind, "lease")
    a = Tablet.open("app", "0", url)
    b = Tablet.open("app", "0", url)
    for t in (a, b):
        t.queues._lease_retry = 0.1
    topo = Topology.from_dict({"keyspaces": {"app": {"shards": {"0": url}, "vschema": {
        "sharded": False, "tables": {}}}}})
    gate = Gate(topo, {("app", "0"): LocalTabletClient(a)})
    try:
        await gate.execute(gate.session("app", identity=TRUSTED),
                           "CREATE QUEUE jobs (user_id BIGINT, body VARCHAR(64)) "
                           "WITH (ack_wait = 0.5)")
        a.queues.start()
        await wait_for_condition(lambda: a.queues.leader, 10)
        b.queues.start()
        await b.queues.detect()
        await asyncio.sleep(0.3)
        assert a.queues.leader and not b.queues.leader
        await gate.execute(gate.session("app", identity=TRUSTED),
                           "INSERT INTO jobs (user_id, body) VALUES (1, 'x')")
        got = await receive(gate, 1)
        assert got[0].epoch == 1
        t0 = time.monotonic()
        await a.close()
        await wait_for_condition(lambda: b.queues.leader, 5)
        print(f"takeover in {time.monotonic() - t0:.2f}s")
        gate.tablets[("app", "0")] = LocalTabletClient(b)
        await wait_for_condition(lambda: "jobs" in b.queues.managers, 5)
        await asyncio.sleep(0.7)  # the acked event does not fire on the new leader
        st = await b.queues.stats("jobs")
        assert st["fired"] == 0 and st["depth"]["acked"] == 1
    finally:
        await b.close()
        await a.close()


async def test_comment_marker_detection_and_purge(backend_kind: str,
                                                   make_database: Callable[..., str]) -> None:
    gate = await open_gate(backend_kind, make_database, shards=1)
    try:
        await create(gate, "retention = 0.01")
        tablet: Any = next(iter(gate.tablets.values()))
        fresh = Tablet(tablet.keyspace, tablet.shard, tablet.tablet.backend)
        assert await fresh.queues.detect() == ["jobs"]
        assert fresh.queues.options["jobs"].retention == 0.01
        await insert(gate, [(1, "a"), (2, "b")])
        await receive(gate, 2)
        deadline = time.monotonic() + 5
        while (await states(gate))["acked"]:
            assert time.monotonic() < deadline, "acked events were not purged"
            await asyncio.sleep(0.2)
    finally:
        await gate.close()


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres),
                                  pytest.param("mysql", marks=pytest.mark.mysql)])
async def test_event_of_a_long_transaction_fires_at_its_commit(
        kind: str, make_database: Callable[..., str]) -> None:
    """An event inserted early in a transaction that commits seconds later fires at once.

    Its ``time_scheduled`` is its insert time; meanwhile a short transaction on the
    same shard commits an event that fires, moving the manager's watermark past
    the long one's by more than the scan slack. The commit's wake-up must reach
    back to the long transaction's writes (before: found only by the next full
    scan, a whole window later).
    """
    require_server(kind)
    gate = await open_gate(kind, make_database, shards=1)
    try:
        await create(gate, "ack_wait = 30, window = 60")
        got: list[QueueEvent] = []
        receiving = asyncio.create_task(receive(gate, 2, timeout=40, received=got))
        long_tx = gate.session(identity=TRUSTED)
        await gate.execute(long_tx, "begin")
        await gate.execute(long_tx, "INSERT INTO jobs (user_id, body) VALUES (1, 'long')")
        await asyncio.sleep(SCAN_SLACK_NS / 1e9 + 1.0)
        await insert(gate, [(2, "short")], tx=False)
        await wait_for_condition(lambda: len(got) == 1, 10)
        await asyncio.sleep(0.5)  # the short event's scan moved the watermark
        await gate.execute(long_tx, "commit")
        committed = time.monotonic()
        await receiving
        assert [e.values[1] for e in got] == ["short", "long"]
        assert time.monotonic() - committed < 2.0
    finally:
        await gate.close()


async def test_new_event_scans_read_only_rows_not_seen(
        backend_kind: str, make_database: Callable[..., str]) -> None:
    """With a backlog held in the window (no receiver), each wake-up's scan reads the
    newly committed rows, not the backlog again: the cost of a scan does not grow with
    the backlog. (Before: every scan re-read the unfired rows of the last 2 s.)"""
    gate = await open_gate(backend_kind, make_database, shards=1)
    try:
        await create(gate, "ack_wait = 30, window = 60")
        old = time.time_ns() - 10 * 1_000_000_000  # a backlog scheduled 10 s ago
        await gate.execute(gate.session(identity=TRUSTED),
                           "INSERT INTO jobs (user_id, body, time_scheduled) "
                           "VALUES " + ", ".join(f"({u}, 'old', {old})" for u in range(1000)))
        queues = next(iter(gate.tablets.values())).tablet.queues  # type: ignore[attr-defined]
        queues.start()  # takes the lease: the manager runs, no receiver yet
        await wait_for_condition(lambda: "jobs" in queues.managers, 10)
        manager = queues.managers["jobs"]
        await wait_for_condition(lambda: len(manager._window.events) == 1000, 10)
        scanned: list[int] = []
        real = manager.store.scan_new

        async def counting(*args: Any, **kwargs: Any) -> Any:
            rows = await real(*args, **kwargs)
            scanned.append(len(rows))
            return rows

        manager.store.scan_new = counting
        for k in range(10):
            await insert(gate, [(u, f"new{k}") for u in range(5)], tx=False)
            await wait_for_condition(lambda k=k: len(manager._window.events) == 1005 + 5 * k, 10)
        # Each scan reads the new rows (and, on a busy machine, a few recent ones
        # again: the clock offset is a lower bound), never the backlog.
        assert scanned and max(scanned) < 1000 and sum(scanned) < 1000, scanned
        got = await receive(gate, 1050, timeout=30)
        assert len({e.id for e in got}) == 1050
    finally:
        await gate.close()


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres),
                                  pytest.param("mysql", marks=pytest.mark.mysql)])
async def test_an_ack_inside_a_transaction_holding_the_only_pooled_connection(
        kind: str, make_database: Callable[..., str]) -> None:
    """Acks go through the shard's pool, except when it has no connection free: the
    receiver may hold the last one in its own transaction while it acks (business
    rows and the ack together); the ack then takes the lease's connection and
    returns instead of waiting for that transaction. (SQLite: one writer at a time
    per database file, whatever the connection.)"""
    require_server(kind)
    gate = await open_gate(kind, make_database, shards=1, pool_size=1)
    try:
        await create(gate, "ack_wait = 30")
        await insert(gate, [(1, "a")], tx=False)
        got = await receive(gate, 1, ack=False)
        s = gate.session(identity=TRUSTED)
        await gate.execute(s, "begin")
        await gate.execute(s, "SELECT count(*) FROM jobs WHERE user_id = 1")  # holds the pool
        await asyncio.wait_for(gate.queue_ack("app", "jobs", got[0].shard, [got[0].id]), 10)
        await gate.execute(s, "commit")
        assert (await states(gate))["acked"] == 1
    finally:
        await gate.close()
