"""The segmented job store: append-only datasets and status tables, dropped whole.

* :mod:`~shardgate.queues.segmented.ddl` - the tables and the job states;
* :mod:`~shardgate.queues.segmented.store` - the SQL and the producers' group commit;
* :mod:`~shardgate.queues.segmented.consumer` - the per-shard consumer (ordering,
  retries, circuit breaker, compaction; its docstring holds the invariants);
* :mod:`~shardgate.queues.segmented.served` - the consumer served to receivers by a tablet;
* :mod:`~shardgate.queues.segmented.queue` - the keyspace-wide front
  (:class:`SegmentedQueue`).

See ``docs/segmented-queues.md``.
"""

from shardgate.queues.segmented.queue import SegmentedJob, SegmentedQueue, segmented_queues_of

__all__ = ["SegmentedJob", "SegmentedQueue", "segmented_queues_of"]
