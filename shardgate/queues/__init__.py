"""Durable queues: three stores, and the parts they share beside them.

The stores (one folder each):

* :mod:`~shardgate.queues.table` - queue tables (the Vitess message-table
  design): state kept in place, one manager per shard and queue
  (``docs/queues.md``);
* :mod:`~shardgate.queues.segmented` - the segmented job store: append-only
  datasets and status tables, dropped whole (``docs/segmented-queues.md``);
* :mod:`~shardgate.queues.inbox` - the inbox store: per-user queues in time
  buckets read with a pointer per consumer (``docs/inbox-queues.md``).

What they share:

* :mod:`~shardgate.queues.events` - events, batches and their states;
* :mod:`~shardgate.queues.options` - the options of a queue;
* :mod:`~shardgate.queues.ddl` - ``CREATE QUEUE`` and per-dialect table DDL;
* :mod:`~shardgate.queues.metrics` - Prometheus metrics;
* :mod:`~shardgate.queues.router` - the gate's side: routing receive, ack,
  enqueue and stats to the shards' tablets.

See ``docs/queues.md`` for the state machine and the user's view.

Nothing is imported here: a process that needs one part (a Spark worker unpickling
the queue source needs :mod:`~shardgate.queues.events`) does not pay for the others.
"""
