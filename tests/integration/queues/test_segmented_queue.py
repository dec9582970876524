"""The segmented job store on SQLite, PostgreSQL and MariaDB (real servers).

What must hold (see ``shardgate/queues/segmented/consumer.py``):

* with injected failures and a consumer restart, per-key order is kept (a job
  is handed out only after every earlier job of its key succeeded), no job is
  lost, none is handed out again after its success committed;
* datasets are dropped whole as they complete; leading mostly-done datasets
  are merged into one, with a bounded pause;
* operators can retry and abort jobs; the ``<queue>_job_state`` view shows
  every job's latest state in plain SQL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardgate.backends import Backend, open_backend
from shardgate.errors import Code, NotFound, Unavailable
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.ddl import DATASET_STEP
from shardgate.queues.segmented.queue import SegmentedJob, SegmentedQueue


def _queue(backend: Backend, **opts: object) -> SegmentedQueue:
    options = QueueOptions.from_mapping({"storage": "segmented", **opts})
    return SegmentedQueue(keyspace="ks", queue="ev", backends={"0": backend}, options=options,
                          poll_interval=0.02, compaction_interval=0.05, read_batch=200)


async def _rows(backend: Backend, sql: str) -> list[tuple[object, ...]]:
    return [tuple(r) for r in (await backend.execute(sql)).rows]


async def _until(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok = cond()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_failures_restart_keep_key_order_no_loss_no_redo(backend: Backend) -> None:
    n_jobs, n_keys = 600, 15
    q = _queue(backend, dataset_max_rows=100, min_backoff=0.02, max_backoff=0.05,
               batch_size=40)
    await q.open()
    stored = await asyncio.gather(*(
        q.store_many([(f"k{i % n_keys}", f"p{i}") for i in range(s, min(n_jobs, s + 50))])
        for s in range(0, n_jobs, 50)))
    ids = [job_id for part in stored for _, job_id in part]
    assert len(set(ids)) == n_jobs
    key_of = {job_id: f"k{i % n_keys}" for i, job_id in enumerate(
        job_id for part in stored for _, job_id in part)}
    # ids increase in commit order; within one store_many call, in order
    earlier: dict[int, list[int]] = {}
    by_key: dict[str, list[int]] = {}
    for job_id in sorted(ids):
        earlier[job_id] = list(by_key.get(key_of[job_id], []))
        by_key.setdefault(key_of[job_id], []).append(job_id)

    succeeded: set[int] = set()
    deliveries: dict[int, int] = {}
    violations: list[str] = []
    acked_total = 0

    async def work(queue: SegmentedQueue, stop_after: int) -> None:
        nonlocal acked_total
        deadline = time.monotonic() + 30
        while acked_total < stop_after:
            assert time.monotonic() < deadline, (
                f"stuck at {acked_total} of {stop_after}: {queue.consumers['0'].stats()}")
            try:
                jobs = await asyncio.wait_for(queue.take(), 0.2)
            except TimeoutError:
                continue
            good: list[SegmentedJob] = []
            bad: list[SegmentedJob] = []
            for job in jobs:
                deliveries[job.job_id] = deliveries.get(job.job_id, 0) + 1
                if job.job_id in succeeded:
                    violations.append(f"job {job.job_id} handed out after its success")
                missing = [e for e in earlier[job.job_id] if e not in succeeded]
                if missing:
                    violations.append(f"job {job.job_id} of {job.key} before {missing[:3]}")
                # inject failures: every 7th job fails its first two attempts
                (bad if job.job_id % 7 == 0 and job.attempt <= 2 else good).append(job)
            if bad:
                await queue.fail(bad, "injected failure")
            if good:
                count = await queue.ack(good)  # (not `+= await`: two workers)
                acked_total += count
                succeeded.update(j.job_id for j in good)

    await asyncio.gather(*(work(q, n_jobs // 2) for _ in range(2)))
    # jobs taken but never acked when the consumer goes away: handed out again later
    orphan = await q.take(5)
    assert orphan
    for o in orphan:
        deliveries[o.job_id] = deliveries.get(o.job_id, 0) + 1
    await q.close()
    assert violations == []

    q2 = _queue(backend, dataset_max_rows=100, min_backoff=0.02, max_backoff=0.05,
                batch_size=40)
    await q2.open()
    await asyncio.gather(*(work(q2, n_jobs) for _ in range(2)))
    assert violations == []
    assert acked_total == n_jobs  # every job succeeded exactly once (acks count pending jobs)
    assert succeeded == set(ids)
    assert all(deliveries[o.job_id] >= 2 for o in orphan)
    consumer = q2.consumers["0"]
    assert consumer.stats()["pending"] == 0

    # datasets are dropped whole as they complete: only the open one and the spare stay
    async def compacted() -> bool:
        states = [r[0] for r in await _rows(backend, "SELECT state FROM ev_datasets")]
        return sorted(states) == ["open", "ready"]

    await _until(compacted)
    with pytest.raises(NotFound):
        await backend.execute(f"SELECT COUNT(*) FROM ev_jobs_{DATASET_STEP}")
    # the status history: 7th jobs have two failed rows then a success, in the view
    state = {int(r[0]): (str(r[1]), int(r[2])) for r in await _rows(
        backend, "SELECT job_id, state, attempt FROM ev_job_state")}
    for job_id, (st, attempt) in state.items():
        assert st == "succeeded"
        if job_id % 7 == 0 and job_id not in {o.job_id for o in orphan}:
            assert attempt == 3
    await q2.close()


async def test_merge_leading_datasets_and_operator_actions(backend: Backend) -> None:
    q = _queue(backend, dataset_max_rows=40, min_backoff=60, max_backoff=60, batch_size=100)
    await q.open()
    # four datasets; the first job of each is of its own "stuck" key and will fail
    stuck: list[int] = []
    for d in range(4):
        out = await q.store_many([(f"stuck{d}", "s")] + [(f"u{d}_{i}", "x") for i in range(39)])
        stuck.append(out[0][1])
    await q.store("tail", "t")  # opens a fifth dataset, so the four are closed
    consumer = q.consumers["0"]
    done = 0
    while done < 4 * 39 + 1:
        jobs = await asyncio.wait_for(q.take(), 5)
        bad = [j for j in jobs if j.key.startswith("stuck")]
        await q.fail(bad, "boom")
        done += await q.ack([j for j in jobs if not j.key.startswith("stuck")])

    async def merged() -> bool:
        rows = await _rows(backend, "SELECT n, state FROM ev_datasets ORDER BY n")
        # one merged dataset, and no source left being dropped
        return [(int(n) % DATASET_STEP, s) for n, s in rows] == [
            (1, "closed"), (0, "open"), (0, "ready")]

    await _until(merged)
    assert consumer.max_pause < 5.0  # the documented bound: copy <= merge_max_rows jobs
    rows = await _rows(backend, "SELECT dataset, job_id, state, reason FROM ev_job_state "
                       "WHERE state <> 'succeeded' ORDER BY job_id")
    assert [int(r[1]) for r in rows] == stuck
    assert {str(r[2]) for r in rows} == {"failed"} and {str(r[3]) for r in rows} == {"boom"}
    assert len({int(r[0]) for r in rows}) == 1  # all in the merged dataset
    assert sorted(consumer.blocked_keys()) == [f"stuck{d}" for d in range(4)]
    info = (await q.inspect())[0]
    assert set(info["blocked_keys"]) == {f"stuck{d}" for d in range(4)}

    # operators: abort one, retry the others now (their backoff is 60 s)
    await q.request("0", stuck[0], "abort", "given up")
    for job_id in stuck[1:]:
        await q.request("0", job_id, "retry")
    again = []
    while len(again) < 3:
        again += await asyncio.wait_for(q.take(), 5)
    assert sorted(j.job_id for j in again) == stuck[1:]
    assert all(j.attempt == 2 for j in again)
    await q.ack(again)

    async def all_done() -> bool:
        rows = await _rows(backend, "SELECT state FROM ev_datasets")
        return "closed" not in {str(r[0]) for r in rows}

    await _until(all_done)
    # the aborted job can be retried while its dataset lives; here it was dropped with it
    await q.request("0", stuck[0], "retry")
    await asyncio.sleep(0.2)
    assert consumer.failure is None
    await q.close()


async def test_hot_key_breaker_and_group_commit(make_database: Callable[..., str]) -> None:
    backend = open_backend(make_database("sqlite"))
    try:
        q = _queue(backend, hot_key_threshold=10, hot_key_cooldown=60, batch_size=100)
        await q.open()
        # 200 concurrent producers: coalesced into few writes, each told its own id
        results = await asyncio.gather(*(q.store("hot" if i < 30 else f"c{i}", str(i))
                                         for i in range(200)))
        assert len({r[1] for r in results}) == 200
        assert q.producers["0"].writes <= 10
        await _until(lambda: q.consumers["0"].stats()["pending"] == 200)
        jobs = await q.take(200)
        hot = [j for j in jobs if j.key == "hot"]
        assert len(hot) == 30  # ordering off for the hot key: all at once
        assert len(jobs) == 200
        assert q.consumers["0"].stats()["hot_keys"] == ["hot"]
        await q.ack(jobs)
        await q.close()

        q2 = _queue(backend, hot_key_threshold=100, batch_size=100)
        await q2.open()
        await q2.store_many([("k", str(i)) for i in range(20)])
        await _until(lambda: q2.consumers["0"].stats()["pending"] == 20)
        first = await q2.take(100)
        assert len(first) == 1  # ordered: one at a time
        await q2.ack(first)
        second = await q2.take(100)
        assert [j.job_id for j in second] == [first[0].job_id + 1]
        await q2.close()
    finally:
        await backend.close()


async def test_second_consumer_waits_for_the_lease(make_database: Callable[..., str]) -> None:
    url = make_database("sqlite")
    b1, b2 = open_backend(url), open_backend(url)
    try:
        q1 = await _queue(b1).open()
        q2 = _queue(b2)
        await q2.open(wait=None)
        await asyncio.sleep(0.3)
        assert q1.consumers["0"].leader and not q2.consumers["0"].leader
        await q2.store("a", "1")  # producers need no lease
        jobs = await asyncio.wait_for(q1.take(), 5)
        assert [j.key for j in jobs] == ["a"]
        await q1.ack(jobs)
        await q1.close()
        await q2.consumers["0"].wait_ready(5)
        await q2.store("b", "2")
        jobs = await asyncio.wait_for(q2.take(), 5)
        assert [j.key for j in jobs] == ["b"]
        await q2.ack(jobs)
        await q2.close()
    finally:
        await b1.close()
        await b2.close()


async def test_open_while_another_consumes_is_refused_with_a_code(
    make_database: Callable[..., str]
) -> None:
    """open() with ``wait`` while another process holds the queue's lock (a tablet serving
    the keyspace, say): UNAVAILABLE naming the cause, and its consumers stopped (they do
    not take the lock later behind the caller's back)."""
    url = make_database("sqlite")
    b1, b2 = open_backend(url), open_backend(url)
    try:
        q1 = await _queue(b1).open()
        q2 = _queue(b2)
        with pytest.raises(Unavailable, match="another process holds the queue's lock") as err:
            await q2.open(wait=0.5)
        assert err.value.code is Code.UNAVAILABLE
        await q1.close()
        await asyncio.sleep(1.2)  # over twice the consumers' lease_retry (0.5 s)
        assert not q2.consumers["0"].leader
        await q2.open()  # free now
        assert q2.consumers["0"].leader
        await q2.close()
    finally:
        await b1.close()
        await b2.close()


async def test_declared_in_vschema_routed_by_vindex(make_database: Callable[..., str]) -> None:
    from shardgate.gate import Gate
    from shardgate.keys import KeyRange
    from shardgate.topo import Topology

    shards = {kr.name: make_database("sqlite", f"s{i}")
              for i, kr in enumerate(KeyRange(b"", b"").split(2))}
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": shards,
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {
            "events": {"type": "queue",
                       "column_vindexes": [{"column": "user_id", "name": "hash"}],
                       "queue": {"storage": "segmented", "batch_size": 500}}}}}}})
    gate = Gate.open(topo)
    try:
        # the tablets know it as a segmented queue (their consumers start only once a
        # receiver subscribes through the gate, so this process's consumers run here)
        from shardgate.queues.router import queue_options_of

        assert queue_options_of(gate, "app")["events"].storage == "segmented"
        q = await SegmentedQueue.from_gate(gate, "app", "events").open()
        placed = await q.store_many([(user, f"{user}:{i}") for i in range(5)
                                     for user in range(40)])
        by_user: dict[int, set[str]] = {}
        for (shard, _), user in zip(placed, [u for _ in range(5) for u in range(40)],
                                    strict=True):
            by_user.setdefault(user, set()).add(shard)
        assert all(len(s) == 1 for s in by_user.values())  # a key lives on one shard
        assert {s for ss in by_user.values() for s in ss} == set(shards)  # both used
        # the shard is the one the vindex gives, as for a row of a table sharded by user_id
        vindex = gate.vschema.keyspace("app").vindexes["hash"]
        for user, (shard,) in by_user.items():
            ksid = vindex.map([user])[0][0]  # type: ignore[attr-defined]
            assert topo.keyspace("app").shard_map.find(ksid) == shard
        seen: dict[str, list[int]] = {}
        while sum(len(v) for v in seen.values()) < 200:
            jobs = await asyncio.wait_for(q.take(), 5)
            for j in jobs:
                seen.setdefault(j.key, []).append(int(str(j.payload).split(":")[1]))
            await q.ack(jobs)
        assert all(v == list(range(5)) for v in seen.values())  # per-key order
        await q.close()
    finally:
        await gate.close()


async def test_postgres_array_literals_round_trip(make_database: Callable[..., str]) -> None:
    backend = open_backend(make_database("postgres"))
    try:
        q = await _queue(backend).open()
        odd = ['a"b', "back\\slash", "{braces}", "comma,x", "NULL", "", "ünï", "tab\tnl\n", None]
        placed = await q.store_many([(f"key{i}", k) for i, k in enumerate(odd)])
        jobs = await asyncio.wait_for(q.take(100), 5)
        assert [j.payload for j in jobs] == odd
        assert [j.job_id for j in jobs] == [p[1] for p in placed]
        await q.close()
    finally:
        await backend.close()


def test_cli_segments_list_stats_and_abort(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from shardgate.cli import main

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": {"-80": "sqlite:///a.db", "80-": "sqlite:///b.db"},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {
            "ev": {"type": "queue", "column_vindexes": [{"column": "user_id", "name": "hash"}],
                   "queue": {"storage": "segmented"}}}}}}}))

    async def produce() -> list[tuple[str, int]]:
        from shardgate.gate import Gate
        from shardgate.topo import load_cluster_file

        gate = Gate.open(load_cluster_file(cluster))
        try:
            q = SegmentedQueue.from_gate(gate, "app", "ev")
            await q.ensure()
            return await q.store_many([(u, "x") for u in range(10)])
        finally:
            await gate.close()

    placed = asyncio.run(produce())
    args = ["--keyspace", "app", "--cluster", str(cluster), "ev"]
    assert main(["queue", "segments", "list", *args]) == 0
    out = capsys.readouterr().out
    assert "-80" in out and "80-" in out and "open" in out and "ready" in out
    assert main(["queue", "segments", "stats", "--json", *args]) == 0
    info = json.loads(capsys.readouterr().out)
    assert sum(s["jobs_by_state"].get("pending", 0) for s in info) == 10
    shard, job_id = placed[0]
    assert main(["queue", "segments", "abort", "--shard", shard, "--reason", "bad input",
                 *args[:4], "ev", str(job_id)]) == 0
    capsys.readouterr()

    async def consume() -> list[int]:
        from shardgate.gate import Gate
        from shardgate.topo import load_cluster_file

        gate = Gate.open(load_cluster_file(cluster))
        try:
            q = await SegmentedQueue.from_gate(gate, "app", "ev", compaction_interval=0.05).open()
            got: list[int] = []
            while len(got) < 9:
                jobs = await asyncio.wait_for(q.take(), 5)
                got += [j.job_id for j in jobs if j.shard == shard]
                got += [-1 for j in jobs if j.shard != shard]
                await q.ack(jobs)
            await q.close()
            return got
        finally:
            await gate.close()

    got = asyncio.run(consume())
    assert job_id not in got  # aborted by the operator before any consumer read it
    assert main(["queue", "segments", "stats", "--json", *args]) == 0
    info = json.loads(capsys.readouterr().out)
    states = {s["shard"]: s["jobs_by_state"] for s in info}
    assert states[shard].get("aborted") == 1


async def test_merge_pause_is_bounded_and_producers_never_wait(
        make_database: Callable[..., str]) -> None:
    """Merges copying up to 1500 pending jobs on PostgreSQL: producers keep storing with low
    latency meanwhile, and the consumer's pause stays well under the documented bound."""
    backend = open_backend(make_database("postgres"), pool_size=6)
    try:
        q = await _queue(backend, dataset_max_rows=2000, merge_max_rows=2000,
                         hot_key_threshold=5000, min_backoff=60, max_backoff=60,
                         batch_size=500).open()
        # 3 datasets; every 4th job is of one key whose first job keeps failing, so 500
        # jobs of each dataset stay pending (blocked behind it)
        for d in range(3):
            for part in range(0, 2000, 500):
                await q.store_many([("stuck" if i % 4 == 0 else f"u{d}_{i}", "x" * 100)
                                    for i in range(part, part + 500)])
        latencies: list[float] = []
        stop = asyncio.Event()

        async def producer() -> None:
            i = 0
            while not stop.is_set():
                t = time.perf_counter()
                await q.store(f"p{i}", "y")
                latencies.append(time.perf_counter() - t)
                i += 1
                await asyncio.sleep(0.005)

        prod = asyncio.create_task(producer())
        consumer = q.consumers["0"]
        done = 0
        while done < 4500:
            jobs = await asyncio.wait_for(q.take(), 5)
            await q.fail([j for j in jobs if j.key == "stuck"], "down")
            done += await q.ack([j for j in jobs
                                 if j.key != "stuck" and not j.key.startswith("p")])
            await q.ack([j for j in jobs if j.key.startswith("p")])

        async def merged() -> bool:
            rows = await _rows(backend, "SELECT n FROM ev_datasets WHERE state = 'closed'")
            return [int(r[0]) for r in rows] == [3 * DATASET_STEP + 1]

        await _until(merged, 20)
        stop.set()
        await prod
        rows = await _rows(backend, "SELECT COUNT(*) FROM ev_job_state WHERE job_key = 'stuck'")
        assert int(rows[0][0]) == 1500  # every pending job was moved
        assert consumer.max_pause < 2.0, consumer.max_pause
        assert max(latencies) < 1.0, max(latencies)  # producers were not held up
        await q.close()
    finally:
        await backend.close()


async def test_max_in_flight(make_database: Callable[..., str]) -> None:
    backend = open_backend(make_database("sqlite"))
    try:
        q = await _queue(backend, max_in_flight=5, batch_size=100).open()
        await q.store_many([(f"k{i}", str(i)) for i in range(20)])
        await _until(lambda: q.consumers["0"].stats()["pending"] == 20)
        first = await q.take()
        assert len(first) == 5
        waiting = asyncio.create_task(q.take())
        await asyncio.sleep(0.1)
        assert not waiting.done()  # at the limit: the next take waits for an ack
        await q.ack(first[:2])
        second = await asyncio.wait_for(waiting, 2)
        assert len(second) == 2
        await q.ack(first[2:] + second)
        await q.close()
    finally:
        await backend.close()


async def test_consumer_starts_over_after_losing_its_connection(
        make_database: Callable[..., str]) -> None:
    """The lease connection is killed (as by a database restart): the consumer drops its
    state, takes the lease again, and every job still succeeds; the batch that was being
    worked on is handed out again (at least once)."""
    import psycopg

    from shardgate.errors import ShardgateError

    url = make_database("postgres")
    backend = open_backend(url)
    try:
        q = await _queue(backend, batch_size=10).open()
        placed = await q.store_many([(f"k{i}", str(i)) for i in range(50)])
        first = await asyncio.wait_for(q.take(), 5)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                          "'advisory' AND database = (SELECT oid FROM pg_database WHERE "
                          "datname = current_database()) AND pid <> pg_backend_pid()")
        with pytest.raises(ShardgateError):  # the ack cannot be written on the dead lease
            for _ in range(20):
                await q.ack(first[:1])
                first = first[1:] or first
                await asyncio.sleep(0.05)
        consumer = q.consumers["0"]
        await _until(lambda: consumer.leader and consumer.restarts == 1)
        succeeded: set[int] = set()
        again = 0
        while len(succeeded) < 50:
            try:
                jobs = await asyncio.wait_for(q.take(), 5)
            except ShardgateError:
                continue
            again += sum(1 for j in jobs if j.attempt > 1)
            await q.ack(jobs)
            succeeded.update(j.job_id for j in jobs)
        assert succeeded == {p[1] for p in placed}
        assert again >= 1  # the interrupted batch ran again
        assert consumer.failure is None
        await q.close()
    finally:
        await backend.close()
