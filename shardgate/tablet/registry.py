"""Tablets in the topo store: each tablet process's record, its heartbeat, its expiry.

A ``shardgate tablet`` started with ``--topo`` keeps one record
``tablet/<alias>`` (:class:`TabletRecord`): keyspace, shard, gRPC address,
role (``lease_holder`` or ``standby``: whether it holds the shard lease,
:mod:`shardgate.tablet.lease`), health (``serving``, ``draining``), its change
log position, when it started, and what a gate needs to talk to it (dialect,
placeholder, two-phase commit support, collation).

Invariants and rules (kept simple on purpose):

* **Heartbeat.** The tablet rewrites its record every ``heartbeat_s`` (1 s)
  with a beat counter that always moves, and at once (within 50 ms) when its
  role or health changes. The record is deleted when the tablet stops cleanly.
* **Expiry, reader side.** A reader (:class:`TabletRoster`) ignores a record
  that has not changed for ``EXPIRE_BEATS`` heartbeats, measured on the
  reader's own monotonic clock from when it saw the record change, so clock
  skew between machines does not matter. A record first seen in a listing
  (gate start) counts from its ``heartbeat_at`` wall time instead.
* **Expiry, store side.** Every tablet, on each heartbeat, deletes records of
  *its own shard* whose ``heartbeat_at`` is older than ``PURGE_AFTER_S``
  (compare-and-swap on the version it read, so a tablet that came back and
  wrote a newer heartbeat is never deleted). A dead tablet's record is
  therefore ignored after about 3 s and gone from the store after a minute.
* **Leases, on a store that has them (etcd).** The record is written with a
  store lease of ``EXPIRE_BEATS`` heartbeats, renewed on every beat; when the
  tablet dies the lease expires and the store deletes the record itself
  (watchers see the delete), so no tablet purges others' records there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from shardgate.aio import cancel_and_wait
from shardgate.errors import ShardgateError
from shardgate.sql.dialects import Dialect
from shardgate.tablet.tablet import Tablet
from shardgate.topo.store import Record, TopoConflict, TopoStore

log = logging.getLogger(__name__)

KIND = "tablet"
LEASE_HOLDER = "lease_holder"
STANDBY = "standby"
SERVING = "serving"
DRAINING = "draining"
DEFAULT_HEARTBEAT_S = 1.0
#: a reader ignores a record unchanged for this many heartbeats
EXPIRE_BEATS = 3
#: record fields newer tablets write and older ones do not (read with their defaults)
_OPTIONAL = frozenset({"gives_wire", "max_result_rows", "max_result_bytes"})
#: a tablet deletes records of its shard whose heartbeat is older than this
PURGE_AFTER_S = 60.0
#: how often a tablet checks whether its role or health changed
_CHANGE_CHECK_S = 0.05


@dataclass(frozen=True)
class TabletRecord:
    """The document of one ``tablet/<alias>`` record."""

    alias: str
    keyspace: str
    shard: str
    #: gRPC address, ``host:port``
    address: str
    role: str
    health: str
    #: the change log position the tablet's stream reader has reached ("" if not started)
    position: str
    #: wall-clock start time and last heartbeat (seconds since the epoch)
    started_at: float
    heartbeat_at: float
    heartbeat_s: float
    beat: int
    dialect: Dialect
    placeholder: str
    supports_twopc: bool
    collation: str
    #: whether the tablet answers ExecuteWire (absent from older tablets' records)
    gives_wire: bool = False
    #: the tablet's result limits (``--max-result-rows``/``--max-result-bytes``, 0: none;
    #: None: an older tablet's record): a gate reading the shard's database itself
    #: (:mod:`shardgate.gate.direct`) reads with the same
    max_result_rows: int | None = None
    max_result_bytes: int | None = None

    @classmethod
    def of(cls, record: Record) -> TabletRecord | None:
        """The record's document, or None for a tombstone or a malformed document."""
        if record.doc is None:
            return None
        try:
            doc = {k: record.doc[k] for k in cls.__dataclass_fields__
                   if k in record.doc or k not in _OPTIONAL}
            doc["dialect"] = Dialect(doc["dialect"])
            return cls(**doc)
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring malformed tablet record %s", record.name)
            return None

    @property
    def expires_after(self) -> float:
        """Seconds without a change after which readers ignore this record."""
        return EXPIRE_BEATS * self.heartbeat_s


class TabletRegistration:
    """Keeps one tablet's record in the store; see the module docstring."""

    def __init__(
        self,
        store: TopoStore,
        tablet: Tablet,
        alias: str,
        address: str,
        *,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        health: Callable[[], str] = lambda: SERVING,
    ) -> None:
        self.store = store
        self.tablet = tablet
        self.alias = alias
        self.address = address
        self.heartbeat_s = heartbeat_s
        self.health = health
        self.started_at = time.time()
        self._beat = 0
        self._task: asyncio.Task[None] | None = None
        self._written: tuple[str, str] | None = None
        self._lease: int | None = None

    def _role(self) -> str:
        return LEASE_HOLDER if self.tablet.queues.leader else STANDBY

    def record(self) -> TabletRecord:
        """The record as of now."""
        t = self.tablet
        stream = t._changes
        token = stream.last_token if stream is not None else None
        limits = t.result_limits
        return TabletRecord(
            alias=self.alias, keyspace=t.keyspace, shard=t.shard, address=self.address,
            role=self._role(), health=self.health(),
            position=token.position if token is not None else "",
            started_at=self.started_at, heartbeat_at=time.time(),
            heartbeat_s=self.heartbeat_s, beat=self._beat, dialect=t.dialect,
            placeholder=t.placeholder, supports_twopc=t.supports_twopc,
            collation=t.backend.collation or "", gives_wire=t.backend.gives_wire,
            max_result_rows=limits.max_rows if limits is not None else 0,
            max_result_bytes=limits.max_bytes if limits is not None else 0,
        )

    async def beat(self) -> None:
        """Write the record now (and purge long-dead records of this shard)."""
        self._beat += 1
        rec = self.record()
        await self.store.put(KIND, self.alias, asdict(rec), lease=await self._renew_lease())
        self._written = (rec.role, rec.health)
        if self._beat % 10 == 1 and not self.store.has_leases:
            await self._purge()

    async def _renew_lease(self) -> int | None:
        """The lease the record goes with (None: the store has none), renewed; a new one
        if it expired (the tablet was stopped or cut off for longer than the lease)."""
        if not self.store.has_leases:
            return None
        if self._lease is None or not await self.store.keep_alive(self._lease):
            self._lease = await self.store.grant_lease(EXPIRE_BEATS * self.heartbeat_s)
        return self._lease

    async def _purge(self) -> None:
        now = time.time()
        for r in await self.store.list_records(KIND):
            other = TabletRecord.of(r)
            if (other is not None and other.alias != self.alias
                    and (other.keyspace, other.shard) == (self.tablet.keyspace, self.tablet.shard)
                    and now - other.heartbeat_at > PURGE_AFTER_S):
                with contextlib.suppress(TopoConflict):
                    await self.store.delete(KIND, r.name, expect=r.version)
                    log.info("purged the record of dead tablet %s", r.name)

    async def start(self) -> None:
        """Register (raises if the store is unreachable) and start heartbeating."""
        await self.beat()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tablet-heartbeat")

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(_CHANGE_CHECK_S)
            changed = self._written != (self._role(), self.health())
            if not changed and time.monotonic() - last < self.heartbeat_s:
                continue
            try:
                await self.beat()
                last = time.monotonic()
            except ShardgateError as exc:  # the store is down: keep serving, keep trying
                log.warning("tablet %s: heartbeat failed: %s", self.alias, exc)

    async def stop(self, *, deregister: bool = True) -> None:
        """Stop heartbeating; delete the record (a clean stop) unless told not to."""
        task, self._task = self._task, None
        await cancel_and_wait([task])
        if deregister:
            with contextlib.suppress(ShardgateError):
                await self.store.delete(KIND, self.alias)
            if self._lease is not None:
                with contextlib.suppress(ShardgateError):
                    await self.store.revoke_lease(self._lease)


class TabletRoster:
    """A reader's view of the registered tablets, with reader-side expiry."""

    def __init__(self) -> None:
        #: alias -> (record, monotonic time it was last seen changing)
        self._seen: dict[str, tuple[TabletRecord, float]] = {}

    def seed(self, records: Iterable[Record]) -> None:
        """Records from a listing: their age counts from their own heartbeat time."""
        now_wall, now = time.time(), time.monotonic()
        for r in records:
            rec = TabletRecord.of(r)
            if rec is not None:
                self._seen[r.name] = (rec, now - max(0.0, now_wall - rec.heartbeat_at))

    def update(self, records: Iterable[Record]) -> None:
        """Records that changed (tombstones remove)."""
        now = time.monotonic()
        for r in records:
            if r.kind != KIND:
                continue
            rec = TabletRecord.of(r)
            if rec is None:
                self._seen.pop(r.name, None)
            else:
                self._seen[r.name] = (rec, now)

    def live(self, keyspace: str | None = None, shard: str | None = None) -> list[TabletRecord]:
        """Tablets whose record changed recently enough, optionally of one shard."""
        now = time.monotonic()
        return [
            rec for rec, seen in self._seen.values()
            if now - seen <= rec.expires_after
            and (keyspace is None or rec.keyspace == keyspace)
            and (shard is None or rec.shard == shard)
        ]

    def serving(self, alias: str, now: float) -> bool:
        """Whether ``alias``'s record is live (as :meth:`live` at ``now``) and says it serves."""
        found = self._seen.get(alias)
        if found is None:
            return False
        rec, seen = found
        return now - seen <= rec.expires_after and rec.health == SERVING

    def all(self) -> list[TabletRecord]:
        """Every record known, live or not."""
        return [rec for rec, _ in self._seen.values()]
