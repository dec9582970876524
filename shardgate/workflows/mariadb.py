"""MariaDB sources of a reshard: the copy's snapshot position and the cut-over's freeze.

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

The write cut-over freezes the moving tables with ``BEFORE`` triggers that
``SIGNAL`` an error carrying :data:`~shardgate.topo.model.WRITES_FROZEN`
(the gates hold such writes), unless the session's user variable
:data:`~shardgate.workflows.freeze.MYSQL_VARIABLE` is 1: the workflow's
applier sets it around its own transactions (the reverse stream writes the
frozen sources; the forward one, after ``reverse-traffic``, the frozen
targets; see :mod:`shardgate.workflows.freeze`). Creating (or replacing) a
trigger takes the table's exclusive metadata lock, so it waits for the
transactions that wrote the table to end: after it, no write in flight can
still commit.
"""

from __future__ import annotations

from shardgate.backends.base import Connection
from shardgate.errors import FailedPrecondition
from shardgate.topo.model import WRITES_FROZEN
from shardgate.workflows.freeze import MYSQL_VARIABLE
from shardgate.workflows.rowsql import quote

_OPS = ("INSERT", "UPDATE", "DELETE")


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


def freeze_sql(table: str, on: bool) -> list[str]:
    """The statements that make ``table`` refuse (``on``) or accept again writes.

    ``CREATE OR REPLACE``: a trigger an older version left (refusing the applier
    too) is replaced by one that lets the applier through."""
    out = []
    for op in _OPS:
        trig = quote("mysql", f"_sg_deny_{op.lower()}_{table}")
        if not on:
            out.append(f"DROP TRIGGER IF EXISTS {trig}")
        else:
            out.append(
                f"CREATE OR REPLACE TRIGGER {trig} BEFORE {op} ON {quote('mysql', table)} "
                f"FOR EACH ROW IF COALESCE(@{MYSQL_VARIABLE}, 0) <> 1 THEN "
                f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{WRITES_FROZEN}: writes paused "
                "for a reshard cut-over'; END IF")
    return out
