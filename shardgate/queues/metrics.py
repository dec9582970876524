"""Prometheus metrics of the queue managers (labels: keyspace, shard, queue).

The same figures ``shardgate queue stats`` prints. Defined once, here, on
prometheus_client's default registry; ``/metrics`` of the gate's and the
tablet's HTTP servers exposes them.
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

# -- segmented job store (shardgate.queues.segmented*): same labels ----------------------
SEG_STORED = Counter("shardgate_segmented_stored", "Jobs committed by producers", LABELS)
SEG_EXECUTING = Counter("shardgate_segmented_executing", "Jobs handed to workers", LABELS)
SEG_SUCCEEDED = Counter("shardgate_segmented_succeeded", "Jobs that succeeded", LABELS)
SEG_FAILED = Counter("shardgate_segmented_failed", "Failed attempts (retried later)", LABELS)
SEG_ABORTED = Counter("shardgate_segmented_aborted", "Jobs aborted (attempts or operator)",
                      LABELS)
SEG_DATASETS = Gauge("shardgate_segmented_datasets", "Live datasets", LABELS)
SEG_PENDING = Gauge("shardgate_segmented_pending", "Jobs read and not done yet", LABELS)
SEG_IN_FLIGHT = Gauge("shardgate_segmented_in_flight", "Jobs executing", LABELS)
SEG_BLOCKED_KEYS = Gauge("shardgate_segmented_blocked_keys",
                         "Keys whose first job failed and blocks later ones", LABELS)
SEG_HOT_KEYS = Gauge("shardgate_segmented_hot_keys", "Keys with ordering switched off", LABELS)
SEG_DROPPED = Counter("shardgate_segmented_datasets_dropped", "Datasets dropped whole", LABELS)
SEG_MERGED = Counter("shardgate_segmented_datasets_merged", "Datasets merged away", LABELS)
SEG_PAUSE = Gauge("shardgate_segmented_compaction_pause_seconds",
                  "Longest pause of status writes by one compaction step", LABELS)
