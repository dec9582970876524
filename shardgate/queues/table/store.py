"""Every SQL statement a queue manager runs, per dialect (procrastinate's named queries).

The manager's two scans are served exactly by the two indexes the DDL
creates (see :mod:`shardgate.queues.ddl`):

* new events: ``state = 'to_be_fired' AND time_scheduled BETWEEN :since AND
  :horizon ORDER BY time_scheduled LIMIT :n`` on the ``due`` index;
* retries and the slow collector: ``state = 'fired' AND time_next <= :horizon
  ORDER BY time_next LIMIT :n`` on the ``next`` index; the purge reads
  ``state = 'acked'`` by ``time_next`` (an ack sets it to the ack time).

On PostgreSQL and SQLite those indexes are partial, one per state
(``(time_scheduled) WHERE state = 'to_be_fired'`` and so on), so each write
of an event's life adds one scan-index entry instead of one to every index,
and a scan never steps over other states' rows. The states are therefore
literals in the statements' text, never parameters: a planner uses a partial
index only for a condition it can see implies the index's own.

Writes are by primary key, in batches (``id IN (...)``), and conditioned on
the state so that an acked event is never fired again; that condition is a
``NOT IN``/``<>`` that no index serves, so the primary key is the only way
in (an ``IN`` over the states let PostgreSQL's generic plan AND in a scan of
a whole state index: 76,000 entries per fire in the queue bench). PostgreSQL
and SQLite return the ids they changed (``RETURNING``); MariaDB has no
``UPDATE ... RETURNING``, so the ids are locked and read first in the same
transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from shardgate.backends import Connection
from shardgate.queues.events import ACKED, EVENT_COLUMNS, FAILED, FIRED, STATES, TO_BE_FIRED
from shardgate.result import Row
from shardgate.sql.dialects import Dialect, sql_dialect

#: Rows a purge statement deletes at most (Vitess purges 500 at a time).
PURGE_BATCH = 500


def _lit(state: str) -> str:
    """A state as a SQL literal (states are fixed words: see the module's docstring)."""
    assert state in STATES
    return f"'{state}'"


#: ``state`` condition of an event that may still be fired (neither acked nor failed).
_LIVE = f"state NOT IN ({_lit(ACKED)}, {_lit(FAILED)})"


def now_ns() -> int:
    return time.time_ns()


#: Positions in a scanned row (the scans return the driver's tuples as they are: no
#: object per row): ``id, priority, time_scheduled, time_next, epoch, state, *values``.
ID, PRIORITY, TIME_SCHEDULED, TIME_NEXT, EPOCH, STATE = range(6)
#: Where the user's columns start in a scanned row.
VALUES = 6


class QueueStore:
    """The SQL of one queue table for one dialect.

    ``user_columns`` are the table's columns besides the mandatory ones, in
    table order (read from the database by :meth:`load_columns`).
    """

    def __init__(self, table: str, dialect: Dialect, placeholder: str) -> None:
        self.table = table
        self.dialect = dialect
        self._d = sql_dialect(dialect)
        self.ph = placeholder
        self.user_columns: list[str] = []
        self._t = self.quote(table)
        self._select_of: tuple[tuple[str, ...], str] = ((), "")

    def quote(self, name: str) -> str:
        return self._d.quote(name)

    def _in(self, n: int) -> str:
        return "(" + ", ".join([self.ph] * n) + ")"

    def _ids(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        """``id IN (...)``, or ``id = ANY(%s)`` on PostgreSQL: one statement text
        for every batch size, so the driver's query cache and prepared
        statements work."""
        if self._d.array_params:  # an array literal: psycopg dumps a list per item
            return f"id = ANY({self.ph}::bigint[])", ["{" + ",".join(map(str, map(int, ids))) + "}"]
        return f"id IN {self._in(len(ids))}", list(ids)

    async def load_columns(self, conn: Connection) -> list[str]:
        res = await conn.execute(f"SELECT * FROM {self._t} WHERE 1 = 0")
        mandatory = {"id", "time_scheduled", "time_next", "epoch", "state", "time_acked",
                     "priority"}
        self.user_columns = [f for f in res.fields if f.lower() not in mandatory]
        return self.user_columns

    @property
    def _select(self) -> str:
        cols = ("id", "priority", "time_scheduled", "time_next", "epoch", "state",
                *self.user_columns)
        if self._select_of[0] != cols:  # quoting (sqlglot) costs more than the scan's rows
            self._select_of = (cols, ", ".join(self.quote(c) for c in cols))
        return self._select_of[1]

    def column_index(self, column: str) -> int:
        """Index of a user column among the user's columns (a scanned row's ``[VALUES:]``)."""
        lowered = [c.lower() for c in self.user_columns]
        return lowered.index(column.lower())

    # -- scans --------------------------------------------------------------------

    async def scan_new(
        self, conn: Connection, since: int, horizon: int, limit: int
    ) -> list[Row]:
        """Unfired events with ``since <= time_scheduled <= horizon``, in that order, at
        most ``limit``: rows laid out as :data:`ID` ... :data:`VALUES` say.

        One statement text whatever the arguments (the LIMIT is a parameter), so the
        driver keeps it prepared."""
        ph = self.ph
        res = await conn.execute(
            f"SELECT {self._select} FROM {self._t} WHERE state = {_lit(TO_BE_FIRED)}"
            f" AND time_scheduled >= {ph} AND time_scheduled <= {ph}"
            f" ORDER BY time_scheduled LIMIT {ph}",
            [since, horizon, int(limit)],
        )
        return res.rows

    async def scan_fired(self, conn: Connection, horizon: int, limit: int) -> list[Row]:
        """Fired, unacked events whose retry time is at most ``horizon`` (as :meth:`scan_new`)."""
        ph = self.ph
        res = await conn.execute(
            f"SELECT {self._select} FROM {self._t} WHERE state = {_lit(FIRED)}"
            f" AND time_next <= {ph} ORDER BY time_next LIMIT {ph}",
            [horizon, int(limit)],
        )
        return res.rows

    async def clock_offset(self, conn: Connection, samples: int = 3) -> int:
        """A lower bound of (database clock - this process's clock) in ns.

        The database's reading of the clock that stamps ``time_scheduled`` happened
        before the local reading taken after the answer, so ``db - after`` never
        exceeds the true offset; the tightest of ``samples`` readings is kept (a
        busy event loop reads its clock late). SQLite runs in this process, on
        this clock: 0."""
        if self._d.embedded:
            return 0
        sql = f"SELECT {self._d.now_ns_sql}"
        best: int | None = None
        for _ in range(samples):
            res = await conn.execute(sql)
            bound = int(res.rows[0][0]) - now_ns()
            best = bound if best is None else max(best, bound)
        assert best is not None
        return best

    async def fired_keys(self, conn: Connection, column: str) -> list[tuple[Any, int]]:
        """(ordering key, id) of every fired, unacked event (they block their keys)."""
        res = await conn.execute(
            f"SELECT {self.quote(column)}, id FROM {self._t} WHERE state = {_lit(FIRED)}"
            " ORDER BY time_scheduled",
        )
        return [(r[0], int(r[1])) for r in res.rows]

    # -- writes (run on the lease connection) ----------------------------------------

    async def fire(self, conn: Connection, ids: Sequence[int], time_next: int) -> set[int]:
        """Mark ``ids`` fired (epoch + 1, next retry ``time_next``); return those changed."""
        if not ids:
            return set()
        ph = self.ph
        id_sql, id_args = self._ids(ids)
        where = f"{id_sql} AND {_LIVE}"
        sets = f"state = {ph}, epoch = epoch + 1, time_next = {ph}"
        if not self._d.update_returning:
            await conn.begin()
            try:
                res = await conn.execute(
                    f"SELECT id FROM {self._t} WHERE {where} FOR UPDATE",
                    id_args,
                )
                found = [int(r[0]) for r in res.rows]
                if found:
                    await conn.execute(
                        f"UPDATE {self._t} SET {sets} WHERE id IN {self._in(len(found))}",
                        [FIRED, time_next, *found],
                    )
                await conn.commit()
            except BaseException:
                if conn.in_transaction:
                    await conn.rollback()
                raise
            return set(found)
        res = await conn.execute(
            f"UPDATE {self._t} SET {sets} WHERE {where} RETURNING id",
            [FIRED, time_next, *id_args],
        )
        return {int(r[0]) for r in res.rows}

    async def release_fired(self, conn: Connection, now: int) -> int:
        """Make every fired, unacked event whose retry time is after ``now`` due at
        ``now`` (a new lease holder's takeover: the receivers they were handed to
        were subscribed to the previous holder and are gone); how many."""
        ph = self.ph
        res = await conn.execute(
            f"UPDATE {self._t} SET time_next = {ph} WHERE state = {_lit(FIRED)}"
            f" AND time_next > {ph}",
            [now, now],
        )
        return res.rows_affected

    async def fail(self, conn: Connection, ids: Sequence[int]) -> int:
        """Mark ``ids`` failed (they ran out of attempts)."""
        if not ids:
            return 0
        ph = self.ph
        id_sql, id_args = self._ids(ids)
        res = await conn.execute(
            f"UPDATE {self._t} SET state = {ph} WHERE {id_sql} AND {_LIVE}",
            [FAILED, *id_args],
        )
        return res.rows_affected

    async def ack(self, conn: Connection, ids: Sequence[int], now: int | None = None) -> int:
        """Mark ``ids`` acked; ``time_next`` takes the ack time (the purge's index)."""
        if not ids:
            return 0
        t = now_ns() if now is None else now
        ph = self.ph
        id_sql, id_args = self._ids(ids)
        res = await conn.execute(
            f"UPDATE {self._t} SET state = {ph}, time_acked = {ph}, time_next = {ph}"
            f" WHERE {id_sql} AND state <> {_lit(ACKED)}",
            [ACKED, t, t, *id_args],
        )
        return res.rows_affected

    async def purge(self, conn: Connection, acked_before: int, limit: int = PURGE_BATCH) -> int:
        """Delete at most ``limit`` events acked before ``acked_before``."""
        ph = self.ph
        if self._d.delete_limit:
            sql = (f"DELETE FROM {self._t} WHERE state = {_lit(ACKED)} AND time_next < {ph}"
                   f" LIMIT {int(limit)}")
        else:
            sql = (f"DELETE FROM {self._t} WHERE id IN (SELECT id FROM {self._t} WHERE"
                   f" state = {_lit(ACKED)} AND time_next < {ph} LIMIT {int(limit)})")
        res = await conn.execute(sql, [acked_before])
        return res.rows_affected

    async def requeue_failed(self, conn: Connection) -> int:
        ph = self.ph
        t = now_ns()
        res = await conn.execute(
            f"UPDATE {self._t} SET state = {ph}, epoch = 0, time_next = 0, time_scheduled = {ph}"
            f" WHERE state = {ph}",
            [TO_BE_FIRED, t, FAILED],
        )
        return res.rows_affected

    async def retry_failed(self, conn: Connection, ids: Sequence[int]) -> int:
        """Failed events ``ids`` become due now, with a fresh attempt count."""
        if not ids:
            return 0
        cond, params = self._ids(ids)
        ph = self.ph
        res = await conn.execute(
            f"UPDATE {self._t} SET state = {ph}, epoch = 0, time_next = 0, time_scheduled = {ph}"
            f" WHERE state = {ph} AND {cond}",
            [TO_BE_FIRED, now_ns(), FAILED, *params],
        )
        return res.rows_affected

    async def delete_state(self, conn: Connection, state: str) -> int:
        """Delete every event in ``state`` (an operator's purge)."""
        res = await conn.execute(f"DELETE FROM {self._t} WHERE state = {self.ph}", [state])
        return res.rows_affected

    # -- groups ----------------------------------------------------------------------

    async def group_open(self, conn: Connection, column: str, key: Any, exclude: int) -> int:
        """Events of group ``key`` not yet acked (the follow-up ``exclude`` aside)."""
        ph = self.ph
        res = await conn.execute(
            f"SELECT count(*) FROM {self._t} WHERE {self.quote(column)} = {ph}"
            f" AND state <> {ph} AND id <> {ph}",
            [key, ACKED, exclude],
        )
        return int(res.rows[0][0])

    async def insert_followup(
        self, conn: Connection, column: str, key: Any, event_id: int, copy_from: int
    ) -> int:
        """Enqueue the follow-up of group ``key`` once (its id is derived from the key).

        It copies the user columns of one event of the group (``copy_from``).
        """
        cols = [c for c in self.user_columns]
        quoted = ", ".join(self.quote(c) for c in cols)
        ph = self.ph
        head, tail = self._d.insert_ignore()
        res = await conn.execute(
            f"{head} {self._t} (id, priority, {quoted}) SELECT {ph}, 0, {quoted}"
            f" FROM {self._t} WHERE id = {ph}{tail}",
            [event_id, copy_from],
        )
        return res.rows_affected

    # -- operations -------------------------------------------------------------------

    async def stats(self, conn: Connection, now: int | None = None) -> dict[str, Any]:
        """Depth per state and lag (seconds since the oldest due, unfired event was due)."""
        t = now_ns() if now is None else now
        ph = self.ph
        res = await conn.execute(f"SELECT state, count(*) FROM {self._t} GROUP BY state")
        depth = dict.fromkeys(STATES, 0)
        for state, count in res.rows:
            depth[str(state)] = int(count)
        res = await conn.execute(
            f"SELECT min(time_scheduled) FROM {self._t} WHERE state = {_lit(TO_BE_FIRED)}"
            f" AND time_scheduled <= {ph}",
            [t],
        )
        oldest_new = res.rows[0][0] if res.rows else None
        res = await conn.execute(
            f"SELECT min(time_next) FROM {self._t} WHERE state = {_lit(FIRED)}"
            f" AND time_next <= {ph}",
            [t],
        )
        oldest_retry = res.rows[0][0] if res.rows else None
        due = [int(v) for v in (oldest_new, oldest_retry) if v is not None]
        lag = max(0.0, (t - min(due)) / 1e9) if due else 0.0
        return {"depth": depth, "lag_seconds": lag}

    async def tail(self, conn: Connection, limit: int) -> tuple[list[str], list[Row]]:
        cols = [*EVENT_COLUMNS, "state", *self.user_columns]
        res = await conn.execute(
            f"SELECT {', '.join(self.quote(c) for c in cols)} FROM {self._t}"
            f" ORDER BY time_scheduled DESC LIMIT {int(limit)}"
        )
        return cols, res.rows

    async def ack_via(self, backend: Any, ids: Sequence[int]) -> int:
        """Ack on a pooled connection (a tablet without the lease)."""
        conn = await backend.acquire()
        try:
            return await self.ack(conn, ids)
        finally:
            await backend.release(conn)
