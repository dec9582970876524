"""The Spark jobs (dump, archive) on a local Spark, over SQLite and PostgreSQL shards."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import ShardgateError
from shardgate.spark.jobs import ArchiveJob, DumpJob, parse_before, read_table
from shardgate.spark.jobs.lake import DELETED, ORDER
from shardgate.topo import write_cluster_file
from tests.integration.conftest import Cluster, open_cluster

KINDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
SEED = 200
ORDER_SCHEMA = "order_id BIGINT, customer_id BIGINT, sku STRING, price BIGINT"


async def _cluster(kind: str, make_database: Callable[..., str], tmp_path: Path
                   ) -> tuple[Cluster, str]:
    if kind == "postgres":
        from tests.conftest import require_server

        require_server("postgres")
    cluster = await open_cluster(kind, make_database)
    path = tmp_path / "cluster.yaml"
    write_cluster_file(cluster.topology, path)
    return cluster, str(path)


async def _db_rows(spark: Any, cluster: Cluster) -> Any:
    """The table as the database holds it (read through the gate) as a DataFrame."""
    res = await cluster.gate.execute(
        cluster.gate.session(identity=TRUSTED),
        "SELECT order_id, customer_id, sku, price FROM corder")
    return spark.createDataFrame([tuple(r) for r in res.rows], ORDER_SCHEMA)


def _lake_rows(lake: str) -> list[dict[str, Any]]:
    """Every row of the lake table (tombstones and tokens too), by key, read by delta-rs."""
    from deltalake import DeltaTable

    return sorted(DeltaTable(lake).to_pyarrow_table().to_pylist(), key=lambda r: r["order_id"])


def _assert_same(lake: Any, db: Any) -> None:
    missing = db.exceptAll(lake).collect()
    extra = lake.exceptAll(db).collect()
    assert (missing, extra) == ([], []), f"db-only rows {missing[:5]}, lake-only rows {extra[:5]}"


class Writers:
    """Tasks inserting, updating and deleting orders through the gate until stopped.

    Writer ``k`` of ``n`` owns the keys ``i % n == k`` (no lock waits between them).
    """

    def __init__(self, cluster: Cluster, seeded: int, n: int = 2) -> None:
        self.cluster = cluster
        self.n = n
        self.owned = [{i for i in range(1, seeded + 1) if i % n == k} for k in range(n)]
        self.next_id = [seeded + 1 + k for k in range(n)]
        self.ops = 0
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(self._write(k, random.Random(k))) for k in range(n)]

    @property
    def live(self) -> set[int]:
        return set().union(*self.owned)

    async def _write(self, k: int, rnd: random.Random) -> None:
        g = self.cluster.gate
        s = g.session(identity=TRUSTED)
        live = self.owned[k]
        while not self.stop.is_set():
            # One key per transaction (1-3 changes): one shard, so SQLite writers never
            # wait on each other across shards.
            ops: list[tuple[str, int]] = []
            pending = set(live)
            if rnd.random() < 0.4 or not pending:
                i = self.next_id[k]
                self.next_id[k] += self.n
                pending.add(i)
                ops.append(("insert", i))
            else:
                i = rnd.choice(sorted(pending))
            for _ in range(rnd.randint(0 if ops else 1, 2)):
                if rnd.random() < 0.75:
                    ops.append(("update", i))
                else:
                    pending.discard(i)
                    ops.append(("delete", i))
                    break
            try:
                await g.execute(s, "BEGIN")
                for op, i in ops:
                    if op == "insert":
                        await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, "
                                        "price) VALUES (:i, :i, :s, :p)",
                                        {"i": i, "s": f"n{i}", "p": i % 7})
                    elif op == "update":
                        await g.execute(s, "UPDATE corder SET price = price + 1, sku = :s "
                                        "WHERE customer_id = :i AND order_id = :i",
                                        {"i": i, "s": f"u{rnd.randint(0, 999)}"})
                    else:
                        await g.execute(s, "DELETE FROM corder WHERE customer_id = :i "
                                        "AND order_id = :i", {"i": i})
                await g.execute(s, "COMMIT")
            except ShardgateError as exc:
                # SQLite: a shard busy for longer than busy_timeout (the dump's change
                # capture set-up takes the write lock too) refuses with ABORTED; go on.
                if exc.code.value != "ABORTED":
                    raise
                await g.execute(s, "ROLLBACK")
                continue
            live.clear()
            live.update(pending)
            self.ops += len(ops)
            await asyncio.sleep(0.002)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


@pytest.mark.parametrize("kind", KINDS)
async def test_dump_converges_while_writers_run(
    kind: str, spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    cluster, _ = await _cluster(kind, make_database, tmp_path)
    g = cluster.gate
    lake = str(tmp_path / "lake")
    try:
        await g.execute(g.session(identity=TRUSTED),
                        "INSERT INTO corder (order_id, customer_id, sku, price) "
                        "VALUES " + ", ".join(f"({i}, {i}, 's{i}', {i % 10})"
                                              for i in range(1, SEED + 1)))
        writers = Writers(cluster, SEED)
        messages: list[str] = []

        def progress(msg: str) -> None:
            messages.append(msg)
            print(f"{time.monotonic():.1f} {msg}")  # shown when the test fails

        stop = threading.Event()
        job = DumpJob(cluster.topology, "commerce", "corder", lake, spark=spark,
                      batch_interval_s=0.3, progress=progress, stall_s=45)
        run = asyncio.create_task(job.run(follow=True, stop=stop))
        # Writers keep going through the snapshot and some of the change apply.
        deadline = time.monotonic() + 90
        while not any(m.startswith("snapshot committed") for m in messages):
            assert not run.done(), run.exception()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        ops_at_snapshot = writers.ops
        await asyncio.sleep(2.0)
        await asyncio.wait_for(writers.finish(), 30)
        stop.set()
        summary = await asyncio.wait_for(run, 60)
        assert summary.snapshot and summary.snapshot_rows >= SEED // 2
        assert writers.ops > ops_at_snapshot > 0  # writes before, during and after the snapshot
        assert summary.change_events > 0 and summary.merges > 0
        db = await _db_rows(spark, cluster)
        assert db.count() == len(writers.live)
        _assert_same(read_table(spark, lake), db)
        # Deleted keys are tombstones, not gone.
        lake_rows = _lake_rows(lake)
        deleted = {r["order_id"] for r in lake_rows if r[DELETED]}
        assert not deleted & writers.live
        assert {r["order_id"] for r in lake_rows if not r[DELETED]} == writers.live

        # A rerun resumes from the lake's positions: no snapshot, nothing changes.
        again = await DumpJob(cluster.topology, "commerce", "corder", lake).run()
        assert not again.snapshot and again.change_rows_merged == 0
        assert _lake_rows(lake) == lake_rows

        # Later writes reach the lake on the next run; replayed old changes are harmless.
        s = g.session(identity=TRUSTED)
        a, b = 10**6 + 1, 10**6 + 2
        for i in (a, b):
            await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                            "VALUES (:i, :i, 'late', 1)", {"i": i})
        await g.execute(s, "UPDATE corder SET price = 1000 WHERE customer_id = :i "
                        "AND order_id = :i", {"i": a})
        await g.execute(s, "DELETE FROM corder WHERE customer_id = :i AND order_id = :i",
                        {"i": b})
        third = await DumpJob(cluster.topology, "commerce", "corder", lake).run()
        assert third.change_events == 4 and not third.snapshot
        rows = {r["order_id"]: r for r in _lake_rows(lake)}
        assert rows[b][DELETED] is True and rows[b]["price"] is None
        assert rows[a]["price"] == 1000 and rows[b][ORDER] > 0
        live = {k: (r["customer_id"], r["sku"], r["price"]) for k, r in rows.items()
                if not r[DELETED]}
        res = await g.execute(s, "SELECT order_id, customer_id, sku, price FROM corder")
        assert live == {int(r[0]): (r[1], r[2], r[3]) for r in res.rows}

        if kind == "postgres":  # TRUNCATE of one shard's table: its rows become tombstones
            be = open_backend(cluster.shard_urls("commerce")["-40"])
            try:
                await be.execute("TRUNCATE corder")
            finally:
                await be.close()
            await DumpJob(cluster.topology, "commerce", "corder", lake).run()
            rows = {r["order_id"]: r for r in _lake_rows(lake)}
            res = await g.execute(s, "SELECT order_id FROM corder")
            assert {k for k, r in rows.items() if not r[DELETED]} == {r[0] for r in res.rows}
            assert any(r[DELETED] and r["_sg_shard"] == "commerce/-40" for r in rows.values())
    finally:
        await g.close()


async def test_dump_refuses_a_foreign_table(
    spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    cluster, _ = await _cluster("sqlite", make_database, tmp_path)
    try:
        other = str(tmp_path / "other")
        write_deltalake(other, pa.table({"x": [1]}))
        with pytest.raises(ShardgateError) as err:
            await DumpJob(cluster.topology, "commerce", "corder", other, spark=spark).run()
        assert err.value.code.value == "FAILED_PRECONDITION"
    finally:
        await cluster.gate.close()


# ------------------------------------------------------------------------- archive --

DAY_NS = 86_400 * 10**9
OLD_NS = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z


async def _queue_rows(cluster: Cluster, kind: str) -> dict[int, tuple[str, int]]:
    """Per shard, events in every state, some acked long ago: id -> (state, time_next)."""
    ph = "?" if kind == "sqlite" else "%s"
    expected: dict[int, tuple[str, int]] = {}
    rnd = random.Random(7)
    next_id = 1
    for url in cluster.shard_urls("commerce").values():
        rows = []
        for j in range(25):
            state = ("acked", "acked", "acked", "fired", "to_be_fired")[j % 5]
            old = j % 3 != 0
            t = OLD_NS + rnd.randrange(0, 3 * DAY_NS) if old else time.time_ns()
            rows.append((next_id, OLD_NS, t, 1, state, t if state == "acked" else None, 0,
                         next_id, f"b{next_id}"))
            expected[next_id] = (state, t)
            next_id += 1
        be = open_backend(url)
        try:
            for r in rows:
                await be.execute(
                    "INSERT INTO jobs (id, time_scheduled, time_next, epoch, state, time_acked,"
                    f" priority, customer_id, body) VALUES ({', '.join([ph] * 9)})", list(r))
        finally:
            await be.close()
    return expected


async def _remaining(cluster: Cluster) -> set[int]:
    ids: set[int] = set()
    for url in cluster.shard_urls("commerce").values():
        be = open_backend(url)
        try:
            ids |= {int(r[0]) for r in (await be.execute("SELECT id FROM jobs")).rows}
        finally:
            await be.close()
    return ids


@pytest.mark.parametrize("kind", KINDS)
async def test_archive_loses_nothing_and_purges_only_what_it_wrote(
    kind: str, spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    cluster, _ = await _cluster(kind, make_database, tmp_path)
    g = cluster.gate
    closed = False
    try:
        await g.execute(g.session(identity=TRUSTED),
                        "CREATE QUEUE jobs (customer_id BIGINT NOT NULL, "
                        "body VARCHAR(64)) SHARD BY customer_id USING hash")
        await g.close()  # no queue manager touches the events below
        closed = True
        expected = await _queue_rows(cluster, kind)
        cutoff = parse_before("2024-02-01")
        to_archive = {i for i, (st, t) in expected.items()
                      if st == "acked" and t < cutoff.timestamp() * 1e9}
        assert 10 < len(to_archive) < len(expected)
        out = str(tmp_path / "archive")

        # The tasks die between the write and the purge (Spark retries each once): the
        # retried attempt finishes the pending chunk first, then dies again on its next.
        with pytest.raises(ShardgateError) as err:
            await ArchiveJob(spark, cluster.topology, "commerce", "jobs", cutoff, out,
                             chunk_rows=5).run(crash_after_write=True)
        assert err.value.code.value == "INTERNAL" and "crash_after_write" in str(err.value)
        assert (tmp_path / "archive" / "_pending").exists()
        left = await _remaining(cluster)
        assert to_archive & left and set(expected) - to_archive <= left

        summary = await ArchiveJob(spark, cluster.topology, "commerce", "jobs", cutoff, out,
                                   chunk_rows=5).run()
        assert summary.resumed_chunks >= 1  # chunks left pending by the failed run
        assert await _remaining(cluster) == set(expected) - to_archive
        archived = spark.read.parquet(out).select("id", "state", "time_next", "date").collect()
        assert sorted(r.id for r in archived) == sorted(to_archive)  # each exactly once
        for r in archived:
            assert r.state == "acked" and expected[r.id] == ("acked", r.time_next)
            assert str(r.date) == time.strftime("%Y-%m-%d", time.gmtime(r.time_next // 10**9))
        assert not list((tmp_path / "archive" / "_pending").iterdir())

        # Nothing left to archive: a rerun writes and purges nothing.
        again = await ArchiveJob(spark, cluster.topology, "commerce", "jobs", cutoff,
                                 out).run()
        assert (again.archived, again.purged, again.files) == (0, 0, 0)
        import pyarrow.dataset as ds

        assert ds.dataset(out, partitioning="hive").count_rows() == len(to_archive)
    finally:
        if not closed:
            await g.close()
