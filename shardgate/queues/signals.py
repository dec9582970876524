"""Queue signals: how a commit the leader tablet did not run still wakes its queue managers.

A queue manager learns of new events from its own tablet's commits
(:meth:`~shardgate.tablet.queue_service.QueueService.committed`). Writes that
do not pass through that tablet (the Spark writer's commit copy, a gate in
another process whose tablet is not the shard's queue leader, any other bulk
load) record a **signal** instead: one row per queue in the shard's
``_sg_queue_signals`` table, written *in the same transaction* as the events
(or right after their commit), so the signal is visible exactly when the
events are:

``queue``     the queue table's name (primary key)
``seq``       bumped by every signal
``since_ns``  the smallest ``time_scheduled`` the signalled events may carry
              (the start of the writing transaction), kept as the minimum
              over signals not yet consumed
``signalled_ns`` the database's clock when the last signal was written (its
              transaction's last statement: about its commit time), for
              measuring the wake-up delay

The leader tablet polls the table (one tiny primary-key read every
``signal_poll_s``; nothing on the hot path of the gate's own enqueues) and,
for each queue whose ``seq`` moved, wakes its manager with ``since_ns``, then
resets ``since_ns`` if no signal arrived meanwhile (conditional on ``seq``).
Its first read wakes every queue whose ``since_ns`` is still pending: a signal
written between the lease's acquisition and that read is not taken for an old
one. A non-leader whose signal write fails sends it again after a pause. A
missed or late signal costs latency only: every manager still scans the whole
table once per ``window``.

No ``NOTIFY`` and no triggers: the hot commit path stays as it is (see the
field notes on ``pg_notify`` costs).
"""

from __future__ import annotations

import re

from shardgate.errors import InvalidArgument
from shardgate.sql.dialects import Dialect, sql_dialect

TABLE = "_sg_queue_signals"
#: ``since_ns`` of a signal consumed with no new one since (larger than any time).
NONE_PENDING = 2**62

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


def ddl() -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the signal table (the same in every dialect)."""
    return (f"CREATE TABLE IF NOT EXISTS {TABLE} (queue VARCHAR(64) NOT NULL PRIMARY KEY, "
            "seq BIGINT NOT NULL, since_ns BIGINT NOT NULL, signalled_ns BIGINT NOT NULL)")


def signal_sql(dialect: Dialect, queue: str, since_ns: int) -> str:
    """The upsert recording one signal of ``queue`` (literal values, no parameters:
    ``queue`` must be a plain identifier, as queue table names are)."""
    if not _NAME.match(queue):
        raise InvalidArgument(f"queue signals: {queue!r} is not a plain table name")
    q, since, d = queue.lower(), int(since_ns), sql_dialect(dialect)
    seq, pending = d.current(TABLE, "seq"), d.current(TABLE, "since_ns")
    sets = (f"seq = {seq} + 1, since_ns = {d.least}({pending}, {d.excluded('since_ns')}), "
            f"signalled_ns = {d.excluded('signalled_ns')}")
    return (f"INSERT INTO {TABLE} (queue, seq, since_ns, signalled_ns) "
            f"VALUES ('{q}', 1, {since}, {d.now_ns_sql}){d.upsert('queue', sets)}")


def read_sql() -> str:
    """Every queue's ``(queue, seq, since_ns)``."""
    return f"SELECT queue, seq, since_ns FROM {TABLE}"


def consumed_sql(placeholder: str) -> str:
    """Reset ``since_ns`` of a queue if its ``seq`` is still the one consumed
    (parameters: queue, seq)."""
    return (f"UPDATE {TABLE} SET since_ns = {NONE_PENDING} WHERE queue = {placeholder} "
            f"AND seq = {placeholder}")
