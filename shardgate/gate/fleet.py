"""A gate's tablets in other processes: discovery, health checks and failover.

``shardgate gate --topo URL`` opens no tablet of its own. A :class:`TabletFleet`
finds the tablets of every shard in the topo store (``tablet/<alias>``
records, :mod:`shardgate.tablet.registry`), keeps one client of each (made by
the :data:`Connect` its caller passes: the transport is not the fleet's
business; ``shardgate.api.grpc.remote_gate`` passes gRPC clients) and asks
each for its health every ``health_interval`` (0.25 s): whether it serves and
whether it holds the shard lease. The health call also names this gate
(``gate_id``), so tablets know it is alive and keep its transactions.

Each shard is one :class:`ShardTablets`, the gate's
:class:`~shardgate.tablet.TabletClient` for it:

* autocommit SELECTs, and INSERT/UPDATE/DELETE of plain tables (``plain_table``),
  go straight to the shard's database through the gate's own pool
  (:mod:`shardgate.gate.direct`: same limits, errors and metrics as through a
  tablet; to the tablet when the gate cannot reach it itself), unless the fleet
  was made with ``direct_statements=False``;
* other statements, transactions, queues and segmented-queue writes go to the
  **lease holder**; ``@replica`` reads (:meth:`ShardTablets.for_tablet_type`)
  go to a standby, or to the lease holder if no standby serves;
* when the lease holder dies, a standby takes the lease (the database frees
  it when the holder's connection closes), its next health answer says so,
  and calls go there: the gate waits up to ``failover_timeout`` (10 s) for
  a serving lease holder, then fails ``UNAVAILABLE``;
* a call that never reached a tablet (connection refused, tablet draining)
  is retried on the new holder; a read outside a transaction is retried even
  if it was sent; a **write that was sent** and got no answer fails with
  :class:`~shardgate.errors.OutcomeUnknown` (code ``UNKNOWN``) and is never
  retried by the gate; a statement of an open transaction whose tablet went
  away fails ``ABORTED`` (the transaction died with the tablet's database
  session, or the tablet reaps it), and a COMMIT that was sent and got no
  answer fails :class:`~shardgate.errors.OutcomeUnknown`;
* a queue receive stream waits for its next batch guarded the same way: when
  the holder serving it fails its health checks (a host cut off sends no end of
  stream), the stream ends ``TabletUnreachable`` and the queue router subscribes
  again, on the new holder.

Invariants: the health loop runs until :meth:`TabletFleet.close`: a health call
that ends without an answer in any way (timeout, refused, or the
``CancelledError`` grpc.aio raises when a cut-off host's connection is torn down
under the call) marks that tablet down and the loop goes on. A gate transaction
id maps to exactly one tablet and that tablet's own id (``ShardTablets._txs``)
until commit or rollback; tablet transaction ids are never reused across tablets
by mistake because the gate hands out its own ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.auth.guard import Guard
from shardgate.backends.changes import LogItem, Transaction
from shardgate.backends.urls import parse_url
from shardgate.errors import (
    Aborted,
    FailedPrecondition,
    OutcomeUnknown,
    TabletUnreachable,
    Unavailable,
)
from shardgate.gate.direct import UNKNOWN_LIMITS, DirectShard
from shardgate.gate.gate import Gate
from shardgate.gate.limits import GateLimits
from shardgate.queues.events import QueueBatch
from shardgate.queues.options import QueueOptions
from shardgate.result import ExecuteOptions, Result, ResultLimits, Row, WireResult
from shardgate.sql.classify import WriteTarget
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.statements import TabletType
from shardgate.tablet.client import TabletClient
from shardgate.tablet.registry import KIND, TabletRecord, TabletRoster
from shardgate.topo.server import TopoServer
from shardgate.topo.store import Record, TopoStore
from shardgate.vschema import TableType

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_HEALTH_INTERVAL_S = 0.25
DEFAULT_FAILOVER_TIMEOUT_S = 10.0
#: how often a caller waiting for a lease holder looks again
_PICK_POLL_S = 0.02
#: database kinds a gate reads itself (a SQLite file is the tablet host's)
_DIRECT_KINDS = frozenset({"postgresql", "mysql"})
#: first words of statements that only read (safe to send again)
_READ_VERBS = frozenset({"select", "show", "describe", "desc", "explain"})


class TabletHealth(Protocol):
    """A tablet's answer to a health check."""

    @property
    def serving(self) -> bool:
        """Whether it serves its shard (not starting, not draining)."""
        ...

    @property
    def lease_holder(self) -> bool:
        """Whether it holds its shard's lease (calls go to the holder)."""
        ...


#: asks one tablet for its health within a timeout (seconds); UNAVAILABLE if it does not answer
HealthCheck = Callable[[float], Awaitable[TabletHealth]]
#: connects to a registered tablet for the gate ``gate_id``: its client (failing with
#: :class:`~shardgate.errors.TabletUnreachable` when the tablet does not answer) and its
#: health check. Nothing is dialled before the first call.
Connect = Callable[[TabletRecord, str], tuple[TabletClient, HealthCheck]]


def is_read(sql: str) -> bool:
    """Whether ``sql`` only reads, so sending it again cannot change anything."""
    words = sql.lstrip(" (\t\r\n").split(None, 1)
    return bool(words) and words[0].lower() in _READ_VERBS and "for update" not in sql.lower()


@dataclass
class _Remote:
    """One tablet process as the gate sees it.

    ``down`` is set while its health checks fail: calls in flight to it are
    then abandoned (see :func:`_guarded` and :meth:`went_down`), so a tablet
    that hangs without closing its connections (stopped, overloaded) cannot
    hang a caller.

    Invariant: ``callers`` holds exactly the tasks suspended in a
    :func:`_guarded` call to this tablet; ``abandoned`` those of them
    :meth:`went_down` cancelled and that have not yet seen it.
    """

    record: TabletRecord
    client: TabletClient
    health: HealthCheck
    healthy: bool = False
    lease_holder: bool = False
    serving: bool = False
    down: asyncio.Event = field(default_factory=asyncio.Event)
    callers: set[asyncio.Task[Any]] = field(default_factory=set)
    abandoned: set[asyncio.Task[Any]] = field(default_factory=set)

    def went_down(self) -> None:
        """Its health check failed: set ``down`` and abandon the calls in flight."""
        self.down.set()
        for task in self.callers:
            if task not in self.abandoned:
                self.abandoned.add(task)
                task.cancel()


async def _guarded(remote: _Remote, call: Awaitable[T]) -> T:
    """``call``, abandoned as not answered if ``remote`` fails its health checks meanwhile.

    The call runs in the caller's task (no task of its own, no watcher task:
    those cost more than a point select's own work); :meth:`_Remote.went_down`
    cancels that task, and this turns its own cancellation into
    :class:`TabletUnreachable`, leaving any other cancellation (the caller's
    timeout, its client gone) as it was. A tablet already down is not sent to.
    """
    if remote.down.is_set():
        if asyncio.iscoroutine(call):
            call.close()
        raise TabletUnreachable(f"tablet {remote.record.address} is not answering its "
                                "health checks", sent=False)
    task = asyncio.current_task()
    assert task is not None
    remote.callers.add(task)
    try:
        return await call
    except asyncio.CancelledError:
        if task not in remote.abandoned:
            raise
        remote.abandoned.discard(task)
        if task.uncancel() > 0:  # cancelled by someone else as well: theirs wins
            raise
        raise TabletUnreachable(f"tablet {remote.record.address} stopped answering its health "
                                "checks while the call was in flight", sent=True) from None
    finally:
        remote.callers.discard(task)
        remote.abandoned.discard(task)


class TabletFleet:
    """The tablets of every shard, found in the topo store; see the module docstring."""

    def __init__(
        self,
        store: TopoStore,
        connect: Connect,
        *,
        gate_id: str | None = None,
        health_interval: float = DEFAULT_HEALTH_INTERVAL_S,
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S,
        direct_statements: bool = True,
        pool_timeout_s: float | None = None,
    ) -> None:
        self.store = store
        #: makes the client of a tablet (its transport, credentials and call timeout)
        self._connect = connect
        self.gate_id = gate_id or uuid.uuid4().hex
        self.health_interval = health_interval
        self.failover_timeout = failover_timeout
        self.roster = TabletRoster()
        self._remotes: dict[str, _Remote] = {}
        #: (keyspace, shard) -> its entries of ``_remotes``, in the same order
        self._by_shard: dict[tuple[str, str], list[_Remote]] = {}
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        #: whether autocommit reads go to the shard databases (see the module docstring)
        self.direct_statements = direct_statements
        self._pool_timeout_s = pool_timeout_s
        #: (keyspace, shard) -> the result limits its tablets last published (None: none);
        #: kept when the records go: a shard whose tablets are all gone stays readable
        self.limits: dict[tuple[str, str], ResultLimits | None] = {}
        #: whether a write to (keyspace, table) may go to the database directly (a table
        #: of the VSchema, not a queue or sequence: set by the gate's opener)
        self.plain_table: Callable[[str, str], bool] = lambda keyspace, table: False

    async def start(self) -> None:
        """Read the registered tablets, check them once, and keep checking."""
        self.roster.seed(await self.store.list_records(KIND))
        self._sync()
        await self._check_all()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tablet-health")

    def on_records(self, records: list[Record]) -> None:
        """Changed ``tablet`` records (the topo watcher's ``on_records``)."""
        self.roster.update(records)
        self._sync()

    def _sync(self) -> None:
        """One client per known tablet; records replaced by a new address get a new one."""
        for rec in self.roster.all():
            found = self._remotes.get(rec.alias)
            if found is not None and found.record.address == rec.address:
                found.record = rec
                continue
            if found is not None:
                self._retire(found)
            client, health = self._connect(rec, self.gate_id)
            self._remotes[rec.alias] = _Remote(rec, client, health)
        known = {rec.alias for rec in self.roster.all()}
        for alias in [a for a in self._remotes if a not in known]:
            self._retire(self._remotes.pop(alias))
        by_shard: dict[tuple[str, str], list[_Remote]] = {}
        for remote in self._remotes.values():
            by_shard.setdefault((remote.record.keyspace, remote.record.shard), []).append(remote)
        self._by_shard = by_shard
        for key, remotes in by_shard.items():
            self._publish_limits(key, [r.record for r in remotes])

    def _publish_limits(self, key: tuple[str, str], records: list[TabletRecord]) -> None:
        """The shard's result limits for direct reads: the strictest its tablets
        publish; unknown (no direct reads) while one of them publishes none."""
        if any(rec.max_result_rows is None or rec.max_result_bytes is None
               for rec in records):
            self.limits.pop(key, None)
            return

        def strictest(values: list[int]) -> int:
            return min((v for v in values if v), default=0)

        limits = ResultLimits(strictest([r.max_result_rows or 0 for r in records]),
                              strictest([r.max_result_bytes or 0 for r in records]))
        self.limits[key] = limits if limits.active else None

    def _retire(self, remote: _Remote) -> None:
        remote.healthy = False
        asyncio.get_running_loop().create_task(remote.client.close())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            try:
                await self._check_all()
            except Exception:  # never stop checking
                log.exception("tablet health checks failed")

    async def _check_all(self) -> None:
        remotes = list(self._remotes.values())
        await asyncio.gather(*(self._check(r) for r in remotes))
        self._changed.set()

    async def _check(self, remote: _Remote) -> None:
        try:
            health = await remote.health(max(1.0, 2 * self.health_interval))
        except Unavailable:
            self._went_down(remote)
            return
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this check was cancelled (the fleet closes)
            # Not ours: grpc.aio ends a call in flight with CancelledError when its
            # connection is torn down under it (a host cut off: the link dropped, the
            # keepalive gave up). No answer, as for a timeout; raising it would end the
            # health loop and the gate would never see the failover.
            self._went_down(remote)
            return
        remote.down.clear()
        remote.healthy, remote.serving = True, health.serving
        remote.lease_holder = health.lease_holder

    @staticmethod
    def _went_down(remote: _Remote) -> None:
        remote.healthy = remote.serving = remote.lease_holder = False
        remote.went_down()

    def mark_down(self, remote: _Remote) -> None:
        """``remote`` failed a call: no traffic until its next good health answer."""
        remote.healthy = remote.lease_holder = False

    def _candidates(self, keyspace: str, shard: str) -> list[_Remote]:
        """The shard's tablets that serve: live serving record, healthy, serving.

        Looked up by shard (``_by_shard``, rebuilt with every record change),
        not by scanning every tablet: this runs on every call.
        """
        now = time.monotonic()
        serving = self.roster.serving
        return [r for r in self._by_shard.get((keyspace, shard), ())
                if r.healthy and r.serving and serving(r.record.alias, now)]

    def remotes_of(self, keyspace: str, shard: str) -> list[_Remote]:
        """Every registered tablet of a shard that answers its health checks."""
        live = {rec.alias for rec in self.roster.live(keyspace, shard)}
        return [r for a, r in self._remotes.items() if a in live and r.healthy]

    def pick(self, keyspace: str, shard: str, *, replica: bool = False) -> _Remote | None:
        """The tablet to send to now: the lease holder, or for ``replica`` a standby."""
        candidates = self._candidates(keyspace, shard)
        holders = [r for r in candidates if r.lease_holder]
        if replica:
            standbys = [r for r in candidates if not r.lease_holder]
            if standbys:
                return min(standbys, key=lambda r: r.record.alias)
        return holders[0] if holders else None

    async def wait_pick(
        self, keyspace: str, shard: str, deadline: float, *, replica: bool = False
    ) -> _Remote:
        """:meth:`pick`, waiting until ``deadline`` (monotonic) for a tablet to serve."""
        while True:
            found = self.pick(keyspace, shard, replica=replica)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                known = [f"{r.record.address} ({'up' if r.healthy else 'down'})"
                         for r in self._remotes.values()
                         if (r.record.keyspace, r.record.shard) == (keyspace, shard)]
                raise Unavailable(
                    f"no tablet of {keyspace}/{shard} holds the shard lease and serves "
                    f"(waited {self.failover_timeout:.0f} s; registered: {known or 'none'}): "
                    "start one with `shardgate tablet --topo URL --keyspace "
                    f"{keyspace} --shard {shard}`")
            with contextlib.suppress(TimeoutError):
                await wait_for(self._changed.wait(), _PICK_POLL_S)
            self._changed.clear()

    def shard(self, keyspace: str, shard: str, dialect: Dialect,
              placeholder: str, url: str | None = None) -> ShardTablets:
        """The gate's tablet client for one shard (reading ``url``, its database, itself
        where :attr:`direct_statements`)."""
        direct = None
        if self.direct_statements and url is not None and parse_url(url).kind in _DIRECT_KINDS:
            direct = DirectShard(keyspace, shard, url, pool_timeout_s=self._pool_timeout_s,
                                 plain_table=lambda table: self.plain_table(keyspace, table))
        return ShardTablets(self, keyspace, shard, dialect, placeholder, direct=direct)

    def describe(self) -> list[dict[str, Any]]:
        """Every known tablet and what the gate thinks of it (``SHOW``-like listings)."""
        return [
            {"alias": r.record.alias, "keyspace": r.record.keyspace, "shard": r.record.shard,
             "address": r.record.address, "healthy": r.healthy, "serving": r.serving,
             "lease_holder": r.lease_holder}
            for r in self._remotes.values()
        ]

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])
        for r in self._remotes.values():
            await r.client.close()
        self._remotes.clear()
        self._by_shard = {}


class ShardTablets(TabletClient):
    """One shard's tablets behind one client: the lease holder, with failover."""

    has_replicas = True
    forgets_queues = True

    def __init__(self, fleet: TabletFleet, keyspace: str, shard: str, dialect: Dialect,
                 placeholder: str, *, replica: bool = False,
                 direct: DirectShard | None = None) -> None:
        self.fleet = fleet
        self.keyspace = keyspace
        self.shard = shard
        self.dialect = Dialect(dialect)
        self.placeholder = placeholder
        self.replica = replica
        self._txs: dict[int, tuple[_Remote, int]] = {}
        self._ids = itertools.count(1)
        self._replica_view: ShardTablets | None = None
        #: the gate's own pool to the shard's database, for autocommit reads
        self.direct = direct

    def _name(self) -> str:
        return f"{self.keyspace}/{self.shard}"

    def _records(self) -> list[TabletRecord]:
        return self.fleet.roster.live(self.keyspace, self.shard)

    @property
    def supports_twopc(self) -> bool:  # type: ignore[override]
        return any(rec.supports_twopc for rec in self._records())

    @property
    def collation(self) -> str | None:
        return next((rec.collation for rec in self._records() if rec.collation), None)

    @property
    def gives_wire(self) -> bool:
        """Every live tablet of the shard answers ExecuteWire (a read may go to any)."""
        records = self._records()
        return bool(records) and all(rec.gives_wire for rec in records)

    def for_tablet_type(self, tablet_type: str) -> TabletClient:
        if tablet_type == TabletType.PRIMARY:
            return self
        if self._replica_view is None:
            self._replica_view = ShardTablets(self.fleet, self.keyspace, self.shard,
                                              self.dialect, self.placeholder, replica=True,
                                              direct=self.direct)
        return self._replica_view

    async def _call(
        self, fn: Callable[[TabletClient], Awaitable[T]], *, may_resend: bool,
        what: str,
    ) -> T:
        """``fn`` on the tablet to use, failing over as the module docstring says."""
        deadline = time.monotonic() + self.fleet.failover_timeout
        while True:
            remote = await self.fleet.wait_pick(self.keyspace, self.shard, deadline,
                                                replica=self.replica)
            try:
                return await _guarded(remote, fn(remote.client))
            except TabletUnreachable as exc:
                self.fleet.mark_down(remote)
                if exc.sent and not may_resend:
                    raise OutcomeUnknown(
                        f"{what} on {self._name()}: the outcome is unknown, it was sent to "
                        f"{remote.record.address} and that tablet went away before it "
                        f"answered ({exc.message}); check whether it was applied before "
                        "sending it again") from exc
                if time.monotonic() >= deadline:
                    raise
                log.info("%s: %s; failing over", self._name(), exc.message)

    def _held(self, transaction_id: int) -> tuple[_Remote, int]:
        try:
            return self._txs[transaction_id]
        except KeyError:
            raise FailedPrecondition(
                f"transaction {transaction_id} is not open on {self._name()} (it was "
                "committed, rolled back or lost): start a new one") from None

    def _lost(self, transaction_id: int, remote: _Remote, exc: TabletUnreachable) -> Aborted:
        self._txs.pop(transaction_id, None)
        self.fleet.mark_down(remote)
        return Aborted(
            f"the tablet of {self._name()} serving this transaction ({remote.record.address}) "
            f"went away ({exc.message}); the transaction is rolled back: retry it")

    async def execute(
        self,
        sql: str,
        params: Sequence[Any],
        transaction_id: int | None = None,
        options: ExecuteOptions | None = None,
        *,
        target: WriteTarget | None = None,
    ) -> Result:
        if transaction_id is None:
            direct = self.direct
            if direct is not None and direct.usable():
                result = await direct.execute(
                    sql, params, options, target,
                    self.fleet.limits.get((self.keyspace, self.shard), UNKNOWN_LIMITS),
                    writes=not self.replica)
                if result is not None:
                    return result
            return await self._call(
                lambda c: c.execute(sql, params, None, options, target=target),
                may_resend=is_read(sql), what="the statement")
        remote, tid = self._held(transaction_id)
        try:
            return await _guarded(
                remote, remote.client.execute(sql, params, tid, options, target=target))
        except TabletUnreachable as exc:
            raise self._lost(transaction_id, remote, exc) from exc

    async def execute_wire(self, sql: str, params: Sequence[Any]) -> WireResult:
        direct = self.direct
        if direct is not None and direct.usable():
            result = await direct.execute_wire(
                sql, params, self.fleet.limits.get((self.keyspace, self.shard), UNKNOWN_LIMITS))
            if result is not None:
                return result
        return await self._call(lambda c: c.execute_wire(sql, params), may_resend=True,
                                what="the statement")

    async def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        deadline = time.monotonic() + self.fleet.failover_timeout
        while True:
            remote = await self.fleet.wait_pick(self.keyspace, self.shard, deadline,
                                                replica=self.replica)
            started = False
            try:
                async for batch in remote.client.stream_execute(sql, params):
                    started = True
                    yield batch
                return
            except TabletUnreachable as exc:
                self.fleet.mark_down(remote)
                if started or time.monotonic() >= deadline:
                    raise Unavailable(
                        f"the stream from {self._name()} broke ({exc.message}); run the "
                        "statement again") from exc

    async def _open(self, fn: Callable[[TabletClient], Awaitable[int]]) -> int:
        # Sending BEGIN again is safe: a transaction begun on a tablet that went away
        # died with it, and one on a tablet that lives is reaped when unused.
        holder: list[_Remote] = []

        async def begin(client: TabletClient) -> int:
            tid = await fn(client)
            holder.append(next(r for r in self.fleet._remotes.values() if r.client is client))
            return tid

        tid = await self._call(begin, may_resend=True, what="BEGIN")
        own = next(self._ids)
        self._txs[own] = (holder[-1], tid)
        return own

    async def begin(self, caller: str | None = None) -> int:
        return await self._open(lambda c: c.begin(caller))

    async def begin_twopc(self, xid: str, caller: str | None = None) -> int:
        return await self._open(lambda c: c.begin_twopc(xid, caller))

    async def commit(self, transaction_id: int) -> None:
        remote, tid = self._held(transaction_id)
        self._txs.pop(transaction_id, None)
        try:
            await _guarded(remote, remote.client.commit(tid))
        except TabletUnreachable as exc:
            self.fleet.mark_down(remote)
            if exc.sent:
                raise OutcomeUnknown(
                    f"COMMIT on {self._name()}: the outcome is unknown, the tablet "
                    f"{remote.record.address} went away before it answered ({exc.message}); "
                    "check whether the transaction's writes are there") from exc
            raise Aborted(f"COMMIT on {self._name()} did not reach the tablet "
                          f"({exc.message}); the transaction is rolled back: retry it") from exc

    async def rollback(self, transaction_id: int) -> None:
        found = self._txs.pop(transaction_id, None)
        if found is None:
            return
        remote, tid = found
        try:
            await _guarded(remote, remote.client.rollback(tid))
        except TabletUnreachable:
            self.fleet.mark_down(remote)  # the transaction dies with the tablet

    async def prepare(self, transaction_id: int, xid: str) -> None:
        remote, tid = self._held(transaction_id)
        try:
            await _guarded(remote, remote.client.prepare(tid, xid))
        except TabletUnreachable as exc:
            self._txs.pop(transaction_id, None)
            self.fleet.mark_down(remote)
            raise OutcomeUnknown(
                f"PREPARE on {self._name()}: the tablet went away ({exc.message}); "
                f"the transaction may be prepared as {xid}") from exc
        self._txs.pop(transaction_id, None)

    # Prepared transactions live in the database, not in a tablet session (PostgreSQL):
    # any tablet of the shard can end or list them.

    async def commit_prepared(self, xid: str) -> None:
        await self._call(lambda c: c.commit_prepared(xid), may_resend=False,
                         what=f"COMMIT PREPARED {xid}")

    async def rollback_prepared(self, xid: str) -> None:
        await self._call(lambda c: c.rollback_prepared(xid), may_resend=False,
                         what=f"ROLLBACK PREPARED {xid}")

    async def list_prepared(self, prefix: str) -> list[str]:
        return await self._call(lambda c: c.list_prepared(prefix), may_resend=True,
                                what="listing prepared transactions")

    async def update_stream(
        self,
        *,
        position: str | None = None,
        timestamp: float | None = None,
        heartbeat_s: float | None = None,
    ) -> AsyncIterator[LogItem]:
        """The shard's change stream from its lease holder (or, ``@replica``, a standby),
        **resumed** on the shard's new lease holder when its tablet goes away (killed,
        drained, its stream broken or ended, its health checks failing).

        It resumes from the position of the last item it yielded (a transaction's commit
        token or a heartbeat's position), so nothing is lost and nothing is delivered
        twice. Before the first item with a position it restarts from where it was
        asked to start; a stream asked to start "from now" restarts from the time it
        was first opened, which may add transactions committed in the moment before
        the first start (never one delivered already). If no tablet serves within
        ``failover_timeout`` after a break, it fails ``UNAVAILABLE`` (restart from the
        last ``safe_timestamp``, as after any stream error).
        """
        opened = time.time()
        deadline = time.monotonic() + self.fleet.failover_timeout
        while True:
            remote = await self.fleet.wait_pick(self.keyspace, self.shard, deadline,
                                                replica=self.replica)
            items = remote.client.update_stream(position=position, timestamp=timestamp,
                                                heartbeat_s=heartbeat_s)
            why, progressed = "its stream ended", False
            try:
                while True:
                    try:
                        item = await _guarded(remote, anext(items))
                    except StopAsyncIteration:
                        break
                    yield item
                    at = item.token.position if isinstance(item, Transaction) else item.position
                    if at is not None:
                        position, timestamp = at, None
                    progressed = True
            except TabletUnreachable as exc:
                why = exc.message
            finally:
                with contextlib.suppress(Exception):
                    await items.aclose()  # type: ignore[attr-defined]
            self.fleet.mark_down(remote)
            if position is None and timestamp is None:
                timestamp = opened
            if progressed:  # a stream that worked gets the whole failover time again
                deadline = time.monotonic() + self.fleet.failover_timeout
            elif time.monotonic() >= deadline:
                raise Unavailable(
                    f"the change stream of {self._name()} broke ({why}) and no tablet took "
                    f"it over within {self.fleet.failover_timeout:.0f} s; restart it from "
                    "the last safe timestamp")
            log.info("%s: change stream from %s: %s; resuming on the lease holder",
                     self._name(), remote.record.address, why)

    async def queue_receive(self, queue: str, max_batch: int = 0) -> AsyncIterator[QueueBatch]:
        deadline = time.monotonic() + self.fleet.failover_timeout
        remote = await self.fleet.wait_pick(self.keyspace, self.shard, deadline)
        stream = remote.client.queue_receive(queue, max_batch)
        batches = aiter(stream)
        try:
            while True:
                # guarded: a holder cut off from the network sends nothing and no end
                # either; its failing health checks end the wait (the router subscribes
                # again, on the new holder)
                try:
                    batch = await _guarded(remote, anext(batches))
                except StopAsyncIteration:
                    return
                yield batch
        except TabletUnreachable:
            self.fleet.mark_down(remote)
            raise
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def queue_ack(self, queue: str, ids: Sequence[int]) -> int:
        # Acking is idempotent (an acked event is gone): safe to send again.
        return await self._call(lambda c: c.queue_ack(queue, ids), may_resend=True,
                                what="queue ack")

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        return await self._call(lambda c: c.queue_stats(queue), may_resend=True,
                                what="queue stats")

    async def queue_nack(self, queue: str, ids: Sequence[int], reason: str,
                         retry_at: int | None = None) -> int:
        # Not sent twice: by then the job may run again, and a second nack would fail
        # that later attempt.
        return await self._call(lambda c: c.queue_nack(queue, ids, reason, retry_at),
                                may_resend=False, what=f"nack of jobs of {queue}")

    async def queue_configure(self, queues: Mapping[str, QueueOptions]) -> None:
        return None  # tablet processes find queue tables by their comment marker

    async def queue_forget(self, queue: str) -> None:
        """Tell every tablet of the shard (lease holder and standbys: each may serve
        receivers, and a standby would start the queue when it takes the lease) to stop
        serving ``queue``. A tablet that does not answer is dead or cut off: it serves
        nothing, and its manager stops by itself when the table is gone."""
        deadline = time.monotonic() + self.fleet.failover_timeout
        await self.fleet.wait_pick(self.keyspace, self.shard, deadline)
        for remote in self.fleet.remotes_of(self.keyspace, self.shard):
            try:
                await _guarded(remote, remote.client.queue_forget(queue))
            except TabletUnreachable as exc:
                self.fleet.mark_down(remote)
                log.warning("%s: DROP QUEUE %s: tablet %s did not answer (%s)", self._name(),
                            queue, remote.record.address, exc.message)

    async def queue_enqueue(self, queue: str, jobs: Sequence[tuple[str, str | None]]) -> list[int]:
        return await self._call(lambda c: c.queue_enqueue(queue, jobs), may_resend=False,
                                what=f"storing jobs of {queue}")

    async def close(self) -> None:
        # the fleet owns the tablets' connections; the shard's database pool is ours
        if self.direct is not None and not self.replica:
            await self.direct.close()


def plain_table(gate: Gate, keyspace: str, table: str) -> bool:
    """Whether ``table`` of ``keyspace`` is in the gate's VSchema and is neither a queue
    nor a sequence (its writes may go to the shard database directly)."""
    ks = gate.vschema.keyspaces.get(keyspace)
    found = ks.tables.get(table) if ks is not None else None
    return found is not None and found.type in (TableType.NORMAL, TableType.REFERENCE)


def dialect_of(url: str) -> tuple[Dialect, str]:
    """The SQL dialect and parameter placeholder of a shard database URL."""
    dialect = Dialect.of(parse_url(url).kind)
    return dialect, sql_dialect(dialect).placeholder


async def open_fleet_gate(
    topo: TopoServer,
    connect: Connect,
    *,
    owns_topo: bool = True,
    health_interval: float = DEFAULT_HEALTH_INTERVAL_S,
    failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S,
    watch_interval: float | None = None,
    guard: Guard | None = None,
    limits: GateLimits | None = None,
    direct_statements: bool = True,
) -> tuple[Gate, TabletFleet]:
    """A gate with no tablet of its own: every shard is served by tablet processes,
    reached through the clients ``connect`` makes; with ``direct_statements``, autocommit
    SELECTs go to the shard databases themselves (:mod:`shardgate.gate.direct`).

    The gate follows ``topo`` (topology and tablet records). Close the gate
    first, then the fleet.
    """
    fleet = TabletFleet(topo.store, connect, health_interval=health_interval,
                        failover_timeout=failover_timeout, direct_statements=direct_statements,
                        pool_timeout_s=limits.pool_timeout_s if limits else None)
    await fleet.start()
    try:
        topology = await topo.load_topology()

        def open_tablet(keyspace: str, shard: str, url: str) -> TabletClient:
            return fleet.shard(keyspace, shard, *dialect_of(url), url=url)

        tablets = {(ks.name, sh.name): open_tablet(ks.name, sh.name, sh.url)
                   for ks in topology.keyspaces.values() for sh in ks.all_shards}
        gate = Gate(topology, tablets, topo=topo, open_tablet=open_tablet, owns_topo=owns_topo,
                    guard=guard, limits=limits)
        fleet.plain_table = lambda keyspace, table: plain_table(gate, keyspace, table)
    except BaseException:
        await fleet.close()
        raise
    if watch_interval is None:
        gate.watch(on_records=fleet.on_records)
    else:
        gate.watch(watch_interval, on_records=fleet.on_records)
    return gate, fleet
