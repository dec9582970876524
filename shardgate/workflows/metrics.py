"""Prometheus metrics of reshard (and MoveTables) workflows: rows copied, catch-up lag,
cut-over pause.

A workflow runs in its own process (the CLI), so its figures live in its
record in the topo store (each save carries them) and are exposed by the
process that serves ``/metrics`` (the gate's HTTP server): it calls
:meth:`ReshardCollector.update` with the records it just read, and the
collector reports them at scrape time. Metrics (labels ``workflow`` and, per
source shard, ``source``):

* ``shardgate_reshard_rows_copied_total``: rows the copy phase wrote;
* ``shardgate_reshard_lag_seconds``: how far each stream's catch-up trails
  its source (commit time of the last change applied);
* ``shardgate_reshard_cutover_seconds``: how long the last write cut-over
  kept writes paused (sources refusing them), also when it rolled back.

Invariant: the collector reports exactly the workflows of the last update
(a completed or cancelled workflow, whose record is gone, disappears).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


def figures(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The metric figures of one reshard record (also in ``status --json``)."""
    streams = doc.get("streams") or {}
    return {
        "rows_copied": {name: sum(int(t.get("rows", 0)) for t in (s.get("tables") or {}).values())
                        for name, s in streams.items()},
        "lag_s": {name: float(s.get("lag_s", 0.0)) for name, s in streams.items()},
        "cutover_s": doc.get("cutover_s"),
    }


class ReshardCollector(Collector):
    """The figures of the reshard records last given to :meth:`update`."""

    def __init__(self) -> None:
        self._docs: dict[str, Mapping[str, Any]] = {}

    def update(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Report the reshard records ``records`` (name -> document) from now on."""
        self._docs = {name: doc for name, doc in records.items()
                      if doc.get("kind") in ("reshard", "movetables")}

    def collect(self) -> Iterable[Metric]:
        rows = CounterMetricFamily("shardgate_reshard_rows_copied",
                                   "Rows a reshard's copy phase wrote to the targets",
                                   labels=["workflow", "source"])
        lag = GaugeMetricFamily("shardgate_reshard_lag_seconds",
                                "How far a reshard stream's catch-up trails its source",
                                labels=["workflow", "source"])
        pause = GaugeMetricFamily("shardgate_reshard_cutover_seconds",
                                  "Writes paused by a reshard's last write cut-over",
                                  labels=["workflow"])
        for name, doc in sorted(self._docs.items()):
            f = figures(doc)
            for source, n in f["rows_copied"].items():
                rows.add_metric([name, source], n)
            for source, s in f["lag_s"].items():
                lag.add_metric([name, source], s)
            if f["cutover_s"] is not None:
                pause.add_metric([name], float(f["cutover_s"]))
        yield from (rows, lag, pause)


COLLECTOR = ReshardCollector()
REGISTRY.register(COLLECTOR)
