"""The inbox store: millions of small per-user queues, read with a pointer per consumer.

The third queue storage of the design documents (the Cassandra write-up):
nothing is updated in place or deleted one by one. Each inbox is a set of
**time-bucket tables** (``<inbox>_<yyyymmdd>``, or monthly / hourly) plus one
**pointer table** (``<inbox>_pointers``), all sharded by the user column
through one of the keyspace's vindexes, so a user's messages and pointers
live on one shard.

* ``append(user, body, session=...)`` is one ``INSERT`` executed through the
  gate in the caller's session: inside its transaction when one is open
  (rolled back with it, committed with it).
* ``read(user, after=pointer, limit=...)`` scans the user's rows from the
  pointer's time minus the rescan window, in position order ``(ts, msg_id)``,
  and delivers those the pointer has not seen (see
  :mod:`shardgate.queues.inbox.model` for the exact-once rule).
* ``commit(user, consumer, pointer)`` stores a consumer's pointer: one row
  per user and consumer, overwritten (last writer wins).
* ``maintain(now)`` creates the buckets ahead of time on every shard and drops
  whole buckets past retention (``DROP TABLE`` on every shard).

Invariants (the state of a store object):

* **Nothing per user or per queue in memory.** A store holds its options,
  the set of bucket tables it knows (a few dozen names: retention divided by
  granularity) and an id generator; the cost of an operation depends on the
  user's rows, never on how many users or queues exist.
* ``_buckets`` holds only buckets that exist on **every** shard and are
  declared in the gate's VSchema; a bucket is registered in the VSchema after
  its table exists on all shards, and removed from it before its tables are
  dropped, so the gate never routes to a table it does not know.
* Bucket tables are never created inside a caller's transaction (DDL would
  commit it on MariaDB and wait on SQLite's write lock): an append to a
  missing bucket inside a transaction is refused with ``FAILED_PRECONDITION``;
  ``maintain`` creates ``precreate`` buckets ahead so that does not happen.
* A message's bucket is chosen by its ``ts``; with ``forward_insert`` a
  message within one rescan window of its bucket's end is also written (same
  id, same ``ts``, same transaction) to the next bucket.

Several processes may serve one inbox: each discovers the buckets from the
databases (every ``bucket_refresh_s`` on reads, and whenever an append needs
a bucket it does not know).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from shardgate.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from shardgate.ports import TRUSTED, GateView, SessionGate, SqlShard
from shardgate.queues.inbox import sql
from shardgate.queues.inbox.model import (
    US,
    Bucket,
    Delivery,
    IdGenerator,
    InboxOptions,
    Message,
    Pointer,
    bucket_of,
    buckets_to_read,
    check_consumer,
    check_name,
    next_bucket,
    parse_bucket_table,
)
from shardgate.queues.inbox.shards import InboxShards
from shardgate.vindexes.base import SingleColumn


class InboxGate(GateView[SqlShard], SessionGate, Protocol):
    """What the inbox store needs of the gate: sessions, the VSchema, the shards' SQL."""


#: Most messages one read returns.
MAX_READ_LIMIT = 10_000
#: Rows one page of a bucket scan fetches at most.
MAX_PAGE = 4096


@dataclass(frozen=True)
class InboxRead:
    """What one read returned: the messages, and the pointer to commit after them.

    ``more`` is True when the read stopped at its limit (read again to get
    the rest); ``pointer`` is None only if nothing was ever delivered.
    """

    messages: list[Message]
    pointer: Pointer | None
    more: bool


@dataclass
class MaintainReport:
    """Buckets :meth:`InboxStore.maintain` created and dropped (table names)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


class InboxStore:
    """One inbox of one keyspace: per-user queues over time-bucket tables.

    ``clock`` gives this writer's and reader's time in seconds (``time.time``
    by default; tests pass skewed clocks). See the module docstring for the
    invariants. Create the tables once with :meth:`create`; every method opens
    the store on first use (:meth:`open`), which fails with ``NOT_FOUND`` if
    the inbox was never created.
    """

    def __init__(
        self,
        gate: InboxGate,
        keyspace: str,
        name: str,
        options: InboxOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gate = gate
        self.keyspace = keyspace
        self.name = check_name(name)
        #: whether the caller chose the options (checked against the stored ones on
        #: open) or left them to the inbox (the stored ones are adopted)
        self.explicit_options = options is not None
        self.options = options or InboxOptions()
        self.clock = clock
        self.shards = InboxShards(gate, keyspace, self.name)
        self._sharded = self.shards.sharded
        self._check_vindex()
        self.pointers_table = f"{name}_pointers"
        self._buckets: dict[str, Bucket] = {}
        self._opened = False
        self._refreshed_at = -math.inf
        self._lock = asyncio.Lock()
        self._ids = IdGenerator()

    def _check_vindex(self) -> None:
        if not self._sharded:
            return
        vindex = self.gate.vschema.keyspace(self.keyspace).vindexes.get(self.options.vindex)
        if vindex is None:
            raise NotFound(
                f"inbox {self.name}: vindex {self.options.vindex!r} is not defined in "
                f"{self.keyspace}.vindexes; add it (e.g. {{\"type\": \"hash\"}}) or pass "
                "InboxOptions(vindex=...)"
            )
        if not isinstance(vindex, SingleColumn) or not vindex.unique or vindex.needs_cursor:
            raise InvalidArgument(
                f"inbox {self.name}: vindex {self.options.vindex!r} must be a unique "
                "functional vindex (hash, xxhash, numeric, unicode_loose_md5...)"
            )

    # -- time --------------------------------------------------------------------

    def now(self) -> int:
        """This store's clock in microseconds."""
        return int(self.clock() * US)

    def _bucket(self, ts: int) -> Bucket:
        return bucket_of(self.name, self.options.granularity, ts)

    def buckets(self) -> list[Bucket]:
        """The buckets this store knows (present on every shard), oldest first."""
        return sorted(self._buckets.values())

    # -- life cycle ----------------------------------------------------------------

    async def create(self) -> MaintainReport:
        """Create the pointer table and the current buckets on every shard (idempotent).

        The options are stored with the inbox (table ``_sg_inboxes`` of every
        shard). Creating an inbox that exists with other options fails with
        ``FAILED_PRECONDITION`` naming them, before anything is written.
        """
        async with self._lock:
            missing = await self._load_options()
            await self.shards.each(
                lambda dialect: sql.pointers_ddl(self.pointers_table, dialect,
                                                 self.options.user_type))
            self.shards.register([self.pointers_table], [], self.options.vindex)
            await self._refresh()
            await self._store_options(missing)
            self._opened = True
        return await self.maintain()

    async def open(self) -> None:
        """Discover the inbox's buckets; ``NOT_FOUND`` if it was never created.

        The first open reads the inbox's stored options: explicit options that
        differ fail with ``FAILED_PRECONDITION`` naming each difference; a
        store created without options adopts them. An inbox created before
        options were stored gets this store's options recorded.
        """
        async with self._lock:
            missing = await self._load_options() if not self._opened else []
            await self._refresh()
            await self._store_options(missing)
            self._opened = True

    async def _load_options(self) -> list[str]:
        """Read the stored options from every shard and check or adopt them (see
        :meth:`open`); the shards that hold none. Holds the lock."""
        await self.shards.each(sql.options_ddl, suppress=AlreadyExists)
        results = await self.shards.each_with(
            lambda dialect: (sql.options_select_sql(dialect), [self.name]))
        shards = [s.name for s in self.gate.topology.keyspace(self.keyspace).shards]
        found: dict[str, list[str]] = {}
        missing: list[str] = []
        for shard, res in zip(shards, results, strict=True):
            if res.rows:
                found.setdefault(str(res.rows[0][0]), []).append(shard)
            else:
                missing.append(shard)
        where = f"inbox {self.keyspace}.{self.name}"
        if len(found) > 1:
            raise FailedPrecondition(
                f"{where}: its shards store different options ({found}); drop and re-create "
                "the inbox, or fix the _sg_inboxes rows")
        if found:
            doc = json.loads(next(iter(found)))
            stored = self.options.with_stored(doc, path=f"{where} (stored options)")
            diff = self.options.differences(stored)
            if diff and self.explicit_options:
                raise FailedPrecondition(
                    f"{where} exists with other options: {'; '.join(diff)}; open it without "
                    "options to use the stored ones, or drop and re-create it")
            if diff:
                self.options = stored
                self._check_vindex()
        return missing

    async def _store_options(self, shards: Sequence[str]) -> None:
        """Record this store's options on ``shards`` (those that hold none), then check
        that every shard agrees (a concurrent creator with other options loses)."""
        if not shards:
            return
        text = json.dumps(self.options.stored(), sort_keys=True)
        clients = [self.gate.tablets[(self.keyspace, s)] for s in shards]

        async def put(c: Any) -> None:
            with contextlib.suppress(AlreadyExists):
                await c.execute(sql.options_insert_sql(c.dialect), [self.name, text, self.now()])

        await asyncio.gather(*(put(c) for c in clients))
        explicit, self.explicit_options = self.explicit_options, True
        try:
            await self._load_options()
        finally:
            self.explicit_options = explicit

    async def _ready(self) -> None:
        if not self._opened:
            await self.open()
        elif time.monotonic() - self._refreshed_at > self.options.bucket_refresh_s:
            async with self._lock:
                if time.monotonic() - self._refreshed_at > self.options.bucket_refresh_s:
                    await self._refresh()

    async def maintain(self, now: int | None = None) -> MaintainReport:
        """Create the buckets from ``now`` to ``precreate`` ahead; drop expired ones whole.

        ``now`` is in microseconds (default: the store's clock). A bucket is
        expired when its end is more than ``retention_s`` before ``now``; its
        table is dropped on every shard (after leaving the VSchema). Buckets
        found on only some shards (an interrupted create) are completed, or
        dropped if expired. Run it periodically (``shardgate inbox maintain``).
        """
        await self._ready()
        now = self.now() if now is None else int(now)
        horizon = now - int(self.options.retention_s * US)
        report = MaintainReport()
        async with self._lock:
            present = await self._discover()
            wanted: list[Bucket] = []
            b = self._bucket(now)
            for _ in range(self.options.precreate + 1):
                wanted.append(b)
                b = next_bucket(self.name, self.options.granularity, b)
            partial = [bk for bk, n in present.values() if n < self.shards.count()]
            to_create = {bk.table: bk for bk in [*wanted, *partial] if bk.end > horizon}
            to_create = {t: bk for t, bk in to_create.items()
                         if present.get(t, (bk, 0))[1] < self.shards.count()}
            expired = sorted(bk.table for bk, _ in present.values() if bk.end <= horizon)
            if expired:
                self.shards.register([], expired, self.options.vindex)
                for t in expired:
                    self._buckets.pop(t, None)
                for t in expired:
                    await self.shards.drop_table(t)
                report.dropped = expired
            if to_create:
                await self._create_buckets(list(to_create.values()))
                report.created = sorted(to_create)
        return report

    async def drop(self) -> None:
        """Drop every table of the inbox on every shard (its messages and pointers)."""
        async with self._lock:
            present = await self._discover()
            tables = [*sorted(present), self.pointers_table]
            self.shards.register([], tables, self.options.vindex)
            self._buckets.clear()
            for t in tables:
                await self.shards.drop_table(t)
            await self.shards.each_with(
                lambda dialect: (sql.options_delete_sql(dialect), [self.name]))
            self._opened = False

    # -- writes -------------------------------------------------------------------

    async def append(
        self,
        user: Any,
        body: str | None,
        *,
        session: Any | None = None,
        ts: int | None = None,
        msg_id: int | None = None,
    ) -> Message:
        """Append one message to ``user``'s inbox, in ``session``'s transaction if open.

        ``ts`` (µs) defaults to the store's clock; ``msg_id`` to a new
        time-ordered id. Without a session the insert commits at once.
        """
        _check_user(user)
        await self._ready()
        now = self.now()
        ts = now if ts is None else int(ts)
        if ts < now - int(self.options.retention_s * US) or ts < 0:
            raise InvalidArgument(
                f"inbox {self.name}: message time {ts} µs is older than the retention "
                f"({self.options.retention_s} s) and would be dropped at once"
            )
        bucket = self._bucket(ts)
        targets = [bucket]
        if self.options.forward_insert and ts >= bucket.end - self.options.window_us:
            targets.append(next_bucket(self.name, self.options.granularity, bucket))
        in_tx = session is not None and session.in_transaction
        for b in targets:
            await self._ensure_bucket(b, in_transaction=in_tx)
        msg = Message(user, ts, self._ids.next(ts) if msg_id is None else int(msg_id), body)
        bind = {"user_id": user, "ts": msg.ts, "msg_id": msg.msg_id, "body": body}
        s = session if session is not None else self.gate.session(self.keyspace, identity=TRUSTED)
        if len(targets) == 1:
            await self.gate.execute(s, sql.insert_sql(self._q(bucket.table)), bind)
            return msg
        own = not s.in_transaction
        if own:
            await self.gate.begin(s)
        try:
            for b in targets:
                await self.gate.execute(s, sql.insert_sql(self._q(b.table)), bind)
        except BaseException:
            if own and s.in_transaction:
                await self.gate.rollback(s)
            raise
        if own:
            await self.gate.commit(s)
        return msg

    async def commit(
        self, user: Any, consumer: str, pointer: Pointer | str, *, session: Any | None = None
    ) -> None:
        """Store ``consumer``'s pointer for ``user`` (last writer wins)."""
        _check_user(user)
        check_consumer(consumer)
        p = Pointer.decode(pointer) if isinstance(pointer, str) else pointer
        if not isinstance(p, Pointer):
            raise InvalidArgument(f"bad inbox pointer {pointer!r}: pass a pointer a read returned")
        await self._ready()
        bind = {
            "user_id": user, "consumer": consumer, "ts": p.ts, "msg_id": p.msg_id,
            "recent": ",".join(f"{t}.{i}" for t, i in p.recent), "updated_at": self.now(),
        }
        s = session if session is not None else self.gate.session(self.keyspace, identity=TRUSTED)
        table = self._q(self.pointers_table)
        res = await self.gate.execute(s, sql.pointer_update_sql(table), bind)
        if res.rows_affected:
            return
        try:
            await self.gate.execute(s, sql.pointer_insert_sql(table), bind)
        except AlreadyExists:  # a concurrent first commit won; overwrite it
            await self.gate.execute(s, sql.pointer_update_sql(table), bind)

    # -- reads --------------------------------------------------------------------

    async def committed(
        self, user: Any, consumer: str, *, session: Any | None = None
    ) -> Pointer | None:
        """``consumer``'s committed pointer for ``user``, or None."""
        _check_user(user)
        check_consumer(consumer)
        await self._ready()
        s = session if session is not None else self.gate.session(self.keyspace, identity=TRUSTED)
        res = await self.gate.execute(
            s, sql.pointer_select_sql(self._q(self.pointers_table)),
            {"user_id": user, "consumer": consumer})
        if not res.rows:
            return None
        ts, msg_id, recent = res.rows[0]
        text = f"p1:{int(ts)}.{int(msg_id)}:{recent or ''}"
        return Pointer.decode(text)

    async def read(
        self,
        user: Any,
        *,
        after: Pointer | str | None = None,
        limit: int = 100,
        session: Any | None = None,
    ) -> InboxRead:
        """Up to ``limit`` messages of ``user`` not yet seen through ``after``.

        ``after`` is a pointer a previous read returned (or its ``encode()``
        text); None reads from the oldest retained message. Commit the
        returned pointer with :meth:`commit` once the messages are handled.
        """
        _check_user(user)
        if not isinstance(limit, int) or not 1 <= limit <= MAX_READ_LIMIT:
            raise InvalidArgument(f"read limit {limit!r}: 1..{MAX_READ_LIMIT}")
        p = Pointer.decode(after) if isinstance(after, str) else after
        if p is not None and not isinstance(p, Pointer):
            raise InvalidArgument(f"bad inbox pointer {after!r}: pass a pointer a read returned")
        await self._ready()
        window = self.options.window_us
        d = Delivery(p, window_us=window, limit=limit, max_recent=self.options.max_recent)
        page = _page_size(limit + (len(p.recent) if p is not None else 0))
        lo = p.scan_from(window) if p is not None else 0
        s = session if session is not None else self.gate.session(self.keyspace, identity=TRUSTED)
        for b in buckets_to_read(list(self._buckets.values()), p, window_us=window,
                                 now=self.now(), forward_insert=self.options.forward_insert):
            if await self._scan_bucket(s, b, user, lo, page, d):
                break
        return InboxRead(d.messages, d.pointer(), d.full)

    async def read_committed(self, user: Any, consumer: str, *, limit: int = 100) -> InboxRead:
        """:meth:`read` after ``consumer``'s committed pointer."""
        return await self.read(user, after=await self.committed(user, consumer), limit=limit)

    async def _scan_bucket(
        self, s: Any, b: Bucket, user: Any, lo: int, page: int, d: Delivery
    ) -> bool:
        """Offer bucket ``b``'s rows of ``user`` from ``ts >= lo``; True once ``d`` is full."""
        table = self._q(b.table)
        stmt, bind = sql.scan_sql(table, page), {"user_id": user, "lo": lo}
        while True:
            try:
                res = await self.gate.execute(s, stmt, bind)
            except NotFound:
                if s.in_transaction:
                    raise
                # Dropped by another process since we looked: forget it, skip it.
                self._refreshed_at = -math.inf
                return False
            for ts, msg_id, body in res.rows:
                if d.offer(Message(user, int(ts), int(msg_id), body)):
                    return True
            if len(res.rows) < page:
                return False
            last = res.rows[-1]
            stmt = sql.scan_after_sql(table, page)
            bind = {"user_id": user, "ts": int(last[0]), "msg_id": int(last[1])}

    # -- bulk load ------------------------------------------------------------------

    async def bulk_load(self, messages: Sequence[tuple[Any, int, str | None]]) -> int:
        """Write many ``(user, ts, body)`` messages straight into the shards' tables.

        For loading and migrations: it bypasses the gate (each shard's part of
        each bucket is one transaction; there is no transaction across shards)
        and uses COPY on PostgreSQL. Buckets are created as needed;
        ``forward_insert`` copies are written too. Returns the messages written.
        Needs ``pyarrow`` (the ``spark`` extra).
        """
        import pyarrow as pa

        from shardgate.backends.bulk import copy as bulk

        await self._ready()
        if not messages:
            return 0
        users = [m[0] for m in messages]
        for u in users[:1]:
            _check_user(u)
        shard_of = self.shards_of(users)
        groups: dict[tuple[str, str], list[tuple[Any, int, int, str | None]]] = {}
        window = self.options.window_us
        needed: dict[str, Bucket] = {}
        ids = self._ids.next_many([int(m[1]) for m in messages])
        bucket = self._bucket(int(messages[0][1]))
        for (user, ts, body), shard, mid in zip(messages, shard_of, ids, strict=True):
            ts = int(ts)
            if not bucket.start <= ts < bucket.end:
                bucket = self._bucket(ts)
            row = (user, ts, mid, body)
            needed[bucket.table] = bucket
            groups.setdefault((bucket.table, shard), []).append(row)
            if self.options.forward_insert and ts >= bucket.end - window:
                nb = next_bucket(self.name, self.options.granularity, bucket)
                needed[nb.table] = nb
                groups.setdefault((nb.table, shard), []).append(row)
        missing = [b for t, b in needed.items() if t not in self._buckets]
        if missing:
            async with self._lock:
                await self._create_buckets(missing)
        urls = {s.name: s.url for s in self.gate.topology.keyspace(self.keyspace).shards}
        user_type = pa.int64() if self.options.user_type == "bigint" else pa.string()

        async def load_shard(shard: str) -> None:
            for (table, sh), rows in sorted(groups.items(), key=lambda kv: kv[0]):
                if sh != shard:
                    continue
                rows.sort(key=lambda r: (r[0], r[1], r[2]))  # primary key order
                cols = list(zip(*rows, strict=True))
                data = pa.table({
                    "user_id": pa.array(cols[0], type=user_type),
                    "ts": pa.array(cols[1], type=pa.int64()),
                    "msg_id": pa.array(cols[2], type=pa.int64()),
                    "body": pa.array(cols[3], type=pa.string()),
                })
                await asyncio.to_thread(bulk.ingest, urls[shard], table, data)

        await asyncio.gather(*(load_shard(sh) for sh in sorted({sh for _, sh in groups})))
        return len(messages)

    def shards_of(self, users: Sequence[Any]) -> list[str]:
        """The shard holding each user's inbox (computed, no I/O)."""
        return self.shards.shards_of(users, self.options.vindex)

    # -- buckets and tables ---------------------------------------------------------

    async def count_rows(self, table: str) -> int:
        """Rows of one of this inbox's tables over every shard (an exact count)."""
        results = await self.shards.each(lambda _dialect: f"SELECT COUNT(*) FROM {table}")
        return sum(int(r.rows[0][0]) for r in results)

    def _q(self, table: str) -> str:
        return f"{self.keyspace}.{table}"

    async def _discover(self) -> dict[str, tuple[Bucket, int]]:
        """Bucket tables found in the databases: table -> (bucket, shards holding it)."""
        results = await self.shards.each(sql.list_tables_sql)
        found: dict[str, tuple[Bucket, int]] = {}
        has_pointers = 0
        for res in results:
            for (table,) in res.rows:
                t = str(table).lower()
                if t == self.pointers_table:
                    has_pointers += 1
                    continue
                b = parse_bucket_table(self.name, self.options.granularity, t)
                if b is not None:
                    found[t] = (b, found.get(t, (b, 0))[1] + 1)
        if has_pointers < len(results):
            raise NotFound(
                f"inbox {self.keyspace}.{self.name} does not exist (no table "
                f"{self.pointers_table} on {len(results) - has_pointers} shard(s)): "
                "create it with InboxStore.create() or `shardgate inbox create`"
            )
        return found

    async def _refresh(self) -> None:
        """Re-read the buckets from the databases; keep the VSchema in step. Holds the lock."""
        present = await self._discover()
        complete = {t: b for t, (b, n) in present.items() if n == self.shards.count()}
        gone = [t for t in self._buckets if t not in complete]
        self.shards.register([self.pointers_table, *complete], gone, self.options.vindex)
        self._buckets = complete
        self._refreshed_at = time.monotonic()

    async def _ensure_bucket(self, b: Bucket, *, in_transaction: bool) -> None:
        if b.table in self._buckets:
            return
        async with self._lock:
            if b.table in self._buckets:
                return
            await self._refresh()
            if b.table in self._buckets:
                return
            if in_transaction:
                raise FailedPrecondition(
                    f"inbox {self.name}: bucket table {b.table} does not exist yet and tables "
                    "are not created inside a transaction; run maintain() regularly (it "
                    f"creates {self.options.precreate} bucket(s) ahead) or append outside "
                    "a transaction"
                )
            await self._create_buckets([b])

    async def _create_buckets(self, buckets: Iterable[Bucket]) -> None:
        """Create ``buckets`` on every shard, then declare them. Holds the lock."""
        todo = sorted(buckets)
        user_type = self.options.user_type
        for b in todo:
            table = b.table
            await self.shards.each(partial(sql.bucket_ddl, table, user_type=user_type))
        self.shards.register([b.table for b in todo], [], self.options.vindex)
        for b in todo:
            self._buckets[b.table] = b



def _check_user(user: Any) -> None:
    if user is None or isinstance(user, bool | float):
        raise InvalidArgument(f"inbox user {user!r}: give an integer or a string")


def _page_size(n: int) -> int:
    """A power of two >= ``n`` (few distinct statement texts for the plan cache)."""
    size = 16
    while size < n and size < MAX_PAGE:
        size *= 2
    return size
