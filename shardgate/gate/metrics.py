"""The gate's Prometheus metrics, named in Vitess's style (``vtgate_api`` ...).

All in prometheus_client's default registry, served at ``/metrics`` by the
HTTP server (:mod:`shardgate.api.http`). Labels stay low-cardinality:
operation (``Execute``, ``StreamExecute``), keyspace, statement type, error
code; never the SQL text.

The per-statement metrics are counted in plain numbers of the calling thread
(:func:`record`: no lock on the statement path) and read at scrape time by
:class:`StatementCollector`; errors by code are a prometheus_client counter.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class _Gate(Protocol):
    """What the collector reads of a gate."""

    plans: Any
    live: Any
    streams: Any
    topology: Any

    @property
    def degraded(self) -> str | None: ...

API_ERRORS = Counter(
    "shardgate_gate_api_errors", "Statements that failed, by error code",
    ("operation", "keyspace", "code"),
)
#: ``shardgate_gate_api_seconds``' buckets (prometheus_client's default ones)
API_BUCKETS: tuple[float, ...] = Histogram.DEFAULT_BUCKETS
#: ``shardgate_gate_shard_calls``' buckets
FANOUT_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, float("inf"))


class _Tally:
    """One thread's counts for one (operation, keyspace, statement type).

    Buckets hold the observations of each bucket alone (index: the first upper
    bound at or above the value); the collector makes them cumulative.
    """

    __slots__ = ("affected", "api_buckets", "api_count", "api_sum", "fanout_buckets",
                 "fanout_sum", "rows")

    def __init__(self) -> None:
        self.api_count = 0
        self.api_sum = 0.0
        self.api_buckets = [0] * len(API_BUCKETS)
        self.rows = 0
        self.affected = 0
        self.fanout_sum = 0.0
        self.fanout_buckets = [0] * len(FANOUT_BUCKETS)


class _Tallies(threading.local):
    """The calling thread's tallies by labels; every thread's are listed in ``_ALL``."""

    def __init__(self) -> None:
        self.by_labels: dict[tuple[str, str, str], _Tally] = {}
        with _ALL_LOCK:
            _ALL.append(self.by_labels)


#: Every thread's tallies (a thread's stay after it ends: counters never go back).
_ALL: list[dict[tuple[str, str, str], _Tally]] = []
_ALL_LOCK = threading.Lock()
_TALLIES = _Tallies()


def record(keyspace: str | None, statement: str, seconds: float, rows: int, affected: int,
           shard_calls: int, error: str | None, operation: str = "Execute") -> None:
    """Count one statement.

    A few additions to plain numbers of the calling thread (no lock, no
    ``labels()`` lookup: prometheus_client's children take a lock per update);
    :class:`StatementCollector` turns them into the metric families at scrape time.
    """
    key = (operation, keyspace or "", statement)
    by_labels = _TALLIES.by_labels
    tally = by_labels.get(key)
    if tally is None:
        tally = by_labels[key] = _Tally()
    tally.api_count += 1
    tally.api_sum += seconds
    tally.api_buckets[bisect.bisect_left(API_BUCKETS, seconds)] += 1
    if error is not None:
        API_ERRORS.labels(operation, key[1], error).inc()
        return
    tally.rows += rows
    tally.affected += affected
    tally.fanout_sum += shard_calls
    tally.fanout_buckets[bisect.bisect_left(FANOUT_BUCKETS, shard_calls)] += 1


def _le(bound: float) -> str:
    """A bucket's ``le`` label as prometheus_client writes it (``0.005``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(bounds, counts, strict=True):
        total += n
        out.append((_le(bound), total))
    return out


class StatementCollector(Collector):
    """The statement metrics :func:`record` counts, summed over threads at scrape time.

    ``shardgate_gate_api_seconds`` (histogram: operation, keyspace, statement type),
    ``shardgate_gate_rows_returned`` and ``shardgate_gate_rows_affected`` (counters:
    operation, keyspace) and ``shardgate_gate_shard_calls`` (histogram: keyspace).
    """

    def collect(self) -> Iterable[Metric]:
        with _ALL_LOCK:
            tables = list(_ALL)
        merged: dict[tuple[str, str, str], _Tally] = {}
        for table in tables:
            for key, t in list(table.items()):
                m = merged.get(key)
                if m is None:
                    m = merged[key] = _Tally()
                m.api_count += t.api_count
                m.api_sum += t.api_sum
                m.api_buckets = [a + b for a, b in zip(m.api_buckets, t.api_buckets, strict=True)]
                m.rows += t.rows
                m.affected += t.affected
                m.fanout_sum += t.fanout_sum
                m.fanout_buckets = [a + b for a, b in zip(m.fanout_buckets, t.fanout_buckets,
                                                          strict=True)]
        api = HistogramMetricFamily(
            "shardgate_gate_api_seconds",
            "Statements through the gate: latency by operation, keyspace and statement type",
            labels=["operation", "keyspace", "statement"])
        rows = CounterMetricFamily("shardgate_gate_rows_returned", "Rows returned to clients",
                                   labels=["operation", "keyspace"])
        affected = CounterMetricFamily("shardgate_gate_rows_affected",
                                       "Rows inserted, updated or deleted",
                                       labels=["operation", "keyspace"])
        fanout = HistogramMetricFamily("shardgate_gate_shard_calls",
                                       "Shard calls per statement (scatter fan-out)",
                                       labels=["keyspace"])
        per_op: dict[tuple[str, str], tuple[int, int]] = {}
        per_ks: dict[str, tuple[list[int], float]] = {}
        for (op, ks, statement), t in sorted(merged.items()):
            api.add_metric([op, ks, statement], _cumulative(API_BUCKETS, t.api_buckets),
                           t.api_sum)
            r, a = per_op.get((op, ks), (0, 0))
            per_op[(op, ks)] = (r + t.rows, a + t.affected)
            buckets, total = per_ks.get(ks, ([0] * len(FANOUT_BUCKETS), 0.0))
            per_ks[ks] = ([x + y for x, y in zip(buckets, t.fanout_buckets, strict=True)],
                          total + t.fanout_sum)
        for (op, ks), (r, a) in per_op.items():
            rows.add_metric([op, ks], r)
            affected.add_metric([op, ks], a)
        for ks, (buckets, total) in per_ks.items():
            fanout.add_metric([ks], _cumulative(FANOUT_BUCKETS, buckets), total)
        yield from (api, rows, affected, fanout)


REGISTRY.register(StatementCollector())


class GateCollector(Collector):
    """Values read from live gates at scrape time: plan cache, sessions, topology."""

    def __init__(self) -> None:
        self.gates: weakref.WeakSet[_Gate] = weakref.WeakSet()

    def collect(self) -> Iterable[Metric]:
        hits = CounterMetricFamily("shardgate_gate_plan_cache_hits", "Plan cache hits")
        misses = CounterMetricFamily("shardgate_gate_plan_cache_misses", "Plan cache misses")
        size = GaugeMetricFamily("shardgate_gate_plan_cache_size", "Cached plans")
        live = GaugeMetricFamily("shardgate_gate_live_queries", "Statements in flight")
        version = GaugeMetricFamily("shardgate_gate_topology_version",
                                    "Topo store version the gate serves")
        degraded = GaugeMetricFamily("shardgate_gate_topo_degraded",
                                     "1 while the gate cannot read its topo store")
        lag = GaugeMetricFamily("shardgate_stream_lag_seconds",
                                "Largest change-stream lag among the gate's consumers",
                                labels=["keyspace"])
        consumers = GaugeMetricFamily("shardgate_stream_consumers",
                                      "Change streams being read", labels=["keyspace"])
        for g in self.gates:
            per_ks: dict[str, list[float]] = {}
            for c in g.streams.snapshot():
                per_ks.setdefault(c.keyspace, []).append(c.lag_seconds)
            for ks, lags in per_ks.items():
                lag.add_metric([ks], max(lags))
                consumers.add_metric([ks], len(lags))
            hits.add_metric([], g.plans.hits)
            misses.add_metric([], g.plans.misses)
            size.add_metric([], len(g.plans))
            live.add_metric([], len(g.live.snapshot()))
            version.add_metric([], g.topology.version)
            degraded.add_metric([], 1 if g.degraded else 0)
        yield from (hits, misses, size, live, version, degraded, lag, consumers)


COLLECTOR = GateCollector()
REGISTRY.register(COLLECTOR)
