"""Durable queues: queue tables (the Vitess message-table design) and their managers.

* :mod:`~shardgate.queues.options` - the options of a queue table;
* :mod:`~shardgate.queues.ddl` - ``CREATE QUEUE`` and per-dialect table DDL;
* :mod:`~shardgate.queues.table_store` - every SQL statement a manager runs;
* :mod:`~shardgate.queues.manager` - the per-shard, per-queue manager (its
  docstring holds the invariants);
* :mod:`~shardgate.queues.metrics` - Prometheus metrics;
* :mod:`~shardgate.queues.inbox` - the inbox store: per-user queues in time
  buckets read with a pointer per consumer (``docs/inbox-queues.md``);
* :mod:`~shardgate.queues.segmented` - the segmented job store: append-only
  datasets and status tables, dropped whole (``docs/segmented-queues.md``).

See ``docs/queues.md`` for the state machine and the user's view.
"""

from shardgate.queues.events import QueueBatch, QueueEvent
from shardgate.queues.options import QueueOptions

__all__ = ["QueueBatch", "QueueEvent", "QueueOptions"]
