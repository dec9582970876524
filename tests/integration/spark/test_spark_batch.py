"""The batch reader and writer on a local Spark, over SQLite and PostgreSQL shards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.backends.bulk import copy as bulk
from shardgate.keys import parse_shard_name
from shardgate.topo import write_cluster_file
from shardgate.vindexes import create_vindex
from tests.integration.conftest import Cluster, open_cluster

KINDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
ROWS = 300


def vitess_hash(n: int) -> bytes:
    return create_vindex("hash", "hash").map([n])[0][0]  # type: ignore[union-attr,no-any-return]


def _ph(kind: str) -> str:
    return "?" if kind == "sqlite" else "%s"


async def _cluster_file(kind: str, make_database: Callable[..., str],
                        tmp_path: Path) -> tuple[Cluster, str]:
    cluster = await open_cluster(kind, make_database)
    path = tmp_path / "cluster.yaml"
    write_cluster_file(cluster.topology, path)
    return cluster, str(path)


async def _shard_rows(cluster: Cluster, sql: str) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for name, url in cluster.shard_urls("commerce").items():
        be = open_backend(url)
        try:
            out[name] = [tuple(r) for r in (await be.execute(sql)).rows]
        finally:
            await be.close()
    return out


@pytest.mark.parametrize("kind", KINDS)
async def test_reader_reads_every_row_once(
    kind: str, spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    cluster, path = await _cluster_file(kind, make_database, tmp_path)
    g = cluster.gate
    try:
        s = g.session(identity=TRUSTED)
        await g.execute_batch(s, [
            ("INSERT INTO corder (order_id, customer_id, sku, price) VALUES "
             + ", ".join(f"({i}, {i}, 'sku{i}', {i % 10})" for i in range(c, c + 100)), None)
            for c in range(1, ROWS + 1, 100)
        ])
        # A stale copy of an order on a shard that does not own it (as after resharding).
        stray = next(i for i in range(1, ROWS) if not parse_shard_name("-40").contains(
            vitess_hash(i)))
        be = open_backend(cluster.shard_urls("commerce")["-40"])
        try:
            await be.execute("INSERT INTO corder (order_id, customer_id, sku, price) VALUES "
                             f"({_ph(kind)}, {_ph(kind)}, 'stale', 99)", [stray, stray])
        finally:
            await be.close()

        def load(**opts: str) -> Any:
            r = spark.read.format("shardgate").option("cluster", path)
            for k, v in opts.items():
                r = r.option(k, v)
            return r

        df = load(table="corder").load()
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
            ("order_id", "bigint"), ("customer_id", "bigint"), ("sku", "string"),
            ("price", "bigint")]
        # NOT NULL columns are non-nullable, as Spark's JDBC reader makes them
        # (SQLite lets a non-INTEGER PRIMARY KEY hold NULL unless it says NOT NULL).
        not_null = {"customer_id"} | ({"order_id"} if kind == "postgres" else set())
        assert {f.name for f in df.schema.fields if not f.nullable} == not_null
        rows = df.collect()
        assert sorted(r.order_id for r in rows) == list(range(1, ROWS + 1))
        assert all(r.sku != "stale" for r in rows)
        assert df.rdd.getNumPartitions() == 4

        for extra in ({"splits": "7"}, {"splits": "8", "path": "gate"}):
            got = load(table="corder", **extra).load().select("order_id").collect()
            assert sorted(r.order_id for r in got) == list(range(1, ROWS + 1)), extra

        narrow = load(table="corder").schema("order_id BIGINT, price BIGINT").load()
        filtered = narrow.where("price >= 7 AND order_id <= 200").collect()
        assert sorted(r.order_id for r in filtered) == [
            i for i in range(1, 201) if i % 10 >= 7]
        assert set(filtered[0].asDict()) == {"order_id", "price"}
        by_sku = load(table="corder").load().where("sku = 'sku5'").collect()
        assert [r.order_id for r in by_sku] == [5]

        q = load(query="SELECT order_id, price FROM corder WHERE price = 3").load()
        assert sorted(r.order_id for r in q.collect()) == [
            i for i in range(1, ROWS + 1) if i % 10 == 3]
    finally:
        await g.close()


def _flaky(batches: Iterator[Any]) -> Iterator[Any]:
    """Fail the first attempt of partition 0 after it let two batches through."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    for i, b in enumerate(batches):
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and i == 2:
            raise RuntimeError("injected failure: the task is retried")
        yield b


@pytest.mark.parametrize("kind", KINDS)
async def test_writer_places_rows_and_retries_add_nothing(
    kind: str, spark: Any, make_database: Callable[..., str], tmp_path: Path
) -> None:
    cluster, path = await _cluster_file(kind, make_database, tmp_path)
    try:
        n = 4000
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "250")
        df = spark.range(1, n + 1, numPartitions=2).selectExpr(
            "id AS order_id", "id * 7 AS customer_id", "concat('s', id) AS sku",
            "id % 13 AS price")
        (df.mapInArrow(_flaky, df.schema).write.format("shardgate")
         .option("cluster", path).option("table", "corder").option("batch_rows", "300")
         .mode("append").save())
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

        placed = await _shard_rows(cluster, "SELECT order_id, customer_id FROM corder")
        smap = cluster.topology.keyspace("commerce").shard_map
        seen = []
        for shard, rows in placed.items():
            for oid, cid in rows:
                assert smap.find(vitess_hash(cid)) == shard, (oid, cid, shard)
                assert cid == oid * 7
                seen.append(oid)
        assert sorted(seen) == list(range(1, n + 1))  # the failed attempt added nothing
        # no staging table is left behind
        for url in cluster.shard_urls("commerce").values():
            if kind == "sqlite":
                left = bulk.query(url, "SELECT name FROM sqlite_master "
                                       "WHERE name LIKE '_sg_stage%'")
            else:
                left = bulk.query(url, "SELECT tablename FROM pg_tables "
                                       "WHERE tablename LIKE '\\_sg\\_stage%'")
            assert left == []

        # A whole job run again with ignore_duplicates adds nothing.
        (df.write.format("shardgate").option("cluster", path).option("table", "corder")
         .option("ignore_duplicates", "true").mode("append").save())
        again = await _shard_rows(cluster, "SELECT COUNT(*) FROM corder")
        assert sum(r[0][0] for r in again.values()) == n

        round_trip = (spark.read.format("shardgate").option("cluster", path)
                      .option("table", "corder").load())
        assert round_trip.exceptAll(df).count() == 0 and df.exceptAll(round_trip).count() == 0
    finally:
        await cluster.gate.close()
