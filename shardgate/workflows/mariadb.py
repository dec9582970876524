"""MariaDB sources of a reshard: the copy's snapshot position.

A copy cycle (and VDiff) needs a read snapshot together with the change-log
position it corresponds to, exactly. On MariaDB,
``START TRANSACTION WITH CONSISTENT SNAPSHOT`` fixes the InnoDB snapshot and,
in the same step, the binlog file and offset of the last transaction in it
(the session's ``binlog_snapshot_file`` / ``binlog_snapshot_position``
status variables: MariaDB blocks binlog commits for the instant the snapshot
is taken, so the two agree); ``BINLOG_GTID_POS`` turns that offset into the
GTID position the change log reader
(:class:`~shardgate.backends.changes.mysql.MySQLChangeLog`) starts from.

Invariant: every transaction whose GTID is at or below the returned position
is in the snapshot, none after it (one GTID domain: see
:func:`shardgate.workflows.catchup.position_key`).

The write cut-over's triggers on MariaDB are in :mod:`shardgate.workflows.freeze`.
"""

from __future__ import annotations

from shardgate.backends.base import Connection
from shardgate.errors import FailedPrecondition


async def begin_snapshot(conn: Connection) -> str:
    """Open a consistent-snapshot read transaction on ``conn``; its GTID position."""
    await conn.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    status = {str(k).lower(): str(v) for k, v in
              (await conn.execute(
                  "SHOW STATUS WHERE Variable_name IN ('Binlog_snapshot_file', "
                  "'Binlog_snapshot_position')")).rows}
    name, offset = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not name or not offset:
        raise FailedPrecondition("the MariaDB source has no binlog (log_bin is off): "
                                 "resharding needs it (scripts/setup-servers.sh)")
    rows = (await conn.execute("SELECT BINLOG_GTID_POS(%s, %s)", (name, int(offset)))).rows
    pos = str(rows[0][0] or "") if rows else ""
    if not pos:
        # no transaction was ever logged with a GTID: the log's beginning
        pos = "0-0-0"
    return pos
