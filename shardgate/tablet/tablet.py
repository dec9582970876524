"""The tablet: the process-side owner of one shard's database.

Invariants:

* every open transaction is one pooled :class:`~shardgate.backends.Connection`
  held in ``_transactions`` under an id that is never reused in this process;
* a transaction id is removed before its connection is released, whether the
  commit or rollback succeeds or fails, so a failed commit never leaves a
  half-open transaction that a later statement could write into;
* statements outside a transaction run on a pooled connection in autocommit
  mode and hold nothing afterwards.
* a prepared (two-phase) transaction is ended only by ``commit_prepared`` or
  ``rollback_prepared``, never by ``rollback`` or ``close``: it belongs to the
  coordinator's decision (:mod:`shardgate.gate.twopc`).
* open transactions hold at most ``max_transactions`` connections (the
  transaction cap, ``--transaction-cap``; by default ``pool_size - 1``, all of
  them with a pool of one): at least one connection always stays for autocommit
  statements, so point selects and two-phase commit's coordinator records
  (autocommit writes) never wait behind transactions that wait for them.
  Taking a transaction slot waits at most the pool timeout, then
  ``RESOURCE_EXHAUSTED`` naming the flag.
* with a per-user cap (``--transaction-cap-per-user``, Vitess's transaction
  limiter), one caller (the user the gate names in ``begin``) holds at most
  ``user_cap`` of those slots; its next ``begin`` fails at once with
  ``RESOURCE_EXHAUSTED`` instead of waiting, so one user's idle transactions
  never starve the others. ``_user_open`` counts each caller's open
  transactions (``_tx_user`` says whose each is); a count is taken before the
  first await of ``begin`` and given back by ``_take`` (or a failed begin).
* with ``idle_transaction_timeout_s``, a transaction (not prepared) on which
  no statement ran for that long is rolled back and its connection freed by a
  reaper task: a gate that died or was cut off leaves no "idle in
  transaction" session behind. A statement running on it keeps it alive.
* with ``result_limits``, ``execute`` reads results in chunks and refuses one
  past the limits with ``RESOURCE_EXHAUSTED`` before it is all in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from shardgate.aio import cancel_and_wait
from shardgate.backends import Backend, Connection, open_backend
from shardgate.backends._pool import DEFAULT_POOL_TIMEOUT_S, wait_for_slot
from shardgate.backends.changes.open import open_change_log
from shardgate.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    ShardgateError,
)
from shardgate.event_token import is_fresher
from shardgate.result import ExecuteOptions, Result, ResultLimits, Row, WireResult
from shardgate.sql.classify import WriteTarget, head_words
from shardgate.sql.dialects import Dialect
from shardgate.tablet import metrics
from shardgate.tablet.queue_service import QueueService, QueueWrite
from shardgate.tablet.stream import TabletStream

#: how long an ``include_event_token`` read waits for the log reader to catch up
EXACT_TOKEN_WAIT_S = 1.0
#: runs of an autocommit statement that meets lock conflicts (see Tablet._autocommit)
AUTOCOMMIT_ATTEMPTS = 4
#: the pause before its second run, doubled before each later one
AUTOCOMMIT_BACKOFF_S = 0.02
#: ``shardgate tablet``'s default: roll back transactions idle this long (a lost gate)
DEFAULT_IDLE_TRANSACTION_TIMEOUT_S = 60.0
#: transactions a tablet holds open at once by default (``--transaction-cap``; Vitess's
#: ``--queryserver-config-transaction-cap`` is 20 too)
DEFAULT_TRANSACTION_CAP = 20
#: connections a tablet keeps beside its transaction cap, for autocommit statements
QUERY_CONNECTIONS = 4
#: the flags named by the errors (the library's callers set the same keyword arguments)
CAP_FLAG = "--transaction-cap"
USER_CAP_FLAG = "--transaction-cap-per-user"

log = logging.getLogger(__name__)


class Tablet:
    """Serves one shard (``keyspace/shard``) from its database."""

    def __init__(
        self,
        keyspace: str,
        shard: str,
        backend: Backend,
        *,
        result_limits: ResultLimits | None = None,
        idle_transaction_timeout_s: float | None = None,
        transaction_cap: int | None = None,
        transaction_cap_per_user: float = 0.0,
    ) -> None:
        if idle_transaction_timeout_s is not None and not idle_transaction_timeout_s > 0:
            raise InvalidArgument(
                f"idle_transaction_timeout_s must be > 0, not {idle_transaction_timeout_s!r}")
        self.keyspace = keyspace
        self.shard = shard
        self.backend = backend
        self.result_limits = result_limits if result_limits and result_limits.active else None
        self.idle_transaction_timeout_s = idle_transaction_timeout_s
        pool_size = int(getattr(backend, "pool_size", 1))
        self._pool_timeout_s = float(getattr(backend, "pool_timeout_s", DEFAULT_POOL_TIMEOUT_S))
        #: transactions may hold all connections but one (see the module docstring)
        self.max_transactions = pool_size - 1 if pool_size > 1 else 1
        if transaction_cap is not None:
            if not isinstance(transaction_cap, int) or transaction_cap < 1:
                raise InvalidArgument(
                    f"{CAP_FLAG} must be a whole number >= 1, not {transaction_cap!r}")
            if transaction_cap > self.max_transactions:
                raise InvalidArgument(
                    f"{CAP_FLAG} {transaction_cap} needs a pool of at least "
                    f"{transaction_cap + 1} connections (one stays for autocommit "
                    f"statements); the backend has {pool_size}")
            self.max_transactions = transaction_cap
        #: open transactions one caller may hold (None: no per-user cap)
        self.user_cap = per_user_cap(transaction_cap_per_user, self.max_transactions)
        self._user_share = transaction_cap_per_user
        self._user_open: dict[str, int] = {}
        self._tx_user: dict[int, str] = {}
        self._tx_slots = asyncio.Semaphore(self.max_transactions)
        #: tid -> monotonic time its last statement ended (absent while one runs)
        self._idle_since: dict[int, float] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._transactions: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self._changes: TabletStream | None = None
        #: xid -> id of a prepared transaction whose session this tablet still holds
        self._prepared: dict[str, int] = {}
        #: the shard's queues (lease, managers, receivers)
        self.queues = QueueService(keyspace, shard, backend)
        #: queue tables each open transaction wrote, to wake their managers on commit
        self._tx_queues: dict[int, list[QueueWrite]] = {}
        metrics.COLLECTOR.tablets.add(self)

    @classmethod
    def open(
        cls,
        keyspace: str,
        shard: str,
        url: str,
        *,
        pool_size: int | None = None,
        pool_timeout_s: float | None = None,
        result_limits: ResultLimits | None = None,
        idle_transaction_timeout_s: float | None = None,
        transaction_cap: int | None = None,
        transaction_cap_per_user: float = 0.0,
    ) -> Tablet:
        """A tablet on a new backend. Without ``pool_size`` the pool holds
        ``transaction_cap`` (default :data:`DEFAULT_TRANSACTION_CAP`) connections for
        transactions and :data:`QUERY_CONNECTIONS` more for autocommit statements;
        with ``pool_size`` alone, transactions may take all of it but one."""
        if pool_size is None:
            cap = DEFAULT_TRANSACTION_CAP if transaction_cap is None else transaction_cap
            pool_size = max(cap, 1) + QUERY_CONNECTIONS
        backend = open_backend(url, pool_size=pool_size, pool_timeout_s=pool_timeout_s)
        return cls(keyspace, shard, backend, result_limits=result_limits,
                   idle_transaction_timeout_s=idle_transaction_timeout_s,
                   transaction_cap=transaction_cap,
                   transaction_cap_per_user=transaction_cap_per_user)

    @property
    def dialect(self) -> Dialect:
        return self.backend.dialect

    @property
    def placeholder(self) -> str:
        return self.backend.placeholder

    def _tx(self, transaction_id: int) -> Connection:
        try:
            return self._transactions[transaction_id]
        except KeyError:
            idle = self.idle_transaction_timeout_s
            raise FailedPrecondition(
                f"transaction {transaction_id} is not open on {self.keyspace}/{self.shard} "
                "(it was committed, rolled back or lost"
                + (f", or idled longer than {idle:g}s" if idle else "")
                + "): start a new one"
            ) from None

    async def execute(
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
        *,
        target: WriteTarget | None = None,
    ) -> Result:
        """Run ``sql`` (in ``transaction_id``'s transaction, else autocommit).

        ``target`` is what the statement writes as the gate classified it
        (:data:`~shardgate.sql.classify.WriteTarget`): a queue write is known
        without reading the SQL text; None: the tablet reads the statement's head.
        """
        start = time.perf_counter()
        try:
            result = await self._execute(sql, params, transaction_id, options, target)
        except ShardgateError as exc:
            self._failed(exc)
            raise
        self._executed(start)
        return result

    _execute_seconds: Any = None

    def _executed(self, start: float) -> None:
        """Count one ``Execute`` that began at ``start`` (``perf_counter``)."""
        timing = self._execute_seconds
        if timing is None:  # labelled once: labels() costs more than the observation
            timing = self._execute_seconds = metrics.QUERIES.labels(
                "Execute", self.keyspace, self.shard, self.dialect)
        timing.observe(time.perf_counter() - start)

    def _failed(self, exc: ShardgateError) -> None:
        metrics.ERRORS.labels("Execute", self.keyspace, self.shard, self.dialect,
                              exc.code.value).inc()

    async def execute_wire(self, sql: str, params: Sequence[Any]) -> WireResult:
        """An autocommit read's answer as MySQL protocol packets (a MariaDB/MySQL
        shard's, unparsed), for a MySQL client; only where the backend ``gives_wire``.
        Counted as an ``Execute``."""
        start = time.perf_counter()
        try:
            result = await self.backend.execute_wire(sql, params, self.result_limits)
        except ShardgateError as exc:
            self._failed(exc)
            raise
        self._executed(start)
        return result

    async def _autocommit(self, sql: str, params: Sequence[Any]) -> Result:
        """One autocommit statement, run again after a lock conflict (``ABORTED``: a
        deadlock, a lock or serialization timeout, SQLite's busy database): the
        statement was its own transaction and rolled back whole, so running it again
        is what its client would do; after ``AUTOCOMMIT_ATTEMPTS`` the error goes back."""
        pause = AUTOCOMMIT_BACKOFF_S
        for _ in range(AUTOCOMMIT_ATTEMPTS - 1):
            try:
                return await self.backend.execute(sql, params, self.result_limits)
            except Aborted:
                metrics.RETRIES.labels(self.keyspace, self.shard).inc()
                await asyncio.sleep(pause)
                pause *= 2
        return await self.backend.execute(sql, params, self.result_limits)

    async def _read_in_snapshot(
        self, sql: str, params: Sequence[Any], snapshot_sql: Sequence[str]
    ) -> tuple[Result, list[Row]]:
        """Run the read ``sql`` in the transaction ``snapshot_sql`` begins; returns its
        result and the rows of the last ``snapshot_sql`` statement (the snapshot)."""
        snap = Result()
        conn = await self.backend.acquire()
        try:
            try:
                for statement in snapshot_sql:
                    snap = await conn.execute(statement)
                result = await conn.execute(sql, params, self.result_limits)
            finally:
                with contextlib.suppress(ShardgateError):
                    await conn.execute("COMMIT")  # a read: nothing to keep or lose
        finally:
            await self.backend.release(conn)
        return result, list(snap.rows)

    async def _execute(
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
        target: WriteTarget | None = None,
    ) -> Result:
        if options is not None and (
            options.include_event_token or options.compare_event_token is not None
        ):
            # The last seen token, read just before the query: the data is at least as fresh.
            stream = await self.change_stream()
            token = stream.last_token
            exact_read = options.include_event_token and transaction_id is None
            snapshot: list[Row] | None = None
            if exact_read and stream.log.snapshot_sql and _is_read(sql):
                result, snapshot = await self._read_in_snapshot(
                    sql, params, stream.log.snapshot_sql)
            else:
                result = await self._execute(sql, params, transaction_id, None, target)
            if exact_read:
                # Returned only when exact: no change of this shard committed between the
                # token and the query (the reader has read past the log end as of after
                # the query and its last token did not move), and every change up to the
                # token is visible to the query (a log that decodes commits before they
                # are visible: checked against the query's snapshot). Equal tokens,
                # equal data.
                end = await self.backend.execute(stream.log.position_sql, [])
                position = str(end.rows[0][0] or "") if end.rows else ""
                exact = (
                    bool(position)
                    and (snapshot is not None or not stream.log.snapshot_sql)
                    and await stream.wait_for(position, EXACT_TOKEN_WAIT_S)
                    and stream.last_token == token
                    and (snapshot is None or stream.visibility.all_visible(snapshot))
                )
                result.event_token = token if exact else None
            if options.compare_event_token is not None:
                result.fresher = is_fresher(token, options.compare_event_token)
            return result
        touched = self.queues.touched(sql, target)
        if transaction_id is None:
            result = await self._autocommit(sql, params)
            if touched is not None:
                self.queues.committed([touched])
            return result
        conn = self._tx(transaction_id)
        self._idle_since.pop(transaction_id, None)  # busy: the reaper leaves it alone
        try:
            result = await conn.execute(sql, params, self.result_limits)
        finally:
            if transaction_id in self._transactions:
                self._idle_since[transaction_id] = time.monotonic()
        if touched is not None:
            self._tx_queues.setdefault(transaction_id, []).append(touched)
        return result

    async def change_stream(self) -> TabletStream:
        """This shard's change stream, its log reader started on first use."""
        if self._changes is None:
            self._changes = TabletStream(
                open_change_log(self.backend.url, f"{self.keyspace}/{self.shard}")
            )
        await self._changes.start()
        return self._changes

    async def stream_execute(
        self, sql: str, params: Sequence[Any], batch_size: int = 1000
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        conn = await self.backend.acquire()
        try:
            async for batch in conn.stream(sql, params, batch_size):
                yield batch
        finally:
            await self.backend.release(conn)

    async def begin(self, caller: str | None = None) -> int:
        """Open a transaction for ``caller`` (the user the gate serves; None: the
        gate's own work, not counted against any per-user cap); its id."""
        return await self._open_transaction(None, caller)

    def _count_user(self, caller: str | None) -> str | None:
        """Take one of ``caller``'s transaction slots (the per-user cap), or refuse."""
        cap = self.user_cap
        if caller is None or cap is None:
            return None
        held = self._user_open.get(caller, 0)
        if held >= cap:
            share = self._user_share
            what = f"{share:g} of {self.max_transactions}" if share < 1 else f"{cap}"
            raise ResourceExhausted(
                f"user {caller!r} already holds {held} open transactions on "
                f"{self.keyspace}/{self.shard}, its cap ({USER_CAP_FLAG} {what}: at most "
                f"{cap} of the tablet's {CAP_FLAG} {self.max_transactions}); commit or roll "
                "back one first, or raise the flag")
        self._user_open[caller] = held + 1
        return caller

    def _uncount_user(self, user: str | None) -> None:
        if user is None:
            return
        left = self._user_open.get(user, 0) - 1
        if left > 0:
            self._user_open[user] = left
        else:
            self._user_open.pop(user, None)

    async def _open_transaction(self, xid: str | None, caller: str | None = None) -> int:
        """A new transaction (``begin_twopc(xid)`` when ``xid``): a slot, a connection."""
        user = self._count_user(caller)
        try:
            await wait_for_slot(self._tx_slots, self._pool_timeout_s, lambda: (
                f"no connection for a new transaction on {self.keyspace}/{self.shard} after "
                f"{self._pool_timeout_s:g}s: {self.max_transactions} transactions are open, "
                f"the tablet's cap ({CAP_FLAG}; long or abandoned ones are rolled back "
                "after their timeout); retry later, or raise the flag"))
        except BaseException:
            self._uncount_user(user)
            raise
        try:
            conn = await self.backend.acquire()
        except BaseException:
            self._tx_slots.release()
            self._uncount_user(user)
            raise
        try:
            if xid is None:
                await conn.begin()
            else:
                await conn.begin_twopc(xid)
        except BaseException:
            self._tx_slots.release()
            self._uncount_user(user)
            await self.backend.release(conn)
            raise
        tid = next(self._ids)
        self._transactions[tid] = conn
        if user is not None:
            self._tx_user[tid] = user
        self._idle_since[tid] = time.monotonic()
        self._start_reaper()
        return tid

    def _take(self, transaction_id: int) -> Connection | None:
        """Forget an open transaction; its connection (to release), or None."""
        conn = self._transactions.pop(transaction_id, None)
        if conn is not None:
            self._idle_since.pop(transaction_id, None)
            self._tx_slots.release()
            self._uncount_user(self._tx_user.pop(transaction_id, None))
        return conn

    def _start_reaper(self) -> None:
        if self.idle_transaction_timeout_s is None:
            return
        loop = asyncio.get_running_loop()
        reaper = self._reaper
        if reaper is None or reaper.done() or reaper.get_loop() is not loop:
            self._reaper = loop.create_task(
                self._reap(self.idle_transaction_timeout_s),
                name=f"sg-tablet-reaper-{self.keyspace}/{self.shard}")

    async def _reap(self, timeout_s: float) -> None:
        """Roll back transactions idle longer than ``timeout_s`` until none is open."""
        period = min(max(timeout_s / 4, 0.05), 1.0)
        while self._transactions:
            await asyncio.sleep(period)
            prepared = set(self._prepared.values())
            for tid in list(self._idle_since):
                since = self._idle_since.get(tid)  # re-read: a statement may have started
                now = time.monotonic()
                if since is not None and tid not in prepared and now - since > timeout_s:
                    log.warning("rolling back transaction %d on %s/%s: idle for %.1fs "
                                "(its gate went away?)", tid, self.keyspace, self.shard,
                                now - since)
                    with contextlib.suppress(Exception):
                        await self.rollback(tid)

    async def commit(self, transaction_id: int) -> None:
        conn = self._take(transaction_id)
        if conn is None:
            self._tx(transaction_id)  # raises the clear error
            return
        touched = self._tx_queues.pop(transaction_id, None)
        try:
            await conn.commit()
        finally:
            await self.backend.release(conn)
        if touched:
            self.queues.committed(touched)

    async def rollback(self, transaction_id: int) -> None:
        conn = self._take(transaction_id)
        self._tx_queues.pop(transaction_id, None)
        if conn is None:
            return
        try:
            await conn.rollback()
        finally:
            await self.backend.release(conn)

    # -- two-phase commit (see shardgate.gate.twopc) ---------------------------------

    @property
    def supports_twopc(self) -> bool:
        return self.backend.supports_twopc

    async def begin_twopc(self, xid: str, caller: str | None = None) -> int:
        """Like :meth:`begin`, for a transaction that may be prepared as ``xid``."""
        return await self._open_transaction(xid, caller)

    async def prepare(self, transaction_id: int, xid: str) -> None:
        """Phase one. If it fails the transaction is rolled back and forgotten.

        A prepared transaction keeps its session (MariaDB lets only that session
        end it while it lives) until :meth:`commit_prepared` or
        :meth:`rollback_prepared`; it is never rolled back implicitly.
        """
        conn = self._tx(transaction_id)
        try:
            await conn.prepare(xid)
        except BaseException:
            self._take(transaction_id)
            await self.backend.release(conn)  # rolls back whatever is left
            raise
        self._prepared[xid] = transaction_id

    async def commit_prepared(self, xid: str) -> None:
        """Commit a prepared transaction: ours, or one a dead gate left behind."""
        await self._end_prepared(xid, commit=True)

    async def rollback_prepared(self, xid: str) -> None:
        """Roll back a prepared transaction: ours, or one a dead gate left behind."""
        await self._end_prepared(xid, commit=False)

    async def _end_prepared(self, xid: str, *, commit: bool) -> None:
        tid = self._prepared.pop(xid, None)
        held = self._take(tid) if tid is not None else None
        conn = held if held is not None else await self.backend.acquire()
        touched = self._tx_queues.pop(tid, None) if tid is not None else None
        try:
            if commit:
                await conn.commit_prepared(xid)
            else:
                await conn.rollback_prepared(xid)
        finally:
            await self.backend.release(conn)
        if commit and touched:
            self.queues.committed(touched)

    async def list_prepared(self, prefix: str) -> list[str]:
        """Xids starting with ``prefix`` prepared in this shard's database."""
        conn = await self.backend.acquire()
        try:
            return await conn.list_prepared(prefix)
        finally:
            await self.backend.release(conn)

    async def close(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.get_loop() is asyncio.get_running_loop():
            await cancel_and_wait([reaper])  # (one of a finished loop ended with it)
        await self.queues.close()
        changes, self._changes = self._changes, None
        if changes is not None:
            await changes.close()
        held = set(self._prepared.values())  # prepared: left to the commit decision
        for tid in list(self._transactions):
            if tid not in held:
                await self.rollback(tid)
        await self.backend.close()


def per_user_cap(share: float, cap: int) -> int | None:
    """Open transactions one user may hold: ``share`` of ``cap`` when below 1 (at least
    one), else ``share`` itself (a count, at most ``cap``); 0: no per-user cap (None)."""
    if isinstance(share, bool) or not isinstance(share, int | float) or share < 0:
        raise InvalidArgument(
            f"{USER_CAP_FLAG} must be a fraction of {CAP_FLAG} (0 < F < 1), a count "
            f"(a whole number >= 1) or 0 (no per-user cap), not {share!r}")
    if share == 0:
        return None
    if share < 1:
        return max(1, int(share * cap))
    if share != int(share):
        raise InvalidArgument(
            f"{USER_CAP_FLAG} {share:g}: a count must be a whole number (or a fraction "
            "below 1)")
    return min(int(share), cap)


def _is_read(sql: str) -> bool:
    """A plain ``SELECT`` (run in a snapshot for an exact event token)."""
    words = head_words(sql, 1)
    return bool(words) and words[0] == "select"
