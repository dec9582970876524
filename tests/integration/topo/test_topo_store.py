"""The topo store on SQLite, PostgreSQL, MariaDB and etcd: versions, compare-and-swap,
changes since a version, the topology on top, and a gate that follows it."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from shardgate.gate import Gate
from shardgate.topo.etcd import EtcdTopoStore
from shardgate.topo.etcd_local import LocalEtcd
from shardgate.topo.local import open_topo, read_topology, store_path_for
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import (
    MemoryTopoStore,
    Record,
    TopoConflict,
    TopoStore,
    open_topo_store,
)
from shardgate.topo.watch import TopoWatcher

BACKENDS = ["memory", "sqlite", "postgres", "mysql", "etcd"]


def store_url(kind: str, request: pytest.FixtureRequest) -> str:
    """An empty store of ``kind`` for this test."""
    if kind == "etcd":
        return str(request.getfixturevalue("etcd_url"))
    return str(request.getfixturevalue("make_database")(kind, "topo"))


@pytest.fixture(params=BACKENDS[1:])
def seed_url(request: pytest.FixtureRequest) -> str | None:
    """Where a cluster file's store is: beside it (SQLite, None) or another backend's URL."""
    return None if request.param == "sqlite" else store_url(request.param, request)


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[TopoStore]:
    kind: str = request.param
    s = MemoryTopoStore() if kind == "memory" else open_topo_store(store_url(kind, request))
    yield s
    await s.close()


async def test_versions_follow_one_clock(store: TopoStore) -> None:
    assert await store.clock() == 0
    v1 = await store.put("keyspace", "a", {"x": 1})
    v2 = await store.put("keyspace", "b", {"x": 2})
    v3 = await store.put("keyspace", "a", {"x": 3})
    assert 0 < v1 < v2 < v3
    if not isinstance(store, EtcdTopoStore):  # etcd's revisions count every prefix's writes
        assert (v1, v2, v3) == (1, 2, 3)
    rec = await store.get("keyspace", "a")
    assert rec is not None and rec.doc == {"x": 3} and rec.version == v3
    assert [r.name for r in await store.list_records("keyspace")] == ["a", "b"]
    clock, changed = await store.changes_since(v1)
    assert clock == v3 == await store.clock()
    assert [(r.name, r.version) for r in changed] == [("b", v2), ("a", v3)]


async def test_compare_and_swap_refuses_a_stale_writer(store: TopoStore) -> None:
    v = await store.put("workflow", "w", {"step": 1}, expect=0)
    with pytest.raises(TopoConflict) as err:
        await store.put("workflow", "w", {"step": 9}, expect=0)  # create, but it exists
    assert err.value.code is Code.ABORTED
    v2 = await store.put("workflow", "w", {"step": 2}, expect=v)
    with pytest.raises(TopoConflict):
        await store.put("workflow", "w", {"step": 3}, expect=v)  # read before v2
    rec = await store.get("workflow", "w")
    assert rec is not None and rec.doc == {"step": 2} and rec.version == v2


async def test_delete_leaves_a_tombstone_watchers_see(store: TopoStore) -> None:
    v = await store.put("tablet", "t1", {"addr": "x"})
    dv = await store.delete("tablet", "t1", expect=v)
    assert await store.get("tablet", "t1") is None
    assert await store.list_records("tablet") == []
    _, changed = await store.changes_since(v)
    assert [(r.name, r.doc, r.version) for r in changed] == [("t1", None, dv)]
    assert await store.delete("tablet", "never") == await store.clock()  # no-op
    # a deleted record can be created again
    assert await store.put("tablet", "t1", {"addr": "y"}, expect=0) > dv


async def test_concurrent_compare_and_swap_one_winner(store: TopoStore) -> None:
    v = await store.put("keyspace", "k", {"n": 0})

    async def write(n: int) -> int | None:
        try:
            return await store.put("keyspace", "k", {"n": n}, expect=v)
        except TopoConflict:
            return None

    results = await asyncio.gather(*(write(n) for n in range(1, 9)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    rec = await store.get("keyspace", "k")
    assert rec is not None and rec.version == winners[0]


def _cluster(tmp_path: Path, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        "default_keyspace: ks\n"
        "keyspaces:\n"
        "  ks:\n"
        "    shards: {'-80': sqlite:///ks-80.db, '80-': sqlite:///ks80-.db}\n"
        "    vschema:\n"
        "      sharded: true\n"
        "      vindexes: {hash: {type: hash}}\n"
        "      tables: {t: {column_vindexes: [{column: id, name: hash}]}}\n"
    )
    return path


async def test_server_refuses_invalid_vschema_and_saves_nothing(
    tmp_path: Path, seed_url: str | None
) -> None:
    server = await open_topo(_cluster(tmp_path), url=seed_url)
    try:
        before = await server.store.clock()

        def bad(vs: dict[str, Any]) -> dict[str, Any]:
            vs["tables"]["u"] = {"column_vindexes": [{"column": "id", "name": "nope"}]}
            return vs

        with pytest.raises(InvalidArgument) as err:
            await server.update_vschema("ks", bad)
        assert "nope" in err.value.message and "u" in err.value.message
        assert await server.store.clock() == before
    finally:
        await server.close()


async def test_update_with_expected_version_conflicts(
    tmp_path: Path, seed_url: str | None
) -> None:
    server = await open_topo(_cluster(tmp_path), url=seed_url)
    try:
        _, v = await server.keyspace_vschema("ks")

        def add(name: str) -> Any:
            def change(vs: dict[str, Any]) -> dict[str, Any]:
                vs["tables"][name] = {"column_vindexes": [{"column": "id", "name": "hash"}]}
                return vs
            return change

        await server.update_vschema("ks", add("a"), expect=v)
        with pytest.raises(TopoConflict):
            await server.update_vschema("ks", add("b"), expect=v)
        await server.update_vschema("ks", add("c"))  # no expectation: re-reads, applies
        vs, _ = await server.keyspace_vschema("ks")
        assert set(vs["tables"]) == {"t", "a", "c"}
    finally:
        await server.close()


async def test_cluster_file_seeds_the_store_once(tmp_path: Path) -> None:
    path = _cluster(tmp_path)
    assert read_topology(path).keyspace("ks").vschema["tables"].keys() == {"t"}
    assert not store_path_for(path).exists()  # reading alone creates nothing
    server = await open_topo(path)
    try:
        await server.update_vschema("ks", lambda vs: {**vs, "tables": {**vs["tables"], "n": {
            "column_vindexes": [{"column": "id", "name": "hash"}]}}})
    finally:
        await server.close()
    # the store is the truth from now on, also for synchronous readers
    assert set(read_topology(path).keyspace("ks").vschema["tables"]) == {"t", "n"}
    server = await open_topo(path)
    try:
        topo = await server.load_topology()
        assert set(topo.keyspace("ks").vschema["tables"]) == {"t", "n"}
        assert topo.version == await server.store.clock()
    finally:
        await server.close()


@pytest.mark.parametrize("kind", BACKENDS[1:])
async def test_empty_store_is_a_coded_error(kind: str, request: pytest.FixtureRequest) -> None:
    server = TopoServer(open_topo_store(store_url(kind, request)))
    try:
        with pytest.raises(FailedPrecondition, match="topo import"):
            await server.load_topology()
    finally:
        await server.close()


async def test_unreachable_store_is_a_coded_error() -> None:
    server = TopoServer(open_topo_store("postgresql://postgres:secret@127.0.0.1:1/topo"))
    try:
        with pytest.raises(Unavailable) as err:
            await Gate.from_topo(server)
        assert "topo store" in err.value.message and "secret" not in err.value.message
    finally:
        await server.close()


async def _wait_for(cond: Any, timeout: float = 5.0) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_second_gate_follows_a_change_within_a_second(
    tmp_path: Path, seed_url: str | None
) -> None:
    path = _cluster(tmp_path)
    g1 = await Gate.from_topo(await open_topo(path, url=seed_url))
    g2 = await Gate.from_topo(await open_topo(path, url=seed_url))
    try:
        s1, s2 = g1.session("ks", identity=TRUSTED), g2.session("ks", identity=TRUSTED)
        await g1.execute(s1, "CREATE TABLE IF NOT EXISTS n (id BIGINT PRIMARY KEY, v TEXT)")
        with pytest.raises(NotFound, match="VSchema"):
            await g2.execute(s2, "SELECT v FROM n WHERE id = 1")

        await g1.change_vschema("ks", lambda vs: {**vs, "tables": {**vs["tables"], "n": {
            "column_vindexes": [{"column": "id", "name": "hash"}]}}})
        await g1.execute(s1, "INSERT INTO n (id, v) VALUES (1, 'one')")
        took = await _wait_for(lambda: "n" in g2.topology.keyspace("ks").vschema["tables"])
        assert took < 1.0
        assert (await g2.execute(s2, "SELECT v FROM n WHERE id = 1")).rows == [("one",)]
        assert g2.degraded is None
    finally:
        await g1.close()
        await g2.close()


async def test_gate_that_loses_the_store_keeps_serving_degraded(tmp_path: Path) -> None:
    class Flaky(MemoryTopoStore):
        down = False

        async def clock(self) -> int:
            if self.down:
                raise Unavailable("the topo store at memory: is unreachable: test")
            return await super().clock()

    topology = Topology.from_dict({"keyspaces": {"ks": {"shards": {
        "0": f"sqlite:///{tmp_path / 'u.db'}"}, "vschema": {"sharded": False}}}})
    store = Flaky.seeded(topology)
    gate = Gate.open(topology, topo=TopoServer(store))
    gate.watch(interval=0.02)
    try:
        store.down = True
        await _wait_for(lambda: gate.degraded is not None)
        assert "unreachable" in (gate.degraded or "")
        s = gate.session("ks", identity=TRUSTED)
        assert (await gate.execute(s, "SELECT 1")).rows == [(1,)]
        store.down = False
        await _wait_for(lambda: gate.degraded is None)
    finally:
        await gate.close()


async def test_watcher_delivers_in_clock_order_never_skips() -> None:
    topology = Topology.from_dict({"keyspaces": {"ks": {"shards": {"0": "sqlite:///:memory:"},
                                                        "vschema": {"sharded": False}}}})
    store = MemoryTopoStore.seeded(topology)
    server = TopoServer(store)
    seen: list[int] = []
    watcher = TopoWatcher(server, lambda t: seen.append(t.version), version=topology.version)
    for n in range(3):
        await server.update_vschema("ks", lambda vs, n=n: {**vs, "tables": {f"t{n}": {}}})
        assert await watcher.poll()
    assert not await watcher.poll()
    assert seen == sorted(seen) and len(seen) == 3 and seen[-1] == await store.clock()


async def test_a_leased_record_goes_with_its_lease(store: TopoStore) -> None:
    if not store.has_leases:  # SQL and memory: no leases; a lease is refused, not ignored
        assert await store.grant_lease(3) is None
        with pytest.raises(InvalidArgument, match="no leases"):
            await store.put("tablet", "t", {"a": 1}, lease=7)
        return
    lease = await store.grant_lease(1)
    assert lease is not None
    v = await store.put("tablet", "t", {"a": 1}, lease=lease)
    assert await store.keep_alive(lease)
    seen: list[Record] = []
    version = v

    async def until_gone() -> None:
        nonlocal version
        while not any(r.name == "t" and r.doc is None for r in seen):
            await store.changed(version, 0.2)
            version, records = await store.changes_since(version)
            seen.extend(records)

    start = time.monotonic()
    await asyncio.wait_for(until_gone(), 10)
    took = time.monotonic() - start
    assert 0.9 < took < 4.0  # the lease's second, plus etcd's expiry check
    assert await store.get("tablet", "t") is None
    assert not await store.keep_alive(lease)
    assert await store.clock() >= version > v


async def test_unreachable_etcd_is_a_coded_error() -> None:
    server = TopoServer(open_topo_store("etcd://root:secret@127.0.0.1:1/sg"))
    try:
        with pytest.raises(Unavailable) as err:
            await Gate.from_topo(server)
        assert "topo store at etcd://127.0.0.1:1/sg" in err.value.message
        assert "secret" not in err.value.message
    finally:
        await server.close()


@pytest.mark.parametrize("url", ["etcd://", "etcd://h:x/p", "etcd://h/p?zone=a", "etcd://h/p?cell=a/b"])
def test_bad_etcd_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument, match="topo store URL"):
        open_topo_store(url)


async def test_a_gate_on_etcd_sees_a_vschema_change_within_100ms_median(
    tmp_path: Path, etcd_url: str
) -> None:
    """Watches, not polling: the median over 20 changes is well under one poll interval."""
    path = _cluster(tmp_path)
    g1 = await Gate.from_topo(await open_topo(path, url=etcd_url), watch=False)
    g2 = await Gate.from_topo(await open_topo(path, url=etcd_url))
    try:
        times: list[float] = []
        for n in range(20):
            name = f"n{n}"
            await g1.change_vschema("ks", lambda vs, name=name: {**vs, "tables": {
                **vs["tables"], name: {"column_vindexes": [{"column": "id", "name": "hash"}]}}})
            times.append(await _wait_for(
                lambda name=name: name in g2.topology.keyspace("ks").vschema["tables"]))
        median = statistics.median(times)
        print(f"etcd watch propagation: median {median * 1000:.1f} ms, "
              f"max {max(times) * 1000:.1f} ms over {len(times)} changes")
        assert median < 0.1
        assert g2.degraded is None
    finally:
        await g1.close()
        await g2.close()


async def test_a_gate_that_loses_etcd_keeps_serving_degraded(tmp_path: Path) -> None:
    """etcd killed: the watch breaks, the gate serves its topology, degraded; etcd back on
    the same ports and data: the watch resumes and a change made meanwhile arrives."""
    etcd = LocalEtcd.start(tmp_path / "etcd")
    url = f"{etcd.url}/sg"
    gate = await Gate.from_topo(await open_topo(_cluster(tmp_path), url=url))
    writer = await open_topo(url=url)
    try:
        s = gate.session("ks", identity=TRUSTED)
        await gate.execute(s, "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY)")
        etcd.kill()
        await _wait_for(lambda: gate.degraded is not None)
        assert "etcd://127.0.0.1" in (gate.degraded or "")
        assert (await gate.execute(s, "SELECT COUNT(*) FROM t")).rows == [(0,)]
        await asyncio.to_thread(etcd.restart)
        back = time.monotonic()
        while True:  # the writer's channel reconnects within a second (UNAVAILABLE: retry)
            try:
                await writer.update_vschema("ks", lambda vs: {**vs, "tables": {
                    **vs["tables"], "m": {"column_vindexes": [{"column": "id", "name": "hash"}]}}})
                break
            except Unavailable:
                assert time.monotonic() - back < 3.0
                await asyncio.sleep(0.1)
        await _wait_for(lambda: "m" in gate.topology.keyspace("ks").vschema["tables"]
                        and gate.degraded is None, timeout=15)
    finally:
        await writer.close()
        await gate.close()
        etcd.stop()
