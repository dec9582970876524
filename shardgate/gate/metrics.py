"""The gate's Prometheus metrics, named in Vitess's style (``vtgate_api`` ...).

All in prometheus_client's default registry, served at ``/metrics`` by the
HTTP server (:mod:`shardgate.api.http`). Labels stay low-cardinality:
operation (``Execute``, ``StreamExecute``), keyspace, statement type, error
code; never the SQL text.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
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

API = Histogram(
    "shardgate_gate_api_seconds",
    "Statements through the gate: latency by operation, keyspace and statement type",
    ("operation", "keyspace", "statement"),
)
API_ERRORS = Counter(
    "shardgate_gate_api_errors", "Statements that failed, by error code",
    ("operation", "keyspace", "code"),
)
ROWS_RETURNED = Counter("shardgate_gate_rows_returned", "Rows returned to clients",
                        ("operation", "keyspace"))
ROWS_AFFECTED = Counter("shardgate_gate_rows_affected", "Rows inserted, updated or deleted",
                        ("operation", "keyspace"))
FANOUT = Histogram(
    "shardgate_gate_shard_calls", "Shard calls per statement (scatter fan-out)", ("keyspace",),
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)


def record(keyspace: str | None, statement: str, seconds: float, rows: int, affected: int,
           shard_calls: int, error: str | None, operation: str = "Execute") -> None:
    """Count one statement."""
    ks = keyspace or ""
    API.labels(operation, ks, statement).observe(seconds)
    if error is not None:
        API_ERRORS.labels(operation, ks, error).inc()
        return
    if rows:
        ROWS_RETURNED.labels(operation, ks).inc(rows)
    if affected:
        ROWS_AFFECTED.labels(operation, ks).inc(affected)
    FANOUT.labels(ks).observe(shard_calls)


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
