"""The streaming sources and bulk enqueue on a local Spark, over SQLite and PostgreSQL shards.

* ``shardgate_changes``: writes while an ``availableNow`` query runs, admission
  control (batches never exceed ``maxEventsPerTrigger``), and a restart from
  the checkpoint that continues without gap or duplicate: the union of the
  runs is exactly the set of committed row changes (a rolled-back transaction
  never shows).
* ``df.write.format("shardgate")`` into a queue table (bulk enqueue), then
  ``shardgate_queue``: a batch whose ``foreachBatch`` fails is not acked (its
  events stay ``fired`` in the table) and is delivered again after the
  restart; every event of a committed batch is still unacked while the
  batch runs and acked once it committed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.changes.open import open_change_log
from shardgate.errors import InvalidArgument
from shardgate.event_token import position_key
from shardgate.topo import write_cluster_file
from shardgate.vindexes import create_vindex
from tests.integration.conftest import Cluster, open_cluster

KINDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


def vitess_hash(n: int) -> bytes:
    return create_vindex("hash", "hash").map([n])[0][0]  # type: ignore[union-attr,no-any-return]


async def _cluster_file(kind: str, make_database: Callable[..., str], tmp_path: Path,
                        *setup: str) -> tuple[Cluster, str]:
    cluster = await open_cluster(kind, make_database)
    for sql in setup:
        await cluster.gate.execute(cluster.gate.session(identity=TRUSTED), sql)
    path = tmp_path / "cluster.yaml"
    write_cluster_file(cluster.topology, path)
    return cluster, str(path)


async def _prepare_capture(cluster: Cluster) -> None:
    for name, url in cluster.shard_urls("commerce").items():
        log = open_change_log(url, f"commerce/{name}")
        try:
            await log.prepare()
        finally:
            await log.close()


class _Collect:
    """A foreachBatch sink keeping each batch's rows (it runs in this process)."""

    def __init__(self, check: Callable[[list[Any]], None] | None = None,
                 fail_first: bool = False) -> None:
        self.batches: list[tuple[int, list[Any]]] = []
        self.check = check
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        if self.check is not None:
            self.check(rows)
        with self.lock:
            if self.fail_first:
                self.fail_first = False
                self.failed = (batch_id, rows)
                raise RuntimeError("injected failure: this batch must not be acked")
            self.batches.append((batch_id, rows))

    @property
    def rows(self) -> list[Any]:
        return [r for _, rows in self.batches for r in rows]


async def _wait(query: Any, timeout: float = 180.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while query.isActive and loop.time() < deadline:
        await asyncio.sleep(0.1)
    assert not query.isActive, "the availableNow query did not end"
    query.awaitTermination()


# -------------------------------------------------------------- change stream --


@pytest.mark.parametrize("kind", KINDS)
async def test_changes_source_exact_set_admission_and_restart(
    kind: str, spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    cluster, path = await _cluster_file(kind, make_database, tmp_path)
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    max_events = 10
    expected: list[tuple[str, int, str | None]] = []  # (op, order_id, sku after)

    async def insert_tx(first: int, n: int) -> None:
        await g.execute(s, "BEGIN")
        for i in range(first, first + n):
            await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES "
                               f"({i}, {i}, 'sku{i}', {i})")
            expected.append(("insert", i, f"sku{i}"))
        await g.execute(s, "COMMIT")

    try:
        await _prepare_capture(cluster)
        # Before the query: 4 transactions of 3 rows, an update, a delete, a rollback.
        for t in range(4):
            await insert_tx(1 + 3 * t, 3)
        await g.execute(s, "UPDATE corder SET sku = 'changed' WHERE order_id = 4")
        expected.append(("update", 4, "changed"))
        await g.execute(s, "DELETE FROM corder WHERE order_id = 5")
        expected.append(("delete", 5, None))
        await g.execute(s, "BEGIN")
        await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                           "VALUES (999, 999, 'rolled back', 0)")
        await g.execute(s, "ROLLBACK")

        checkpoint = str(tmp_path / "ckpt-changes")
        sink = _Collect()

        def start(limit: int | None) -> Any:
            r = (spark.readStream.format("shardgate_changes").option("cluster", path)
                 .option("starting", "earliest").option("tables", "corder")
                 .option("images", "json"))
            if limit is not None:
                r = r.option("maxEventsPerTrigger", str(limit))
            return (r.load().writeStream.foreachBatch(sink)
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True).start())

        query = start(max_events)
        # Writes while the first run streams: they land in it or in the restarted run.
        for t in range(2):
            await insert_tx(100 + 3 * t, 3)
        await _wait(query)
        first_run = len(sink.batches)
        assert first_run >= 1
        for i in range(200, 205):
            await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES "
                               f"({i}, {i}, 'late{i}', 0)")
            expected.append(("insert", i, f"late{i}"))

        query = start(None)  # same checkpoint, no limit: continues where the first run stopped
        await _wait(query)
        assert len(sink.batches) > first_run

        got = sorted(
            (r.op, json.loads(r.pk)[0],
             json.loads(r.after)["sku"] if r.after is not None else None)
            for r in sink.rows)
        assert got == sorted(expected)  # every committed change once: no gap, no duplicate
        limited = sink.batches[:first_run]
        for _, rows in limited:
            # whole 3-row transactions only; a batch never passes the limit
            assert 0 < len(rows) <= max_events
        assert len(limited) >= -(-sum(len(rows) for _, rows in limited) // max_events) >= 2
        assert all(r.table == "corder" and r.keyspace == "commerce" for r in sink.rows)
        smap = cluster.topology.keyspace("commerce").shard_map
        for r in sink.rows:
            assert smap.find(vitess_hash(json.loads(r.pk)[0])) == r.shard
        # per shard, positions only grow from batch to batch (commit order)
        by_shard: dict[str, list[str]] = {}
        for r in sink.rows:
            by_shard.setdefault(r.shard, []).append(r.token)
        assert len(by_shard) == 4
        before = next(r for r in sink.rows if r.op == "update")
        assert json.loads(before.before)["sku"] == "sku4"
    finally:
        await g.close()


def test_changes_reader_replays_ranges_and_refreshes_shards(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    """Driver and executor calls without Spark jobs: a range read twice gives the same
    rows; a shard added to the cluster file joins the offsets and is read from then on."""
    import yaml
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from shardgate.gate import Gate
    from shardgate.spark.changes_source import SCHEMA, ShardgateChangesDataSource
    from shardgate.topo import Topology

    async def setup() -> str:
        cluster, path = await _cluster_file("sqlite", make_database, tmp_path)
        await cluster.gate.close()
        return path

    async def write(path: str, ids: range) -> None:
        gate = Gate.open(Topology.from_dict(yaml.safe_load(Path(path).read_text())))
        try:
            s = gate.session("commerce", identity=TRUSTED)
            for i in ids:
                await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                                      f"VALUES ({i}, {i}, 's', 1)")
        finally:
            await gate.close()

    path = asyncio.run(setup())
    reader = ShardgateChangesDataSource({"cluster": path, "starting": "latest"}).streamReader(
        SCHEMA)
    off0 = reader.initialOffset()
    assert sorted(off0) == ["-40", "40-80", "80-c0", "c0-"]
    assert reader.latestOffset(off0, ReadAllAvailable()) == off0  # nothing new: no batch
    asyncio.run(write(path, range(1, 11)))
    since = time.time()
    time.sleep(0.05)
    asyncio.run(write(path, range(11, 21)))
    off1 = reader.latestOffset(off0, ReadAllAvailable())
    def rows_of(start: dict[str, str], end: dict[str, str]) -> list[tuple[Any, ...]]:
        return [tuple(row.values()) for p in reader.partitions(start, end)
                for b in reader.read(p) for row in b.to_pylist()]

    first = rows_of(off0, off1)
    again = rows_of(off0, off1)
    assert first == again  # a replayed batch is the same batch
    assert sorted(json.loads(r[4])[0] for r in first) == list(range(1, 21))

    # Starting at a timestamp: the commits at or after it; at tokens: the commits after them.
    timed = ShardgateChangesDataSource({"cluster": path, "starting": str(since)}).streamReader(
        SCHEMA)
    t0 = timed.initialOffset()
    t1 = timed.latestOffset(t0, ReadAllAvailable())
    got = [row for p in timed.partitions(t0, t1) for b in timed.read(p) for row in b.to_pylist()]
    assert sorted(json.loads(r["pk"])[0] for r in got) == list(range(11, 21))
    tokens = {r["shard"]: r["token"] for r in got}  # the last token of each shard
    after = ShardgateChangesDataSource(
        {"cluster": path, "starting": json.dumps(tokens)}).streamReader(SCHEMA)
    a0 = after.initialOffset()
    # tokens give the position after their commit; a shard without one starts at its oldest
    assert a0 == {s: t1[s] if s in tokens else "0" for s in t1}

    # Split c0- into two new shards (new databases, as resharding makes) in the cluster file.
    doc = yaml.safe_load(Path(path).read_text())
    shards = doc["keyspaces"]["commerce"]["shards"]
    del shards["c0-"]
    shards["c0-e0"] = make_database("sqlite", "c0e0")
    shards["e0-"] = make_database("sqlite", "e0")
    Path(path).write_text(yaml.safe_dump(doc))

    async def new_table() -> None:
        gate = Gate.open(Topology.from_dict(doc))
        try:
            for name in ("c0-e0", "e0-"):
                await gate.tablets[("commerce", name)].execute(
                    "CREATE TABLE corder (order_id BIGINT PRIMARY KEY, customer_id BIGINT "
                    "NOT NULL, sku VARCHAR(64), price BIGINT)", [])
        finally:
            await gate.close()

    asyncio.run(new_table())
    off2 = reader.latestOffset(off1, ReadAllAvailable())
    assert {"c0-e0", "e0-"} <= set(off2) and off2["c0-"] == off1["c0-"]
    assert reader.partitions(off1, off2) == []  # new shards are read from the next batch
    asyncio.run(write(path, range(100, 140)))
    off3 = reader.latestOffset(off2, ReadAllAvailable())
    rows = rows_of(off2, off3)
    assert sorted(json.loads(r[4])[0] for r in rows) == list(range(100, 140))
    smap = Topology.from_dict(doc).keyspace("commerce").shard_map
    assert {r[1] for r in rows} == {smap.find(vitess_hash(i)) for i in range(100, 140)}
    assert "e0-" in {r[1] for r in rows}


@pytest.mark.parametrize("kind", KINDS)
async def test_changes_partitions_group_shards_read_concurrently(
    kind: str, make_database: Callable[..., str], tmp_path: Path
) -> None:
    """Option ``partitions``: the moved shards' ranges grouped into at most that many
    partitions, each read concurrently: exactly the rows of one partition per shard, and
    each shard's rows still in log order (positions, then ordinals, never going back)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from shardgate.spark.changes_source import SCHEMA, ShardgateChangesDataSource

    cluster, path = await _cluster_file(kind, make_database, tmp_path)
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    try:
        await _prepare_capture(cluster)
        base = ShardgateChangesDataSource({"cluster": path, "starting": "latest"}).streamReader(
            SCHEMA)
        off0 = await asyncio.to_thread(base.initialOffset)
        for t in range(12):  # 12 transactions of 3 rows, over the 4 shards
            await g.execute(s, "BEGIN")
            for i in range(1 + 3 * t, 4 + 3 * t):
                await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                                   f"VALUES ({i}, {i}, 'sku{i}', {i})")
            await g.execute(s, "COMMIT")
        await g.execute(s, "UPDATE corder SET sku = 'changed' WHERE order_id = 4")
        off1 = await asyncio.to_thread(base.latestOffset, off0, ReadAllAvailable())
        moved = [k for k in off1 if off1[k] != off0[k]]
        assert len(moved) >= 2

        def rows(partitions: int) -> tuple[int, list[list[dict[str, Any]]]]:
            reader = ShardgateChangesDataSource(
                {"cluster": path, "starting": "latest", "partitions": str(partitions)}
            ).streamReader(SCHEMA)
            parts = reader.partitions(off0, off1)
            return len(parts), [[r for b in reader.read(p) for r in b.to_pylist()]
                                for p in parts]

        n_one, per_shard = await asyncio.to_thread(rows, 0)
        assert n_one == len(moved)
        want = sorted(json.dumps(r, default=str) for part in per_shard for r in part)
        assert len(want) == 12 * 3 + 1
        for k in (1, 2, len(moved) + 3):
            n, parts = await asyncio.to_thread(rows, k)
            assert n == min(k, len(moved))
            assert sorted(json.dumps(r, default=str) for part in parts for r in part) == want
            for part in parts:
                for shard in {r["shard"] for r in part}:
                    mine = [r for r in part if r["shard"] == shard]
                    # Positions order a shard's commits (PostgreSQL LSNs, SQLite sequences).
                    keys = [(position_key(r["position"]), r["ordinal"]) for r in mine]
                    assert keys == sorted(keys)
    finally:
        await g.close()


def test_changes_source_refuses_bad_options() -> None:
    from shardgate.spark.options import ChangesOptions

    with pytest.raises(InvalidArgument, match="starting"):
        ChangesOptions.parse({"starting": "yesterday"})
    with pytest.raises(InvalidArgument, match="newShards"):
        ChangesOptions.parse({"newShards": "x"})
    with pytest.raises(InvalidArgument, match="maxEventsPerTrigger"):
        ChangesOptions.parse({"maxEventsPerTrigger": "-1"})
    assert ChangesOptions.parse({"starting": "2026-01-01T00:00:00"}).starting.startswith("2026")


# --------------------------------------------------------- queue: write + read --

QUEUE = ("CREATE QUEUE jobs (customer_id BIGINT NOT NULL, body VARCHAR(64)) "
         "SHARD BY customer_id WITH (ack_wait = 3, window = 2, min_backoff = 0.2)")


def _states(cluster: Cluster, ids: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    if not ids:
        return out
    for url in cluster.shard_urls("commerce").values():
        for i, state in bulk.query(url, "SELECT id, state FROM jobs WHERE id IN "
                                        f"({', '.join(str(i) for i in ids)})"):
            out[int(i)] = str(state)
    return out


@pytest.mark.parametrize("kind", KINDS)
async def test_bulk_enqueue_then_queue_source_acks_only_committed_batches(
    kind: str, spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    from shardgate.spark.writer import ShardgateWriter

    cluster, path = await _cluster_file(kind, make_database, tmp_path, QUEUE)
    n = 60
    try:
        # Bulk enqueue: events land on their owner shards, to be fired, defaults filled in.
        df = spark.range(1, n + 1, numPartitions=2).selectExpr(
            "id * 1000 AS id", "id AS customer_id", "concat('job', id) AS body")
        (df.write.format("shardgate").option("cluster", path).option("table", "jobs")
         .mode("append").save())
        smap = cluster.topology.keyspace("commerce").shard_map
        placed = 0
        for shard, url in cluster.shard_urls("commerce").items():
            for cid, state, epoch, t_next, t_sched in bulk.query(
                    url, "SELECT customer_id, state, epoch, time_next, time_scheduled FROM jobs"):
                assert smap.find(vitess_hash(int(cid))) == shard
                assert (state, epoch, t_next) == ("to_be_fired", 0, 0) and t_sched > 0
                placed += 1
        assert placed == n
        with pytest.raises(InvalidArgument, match="fire state"):
            ShardgateWriter({"cluster": path, "table": "jobs"},
                            df.selectExpr("*", "'acked' AS state").schema, False)

        def unacked(rows: list[Any]) -> None:
            # While a batch runs, none of its events is acked yet.
            states = _states(cluster, [r.id for r in rows])
            assert set(states.values()) <= {"fired"}, states

        sink = _Collect(check=unacked, fail_first=True)
        checkpoint = str(tmp_path / "ckpt-queue")

        def start() -> Any:
            return (spark.readStream.format("shardgate_queue").option("cluster", path)
                    .option("queue", "jobs").option("maxEventsPerTrigger", "25").load()
                    .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True).start())

        query = start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180
        while query.isActive and loop.time() < deadline:
            await asyncio.sleep(0.1)
        assert query.exception() is not None, "the injected failure must stop the query"
        failed_ids = [r.id for r in sink.failed[1]]
        assert 0 < len(failed_ids) <= 25
        assert [r.body for r in sink.failed[1]] == [f"job{i // 1000}" for i in failed_ids]
        assert set(_states(cluster, failed_ids).values()) == {"fired"}  # not acked

        query = start()  # same checkpoint: the failed batch runs again, then the rest
        await _wait(query)
        delivered = [r.id for r in sink.rows]
        assert sorted(delivered) == [i * 1000 for i in range(1, n + 1)]  # each once
        assert set(failed_ids) <= set(delivered)
        assert all(0 < len(rows) <= 25 for _, rows in sink.batches)
        states = _states(cluster, delivered)
        assert set(states.values()) == {"acked"} and len(states) == n
    finally:
        await cluster.gate.close()


def test_queue_reader_over_grpc_gate_acks_after_next_offset_and_replays(tmp_path: Path) -> None:
    """Driver and executor calls without Spark jobs, receiving from a gate over gRPC: a
    batch is acked only when the next offset is asked for; a batch re-planned by a new
    reader (a restart) is read back by id."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shardgate.api.grpc.server import serve
    from shardgate.client.sync import LoopThread
    from shardgate.gate import Gate
    from shardgate.spark.queue_source import ShardgateQueueDataSource
    from shardgate.topo.embedded import embedded_topology

    loop = LoopThread("test-gate")

    async def up() -> tuple[Gate, Any, int]:
        gate = Gate.open(embedded_topology(tmp_path / "data"))
        s = gate.session("commerce", identity=TRUSTED)
        await gate.execute(s, QUEUE)
        await gate.execute(s, "INSERT INTO jobs (customer_id, body) VALUES "
                              + ", ".join(f"({i}, 'b{i}')" for i in range(1, 31)))
        server, port = await serve(gate, "127.0.0.1", 0)
        return gate, server, port

    gate, server, port = loop.run(up())
    readers: list[Any] = []
    try:
        path = tmp_path / "cluster.yaml"
        write_cluster_file(gate.topology, path)
        options = {"cluster": str(path), "queue": "jobs", "gate": f"grpc://127.0.0.1:{port}",
                   "waitMs": "3000"}
        src = ShardgateQueueDataSource(options)
        schema = src.schema()
        assert schema.fieldNames() == ["shard", "id", "epoch", "time_scheduled", "priority",
                                       "customer_id", "body"]
        reader = src.streamReader(schema)
        readers.append(reader)
        urls = {s.name: s.url for s in gate.topology.keyspace("commerce").shards}

        def states(ids: list[int]) -> set[str]:
            found = set()
            for url in urls.values():
                found |= {str(r[0]) for r in bulk.query(
                    url, f"SELECT state FROM jobs WHERE id IN ({', '.join(map(str, ids))})")}
            return found

        off0 = reader.initialOffset()
        off1 = reader.latestOffset(off0, ReadMaxRows(10))
        rows = [r for p in reader.partitions(off0, off1) for r in reader.read(p)]
        assert 0 < len(rows) <= 10 and off1["seq"] == 1
        assert all(r[6] == f"b{r[5]}" and r[2] == 1 for r in rows)
        ids = [r[1] for r in rows]
        assert states(ids) == {"fired"}

        # A restart re-plans the batch from its offset alone.
        again = ShardgateQueueDataSource(options).streamReader(schema)
        readers.append(again)
        replay = [r for p in again.partitions(off0, off1) for r in again.read(p)]
        assert sorted(r[1] for r in replay) == sorted(ids)

        off2 = reader.latestOffset(off1, ReadMaxRows(10))  # batch 1 committed: acked now
        # (the ack write runs on the receiver's loop, not holding up the next batch)
        deadline = time.monotonic() + 10
        while states(ids) != {"acked"}:
            assert time.monotonic() < deadline, states(ids)
            time.sleep(0.02)
        more = [r[1] for p in reader.partitions(off1, off2) for r in reader.read(p)]
        assert 0 < len(more) <= 10 and not set(more) & set(ids)
        assert states(more) == {"fired"}
        reader.commit(off2)
        assert states(more) == {"acked"}
    finally:
        for r in readers:
            r.stop()

        async def down() -> None:
            await server.stop(None)
            await gate.close()

        loop.run(down())
        loop.close()
