"""The Spark source ``shardgate_changes`` across a reshard (issue 21 item 3).

A 2-shard keyspace (its topo store beside the cluster file) is split 2 -> 4 while
writers write through a gate and a streaming query on ``shardgate_changes`` runs
(``availableNow`` runs in a loop on one checkpoint) through ``switch-traffic
--writes`` and ``complete``, then more writes. The sink's changes, replayed per
batch in log order onto the table as it was when the query began, give exactly
the final table; no change is delivered twice (the journal has the targets'
positions). A copy of the checkpoint taken before the reshard, restarted after
``complete``, delivers exactly the changes the first query delivered after that
point: the retired sources are read to their final positions from the history
``complete`` keeps, then the targets. Once a source's log is gone, such a restart
fails with ``OUT_OF_RANGE`` instead of skipping.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.backends.changes.open import open_change_log
from shardgate.event_token import position_key
from shardgate.topo.local import store_url_for
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.spark.test_spark_streaming import _Collect
from tests.integration.workflows.test_reshard import Model, Writers, _wait
from tests.integration.workflows.test_reshard_spark import SOURCES, TARGETS, _cluster

KINDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]

#: a change as the sink sees it: (token, ordinal) names it; the rest is what it says
Change = tuple[str, int, str, str, str | None, str | None]


def _change(r: Any) -> Change:
    return (r.token, int(r.ordinal), r.op, r.pk, r.before, r.after)


class _Runs:
    """One query on one checkpoint: ``availableNow`` runs (:meth:`once`), or one query
    triggered every 0.3 s (:meth:`start`, :meth:`stop`): one Python runner process for
    the whole reshard, not one per run."""

    def __init__(self, spark: Any, cluster: str, checkpoint: str) -> None:
        self.spark, self.cluster, self.checkpoint = spark, cluster, checkpoint
        self.sink = _Collect()
        self.query: Any = None

    def _writer(self) -> Any:
        return (self.spark.readStream.format("shardgate_changes")
                .option("cluster", self.cluster).option("keyspace", "app")
                .option("starting", "earliest").option("tables", "t")
                .option("images", "json")
                .load().writeStream.foreachBatch(self.sink)
                .option("checkpointLocation", self.checkpoint))

    def once(self) -> None:
        self._writer().trigger(availableNow=True).start().awaitTermination()

    def start(self) -> None:
        self.query = self._writer().trigger(processingTime="0.3 seconds").start()

    @property
    def error(self) -> Any:
        return None if self.query is None or self.query.isActive else \
            (self.query.exception() or "the query stopped")

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()

    def changes(self, after_batch: int = -1) -> list[tuple[int, list[Change]]]:
        with self.sink.lock:
            batches = list(self.sink.batches)
        return [(b, [_change(r) for r in sorted(
                    rows, key=lambda r: (position_key(r.position), r.ordinal))])
                for b, rows in batches if b > after_batch]


def _replay(base: Model, batches: list[tuple[int, list[Change]]]) -> Model:
    """``base`` with the changes applied in batch order, each batch in log order."""
    out = dict(base)
    for _, changes in sorted(batches, key=lambda b: b[0]):
        for _token, _ordinal, op, pk, _before, after in changes:
            key = int(json.loads(pk)[0])
            if op == "delete":
                out.pop(key, None)
            else:
                image = json.loads(after or "{}")
                out[key] = (str(image["v"]), int(image["n"]))
    return out


async def _until(cond: Any, what: str, runs: _Runs, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert runs.error is None, runs.error
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.3)


async def _split_under_stream(kind: str, spark: Any, make_database: Any,
                              tmp_path: Path) -> None:
    cluster, gate, sources, model = await _cluster(make_database, tmp_path, kind)
    base = dict(model)  # the table when the query begins (its log starts there)
    writers = Writers(gate, model)
    runs = _Runs(spark, cluster, str(tmp_path / "ckpt"))
    server = TopoServer(open_topo_store(store_url_for(cluster)))
    four = {n: make_database(kind, f"cf{i}") for i, n in enumerate(TARGETS)}
    flow = ReshardWorkflow(server, ReshardSpec(
        keyspace="app", sources=SOURCES, targets=TARGETS,
        target_urls=tuple(sorted(four.items())), workflow="sparkchanges"), batch=500)
    try:
        await asyncio.to_thread(runs.once)  # the query begins: capture on the sources
        writers.start()
        await _wait(lambda: sum(writers.counts.values()) > 30, "writers stalled", 30)
        await asyncio.to_thread(runs.once)
        assert runs.sink.batches, "no batch before the reshard"
        # copies of the checkpoint taken before the reshard
        before, before2 = str(tmp_path / "ckpt-before"), str(tmp_path / "ckpt-before-2")
        for dest in (before, before2):
            shutil.copytree(runs.checkpoint, dest)
        before_batch = max(b for b, _ in runs.sink.batches)
        runs.start()  # the query runs on through the reshard

        await flow.create()
        await flow.switch_reads()
        at = sum(writers.counts.values())
        await _wait(lambda: sum(writers.counts.values()) > at + 30, "writers stalled", 30)
        await flow.switch_writes()
        await _wait(lambda: {s.name for s in gate.topology.keyspace("app").shards}
                    == set(TARGETS), "writes did not switch")
        at = sum(writers.counts.values())
        await _wait(lambda: sum(writers.counts.values()) > at + 60,
                    "writers stalled after the switch", 30)
        await flow.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "complete not seen")
        at = sum(writers.counts.values())
        await _wait(lambda: sum(writers.counts.values()) > at + 60,
                    "writers stalled after complete", 30)
        await writers.halt()
        assert min(writers.counts.values()) > 0, writers.counts

        # the query, never restarted by hand, delivers every change across the hop
        final = dict(model)
        await _until(lambda: _replay(base, runs.changes()) == final,
                     "the replayed changes do not give the table", runs, 120)
        assert runs.error is None, runs.error
        await asyncio.to_thread(runs.stop)
        delivered = runs.changes()
        flat = [c for _, changes in delivered for c in changes]
        assert len(flat) == len(set(flat)), "a change was delivered twice"
        assert _replay(base, delivered) == final
        names = {r.shard for _, rows in runs.sink.batches for r in rows}
        assert set(SOURCES) <= names and set(TARGETS) <= names, names
        # per row, every change of a source is in an earlier batch than any of a target
        last_source: dict[int, int] = {}
        first_target: dict[int, int] = {}
        for b, rows in runs.sink.batches:
            for r in rows:
                key = int(json.loads(r.pk)[0])
                if r.shard in SOURCES:
                    last_source[key] = max(last_source.get(key, -1), b)
                else:
                    first_target[key] = min(first_target.get(key, 1 << 30), b)
        both = set(last_source) & set(first_target)
        assert both and all(last_source[k] < first_target[k] for k in both)

        # the checkpoint taken before the reshard, restarted after complete: the changes
        # after its offset, every one once (the sources read from the kept history)
        expected = sorted(c for _, changes in runs.changes(before_batch) for c in changes)
        again = _Runs(spark, cluster, before)
        again.start()
        try:
            def got() -> list[Change]:
                return sorted(c for _, changes in again.changes() for c in changes)

            await _until(lambda: len(got()) >= len(expected),
                         "the restarted query did not catch up", again, 120)
            assert again.error is None, again.error
        finally:
            await asyncio.to_thread(again.stop)
        assert got() == expected

        # a source's log dropped: the other copy's restart fails, naming what to do
        for name, url in sources.items():
            log = open_change_log(url, f"app/{name}")
            try:
                await log.drop()
            finally:
                await log.close()
        lost = _Runs(spark, cluster, before2)
        with pytest.raises(Exception, match=r"OUT_OF_RANGE|no longer holds") as err:
            await asyncio.to_thread(lost.once)
        assert "new checkpoint" in str(err.value)
        assert not lost.sink.batches
    finally:
        await asyncio.to_thread(runs.stop)
        if not writers.stop.is_set():
            await writers.halt()
        await flow.close()
        await server.close()
        await gate.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_changes_source_follows_a_split_and_a_checkpoint_from_before_it(
    kind: str, spark: Any, make_database: Any, tmp_path: Path
) -> None:
    await _split_under_stream(kind, spark, make_database, tmp_path)
