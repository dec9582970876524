"""The queue table store (the Vitess message-table design): state kept in place.

* :mod:`~shardgate.queues.table.store` - every SQL statement a manager runs;
* :mod:`~shardgate.queues.table.manager` - the per-shard, per-queue manager (its
  docstring holds the invariants).

See ``docs/queues.md``.
"""

from shardgate.queues.table.manager import QueueManager, Writer
from shardgate.queues.table.store import QueueStore

__all__ = ["QueueManager", "QueueStore", "Writer"]
