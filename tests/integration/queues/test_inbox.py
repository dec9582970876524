"""The inbox store on every backend: transactions, pointers, buckets, retention, errors."""

from __future__ import annotations

import calendar
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, FailedPrecondition, InvalidArgument, NotFound
from shardgate.queues.inbox import sql as inbox_sql
from shardgate.queues.inbox.model import US, InboxOptions, Pointer
from shardgate.queues.inbox.store import InboxStore
from tests.conftest import require_server
from tests.integration.conftest import Cluster, close_cluster, open_cluster, with_tablets

DAY = 86_400
Scenario = Callable[[Cluster, str], Awaitable[None]]


class Clock:
    """A settable clock (seconds)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def at(*args: int) -> float:
    return float(calendar.timegm(datetime(*args, tzinfo=UTC).timetuple()))  # type: ignore[misc]


async def tables_per_shard(c: Cluster) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for shard in c.topology.keyspace("commerce").shards:
        client = c.gate.tablets[("commerce", shard.name)]
        res = await client.execute(inbox_sql.list_tables_sql(client.dialect), [])
        out[shard.name] = {str(r[0]).lower() for r in res.rows}
    return out


async def scenario_append_joins_the_callers_transaction(cluster: Cluster, name: str) -> None:
    gate = cluster.gate
    store = InboxStore(gate, "commerce", name)
    await store.create()
    s = gate.session("commerce", identity=TRUSTED)

    await gate.begin(s)
    await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                          "VALUES (1, 42, 'x', 5)")
    await store.append(42, "order 1 shipped", session=s)
    await gate.rollback(s)
    assert (await store.read(42)).messages == []

    await gate.begin(s)
    await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                          "VALUES (2, 42, 'y', 7)")
    m = await store.append(42, "order 2 shipped", session=s)
    assert (await store.read(42)).messages == []  # not committed yet: invisible to others
    await gate.commit(s)
    got = (await store.read(42)).messages
    assert [(x.msg_id, x.body) for x in got] == [(m.msg_id, "order 2 shipped")]

    # The row lives on the user's shard only (same shard as the user's orders).
    order_shard = [sh for sh, rows in (await _rows_by_shard(cluster, "corder")).items() if rows]
    inbox_shard = [sh for sh, rows in (await _rows_by_shard(cluster, store.buckets()[0].table))
                   .items() if rows]
    assert inbox_shard == order_shard and len(inbox_shard) == 1


async def _rows_by_shard(c: Cluster, table: str) -> dict[str, int]:
    out = {}
    for shard in c.topology.keyspace("commerce").shards:
        res = await c.gate.tablets[("commerce", shard.name)].execute(
            f"SELECT COUNT(*) FROM {table}", [])
        out[shard.name] = int(res.rows[0][0])
    return out


async def scenario_late_commit_below_the_pointer_is_delivered(cluster: Cluster, name: str) -> None:
    """A message whose transaction commits after a reader moved past its time."""
    gate = cluster.gate
    store = InboxStore(gate, "commerce", name, InboxOptions(rescan_window_s=60))
    await store.create()
    slow = gate.session("commerce", identity=TRUSTED)
    await gate.begin(slow)
    late = await store.append(7, "slow writer", session=slow)  # ts taken now
    fast = await store.append(7, "fast writer")  # later ts, committed first
    r1 = await store.read_committed(7, "app")
    assert [m.msg_id for m in r1.messages] == [fast.msg_id]
    assert r1.pointer is not None
    await store.commit(7, "app", r1.pointer)
    await gate.commit(slow)
    r2 = await store.read_committed(7, "app")
    assert [m.msg_id for m in r2.messages] == [late.msg_id]
    assert r2.pointer is not None
    await store.commit(7, "app", r2.pointer)
    assert (await store.read_committed(7, "app")).messages == []


async def scenario_consumers_have_their_own_pointers(cluster: Cluster, name: str) -> None:
    store = InboxStore(cluster.gate, "commerce", name)
    await store.create()
    sent = [await store.append(5, f"m{i}") for i in range(7)]
    await store.append(6, "someone else's")

    phone = await store.read_committed(5, "phone", limit=4)
    assert [m.body for m in phone.messages] == ["m0", "m1", "m2", "m3"] and phone.more
    assert phone.pointer is not None
    await store.commit(5, "phone", phone.pointer.encode())  # the text form works too
    assert await store.committed(5, "phone") == phone.pointer
    assert await store.committed(5, "laptop") is None

    laptop = await store.read_committed(5, "laptop", limit=100)
    assert [m.msg_id for m in laptop.messages] == [m.msg_id for m in sent]
    assert not laptop.more

    rest = await store.read_committed(5, "phone", limit=100)
    assert [m.body for m in rest.messages] == ["m4", "m5", "m6"]
    assert rest.pointer is not None
    await store.commit(5, "phone", rest.pointer)
    await store.commit(5, "phone", rest.pointer)  # idempotent
    assert (await store.read_committed(5, "phone")).messages == []


async def scenario_pages_past_many_already_delivered_rows(cluster: Cluster, name: str) -> None:
    """More remembered messages in the window than one page: keyset paging continues."""
    clock = Clock(at(2026, 3, 1, 12))
    store = InboxStore(cluster.gate, "commerce", name,
                       InboxOptions(rescan_window_s=3600), clock=clock)
    await store.create()
    for i in range(40):
        clock.t += 1
        await store.append(9, f"m{i}")
    r = await store.read(9, limit=30)
    assert len(r.messages) == 30 and r.pointer is not None and len(r.pointer.recent) == 30
    r2 = await store.read(9, after=r.pointer, limit=1)  # page of 32 rows, 30 of them seen
    assert [m.body for m in r2.messages] == ["m30"]
    r3 = await store.read(9, after=r2.pointer, limit=100)
    assert [m.body for m in r3.messages] == [f"m{i}" for i in range(31, 40)]


async def scenario_forward_insert_lets_a_read_touch_one_bucket(cluster: Cluster, name: str) -> None:
    clock = Clock(at(2026, 3, 1, 23, 58))  # two minutes before the day's end
    store = InboxStore(cluster.gate, "commerce", name,
                       InboxOptions(rescan_window_s=300, forward_insert=True), clock=clock)
    await store.create()
    m1 = await store.append(3, "before midnight")  # in both 20260301 and 20260302
    clock.t = at(2026, 3, 2, 0, 1)
    m2 = await store.append(3, "after midnight")
    counts = {b.table: sum((await _rows_by_shard(cluster, b.table)).values())
              for b in store.buckets()}
    assert counts[f"{name}_20260301"] == 1 and counts[f"{name}_20260302"] == 2
    r = await store.read(3)
    assert [m.msg_id for m in r.messages] == [m1.msg_id, m2.msg_id]  # the copy once
    assert r.pointer is not None
    # Pointer in 20260302: only that bucket (and those after it) is scanned, yet a
    # message from 23:59 committed late (within the window) is still found there.
    late = await store.append(3, "late", ts=int(at(2026, 3, 1, 23, 59) * US))
    await _drop_everywhere(cluster, f"{name}_20260301")  # prove the old bucket is not read
    r2 = await store.read(3, after=r.pointer)
    assert [m.msg_id for m in r2.messages] == [late.msg_id]


async def _drop_everywhere(c: Cluster, table: str) -> None:
    for shard in c.topology.keyspace("commerce").shards:
        await c.gate.tablets[("commerce", shard.name)].execute(f"DROP TABLE {table}", [])


async def scenario_retention_drops_whole_buckets_on_every_shard(
    cluster: Cluster, name: str
) -> None:
    clock = Clock(at(2026, 1, 1, 12))
    opts = InboxOptions(retention_s=3 * DAY, rescan_window_s=60, precreate=1)
    store = InboxStore(cluster.gate, "commerce", name, opts, clock=clock)
    await store.create()
    for _day in range(6):
        for user in range(20):
            await store.append(user, f"day {clock.t}")
        clock.t += DAY
        await store.maintain()
    # now: 2026-01-07 12:00; buckets ending more than 3 days ago (<= 01-04 12:00) are gone.
    report = await store.maintain()
    assert report.dropped == []  # already done on the way
    names = [b.table for b in store.buckets()]
    assert names == [f"{name}_2026010{d}" for d in range(4, 9)]
    for shard, tables in (await tables_per_shard(cluster)).items():
        inbox_tables = sorted(t for t in tables if t.startswith(f"{name}_2"))
        assert inbox_tables == names, shard
    vs_tables = set(cluster.gate.vschema.keyspace("commerce").tables)
    assert f"{name}_20260103" not in vs_tables and f"{name}_20260104" in vs_tables
    # Reads from the start see only the retained days, each user its own.
    r = await store.read(4)
    assert len(r.messages) == 3  # days 01-04, 01-05, 01-06 (01-07 has none yet)
    # A message older than the retention is refused rather than lost.
    with pytest.raises(InvalidArgument):
        await store.append(4, "too old", ts=int((clock.t - 4 * DAY) * US))
    # A bucket left on only some shards (an interrupted create) is not used until
    # maintain completes it on every shard.
    first = cluster.topology.keyspace("commerce").shards[0].name
    client = cluster.gate.tablets[("commerce", first)]
    await client.execute(inbox_sql.bucket_ddl(f"{name}_20260110", client.dialect,
                                              user_type="bigint"), [])
    await store.open()
    assert f"{name}_20260110" not in [b.table for b in store.buckets()]
    assert (await store.maintain()).created == [f"{name}_20260110"]
    assert f"{name}_20260110" in [b.table for b in store.buckets()]
    assert all(f"{name}_20260110" in t for t in (await tables_per_shard(cluster)).values())


async def scenario_errors_have_codes(cluster: Cluster, name: str) -> None:
    gate = cluster.gate
    missing = InboxStore(gate, "commerce", "nothere")
    with pytest.raises(NotFound) as nf:
        await missing.read(1)
    assert "create" in nf.value.message
    with pytest.raises(NotFound, match="vindex"):
        InboxStore(gate, "commerce", "x", InboxOptions(vindex="nope"))
    with pytest.raises(InvalidArgument):
        InboxStore(gate, "commerce", "Bad-Name")

    clock = Clock(at(2026, 5, 1, 12))
    store = InboxStore(gate, "commerce", name, InboxOptions(precreate=0), clock=clock)
    await store.create()
    with pytest.raises(InvalidArgument) as bad:
        await store.read(1, after="p1:not-a-pointer:")
    assert bad.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(InvalidArgument):
        await store.read(1, limit=0)
    with pytest.raises(InvalidArgument):
        await store.commit(1, "", Pointer(1, 1))

    # A bucket that does not exist yet is not created inside a transaction.
    clock.t += DAY
    s = gate.session("commerce", identity=TRUSTED)
    await gate.begin(s)
    with pytest.raises(FailedPrecondition) as fp:
        await store.append(1, "tomorrow", session=s)
    assert "maintain" in fp.value.message
    await gate.rollback(s)
    # Outside one, it is created on the spot.
    await store.append(1, "tomorrow")
    assert [b.table for b in store.buckets()] == [f"{name}_20260501", f"{name}_20260502"]

    # Another process's store discovers the buckets and serves the same data.
    other = InboxStore(gate, "commerce", name, InboxOptions(precreate=0), clock=clock)
    assert [m.body for m in (await other.read(1)).messages] == ["tomorrow"]
    # Its options are stored with it: other explicit options are refused, naming each
    # difference; a store opened without options adopts the stored ones.
    with pytest.raises(FailedPrecondition) as other_opts:
        await InboxStore(gate, "commerce", name, InboxOptions(granularity="hour")).open()
    assert "granularity='hour' (stored: 'day')" in other_opts.value.message
    assert "precreate=1 (stored: 0)" in other_opts.value.message
    adopted = InboxStore(gate, "commerce", name, clock=clock)
    await adopted.open()
    assert adopted.options == InboxOptions(precreate=0)

    await store.drop()
    assert not any(t.startswith(name + "_") for ts in (await tables_per_shard(cluster)).values()
                   for t in ts)


async def scenario_string_users_through_a_string_vindex(cluster: Cluster, name: str) -> None:
    gate = cluster.gate
    ks = gate.topology.keyspace("commerce")  # the gate's own (read from its topo store)
    ks.vschema = {**ks.vschema, "vindexes": {**ks.vschema["vindexes"],
                                             "md5": {"type": "unicode_loose_md5"}}}
    gate.rebuild_vschema()
    store = InboxStore(gate, "commerce", name, InboxOptions(vindex="md5", user_type="varchar"))
    await store.create()
    await store.append("ada@example.com", "hi Ada")
    await store.bulk_load([("bob@example.com", store.now(), "hi Bob"),
                           ("ada@example.com", store.now(), "again")])
    assert [m.body for m in (await store.read("ada@example.com")).messages] == ["hi Ada",
                                                                              "again"]
    r = await store.read("bob@example.com")
    assert [m.body for m in r.messages] == ["hi Bob"] and r.pointer is not None
    await store.commit("bob@example.com", "web", r.pointer)
    assert await store.committed("bob@example.com", "web") == r.pointer
    # Each user's rows are on the shard the vindex gives, and only there.
    shard = store.shards_of(["bob@example.com"])[0]
    table = store.buckets()[0].table
    for sh in ks.shards:
        res = await gate.tablets[("commerce", sh.name)].execute(
            f"SELECT COUNT(*) FROM {table} WHERE user_id = 'bob@example.com'", [])
        assert int(res.rows[0][0]) == (1 if sh.name == shard else 0)


# One SQLite cluster per scenario (fast); on the servers, every scenario in one cluster
# (databases are slow to create and drop), each with its own inbox.
SQLITE_SCENARIOS = [
    scenario_append_joins_the_callers_transaction,
    scenario_consumers_have_their_own_pointers,
    scenario_pages_past_many_already_delivered_rows,
    scenario_forward_insert_lets_a_read_touch_one_bucket,
    scenario_retention_drops_whole_buckets_on_every_shard,
    scenario_errors_have_codes,
    scenario_string_users_through_a_string_vindex,
]
# SQLite has one writer per file: the reader's pointer commit would wait for the open
# writer transaction, so the late-commit scenario runs on the servers only.
SERVER_SCENARIOS = [*SQLITE_SCENARIOS, scenario_late_commit_below_the_pointer_is_delivered]


@pytest.mark.parametrize("scenario", SQLITE_SCENARIOS, ids=lambda f: f.__name__[9:])
async def test_inbox_on_sqlite(scenario: Scenario, make_database: Callable[..., str]) -> None:
    c = await open_cluster("sqlite", make_database)
    try:
        await scenario(c, "inbox")
    finally:
        await c.gate.close()


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres),
                                  pytest.param("mysql", marks=pytest.mark.mysql)])
async def test_inbox_on_servers(kind: str, tablets: str, make_database: Callable[..., str],
                                tmp_path: Path) -> None:
    require_server(kind)
    c = await with_tablets(await open_cluster(kind, make_database), tablets,
                           tmp_path / "tablets")
    try:
        for i, scenario in enumerate(SERVER_SCENARIOS):
            await scenario(c, f"inbox{i}")
    finally:
        await close_cluster(c)
