"""Every SQL statement of the segmented job store, and the producers' group commit.

:class:`SegmentedStore` is the SQL of one segmented queue on one shard (the
tables are described in :mod:`shardgate.queues.segmented.ddl`);
:class:`ShardProducer` coalesces concurrent producers into few writes.

Invariants kept here:

1. **Job ids increase per shard in commit order.** A producer's write takes
   the row lock of the ``open`` catalog row (``SELECT ... FOR UPDATE``;
   SQLite's ``BEGIN IMMEDIATE`` locks the whole database; on PostgreSQL
   usually one ``WITH c AS (UPDATE catalog ... RETURNING) INSERT ...``
   statement), gives its jobs the ids ``next_id ..`` and advances ``next_id``
   in the same transaction. So
   writes to a shard's queue commit one after the other, in id order, and a
   reader that has seen job ``i`` committed has seen every job ``< i`` of the
   shard: a consumer can read by ``job_id > last`` without missing a late
   commit.
2. **Jobs and status rows are never updated or deleted**; tables are dropped
   whole. The only rows updated in place are the catalog's (one per dataset).
3. **A dataset is closed in the transaction that opens the next one**, and
   once closed it is never written again (only the ``open`` dataset is).
   Rolling over needs a ``ready`` dataset created ahead of time, because DDL
   commits implicitly on MariaDB: the write that finds none creates one
   outside its transaction and starts again.
4. **A producer learns "stored" only after COMMIT** of the write holding its
   jobs (:meth:`ShardProducer.store`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardgate.backends import Backend, Connection
from shardgate.backends.base import transaction
from shardgate.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ShardgateError,
)
from shardgate.queues.segmented.ddl import (
    CLOSED,
    DATASET_STEP,
    DROPPING,
    MERGING,
    OPEN,
    READY,
    SegmentedNames,
    catalog_ddl,
    dataset_ddl,
    drop_dataset_ddl,
    status_seq,
    view_ddl,
)
from shardgate.result import Result
from shardgate.sql.dialects import Dialect

#: Jobs per producer write (group commit), as RudderStack's jobsdb batches them.
DEFAULT_WRITE_BATCH = 128
#: Ids per ``IN (...)`` list on MariaDB and SQLite (PostgreSQL sends one array).
IN_CHUNK = 500
#: Bytes counted per job besides its key and payload (ids, timestamps, row header).
ROW_OVERHEAD_BYTES = 32

#: ``execute(sql, params)`` inside a transaction someone else opened and ends.
Execute = Callable[[str, Sequence[Any]], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class Dataset:
    """One catalog row."""

    n: int
    state: str
    first_id: int
    next_id: int
    job_rows: int
    job_bytes: int
    created: int
    closed: int | None


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job as read back, with its latest status (``None`` without status rows)."""

    job_id: int
    key: str
    payload: str | None
    created: int
    attempt: int
    state: str | None


def pg_array(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal of ints or strings (``None`` is NULL), for a ``%s::T[]``
    parameter: built with str methods, several times faster than the driver's
    per-element array dumper on the hot path."""
    if values and isinstance(values[0], int):
        return "{" + ",".join(map(str, values)) + "}"
    return "{" + ",".join(
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values) + "}"


def job_bytes(key: str, payload: str | None) -> int:
    """What a job counts towards ``dataset_max_bytes``."""
    return len(key) + (len(payload) if payload else 0) + ROW_OVERHEAD_BYTES


class SegmentedStore:
    """The SQL of one segmented queue on one shard (one dialect).

    Every method takes the connection to run on; none opens a transaction
    unless it says so.
    """

    def __init__(self, queue: str, dialect: Dialect, placeholder: str, *,
                 max_rows: int, max_bytes: int, marker: str | None = None) -> None:
        self.names = SegmentedNames(queue, dialect)
        #: the comment marker put on the catalog (see :func:`catalog_ddl`), if any
        self.marker = marker
        self.dialect = dialect
        #: the dialect's object (its SQL forms and capabilities)
        self.sql = self.names.sql
        self.ph = placeholder
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._lock_clause = self.sql.row_lock
        #: the dataset last seen open (PostgreSQL's one-statement write tries it first)
        self._open_hint: int | None = None

    @classmethod
    def for_backend(cls, queue: str, backend: Backend, *, max_rows: int,
                    max_bytes: int, marker: str | None = None) -> SegmentedStore:
        return cls(queue, backend.dialect, backend.placeholder, max_rows=max_rows,
                   max_bytes=max_bytes, marker=marker)

    # -- helpers ----------------------------------------------------------------------

    def _in(self, column: str, ids: Sequence[int]) -> list[tuple[str, list[Any]]]:
        """``column IN (...)`` predicates with their parameters, in chunks."""
        if self.sql.array_params:  # a hash semi-join, not a linear ANY() per row
            return [(f"{column} IN (SELECT unnest({self.ph}::bigint[]))", [pg_array(list(ids))])]
        out = []
        for i in range(0, len(ids), IN_CHUNK):
            chunk = list(ids[i:i + IN_CHUNK])
            out.append((f"{column} IN ({', '.join([self.ph] * len(chunk))})", chunk))
        return out

    async def _tx(self, conn: Connection, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        async with transaction(conn):
            for sql, params in statements:
                await conn.execute(sql, params)

    # -- catalog ----------------------------------------------------------------------

    async def ensure(self, conn: Connection) -> list[Dataset]:
        """Create the catalog, a first open dataset and the view if missing (idempotent)."""
        for stmt in catalog_ddl(self.names, self.marker):
            await conn.execute(stmt)
        live = await self.datasets(conn)
        if not live:
            n = DATASET_STEP
            for stmt in dataset_ddl(self.names, n):
                await conn.execute(stmt)
            with contextlib.suppress(AlreadyExists):  # another process was first
                await conn.execute(
                    f"INSERT INTO {self.names.catalog} (n, state, first_id, next_id, job_rows, "
                    f"job_bytes, created) VALUES ({self.ph}, {self.ph}, 1, 1, 0, 0, {self.ph})",
                    [n, OPEN, time.time_ns()])
            live = await self.datasets(conn)
            await self.rebuild_view(conn, [d.n for d in live if d.state != MERGING])
        return live

    async def ensure_via(
        self, execute: Callable[[str, Sequence[Any]], Awaitable[Result]]
    ) -> None:
        """:meth:`ensure` through any autocommit ``execute(sql, params)`` (the gate's
        tablet clients, in-process or gRPC): the catalog, a first open dataset and the
        view if missing (idempotent; creating the view is not atomic here, which is fine
        before the queue serves anyone)."""
        for stmt in catalog_ddl(self.names, self.marker):
            await execute(stmt, [])
        res = await execute(f"SELECT COUNT(*) FROM {self.names.catalog}", [])
        if int(res.rows[0][0]):
            return
        n = DATASET_STEP
        for stmt in dataset_ddl(self.names, n):
            await execute(stmt, [])
        with contextlib.suppress(AlreadyExists):  # another gate was first
            await execute(
                f"INSERT INTO {self.names.catalog} (n, state, first_id, next_id, job_rows, "
                f"job_bytes, created) VALUES ({self.ph}, {self.ph}, 1, 1, 0, 0, {self.ph})",
                [n, OPEN, time.time_ns()])
        for stmt in view_ddl(self.names, [n]):
            await execute(stmt, [])

    async def datasets(self, conn: Connection) -> list[Dataset]:
        """Every catalog row, in dataset order."""
        res = await conn.execute(
            f"SELECT n, state, first_id, next_id, job_rows, job_bytes, created, closed "
            f"FROM {self.names.catalog} ORDER BY n")
        return [Dataset(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]),
                        int(r[6]), None if r[7] is None else int(r[7])) for r in res.rows]

    async def add_spare(self, conn: Connection) -> int | None:
        """Create a ``ready`` dataset after every existing one; None if one already exists."""
        live = await self.datasets(conn)
        if any(d.state == READY for d in live):
            return None
        top = max((d.n for d in live), default=0)
        n = (top // DATASET_STEP + 1) * DATASET_STEP
        for stmt in dataset_ddl(self.names, n):
            await conn.execute(stmt)
        try:
            await conn.execute(
                f"INSERT INTO {self.names.catalog} (n, state, first_id, next_id, job_rows, "
                f"job_bytes, created) VALUES ({self.ph}, {self.ph}, 0, 0, 0, 0, {self.ph})",
                [n, READY, time.time_ns()])
        except AlreadyExists:
            return None
        return n

    async def rebuild_view(self, conn: Connection, datasets: Sequence[int]) -> None:
        """Re-create the ``<queue>_job_state`` view over ``datasets`` (atomically where the
        dialect allows)."""
        stmts = view_ddl(self.names, datasets)
        if len(stmts) == 1:
            await conn.execute(stmts[0])
        else:
            await self._tx(conn, [(s, ()) for s in stmts])

    # -- producers --------------------------------------------------------------------

    async def append_jobs(self, conn: Connection,
                          jobs: Sequence[tuple[str, str | None]]) -> tuple[list[int], bool]:
        """Write ``(key, payload)`` jobs in one transaction; return their ids (in order) and
        whether the write rolled over to a new dataset (see the module invariants)."""
        if not jobs:
            return [], False
        ph = self.ph
        size = sum(job_bytes(k, p) for k, p in jobs)
        count = len(jobs)
        if self.sql.array_params and self._open_hint is not None:
            ids = await self._append_fast(conn, self._open_hint, jobs, size)
            if ids:
                return ids, False
        for _ in range(5):
            await conn.begin()
            try:
                res = await conn.execute(
                    f"SELECT n, next_id, job_rows, job_bytes FROM {self.names.catalog} "
                    f"WHERE state = {ph}{self._lock_clause}", [OPEN])
                if not res.rows:
                    raise Internal(
                        f"segmented queue {self.names.queue}: no open dataset in the catalog; "
                        "run ensure() (SegmentedQueue.open does)")
                n, next_id, rows, nbytes = (int(v) for v in res.rows[0])
                rolled = False
                if rows > 0 and (rows + count > self.max_rows or nbytes + size > self.max_bytes):
                    spare = await conn.execute(
                        f"SELECT n FROM {self.names.catalog} WHERE state = {ph} "
                        f"ORDER BY n LIMIT 1{self._lock_clause}", [READY])
                    if not spare.rows:
                        await conn.rollback()
                        await self.add_spare(conn)
                        continue
                    now = time.time_ns()
                    await conn.execute(
                        f"UPDATE {self.names.catalog} SET state = {ph}, closed = {ph} "
                        f"WHERE n = {ph}", [CLOSED, now, n])
                    n = int(spare.rows[0][0])
                    await conn.execute(
                        f"UPDATE {self.names.catalog} SET state = {ph}, first_id = {ph}, "
                        f"next_id = {ph}, created = {ph} WHERE n = {ph}",
                        [OPEN, next_id, next_id, now, n])
                    rolled = True
                ids = list(range(next_id, next_id + count))
                await self._insert_jobs(conn, n, ids, jobs)
                await conn.execute(
                    f"UPDATE {self.names.catalog} SET next_id = {ph}, job_rows = job_rows + {ph}, "
                    f"job_bytes = job_bytes + {ph} WHERE n = {ph}",
                    [next_id + count, count, size, n])
                await conn.commit()
                self._open_hint = n
                return ids, rolled
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(ShardgateError):
                        await conn.rollback()
                raise
        raise Internal(f"segmented queue {self.names.queue}: could not create a spare dataset")

    async def append_in_transaction(
        self, execute: Execute, jobs: Sequence[tuple[str, str | None]]
    ) -> list[int]:
        """Write ``(key, payload)`` jobs inside a transaction the caller owns (a gate
        session's shard transaction, or a tablet transaction); return their ids.

        The same invariants as :meth:`append_jobs`: the first statement updates
        the ``open`` catalog row (taking its row lock, or SQLite's write lock,
        until the caller's transaction ends), so ids still increase in commit
        order; a caller holding the transaction open holds back the shard's
        other producers meanwhile. A roll-over needs a ``ready`` dataset (DDL
        cannot run inside the caller's transaction): without one it fails with
        ``FAILED_PRECONDITION`` before writing anything (the producers and the
        consumer create one ahead, so retrying soon succeeds).
        """
        if not jobs:
            return []
        ph, cat = self.ph, self.names.catalog
        count = len(jobs)
        size = sum(job_bytes(k, p) for k, p in jobs)
        res = await execute(
            f"UPDATE {cat} SET next_id = next_id + {ph}, job_rows = job_rows + {ph}, "
            f"job_bytes = job_bytes + {ph} WHERE state = {ph} AND (job_rows = 0 OR "
            f"(job_rows + {ph} <= {ph} AND job_bytes + {ph} <= {ph}))",
            [count, count, size, OPEN, count, self.max_rows, size, self.max_bytes])
        if res.rows_affected:
            got = await execute(f"SELECT n, next_id FROM {cat} WHERE state = {ph}", [OPEN])
            n, first = int(got.rows[0][0]), int(got.rows[0][1]) - count
        else:
            n, first = await self._roll_over_in_transaction(execute, count, size)
        ids = list(range(first, first + count))
        now = time.time_ns()
        table = self.names.jobs(n)
        if self.sql.array_params:
            await execute(
                f"INSERT INTO {table} (job_id, job_key, payload, created) SELECT * FROM "
                "unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[])",
                [pg_array(ids), pg_array([k for k, _ in jobs]), pg_array([p for _, p in jobs]),
                 pg_array([now] * count)])
            return ids
        for at in range(0, count, IN_CHUNK):
            chunk = list(zip(ids[at:at + IN_CHUNK], jobs[at:at + IN_CHUNK], strict=True))
            values = ", ".join([f"({ph}, {ph}, {ph}, {ph})"] * len(chunk))
            await execute(
                f"INSERT INTO {table} (job_id, job_key, payload, created) VALUES {values}",
                [v for i, (k, p) in chunk for v in (i, k, p, now)])
        return ids

    async def _roll_over_in_transaction(
        self, execute: Execute, count: int, size: int
    ) -> tuple[int, int]:
        """Close the open dataset and open the first ``ready`` one with ``count`` jobs of
        ``size`` bytes, in the caller's transaction; its number and first job id."""
        ph, cat = self.ph, self.names.catalog
        spare = await execute(
            f"SELECT n FROM {cat} WHERE state = {ph} ORDER BY n LIMIT 1", [READY])
        if not spare.rows:
            raise FailedPrecondition(
                f"segmented queue {self.names.queue}: its open dataset is full and no spare "
                "dataset is ready (tables are not created inside a transaction); retry in a "
                "moment or enqueue outside the transaction")
        cur = await execute(
            f"SELECT n, next_id FROM {cat} WHERE state = {ph}{self._lock_clause}", [OPEN])
        if not cur.rows:
            raise Internal(f"segmented queue {self.names.queue}: no open dataset in the "
                           "catalog; run ensure() (SegmentedQueue.open does)")
        old, first = int(cur.rows[0][0]), int(cur.rows[0][1])
        n, now = int(spare.rows[0][0]), time.time_ns()
        await execute(f"UPDATE {cat} SET state = {ph}, closed = {ph} WHERE n = {ph}",
                      [CLOSED, now, old])
        opened = await execute(
            f"UPDATE {cat} SET state = {ph}, first_id = {ph}, next_id = {ph}, job_rows = {ph}, "
            f"job_bytes = {ph}, created = {ph} WHERE n = {ph} AND state = {ph}",
            [OPEN, first, first + count, count, size, now, n, READY])
        if not opened.rows_affected:
            raise Aborted(f"segmented queue {self.names.queue}: another producer took the "
                          "spare dataset meanwhile; retry the transaction")
        return n, first

    async def _append_fast(self, conn: Connection, n: int,
                           jobs: Sequence[tuple[str, str | None]], size: int) -> list[int]:
        """PostgreSQL: the whole write as one autocommit statement when dataset ``n`` is
        still open and has room: the UPDATE of its catalog row takes the row lock (held
        until the commit, as invariant 1 needs) and hands the ids to the INSERT. Returns
        no ids (and writes nothing) otherwise."""
        count = len(jobs)
        res = await conn.execute(
            f"WITH c AS (UPDATE {self.names.catalog} SET next_id = next_id + %s, "
            "job_rows = job_rows + %s, job_bytes = job_bytes + %s "
            "WHERE n = %s AND state = 'open' AND (job_rows = 0 OR "
            "(job_rows + %s <= %s AND job_bytes + %s <= %s)) RETURNING next_id - %s AS first) "
            f"INSERT INTO {self.names.jobs(n)} (job_id, job_key, payload, created) "
            "SELECT c.first + u.ord - 1, u.k, u.p, %s FROM c, "
            "unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(k, p, ord) RETURNING job_id",
            [count, count, size, n, count, self.max_rows, size, self.max_bytes, count,
             time.time_ns(), pg_array([k for k, _ in jobs]), pg_array([p for _, p in jobs])])
        if not res.rows:
            self._open_hint = None
            return []
        first = min(int(r[0]) for r in res.rows)
        return list(range(first, first + count))

    async def _insert_jobs(self, conn: Connection, n: int, ids: Sequence[int],
                           jobs: Sequence[tuple[str, str | None]]) -> None:
        now = time.time_ns()
        table = self.names.jobs(n)
        if self.sql.array_params:
            await conn.execute(
                f"INSERT INTO {table} (job_id, job_key, payload, created) SELECT * FROM "
                "unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[])",
                [pg_array(ids), pg_array([k for k, _ in jobs]), pg_array([p for _, p in jobs]),
                 pg_array([now] * len(ids))])
        else:
            ph = self.ph
            await conn.executemany(
                f"INSERT INTO {table} (job_id, job_key, payload, created) "
                f"VALUES ({ph}, {ph}, {ph}, {ph})",
                [(i, k, p, now) for i, (k, p) in zip(ids, jobs, strict=True)])

    # -- consumers --------------------------------------------------------------------

    async def read_jobs(self, conn: Connection, n: int, after_id: int,
                        limit: int) -> list[StoredJob]:
        """Jobs of dataset ``n`` with ``job_id > after_id`` in id order, as fresh jobs
        (attempt 0, no state: see :meth:`latest_states` for what the status rows say)."""
        res = await conn.execute(
            f"SELECT job_id, job_key, payload, created FROM {self.names.jobs(n)} "
            f"WHERE job_id > {self.ph} ORDER BY job_id LIMIT {int(limit)}", [after_id])
        return [StoredJob(r[0], r[1], r[2], r[3], 0, None) for r in res.rows]

    async def latest_states(self, conn: Connection, n: int,
                            job_id: int | None = None) -> dict[int, tuple[int, str]]:
        """``{job_id: (attempt, state)}``: the latest status row of every job of dataset
        ``n`` that has one (or of ``job_id`` only). One scan of the status table."""
        s = self.names.status(n)
        where = f" WHERE job_id = {self.ph}" if job_id is not None else ""
        params = [job_id, job_id] if job_id is not None else []
        res = await conn.execute(
            f"SELECT x.job_id, x.attempt, x.state FROM {s} x JOIN (SELECT job_id, MAX(seq) AS seq "
            f"FROM {s}{where} GROUP BY job_id) m ON m.job_id = x.job_id AND m.seq = x.seq"
            + (f" WHERE x.job_id = {self.ph}" if job_id is not None else ""), params)
        return {int(r[0]): (int(r[1]), str(r[2])) for r in res.rows}

    async def append_status(self, conn: Connection, n: int,
                            rows: Sequence[tuple[int, int, str, str | None, int]]) -> None:
        """Append ``(job_id, attempt, state, reason, at)`` rows to dataset ``n``, in order,
        in one statement."""
        if not rows:
            return
        table = self.names.status(n)
        cols = "(job_id, attempt, seq, state, reason, at)"
        if self.sql.array_params:
            first = rows[0]
            if all(r[2] == first[2] and r[3] == first[3] and r[4] == first[4] for r in rows):
                # the usual batch: one state, reason and time; only ids and attempts vary
                await conn.execute(
                    f"INSERT INTO {table} {cols} SELECT u.j, u.a, u.a * 8 + %s, %s, %s, %s "
                    "FROM unnest(%s::bigint[], %s::int[]) AS u(j, a)",
                    [status_seq(0, first[2]), first[2], first[3], first[4],
                     pg_array([r[0] for r in rows]), pg_array([r[1] for r in rows])])
                return
            await conn.execute(
                f"INSERT INTO {table} {cols} SELECT * FROM unnest(%s::bigint[], %s::int[], "
                "%s::int[], %s::text[], %s::text[], %s::bigint[])",
                [pg_array([r[0] for r in rows]), pg_array([r[1] for r in rows]),
                 pg_array([status_seq(r[1], r[2]) for r in rows]),
                 pg_array([r[2] for r in rows]), pg_array([r[3] for r in rows]),
                 pg_array([r[4] for r in rows])])
        else:
            ph = self.ph
            await conn.executemany(
                f"INSERT INTO {table} {cols} VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph})",
                [(r[0], r[1], status_seq(r[1], r[2]), r[2], r[3], r[4]) for r in rows])

    async def find_job(self, conn: Connection, job_id: int) -> tuple[Dataset, StoredJob] | None:
        """The live dataset holding ``job_id`` and the job, or None."""
        for d in reversed(await self.datasets(conn)):
            if d.state in (READY, DROPPING, MERGING) or not d.first_id <= job_id < d.next_id:
                continue
            found = await self.read_jobs(conn, d.n, job_id - 1, 1)
            if found and found[0].job_id == job_id:
                attempt, state = (await self.latest_states(conn, d.n, job_id)).get(
                    job_id, (0, None))
                j = found[0]
                return d, StoredJob(j.job_id, j.key, j.payload, j.created, attempt, state)
        return None

    async def add_action(self, conn: Connection, job_id: int, action: str,
                         reason: str | None) -> None:
        """Record an operator's ``retry`` / ``abort`` of ``job_id`` for the consumer."""
        if action not in ("retry", "abort"):
            raise InvalidArgument(f"unknown action {action!r}: use retry or abort")
        ph = self.ph
        await conn.execute(
            f"INSERT INTO {self.names.actions} (job_id, action, reason, at) "
            f"VALUES ({ph}, {ph}, {ph}, {ph})", [job_id, action, reason, time.time_ns()])

    async def actions_after(self, conn: Connection,
                            after: int) -> list[tuple[int, int, str, str | None]]:
        """``(id, job_id, action, reason)`` recorded after action ``after``, in order."""
        res = await conn.execute(
            f"SELECT id, job_id, action, reason FROM {self.names.actions} WHERE id > {self.ph} "
            "ORDER BY id LIMIT 1000", [after])
        return [(int(r[0]), int(r[1]), str(r[2]), None if r[3] is None else str(r[3]))
                for r in res.rows]

    # -- compaction -------------------------------------------------------------------

    async def drop_datasets(self, conn: Connection, drop: Sequence[int],
                            keep: Sequence[int]) -> None:
        """Drop datasets ``drop`` whole: mark them ``dropping``, rebuild the view over
        ``keep``, ``DROP TABLE`` both tables, delete the catalog rows. A crash midway
        leaves ``dropping`` rows that :meth:`recover` finishes."""
        if not drop:
            return
        for pred, params in self._in("n", drop):
            await conn.execute(f"UPDATE {self.names.catalog} SET state = {self.ph} WHERE {pred}",
                               [DROPPING, *params])
        await self.rebuild_view(conn, keep)
        for n in drop:
            for stmt in drop_dataset_ddl(self.names, n):
                await conn.execute(stmt)
        for pred, params in self._in("n", drop):
            await conn.execute(f"DELETE FROM {self.names.catalog} WHERE {pred}", params)

    async def merge(self, conn: Connection, sources: Sequence[Dataset],
                    job_ids: Sequence[int], keep: Sequence[int]) -> Dataset:
        """Copy jobs ``job_ids`` of ``sources`` (leading, closed datasets) and their status
        rows into one new dataset numbered ``sources[-1].n + 1``, then drop the sources.

        The copy and the catalog switch are one transaction: before it commits the
        new dataset is ``merging`` (dropped by :meth:`recover`), after it the sources
        are ``dropping``. ``keep`` are the datasets the view shows besides the new one.
        """
        target = sources[-1].n + 1
        if target % DATASET_STEP == 0:
            raise Internal(f"segmented queue {self.names.queue}: no free dataset number "
                           f"after {sources[-1].n}")
        ph = self.ph
        cat = self.names.catalog
        for stmt in drop_dataset_ddl(self.names, target) + dataset_ddl(self.names, target):
            await conn.execute(stmt)
        now = time.time_ns()
        await conn.execute(f"DELETE FROM {cat} WHERE n = {ph}", [target])
        await conn.execute(
            f"INSERT INTO {cat} (n, state, first_id, next_id, job_rows, job_bytes, created, "
            f"closed) VALUES ({ph}, {ph}, {ph}, {ph}, 0, 0, {ph}, {ph})",
            [target, MERGING, min(d.first_id for d in sources),
             max(d.next_id for d in sources), now, now])
        ids = sorted(job_ids)
        async with transaction(conn):
            for d in sources:
                lo, hi = d.first_id, d.next_id
                mine = [i for i in ids if lo <= i < hi]
                if not mine:
                    continue
                for pred, params in self._in("job_id", mine):
                    await conn.execute(
                        f"INSERT INTO {self.names.jobs(target)} (job_id, job_key, payload, "
                        f"created) SELECT job_id, job_key, payload, created FROM "
                        f"{self.names.jobs(d.n)} WHERE {pred} ORDER BY job_id", params)
                    await conn.execute(
                        f"INSERT INTO {self.names.status(target)} (job_id, attempt, seq, state, "
                        f"reason, at) SELECT job_id, attempt, seq, state, reason, at FROM "
                        f"{self.names.status(d.n)} WHERE {pred}", params)
            size = await conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(LENGTH(job_key) + COALESCE(LENGTH(payload), 0)),"
                f" 0) FROM {self.names.jobs(target)}")
            rows, nbytes = int(size.rows[0][0]), int(size.rows[0][1])
            await conn.execute(
                f"UPDATE {cat} SET state = {ph}, job_rows = {ph}, job_bytes = {ph} "
                f"WHERE n = {ph}", [CLOSED, rows, nbytes + rows * ROW_OVERHEAD_BYTES, target])
            for pred, params in self._in("n", [d.n for d in sources]):
                await conn.execute(f"UPDATE {cat} SET state = {ph} WHERE {pred}",
                                   [DROPPING, *params])
        views = sorted({*keep, target})
        await self.drop_datasets(conn, [d.n for d in sources], views)
        merged = [d for d in await self.datasets(conn) if d.n == target]
        return merged[0]

    async def recover(self, conn: Connection) -> list[Dataset]:
        """Finish what a crash interrupted: drop unfinished merge targets (``merging``) and
        the tables of ``dropping`` datasets; rebuild the view. Returns the live datasets."""
        live = await self.ensure(conn)
        stale = [d.n for d in live if d.state in (MERGING, DROPPING)]
        keep = [d.n for d in live if d.state not in (MERGING, DROPPING)]
        if stale:
            await self.drop_datasets(conn, stale, keep)
        else:
            await self.rebuild_view(conn, keep)
        return [d for d in live if d.n in keep]

    # -- inspection -------------------------------------------------------------------

    async def table_bytes(self, conn: Connection, datasets: Sequence[int]) -> dict[int, int]:
        """On-disk bytes of each dataset's two tables with their indexes (PostgreSQL:
        ``pg_total_relation_size``; MariaDB: ``information_schema``); SQLite reports the
        catalog's count of written bytes."""
        sizes_sql = self.sql.table_sizes_sql()
        if sizes_sql is None:
            by_n = {d.n: d.job_bytes for d in await self.datasets(conn)}
            return {n: by_n.get(n, 0) for n in datasets}
        res = await conn.execute(sizes_sql, [f"{self.names.queue}\\_%"])
        sizes = {str(r[0]).lower(): int(r[1] or 0) for r in res.rows}
        return {n: sizes.get(f"{self.names.queue}_jobs_{n}", 0)
                + sizes.get(f"{self.names.queue}_job_status_{n}", 0) for n in datasets}


class ShardProducer:
    """Group commit of one segmented queue on one shard.

    Callers of :meth:`store` that arrive while a write is running are written
    together by the next one (up to ``write_batch`` jobs per write; one
    caller's jobs are never split). Each caller's future resolves with its
    job ids only after the write holding them committed, or fails with the
    write's error (nothing of that write was stored). One write at a time per
    shard: they serialise on the catalog row lock anyway.
    """

    def __init__(self, store: SegmentedStore, backend: Backend, *,
                 write_batch: int = DEFAULT_WRITE_BATCH,
                 on_stored: Callable[[], None] | None = None) -> None:
        if write_batch < 1:
            raise InvalidArgument(f"write_batch must be >= 1, not {write_batch}")
        self.seg = store
        self.backend = backend
        self.write_batch = write_batch
        self.on_stored = on_stored
        self.writes = 0
        self.jobs = 0
        self._pending: list[tuple[Sequence[tuple[str, str | None]], asyncio.Future[list[int]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def store(self, jobs: Sequence[tuple[str, str | None]]) -> list[int]:
        """Store ``(key, payload)`` jobs; return their ids once committed."""
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append((jobs, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return await fut

    async def _run(self) -> None:
        while self._pending:
            take: list[tuple[Sequence[tuple[str, str | None]], asyncio.Future[list[int]]]] = []
            count = 0
            while self._pending and (not take or count + len(self._pending[0][0])
                                     <= self.write_batch):
                entry = self._pending.pop(0)
                take.append(entry)
                count += len(entry[0])
            rows = [job for jobs, _ in take for job in jobs]
            try:
                conn = await self.backend.acquire()
                try:
                    ids, rolled = await self.seg.append_jobs(conn, rows)
                    if rolled:
                        await self.seg.add_spare(conn)
                finally:
                    await self.backend.release(conn)
            except BaseException as exc:
                for _, fut in take:
                    if not fut.done():
                        fut.set_exception(exc if isinstance(exc, Exception)
                                          else Internal(f"producer write interrupted: {exc!r}"))
                if not isinstance(exc, Exception):
                    raise
                continue
            self.writes += 1
            self.jobs += len(ids)
            at = 0
            for jobs, fut in take:
                if not fut.done():
                    fut.set_result(ids[at:at + len(jobs)])
                at += len(jobs)
            if self.on_stored is not None:
                self.on_stored()
