"""Prometheus metrics of the queue managers (labels: keyspace, shard, queue).

The same figures ``shardgate queue stats`` prints. Defined once, here, on
prometheus_client's default registry; ``start_http_server`` on the tablet's
metrics port exposes them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LABELS = ("keyspace", "shard", "queue")

FIRED = Counter("shardgate_queue_fired", "Events fired (sent to a receiver)", LABELS)
RETRIES = Counter("shardgate_queue_retries", "Events fired again (epoch > 1)", LABELS)
ACKED = Counter("shardgate_queue_acked", "Events acked", LABELS)
FAILED = Counter("shardgate_queue_failed", "Events that ran out of attempts", LABELS)
PURGED = Counter("shardgate_queue_purged", "Acked events deleted by retention", LABELS)
IN_FLIGHT = Gauge("shardgate_queue_in_flight", "Fired events awaiting their ack", LABELS)
CACHED = Gauge("shardgate_queue_cached", "Events held in the manager's window", LABELS)
BLOCKED_KEYS = Gauge("shardgate_queue_blocked_keys", "Ordering keys with waiting events", LABELS)
RECEIVERS = Gauge("shardgate_queue_receivers", "Connected receivers", LABELS)
DEPTH = Gauge("shardgate_queue_depth", "Events per state", (*LABELS, "state"))
LAG = Gauge("shardgate_queue_lag_seconds", "Age of the oldest due, unfired event", LABELS)
