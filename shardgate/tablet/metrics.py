"""A tablet's Prometheus metrics: its shard's queries, connections and lease.

Named like Vitess's ``vttablet_queries``; labels: operation, keyspace,
shard, backend, and the error code for failures. Served by the gate's
``/metrics`` in ``shardgate up`` and by ``shardgate tablet --http-port``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from shardgate.sql.dialects import Dialect


class _Tablet(Protocol):
    """What the collector reads of a tablet."""

    keyspace: str
    shard: str
    queues: Any
    _transactions: dict[int, Any]

    @property
    def dialect(self) -> Dialect: ...

QUERIES = Histogram(
    "shardgate_tablet_query_seconds", "Statements a tablet ran on its shard",
    ("operation", "keyspace", "shard", "backend"),
)
ERRORS = Counter(
    "shardgate_tablet_query_errors", "Statements that failed on the shard, by code",
    ("operation", "keyspace", "shard", "backend", "code"),
)

RETRIES = Counter(
    "shardgate_tablet_autocommit_retries",
    "Autocommit statements run again after a lock conflict (deadlock, busy database)",
    ("keyspace", "shard"),
)


class TabletCollector(Collector):
    """Connections, open transactions and lease state, read at scrape time."""

    def __init__(self) -> None:
        self.tablets: weakref.WeakSet[_Tablet] = weakref.WeakSet()

    def collect(self) -> Iterable[Metric]:
        labels = ["keyspace", "shard", "backend"]
        txs = GaugeMetricFamily("shardgate_tablet_transactions", "Open transactions", labels=labels)
        lease = GaugeMetricFamily("shardgate_tablet_lease_holder",
                                  "1 if this tablet holds its shard's lease", labels=labels)
        for t in self.tablets:
            key = [t.keyspace, t.shard, t.dialect]
            txs.add_metric(key, len(t._transactions))
            lease.add_metric(key, 1 if t.queues.leader else 0)
        yield from (txs, lease)


COLLECTOR = TabletCollector()
REGISTRY.register(COLLECTOR)
