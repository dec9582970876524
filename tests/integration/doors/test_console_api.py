"""The console's HTTP server against a real gate on SQLite shards: JSON APIs,
saving a VSchema, /debug, /metrics parsed by prometheus_client."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardgate.api.http import HttpServer
from shardgate.auth.identity import TRUSTED
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.topo.local import open_topo
from tests.conftest import console_cluster


@pytest.fixture
def console(console_site: tuple[Gate, str]) -> tuple[Gate, str]:
    return console_site


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_cluster_lists_shards_with_redacted_urls(console: tuple[Gate, str]) -> None:
    _, base = console
    doc = await _get(f"{base}/api/cluster")
    ks = doc["keyspaces"][0]
    assert ks["name"] == "ks" and [s["name"] for s in ks["shards"]] == ["-80", "80-"]
    assert all(s["backend"] == "sqlite" for s in ks["shards"])
    assert all(s["tablet"]["health"] == "serving" for s in ks["shards"])


async def test_invalid_vschema_is_refused_with_its_path_and_nothing_written(
    console: tuple[Gate, str],
) -> None:
    gate, base = console
    before = await gate.topo.store.clock()
    bad = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "nosuch"}]}}}
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{base}/api/vschema/ks", json={"vschema": bad}) as r:
            body = await r.json()
            assert r.status == 400, body
            assert body["code"] == "INVALID_ARGUMENT"
            assert body["path"].startswith("ks.tables.t.column_vindexes")
        async with http.post(f"{base}/api/vschema/ks/check", json=bad) as r:
            found = await r.json()
            assert found["errors"] and found["errors"][0]["path"].startswith("tables.t")
    assert await gate.topo.store.clock() == before


async def test_save_routes_by_the_new_vschema_and_conflicts_are_coded(
    console: tuple[Gate, str],
) -> None:
    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE IF NOT EXISTS u (id BIGINT PRIMARY KEY, v TEXT)")
    cur = await _get(f"{base}/api/vschema/ks")
    new = cur["vschema"]
    new["tables"]["u"] = {"column_vindexes": [{"column": "id", "name": "hash"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/vschema/ks/check", json=new) as r:
            found = await r.json()
            assert found["errors"] == [] and '+    "u": {' in found["diff"]
        async with http.put(f"{base}/api/vschema/ks",
                            json={"vschema": new, "version": cur["version"]}) as r:
            assert r.status == 200, await r.text()
        async with http.put(f"{base}/api/vschema/ks",
                            json={"vschema": new, "version": cur["version"]}) as r:
            assert r.status == 409 and (await r.json())["code"] == "ABORTED"
    await gate.execute(s, "INSERT INTO u (id, v) VALUES (7, 'x')")
    plan = gate.explain("SELECT v FROM u WHERE id = 7", "ks")
    assert plan["Instructions"]["Variant"] == "EqualUnique"


async def test_warnings_for_a_vschema_that_compiles_but_looks_wrong(
    console: tuple[Gate, str],
) -> None:
    _, base = console
    doc = {"sharded": True,
           "vindexes": {"hash": {"type": "hash"}, "spare": {"type": "xxhash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}
    async with aiohttp.ClientSession() as http, \
            http.post(f"{base}/api/vschema/ks/check", json=doc) as r:
        found = await r.json()
    assert found["errors"] == []
    assert {"path": "vindexes.spare", "message": "no table uses this vindex"} in found["warnings"]


async def test_debug_endpoints_and_query_log(console: tuple[Gate, str]) -> None:
    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, v TEXT)")
    await gate.execute(s, "INSERT INTO t (id, v) VALUES (1, 'a')")
    await gate.execute(s, "SELECT v FROM t WHERE id = 1")
    queryz = await _get(f"{base}/debug/queryz")
    assert any(q["query"] == "SELECT v FROM t WHERE id = ?" and q["count"] == 1 for q in queryz)
    log = await _get(f"{base}/debug/querylogz")
    assert log[0]["sql"] == "SELECT v FROM t WHERE id = ?" and log[0]["rows"] == 1
    assert (await _get(f"{base}/debug/health"))["status"] == "ok"
    assert "ks" in await _get(f"{base}/debug/schemaz")
    assert (await _get(f"{base}/debug/vars"))["topology_version"] == gate.topology.version
    plans = await _get(f"{base}/debug/query_plans")
    assert any(p["sql"].startswith("SELECT v FROM t") for p in plans)


async def _scrape(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        text = await r.text()
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _total(samples: dict[str, Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, [])
               if all(s.labels.get(k) == v for k, v in labels.items()))


async def test_metrics_move_when_queries_run(console: tuple[Gate, str]) -> None:
    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, v TEXT)")
    before = await _scrape(base)
    for i in range(5):
        await gate.execute(s, f"INSERT INTO t (id, v) VALUES ({100 + i}, 'x')")
    await gate.execute(s, "SELECT * FROM t")
    with pytest.raises(Exception, match="NOT_FOUND"):
        await gate.execute(s, "SELECT * FROM nosuch")
    after = await _scrape(base)
    count = "shardgate_gate_api_seconds_count"
    assert _total(after, count, keyspace="ks") - _total(before, count, keyspace="ks") >= 6
    assert _total(after, "shardgate_gate_rows_affected_total", keyspace="ks") \
        - _total(before, "shardgate_gate_rows_affected_total", keyspace="ks") == 5
    assert _total(after, "shardgate_tablet_query_seconds_count", keyspace="ks") \
        > _total(before, "shardgate_tablet_query_seconds_count", keyspace="ks")
    for family in ("shardgate_gate_plan_cache_hits_total", "shardgate_gate_shard_calls_bucket",
                   "shardgate_tablet_lease_holder", "shardgate_gate_topology_version"):
        assert family in after, family


async def test_streams_list_consumers_with_position_and_lag(console: tuple[Gate, str]) -> None:
    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, v TEXT)")
    assert await _get(f"{base}/api/streams") == []
    stream = gate.update_stream("ks", heartbeat_s=0.1, identity=TRUSTED)
    seen = 0
    beats = asyncio.Event()
    done = asyncio.Event()

    async def consume() -> None:
        nonlocal seen
        async for ev in stream:
            if ev.heartbeat:
                beats.set()
            seen += len(ev.changes)
            if seen >= 3:
                done.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(beats.wait(), 20)  # the stream runs: later commits reach it
    for i in range(3):
        await gate.execute(s, f"INSERT INTO t (id, v) VALUES ({i}, 'x')")
    await asyncio.wait_for(done.wait(), 20)
    consumers = await _get(f"{base}/api/streams")
    assert len(consumers) == 1 and consumers[0]["keyspace"] == "ks"
    assert consumers[0]["events"] >= 1 and consumers[0]["position"]
    samples = await _scrape(base)
    assert _total(samples, "shardgate_stream_consumers", keyspace="ks") == 1
    assert "shardgate_stream_lag_seconds" in samples
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await _get(f"{base}/api/streams") == []


async def test_kill_a_live_query_on_postgresql(make_database: Any) -> None:
    url = make_database("postgres", "console_kill")
    from shardgate.topo.model import Topology

    gate = Gate.open(Topology.from_dict({"keyspaces": {"pg": {
        "shards": {"0": url}, "vschema": {"sharded": False}}}}))
    server = HttpServer(gate, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{await server.start()}"
    try:
        s = gate.session("pg", identity=TRUSTED)
        slow = asyncio.create_task(gate.execute(s, "SELECT pg_sleep(30)"))
        live: list[Any] = []
        for _ in range(200):
            live = [q for q in await _get(f"{base}/api/live") if "PG_SLEEP" in q["sql"].upper()]
            if live:
                break
            await asyncio.sleep(0.05)
        assert live, "the running query is not listed"
        async with aiohttp.ClientSession() as http, \
                http.post(f"{base}/api/live/{live[0]['id']}/kill") as r:
            assert r.status == 200
        with pytest.raises(Exception, match="killed by an operator") as err:
            await asyncio.wait_for(slow, 10)
        assert "ABORTED" in str(err.value)
        # the shard still answers, on a connection that is not stuck in the sleep
        assert (await gate.execute(s, "SELECT 1")).rows == [(1,)]
        assert [q for q in await _get(f"{base}/api/live") if "PG_SLEEP" in q["sql"].upper()] == []
    finally:
        await server.stop()
        await gate.close()


async def test_console_needs_the_gates_users_and_admins_to_change(tmp_path: Path) -> None:
    from shardgate.auth.acl import TableACL
    from shardgate.auth.guard import Guard
    from shardgate.auth.users import StaticUsers

    users = StaticUsers.from_mapping({"rita": [{"Password": "r-pw"}],
                                      "dba": [{"Password": "d-pw"}]})
    acl = TableACL.from_mapping({"table_groups": [{
        "name": "all", "table_names_or_prefixes": ["%"], "readers": ["rita"],
        "writers": [], "admins": ["dba"]}]})
    gate = await Gate.from_topo(await open_topo(console_cluster(tmp_path)), guard=Guard(acl))
    server = HttpServer(gate, "127.0.0.1", 0, users=users)
    base = f"http://127.0.0.1:{await server.start()}"
    def basic(user: str, pw: str) -> dict[str, str]:
        return {"Authorization": aiohttp.encode_basic_auth(user, pw)}

    rita, dba = basic("rita", "r-pw"), basic("dba", "d-pw")
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/", "/api/cluster", "/metrics", "/debug/vars"):
                async with http.get(base + path) as r:
                    assert r.status == 401 and "Basic" in r.headers["WWW-Authenticate"], path
            async with http.get(base + "/api/cluster",
                               headers=basic("rita", "wrong")) as r:
                assert r.status == 401
            async with http.get(base + "/api/vschema/ks", headers=rita) as r:
                assert r.status == 200
                cur = await r.json()
            before = await gate.topo.store.clock()
            async with http.put(base + "/api/vschema/ks", headers=rita,
                                json={"vschema": cur["vschema"], "version": cur["version"]}) as r:
                body = await r.json()
                assert r.status == 403 and body["code"] == "PERMISSION_DENIED", body
            assert await gate.topo.store.clock() == before
            async with http.put(base + "/api/vschema/ks", headers=dba,
                                json={"vschema": cur["vschema"], "version": cur["version"]}) as r:
                assert r.status == 200, await r.text()
    finally:
        await server.stop()
        await gate.close()


async def test_segmented_queues_and_inbox_stores_on_the_queue_api(
    console: tuple[Gate, str],
) -> None:
    from shardgate.queues.inbox.store import InboxStore

    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE QUEUE sjobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                          "SHARD BY user_id WITH (storage = segmented)")
    refs = await gate.queue_enqueue("ks", "sjobs", [(str(i), f"job {i}") for i in range(6)])
    inbox = InboxStore(gate, "ks", "notes")
    await inbox.create()
    await inbox.append(7, "hello")
    queues = {q["queue"]: q for q in await _get(f"{base}/api/queues")}
    seg = queues["sjobs"]
    assert seg["storage"] == "segmented"
    assert sum(sum(sh["jobs_by_state"].values()) for sh in seg["shards"]) == 6
    shard, job_id = refs[0]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/queues/ks/sjobs/abort_job",
                             json={"shard": shard, "ids": [str(job_id)], "reason": "test"}) as r:
            assert r.status == 200 and (await r.json()) == {"requested": 1}, await r.text()
        async with http.post(f"{base}/api/queues/ks/sjobs/retry_job", json={"ids": [1]}) as r:
            assert r.status == 400 and "shard" in (await r.json())["message"]
    inboxes = await _get(f"{base}/api/inboxes")
    notes = [i for i in inboxes if i["name"] == "notes"]
    assert notes and notes[0]["keyspace"] == "ks" and notes[0]["bucket_count"] >= 1
    counted = await _get(f"{base}/api/inboxes/ks/notes?counts=1")
    assert counted["messages"] == 1


# -- the charts' figures, lease holder and log positions, workflows (issue 34 item 12) ------


def _totals(stats: dict[str, Any], keyspace: str) -> dict[str, tuple[int, int]]:
    """(calls, errors) in the window per series: "" for the keyspace, else the shard."""
    return {s["shard"]: (s["total"]["count"], s["total"]["errors"])
            for s in stats["keyspaces"] + stats["shards"] if s["keyspace"] == keyspace}


async def test_stats_count_known_traffic_per_keyspace_and_shard(
    console: tuple[Gate, str],
) -> None:
    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, v TEXT)")
    before = _totals(await _get(f"{base}/api/stats?minutes=5"), "ks")
    for i in range(50):
        await gate.execute(s, f"INSERT INTO t (id, v) VALUES ({1000 + i}, 'x')")
    for i in range(2):  # the shard refuses a duplicate key: two failed statements
        with pytest.raises(ShardgateError):
            await gate.execute(s, f"INSERT INTO t (id, v) VALUES ({1000 + i}, 'again')")
    stats = await _get(f"{base}/api/stats?minutes=5")
    after = _totals(stats, "ks")
    assert after[""][0] - before[""][0] == 52 and after[""][1] - before[""][1] == 2
    # each insert is one call to the shard of its id; together the shards saw all 52
    shard_calls = {k: after[k][0] - before.get(k, (0, 0))[0] for k in ("-80", "80-")}
    assert sum(shard_calls.values()) == 52 and all(n > 0 for n in shard_calls.values())
    assert sum(after[k][1] - before.get(k, (0, 0))[1] for k in ("-80", "80-")) == 2
    assert stats["bucket_s"] == 10 and len(stats["starts"]) == 30
    ks = next(x for x in stats["keyspaces"] if x["keyspace"] == "ks")
    assert len(ks["qps"]) == len(ks["count"]) == len(ks["p99_ms"]) == 30
    assert ks["count"][-1] + ks["count"][-2] >= 52  # now's window (or the one before)
    busy = [i for i, c in enumerate(ks["count"]) if c]
    assert all(ks["p50_ms"][i] is not None and 0 < ks["p50_ms"][i] <= ks["p99_ms"][i]
               for i in busy)
    assert all(ks["p50_ms"][i] is None for i, c in enumerate(ks["count"]) if not c)
    assert max(ks["error_rate"]) > 0 and ks["qps"][busy[-1]] > 0
    async with aiohttp.ClientSession() as http, \
            http.get(f"{base}/api/stats?minutes=soon") as r:
        assert r.status == 400 and (await r.json())["code"] == "INVALID_ARGUMENT"


#: each backend's log end as the cluster page shows it
LOG_END = {"postgres": r"[0-9A-F]+/[0-9A-F]+", "mysql": r"\d+-\d+-\d+(,\d+-\d+-\d+)*"}


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres),
                                  pytest.param("mysql", marks=pytest.mark.mysql)])
async def test_cluster_names_the_lease_holder_and_log_end_without_a_queue(
    make_database: Any, kind: str
) -> None:
    from shardgate.topo.model import Topology

    url = make_database(kind, "console_lease")
    gate = Gate.open(Topology.from_dict({"keyspaces": {"pg": {
        "shards": {"0": url}, "vschema": {"sharded": False}}}}))
    gate.compete_for_leases()  # what a serving gate (`shardgate up`, `gate`) does first
    server = HttpServer(gate, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{await server.start()}"
    try:
        shard: dict[str, Any] = {}
        for _ in range(200):  # the lease is taken in the background
            shard = (await _get(f"{base}/api/cluster"))["keyspaces"][0]["shards"][0]
            if shard["lease_holder"]:
                break
            await asyncio.sleep(0.05)
        assert shard["lease_holder"].startswith("in-process ("), shard
        assert re.fullmatch(LOG_END[kind], shard["log_position"]), shard
        assert shard["reader_position"] == ""  # nothing streams it: the reader is not started
        async with aiohttp.ClientSession() as http, http.get(f"{base}/") as r:
            page = await r.text()
        # the page reads the log end again: the server's WAL moves with any other
        # database's writes (PostgreSQL's LSN is server-wide), so its shape, not its value
        assert "in-process (" in page
        shown = re.search(r'<code class="log-end">([^<]*)</code>', page)
        assert shown is not None and re.fullmatch(LOG_END[kind], shown.group(1)), page
    finally:
        await server.stop()
        await gate.close()


async def test_queue_api_keeps_a_history_for_the_charts(console: tuple[Gate, str]) -> None:
    gate, base = console
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE QUEUE hjobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                          "SHARD BY user_id")
    for i in range(3):
        await gate.execute(s, f"INSERT INTO hjobs (user_id, body) VALUES ({i}, 'job')")
    queues = {q["queue"]: q for q in await _get(f"{base}/api/queues")}
    history = queues["hjobs"]["history"]
    assert len(history) == 1 and history[0][1] == 3  # [time, pending, fired, acked, ...]
    # a second read within QUEUE_SAMPLE_S adds no sample
    queues = {q["queue"]: q for q in await _get(f"{base}/api/queues")}
    assert len(queues["hjobs"]["history"]) == 1


def test_queue_history_rates_from_the_leaders_counters() -> None:
    from shardgate.api.http.model import QueueHistory

    h = QueueHistory()

    def doc(pending: int, fired: int, acked: int) -> list[dict[str, Any]]:
        return [{"keyspace": "ks", "queue": "q", "storage": "table", "shards": [
            {"shard": "-80", "depth": {"to_be_fired": pending}, "fired": fired, "acked": acked},
            {"shard": "80-", "depth": {"to_be_fired": 0}, "fired": 0, "acked": 0}]}]

    h.add(doc(10, 0, 0), now=100.0)
    h.add(doc(9, 5, 5), now=101.0)  # within QUEUE_SAMPLE_S: not kept
    h.add(doc(4, 20, 10), now=104.0)
    assert h.series("ks", "q") == [[100.0, 10, 0, 0, 0.0, 0.0], [104.0, 4, 20, 10, 5.0, 2.5]]
    h.add(doc(4, 1, 1), now=110.0)  # a new leader's counters start again: no negative rate
    assert h.series("ks", "q")[-1][4:] == [0.0, 0.0]


async def test_workflow_actions_need_the_admin_role_and_a_real_workflow(
    tmp_path: Path,
) -> None:
    from shardgate.auth.acl import TableACL
    from shardgate.auth.guard import Guard
    from shardgate.auth.users import StaticUsers

    users = StaticUsers.from_mapping({"rita": [{"Password": "r-pw"}],
                                      "dba": [{"Password": "d-pw"}]})
    acl = TableACL.from_mapping({"table_groups": [{
        "name": "all", "table_names_or_prefixes": ["%"], "readers": ["rita"],
        "writers": [], "admins": ["dba"]}]})
    gate = await Gate.from_topo(await open_topo(console_cluster(tmp_path)), guard=Guard(acl))
    server = HttpServer(gate, "127.0.0.1", 0, users=users)
    base = f"http://127.0.0.1:{await server.start()}"
    rita = {"Authorization": aiohttp.encode_basic_auth("rita", "r-pw")}
    dba = {"Authorization": aiohttp.encode_basic_auth("dba", "d-pw")}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/api/workflows", headers=rita) as r:
                assert r.status == 200 and await r.json() == []
            url = f"{base}/api/workflows/reshard:ks.split/switch_writes"
            async with http.post(url, headers=rita) as r:
                body = await r.json()
                assert r.status == 403 and body["code"] == "PERMISSION_DENIED", body
            async with http.post(url, headers=dba) as r:
                body = await r.json()
                assert r.status == 404 and body["code"] == "NOT_FOUND", body
            async with http.post(f"{base}/api/workflows/reshard:ks.split/drop",
                                 headers=dba) as r:
                assert r.status == 400 and "unknown workflow action" in (await r.json())["message"]
            async with http.post(f"{base}/api/workflows/backfill:ks/vdiff", headers=dba) as r:
                assert r.status == 400
    finally:
        await server.stop()
        await gate.close()
