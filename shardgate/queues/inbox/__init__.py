"""The inbox store: per-user queues in time buckets, read with a pointer per consumer.

* :mod:`~shardgate.queues.inbox.model` - options, buckets, ids, pointers and the
  exact-once delivery rule (pure);
* :mod:`~shardgate.queues.inbox.sql` - DDL and statements;
* :mod:`~shardgate.queues.inbox.store` - :class:`InboxStore`, on the gate.

The blocking client is :class:`shardgate.client.inbox.SyncInbox`. See
``docs/inbox-queues.md``.
"""

from shardgate.queues.inbox.model import Bucket, InboxOptions, Message, Pointer
from shardgate.queues.inbox.store import InboxRead, InboxStore, MaintainReport

__all__ = ["Bucket", "InboxOptions", "InboxRead", "InboxStore", "MaintainReport", "Message",
           "Pointer"]
