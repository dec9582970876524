"""Spark across a reshard (issue 21 item 5): the batch reader and ``split_query`` see
the new shards after the switch, and a ``dump --follow`` started before the reshard
keeps converging across it.

A 2-shard keyspace named by a cluster file (its topo store beside it, as ``shardgate
up`` leaves it) is split 2 -> 4 onto new databases while writers run through a gate.
After ``switch_writes`` and ``complete``: a new Spark read returns every row of an
exact model once, its partitions and the gate's splits are over the four new shards
only, though the retired sources still hold their (stale) rows; the dump, never
restarted, follows the change stream's hop and its lake converges to the model,
before and after more writes; a rerun resumes from the targets' positions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.spark.jobs import DumpJob
from shardgate.spark.jobs.lake import DELETED, GENERATION_SHIFT, ORDER, SHARD
from shardgate.spark.options import ReadOptions, SourceOptions
from shardgate.spark.reader import plan_splits
from shardgate.topo import write_cluster_file
from shardgate.topo.local import open_topo, store_url_for
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows.test_reshard import DDL, VSCHEMA, Model, Writers, _rows_of, _wait

KINDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
ROWS = 3000
SOURCES = ("-80", "80-")
TARGETS = ("-40", "40-80", "80-c0", "c0-")


async def _cluster(make_database: Any, tmp_path: Path, kind: str
                   ) -> tuple[str, Gate, dict[str, str], Model]:
    """A cluster file and its topo store, a gate following the store, ``ROWS`` rows."""
    shards = {name: make_database(kind, f"sk{i}") for i, name in enumerate(SOURCES)}
    path = tmp_path / "cluster.yaml"
    write_cluster_file(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}), path)
    gate = await Gate.from_topo(await open_topo(path))  # seeds the store from the file
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, DDL)
    model: Model = {}
    for start in range(1, ROWS + 1, 500):
        ids = range(start, min(start + 500, ROWS + 1))
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                           + ", ".join(f"({i}, 'v{i}', 0)" for i in ids))
        model.update({i: (f"v{i}", 0) for i in ids})
    return str(path), gate, shards, model


def _spark_read(spark: Any, cluster: str) -> tuple[list[tuple[int, str, int]], int]:
    """Every row a new Spark read of ``t`` returns, and its partition count."""
    df = (spark.read.format("shardgate").option("cluster", cluster).option("keyspace", "app")
          .option("table", "t").load())
    rows = [(int(r.id), str(r.v), int(r.n)) for r in df.collect()]
    return rows, df.rdd.getNumPartitions()


def _exactly(rows: list[tuple[int, str, int]], model: Model) -> None:
    got = {i: (v, n) for i, v, n in rows}
    assert len(got) == len(rows), "a row was read twice"
    missing = {i for i in model if got.get(i) != model[i]}
    extra = set(got) - set(model)
    assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])


def _plan_urls(cluster: str) -> set[str]:
    """The databases the reader's partitions read (planned as ``partitions()`` does)."""
    plans = plan_splits(SourceOptions.parse({"cluster": cluster, "keyspace": "app"}),
                        ReadOptions.parse({"table": "t"}), None)
    return {p.url for p in plans}


def _lake(lake: str) -> dict[int, dict[str, Any]]:
    from deltalake import DeltaTable

    return {int(r["id"]): r for r in DeltaTable(lake).to_pyarrow_table().to_pylist()}


def _live(rows: dict[int, dict[str, Any]]) -> Model:
    return {i: (str(r["v"]), int(r["n"])) for i, r in rows.items() if not r[DELETED]}


async def _converged(lake: str, model: Model, run: asyncio.Task[Any], timeout: float) -> None:
    """Poll the lake's committed version until its live rows are the model."""
    deadline = time.monotonic() + timeout
    while True:
        assert not run.done(), run.exception() if not run.cancelled() else "cancelled"
        live = await asyncio.to_thread(lambda: _live(_lake(lake)))
        if live == model:
            return
        if time.monotonic() > deadline:
            diff = {i for i in set(live) | set(model) if live.get(i) != model.get(i)}
            raise AssertionError(f"the lake differs on {len(diff)} keys, e.g. {sorted(diff)[:5]}")
        await asyncio.sleep(0.3)


async def _split_under_spark(kind: str, spark: Any, make_database: Any, tmp_path: Path) -> None:
    cluster, gate, sources, model = await _cluster(make_database, tmp_path, kind)
    writers = Writers(gate, model)
    lake = str(tmp_path / "lake")
    messages: list[str] = []

    def progress(msg: str) -> None:
        messages.append(msg)
        print(f"{time.monotonic():.1f} {msg}")  # shown when the test fails

    stop = threading.Event()
    job = DumpJob(gate.topology, "app", "t", lake, spark=spark, cluster_file=cluster,
                  batch_interval_s=0.3, stall_s=45, progress=progress)
    run = asyncio.create_task(job.run(follow=True, stop=stop))
    server = TopoServer(open_topo_store(store_url_for(cluster)))
    four = {n: make_database(kind, f"sf{i}") for i, n in enumerate(TARGETS)}
    flow = ReshardWorkflow(server, ReshardSpec(
        keyspace="app", sources=SOURCES, targets=TARGETS,
        target_urls=tuple(sorted(four.items())), workflow="sparkhop"), batch=500)
    try:
        # before: the reader and split_query over the two sources
        rows, partitions = await asyncio.to_thread(_spark_read, spark, cluster)
        _exactly(rows, model)
        assert partitions == 2
        assert await asyncio.to_thread(_plan_urls, cluster) == set(sources.values())
        assert {s.shard for s in gate.split_query("SELECT id, v, n FROM t", 4, "app")} \
            == set(SOURCES)
        await _wait(lambda: run.done() or any(m.startswith("snapshot committed")
                                              for m in messages),
                    "no snapshot", timeout=90)
        assert not run.done(), run.exception()

        writers.start()
        await flow.create()
        await flow.switch_reads()
        before = sum(writers.counts.values())
        await _wait(lambda: sum(writers.counts.values()) > before + 30, "writers stalled",
                    timeout=30)
        await flow.switch_writes()
        await _wait(lambda: {s.name for s in gate.topology.keyspace("app").shards}
                    == set(TARGETS), "writes did not switch")
        at_switch = sum(writers.counts.values())
        await _wait(lambda: sum(writers.counts.values()) > at_switch + 60,
                    "writers stalled after the switch", timeout=30)
        # as an operator must (docs/resharding.md): `complete` once no change-stream
        # reader is behind the switch. A stream interrupted by the switch and reopened
        # after `complete` names shards the keyspace no longer has (OUT_OF_RANGE); under
        # load the dump's reopening came after `complete` (a CI failure)
        await _wait(lambda: run.done() or all(
            any(m.strip().startswith(f"app/{s} drained") for m in messages) for s in SOURCES),
            "the dump did not pass the switch", timeout=60)
        assert not run.done(), run.exception()
        await flow.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "complete not seen")
        await writers.halt()
        assert min(writers.counts.values()) > 0, writers.counts

        # after: a new read is over the four targets, every row once, though the retired
        # sources still hold rows the writers changed or deleted after the switch
        stale = {int(r[0]): (str(r[1]), int(r[2]))
                 for url in sources.values() for r in await _rows_of(url)}
        assert stale and stale != model
        rows, partitions = await asyncio.to_thread(_spark_read, spark, cluster)
        _exactly(rows, model)
        assert partitions == 4
        assert await asyncio.to_thread(_plan_urls, cluster) == set(four.values())
        assert {s.shard for s in gate.split_query("SELECT id, v, n FROM t", 8, "app")} \
            == set(TARGETS)

        # the dump, started before the reshard, converges across it while following
        await _converged(lake, model, run, timeout=60)
        writers.start()  # more writes after the reshard
        at_complete = sum(writers.counts.values())
        await _wait(lambda: sum(writers.counts.values()) > at_complete + 100,
                    "writers stalled after complete", timeout=30)
        await writers.halt()
        await _converged(lake, model, run, timeout=60)
        stop.set()
        summary = await asyncio.wait_for(run, 60)
        assert summary.snapshot and summary.snapshot_rows == ROWS
        assert set(summary.positions) == {f"app/{n}" for n in TARGETS}, summary.positions
        assert any("drained" in m for m in messages), messages
        rows_now = _lake(lake)
        assert _live(rows_now) == model
        moved = [r for r in rows_now.values() if r[SHARD] in {f"app/{n}" for n in TARGETS}]
        assert moved and all(r[ORDER] >> GENERATION_SHIFT == 1 for r in moved)

        # a rerun resumes from the targets' positions: nothing to apply
        again = await DumpJob(gate.topology, "app", "t", lake, cluster_file=cluster).run()
        assert not again.snapshot and again.change_rows_merged == 0
        assert _lake(lake) == rows_now
    finally:
        stop.set()
        if not writers.stop.is_set():
            await writers.halt()
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await flow.close()
        await server.close()
        await gate.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_spark_reads_and_a_following_dump_cross_a_split(
    kind: str, spark: Any, make_database: Any, tmp_path: Path
) -> None:
    await _split_under_spark(kind, spark, make_database, tmp_path)


def test_orders_carry_the_generation_and_refuse_what_does_not_fit() -> None:
    from shardgate.errors import Unsupported
    from shardgate.event_token import EventToken
    from shardgate.spark.jobs.lake import MAX_GENERATION, Positions, token_order

    assert token_order("123") == 123  # generation 0: the orders of lakes made before
    assert token_order("5", 1) > token_order(str((1 << GENERATION_SHIFT) - 1))
    assert token_order("0/10", 2) == (2 << GENERATION_SHIFT) | 16
    with pytest.raises(Unsupported, match="generation"):
        token_order("5", MAX_GENERATION + 1)
    with pytest.raises(Unsupported, match="does not fit"):
        token_order(str(1 << GENERATION_SHIFT))
    p = Positions({"app/-40": EventToken(1.0, "app/-40", "7")}, {"app/-40": 1, "app/-80": 0})
    back = Positions.from_json(p.to_json()).with_generations(p.generations_json())
    assert back == p
    assert Positions.from_json(p.to_json()).with_generations(None).generations == {}

