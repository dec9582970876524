"""The Spark sources against a production-shaped cluster: option ``topo`` (the topo
store of tablet processes and ``shardgate gate --topo``), PostgreSQL shards.

One tablet process per shard, started once for the module (``commerce_tablets``);
each test writes through a gate reaching them, then reads with Spark:

* ``shardgate`` (the batch reader): every row once;
* ``shardgate_changes``: every committed change once;
* ``shardgate_queue``: every event of a queue created with CREATE QUEUE through
  that gate (the VSchema change is in the topo store, not in any cluster file),
  received through the tablet processes (which hold the shard leases) and acked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.changes.open import open_change_log
from tests.integration.conftest import Cluster, close_cluster, open_cluster_on
from tests.integration.spark.test_spark_streaming import _Collect, _wait

pytestmark = pytest.mark.postgres


@pytest.fixture
async def prod(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Cluster, str]]:
    """A gate on the module's tablet processes, and the topo store URL."""
    cluster = await open_cluster_on(request.getfixturevalue("commerce_tablets"))
    assert cluster.processes is not None
    try:
        yield cluster, cluster.processes.topo_url
    finally:
        await close_cluster(cluster)


async def _insert_orders(cluster: Cluster, ids: range) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    await g.execute(s, "BEGIN")
    for i in ids:
        await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES "
                           f"({i}, {i}, 'sku{i}', {i})")
    await g.execute(s, "COMMIT")


async def test_reader(prod: tuple[Cluster, str], spark: Any) -> None:
    cluster, topo = prod
    await _insert_orders(cluster, range(1, 41))
    rows = (spark.read.format("shardgate").option("topo", topo).option("table", "corder")
            .load().select("order_id", "sku").collect())
    assert sorted((r.order_id, r.sku) for r in rows) == [(i, f"sku{i}") for i in range(1, 41)]


async def test_changes_source(prod: tuple[Cluster, str], spark: Any, tmp_path: Path) -> None:
    cluster, topo = prod
    urls = cluster.shard_urls("commerce")
    for name, url in urls.items():
        log = open_change_log(url, f"commerce/{name}")
        try:
            await log.prepare()
        finally:
            await log.close()
    try:
        await _insert_orders(cluster, range(1, 21))
        await cluster.gate.execute(cluster.gate.session(identity=TRUSTED),
                                   "UPDATE corder SET sku = 'changed' WHERE order_id = 3")
        sink = _Collect()
        query = (spark.readStream.format("shardgate_changes").option("topo", topo)
                 .option("starting", "earliest").option("tables", "corder")
                 .option("images", "json").load()
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start())
        await _wait(query)
        got = sorted((r.op, json.loads(r.pk)[0]) for r in sink.rows)
        assert got == sorted([("insert", i) for i in range(1, 21)] + [("update", 3)])
    finally:
        for name, url in urls.items():
            log = open_change_log(url, f"commerce/{name}")
            try:
                await log.drop()
            finally:
                await log.close()


async def test_queue_source(prod: tuple[Cluster, str], spark: Any, tmp_path: Path) -> None:
    cluster, topo = prod
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    await g.execute(s, "CREATE QUEUE jobs (customer_id BIGINT NOT NULL, body VARCHAR(64)) "
                       "SHARD BY customer_id WITH (ack_wait = 5, min_backoff = 0.2)")
    n = 30
    await g.execute(s, "BEGIN")
    for i in range(1, n + 1):
        await g.execute(s, "INSERT INTO jobs (customer_id, body) VALUES (:c, :b)",
                        {"c": i, "b": f"job{i}"})
    await g.execute(s, "COMMIT")
    sink = _Collect()
    query = (spark.readStream.format("shardgate_queue").option("topo", topo)
             .option("queue", "jobs").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    await _wait(query)
    assert sorted(r.body for r in sink.rows) == sorted(f"job{i}" for i in range(1, n + 1))
    # acked once their batch committed (the last one at the query's end)
    acked = sum(int(c) for url in cluster.shard_urls("commerce").values()
                for (c,) in bulk.query(url, "SELECT COUNT(*) FROM jobs WHERE state = 'acked'"))
    assert acked == n


async def test_writer(prod: tuple[Cluster, str], spark: Any) -> None:
    """The sink with option ``topo``: rows land on the shards the gate (reaching the
    tablet processes) routes them to, and read back through it."""
    cluster, topo = prod
    n = 200
    df = spark.range(1, n + 1, numPartitions=2).selectExpr(
        "id AS order_id", "id * 7 AS customer_id", "concat('s', id) AS sku", "id % 13 AS price")
    (df.write.format("shardgate").option("topo", topo).option("table", "corder")
     .mode("append").save())
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    res = await g.execute(s, "SELECT order_id, customer_id, sku, price FROM corder")
    assert sorted(tuple(r) for r in res.rows) == [(i, i * 7, f"s{i}", i % 13)
                                                 for i in range(1, n + 1)]
    for i in (1, 77, n):  # routed by the primary vindex: found by a single-shard lookup
        one = await g.execute(s, f"SELECT order_id FROM corder WHERE customer_id = {i * 7}")
        assert one.rows == [(i,)]


async def test_dump(prod: tuple[Cluster, str], spark: Any, tmp_path: Path) -> None:
    """The dump job with ``topo_url``: snapshot, then the changes written through the gate
    after it, read from the change stream; a rerun resumes from the lake's positions."""
    from shardgate.spark.jobs import DumpJob, read_table
    from shardgate.topo.local import read_topology

    cluster, topo = prod
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    await _insert_orders(cluster, range(1, 31))
    lake = str(tmp_path / "lake")
    urls = cluster.shard_urls("commerce")
    try:
        first = await DumpJob(read_topology(None, url=topo), "commerce", "corder", lake,
                              spark=spark, topo_url=topo).run()
        assert first.snapshot and first.snapshot_rows == 30
        await _insert_orders(cluster, range(31, 41))
        await g.execute(s, "UPDATE corder SET sku = 'changed' WHERE customer_id = 3")
        await g.execute(s, "DELETE FROM corder WHERE customer_id = 4")
        again = await DumpJob(read_topology(None, url=topo), "commerce", "corder", lake,
                              topo_url=topo).run()
        assert not again.snapshot and again.change_events > 0
        res = await g.execute(s, "SELECT order_id, customer_id, sku, price FROM corder")
        got = sorted((r.order_id, r.customer_id, r.sku, r.price) for r in
                     read_table(spark, lake).select("order_id", "customer_id", "sku", "price")
                     .collect())
        assert got == sorted(tuple(r) for r in res.rows)
    finally:
        for name, url in urls.items():
            log = open_change_log(url, f"commerce/{name}")
            try:
                await log.drop()
            finally:
                await log.close()
