"""Autocommit statements straight to a shard's primary database, without the tablet hop.

A gate with tablet processes (``shardgate gate --topo``) sends a statement to a
shard's lease holder over gRPC, and the tablet sends it to the database: two
hops, each paid in CPU by both processes (issue #31: ~750-950 us of gate CPU and
as much tablet CPU per point select, most of it the gRPC hop and the conversion
of the answer). The tablets of a shard share one database, so a read can be
sent there by the gate itself. :class:`DirectShard` is one shard's pool of
the gate's own connections to that database, used by
:class:`~shardgate.gate.fleet.ShardTablets` for **autocommit SELECTs** and
**autocommit INSERT/UPDATE/DELETE of plain tables** (a table of the VSchema that
is not a queue nor a sequence); transactions, queue tables, streams, queues and
change streams still go to the tablets (they hold the leases, queue managers
and transaction caps), and so does a statement asking for an event token.

What stays as through a tablet (invariants):

* **The database URL is the topo's.** The shard's URL comes from the keyspace
  record, as a tablet's does (credentials, if any, as the tablets take them:
  in the URL an operator stored, or the driver's own environment:
  ``PGPASSWORD``/``~/.pgpass``); a changed URL (or a reshard's new shards)
  gives a new :class:`ShardTablets` and so a new pool. Messages and logs name
  the URL with its password redacted.
* **Limits.** Rows are read with the result limits the shard's tablets
  publish in their records (``--max-result-rows``/``--max-result-bytes``;
  :class:`~shardgate.tablet.registry.TabletRecord`); a shard whose tablets
  published none (an older tablet) is read through them. The statement
  timeout, the authorize step, the gate's statistics and the merged result's
  limits are the gate's, above this module, unchanged.
* **Errors.** The backend's coded errors (``Backend``'s translation, the same
  the tablet's backend raises). A lock conflict (``ABORTED``) is run again as
  the tablet's autocommit does (:data:`~shardgate.tablet.tablet.AUTOCOMMIT_ATTEMPTS`).
  A read that lost its connection (``UNAVAILABLE``: the session was killed, the
  server restarted) is sent again on another connection: it only reads. A
  write is never sent twice unless its database refused it whole (``ABORTED``):
  one that lost its connection after it was sent fails
  :class:`~shardgate.errors.OutcomeUnknown` (``UNKNOWN``), as a write whose
  tablet went away does.
* **Falls back to the tablet**, never fails where the tablet would answer: a
  read the gate cannot get an answer for itself, or a write it could not send
  (the database unreachable *from the gate*, its credentials refused, the
  gate's pool busy) goes to the tablet path as before, so a shard whose
  database is down answers with the tablet's ``UNAVAILABLE``; after an
  unreachable database the shard's statements go through the tablets for
  :data:`BACKOFF_S` before the gate tries again.
* **Metrics.** Each direct statement is counted in the gate process as a tablet
  counts its statements (``shardgate_tablet_query_seconds`` with operation
  ``Execute``, ``shardgate_tablet_query_errors``,
  ``shardgate_tablet_autocommit_retries``; same labels), so a dashboard summing
  gates and tablets sees every statement once.

Which statements: :func:`direct_read` -- a ``SELECT`` that cannot write or
change a session (no ``FOR UPDATE``/``INTO``, no function call outside the
pool's list of harmless ones, :func:`~shardgate.backends._pool.changes_session`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from shardgate.backends import Backend, open_backend
from shardgate.backends._pool import changes_session
from shardgate.backends.urls import redacted
from shardgate.errors import Aborted, Code, OutcomeUnknown, ShardgateError, Unavailable
from shardgate.result import ExecuteOptions, Result, ResultLimits, WireResult
from shardgate.sql.classify import WriteTarget
from shardgate.tablet import metrics
from shardgate.tablet.tablet import AUTOCOMMIT_ATTEMPTS, AUTOCOMMIT_BACKOFF_S

log = logging.getLogger(__name__)

T = TypeVar("T")

#: connections the gate keeps to one shard's database (reads past them go to the tablet)
DIRECT_POOL_SIZE = 8
#: after the gate could not reach a shard's database, its reads go through tablets this long
BACKOFF_S = 1.0
#: errors after which a read is sent to the tablet instead (the gate's own path failed)
_FALLBACK_CODES = frozenset({Code.UNAVAILABLE, Code.PERMISSION_DENIED, Code.UNAUTHENTICATED})
_DIRECT: dict[str, bool] = {}
_DIRECT_MAX = 4096
#: the limits of a shard whose tablets published none: go through them
UNKNOWN_LIMITS: Any = object()
_WRITE_VERBS = frozenset({"insert", "update", "delete"})


def direct_read(sql: str) -> bool:
    """Whether ``sql`` may go straight to the database: a plain ``SELECT`` that
    cannot write nor change its session (see the module docstring). Cached per text."""
    hit = _DIRECT.get(sql)
    if hit is not None:
        return hit
    low = sql.lower()
    head = low.lstrip(" (\t\r\n")[:7]
    found = (head.startswith("select") and head[6:7] in (" ", "\t", "\r", "\n", "")
             and "for update" not in low and "for no key" not in low
             and " into " not in low and not changes_session(sql))
    if len(_DIRECT) >= _DIRECT_MAX:
        _DIRECT.clear()
    _DIRECT[sql] = found
    return found


class DirectShard:
    """One shard's database reached by the gate itself, for autocommit statements.

    ``execute``/``execute_wire`` return None when the statement should go to the
    tablet instead (see the module docstring); they raise the statement's own
    error otherwise. The backend is opened on first use (in the serving loop).
    ``plain_table(table)`` says whether a write to ``table`` may go direct.
    """

    def __init__(self, keyspace: str, shard: str, url: str, *,
                 plain_table: Callable[[str], bool] = lambda table: False,
                 pool_size: int = DIRECT_POOL_SIZE, pool_timeout_s: float | None = None) -> None:
        self.keyspace = keyspace
        self.shard = shard
        self.url = url
        self.plain_table = plain_table
        self.pool_size = pool_size
        self._pool_timeout_s = pool_timeout_s
        self._backend: Backend | None = None
        self._busy = 0
        self._off_until = 0.0
        self._closed = False
        self._timing: Any = None
        #: reads answered directly, and sent to the tablet instead (console, tests)
        self.answered = 0
        self.fell_back = 0

    def _name(self) -> str:
        return f"{self.keyspace}/{self.shard}"

    @property
    def backend(self) -> Backend:
        """The gate's pool to the shard's database (opened on first use)."""
        if self._backend is None:
            self._backend = open_backend(self.url, pool_size=self.pool_size,
                                         pool_timeout_s=self._pool_timeout_s)
        return self._backend

    @property
    def gives_wire(self) -> bool:
        """Whether :meth:`execute_wire` can answer (a MariaDB shard without TLS)."""
        return self.backend.gives_wire

    def usable(self) -> bool:
        """Whether to try the database now (not closed, not backing off, a free connection)."""
        return (not self._closed and self._busy < self.pool_size
                and (not self._off_until or time.monotonic() >= self._off_until))

    async def execute(self, sql: str, params: Sequence[Any], options: ExecuteOptions | None,
                      target: WriteTarget | None, limits: ResultLimits | None, *,
                      writes: bool = True) -> Result | None:
        """``sql``'s result, run by the gate itself; None: send it to the tablet.
        ``limits`` is :data:`UNKNOWN_LIMITS` where the tablets published none."""
        if limits is UNKNOWN_LIMITS or (options is not None and (
                options.include_event_token or options.compare_event_token is not None)):
            return None
        backend = self.backend
        if direct_read(sql):
            return await self._read(lambda: backend.execute(sql, params, limits))
        if (writes and target is not None and target[0] in _WRITE_VERBS
                and self.plain_table(target[1]) and not changes_session(sql)):
            return await self._write(sql, params, limits)
        return None

    async def execute_wire(self, sql: str, params: Sequence[Any],
                           limits: ResultLimits | None) -> WireResult | None:
        """``sql``'s answer as MySQL packets; None: send it to the tablet."""
        if limits is UNKNOWN_LIMITS or not direct_read(sql):
            return None
        backend = self.backend
        if not backend.gives_wire:
            return None
        return await self._read(lambda: backend.execute_wire(sql, params, limits))

    async def _read(self, run: Callable[[], Awaitable[T]]) -> T | None:
        start = time.perf_counter()
        self._busy += 1
        try:
            result = await self._attempts(run)
        except ShardgateError as exc:
            if exc.code in _FALLBACK_CODES:
                self._back_off(exc)
                return None
            metrics.ERRORS.labels("Execute", self.keyspace, self.shard,
                                  self.backend.dialect, exc.code.value).inc()
            raise
        finally:
            self._busy -= 1
        self._observe(start)
        return result

    async def _attempts(self, run: Callable[[], Awaitable[T]]) -> T:
        """``run``, again after a lock conflict (as the tablet's autocommit) and after
        a lost connection (a read: sending it again changes nothing)."""
        pause = AUTOCOMMIT_BACKOFF_S
        conflicts = lost = 0
        while True:
            try:
                return await run()
            except Aborted:
                conflicts += 1
                if conflicts >= AUTOCOMMIT_ATTEMPTS:
                    raise
                metrics.RETRIES.labels(self.keyspace, self.shard).inc()
                await asyncio.sleep(pause)
                pause *= 2
            except Unavailable:
                # each try drops the connection that failed: after the pool's worth
                # (its idle connections all killed), a new connection is tried
                lost += 1
                if lost > self.pool_size:
                    raise

    async def _write(self, sql: str, params: Sequence[Any],
                     limits: ResultLimits | None) -> Result | None:
        """One autocommit write: run again only after a lock conflict (it rolled back
        whole, as the tablet's autocommit does); None if it could not be sent."""
        backend = self.backend
        start = time.perf_counter()
        pause = AUTOCOMMIT_BACKOFF_S
        self._busy += 1
        try:
            for attempt in range(1, AUTOCOMMIT_ATTEMPTS + 1):
                try:
                    conn = await backend.acquire()
                except ShardgateError as exc:  # not sent
                    if exc.code in _FALLBACK_CODES:
                        self._back_off(exc)
                        return None
                    raise
                conflict = False
                try:
                    result = await conn.execute(sql, params, limits)
                except Aborted:
                    if attempt == AUTOCOMMIT_ATTEMPTS:
                        raise
                    conflict = True
                except Unavailable as exc:
                    raise OutcomeUnknown(
                        f"the statement on {self._name()}: the outcome is unknown, it was sent "
                        f"to the shard database and the connection was lost before it answered "
                        f"({exc.message}); check whether it was applied before sending it "
                        "again") from exc
                finally:
                    await backend.release(conn)
                if not conflict:
                    break
                metrics.RETRIES.labels(self.keyspace, self.shard).inc()
                await asyncio.sleep(pause)
                pause *= 2
        except ShardgateError as exc:
            metrics.ERRORS.labels("Execute", self.keyspace, self.shard, backend.dialect,
                                  exc.code.value).inc()
            raise
        finally:
            self._busy -= 1
        self._observe(start)
        return result

    def _observe(self, start: float) -> None:
        timing = self._timing
        if timing is None:  # labelled once: labels() costs more than the observation
            timing = self._timing = metrics.QUERIES.labels(
                "Execute", self.keyspace, self.shard, self.backend.dialect)
        timing.observe(time.perf_counter() - start)
        self.answered += 1

    def _back_off(self, exc: ShardgateError) -> None:
        self.fell_back += 1
        if exc.code == Code.UNAVAILABLE or exc.code == Code.UNAUTHENTICATED or \
                "authentication" in exc.message.lower():
            if not self._off_until or time.monotonic() >= self._off_until:
                log.warning("%s: the gate could not read from %s itself (%s); its reads go "
                            "through the tablets for %g s", self._name(), redacted(self.url),
                            exc.message, BACKOFF_S)
            self._off_until = time.monotonic() + BACKOFF_S

    async def close(self) -> None:
        """Close the pool (connections lent now are closed when they come back)."""
        self._closed = True
        backend, self._backend = self._backend, None
        if backend is not None:
            await backend.close()
