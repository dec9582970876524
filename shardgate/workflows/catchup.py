"""Catch-up: a source shard's change log replayed on the target shards.

:class:`Applier` turns committed source transactions into idempotent writes
(upsert the after-image, delete the before-image's key; see
:mod:`shardgate.workflows.rowsql`) on the target whose key range holds each
image's keyspace id (every target, for a reference table), in commit order.
An update that moves a row to another target (its vindex column changed) or
changes its key deletes the old row there. ``keep(table, pk)`` filters changes
of rows the copy has not reached yet (the copy will read them, newer, from its
next snapshot). Its writes go
through a frozen target's triggers (:mod:`shardgate.workflows.freeze`): the
reverse stream writes the frozen sources, the forward one after a
``reverse-traffic`` the frozen targets.

:func:`catch_up` reads the log from a position and hands transactions to the
applier in batches; after each applied batch it reports the new position
(the caller saves it). Invariant: a reported position is never ahead of what
the targets committed, so resuming from a saved position replays at most the
last batch, which the idempotent writes absorb.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from shardgate.backends.base import Backend, transaction
from shardgate.backends.changes import ChangeLog, Heartbeat, LogItem, Transaction
from shardgate.errors import Unsupported
from shardgate.event_token import position_key as gtid_key
from shardgate.keys import KeyRange
from shardgate.sql.dialects import Dialect
from shardgate.workflows.freeze import ApplyPass
from shardgate.workflows.rowsql import MovingTable, RowWriter, has_secondary_unique

#: source transactions applied per target transaction at most
APPLY_BATCH = 200
#: heartbeat interval asked of the change log (also how often a deadline is checked)
HEARTBEAT_S = 0.1

Keep = Callable[[str, tuple[Any, ...]], bool]
Op = tuple[str, RowWriter, tuple[Any, ...]]  # ("upsert" | "delete", writer, row or key)


def _lsn_key(position: str) -> int:
    hi, lo = position.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _gtid_key(position: str) -> int:
    key = gtid_key(position)
    if len(key) != 2:
        raise Unsupported(
            f"MariaDB position {position!r} names several GTID domains: resharding "
            "orders a source's binlog by the sequence number of one domain")
    return key[1]


#: per dialect, a change-log position as an integer (the change logs' own formats)
_POSITION_KEYS: dict[Dialect, Callable[[str], int]] = {
    Dialect.SQLITE: int, Dialect.POSTGRES: _lsn_key, Dialect.MYSQL: _gtid_key}
#: per dialect, SQL giving a position every committed write is at or before (else the
#: log's current position)
_FINAL_POSITION_SQL: dict[Dialect, str] = {
    Dialect.POSTGRES: "SELECT pg_current_wal_flush_lsn()::text"}


def position_key(dialect: Dialect, position: str | None) -> int:
    """A position as an integer that grows with the log (SQLite seq, PostgreSQL LSN,
    MariaDB: the sequence number of a GTID of one replication domain).

    A MariaDB position naming several domains has no such order (each domain
    counts on its own): refused with ``UNIMPLEMENTED``.
    """
    if position is None or position == "":
        return -1
    return _POSITION_KEYS[dialect](position)


async def final_position(backend: Backend, log: ChangeLog) -> str:
    """The position of ``log`` every write committed on its frozen shard is at or before.

    PostgreSQL: the WAL flush position, not the insert position: each commit
    was flushed before it was acknowledged and the freeze waited for the
    commits in flight, so nothing committed is past it, and the log reader
    reaches it without waiting for the WAL writer.
    """
    sql = _FINAL_POSITION_SQL.get(backend.dialect)
    if sql is not None:
        return str((await backend.execute(sql)).rows[0][0])
    return await log.current_position()



class Applier:
    """Applies source transactions to the targets (see the module docstring)."""

    def __init__(self, tables: Mapping[str, MovingTable], targets: Sequence[tuple[str, KeyRange]],
                 backends: Mapping[str, Backend]) -> None:
        self.tables = dict(tables)
        self.targets = list(targets)
        self.backends = dict(backends)
        self.writers = {(t, name): RowWriter(backends[t], table)
                        for t, _ in targets for name, table in tables.items()}
        #: row changes applied so far
        self.applied = 0
        self._pass = ApplyPass()
        #: per (target, table): whether the target table has a unique key besides its
        #: primary key (its writes then keep their order; see :meth:`_plan`)
        self._ordered: dict[tuple[str, str], bool] = {}

    def _ops(self, txs: Sequence[Transaction], keep: Keep | None) -> dict[str, list[Op]]:
        ops: dict[str, list[Op]] = {}
        for tx in txs:
            for ch in tx.changes:
                table = self.tables.get(ch.table)
                if table is None:
                    continue
                old: tuple[list[str], tuple[Any, ...]] | None = None
                new: tuple[list[str], tuple[Any, ...], tuple[Any, ...]] | None = None
                if ch.before is not None:
                    row = tuple(ch.before.get(c) for c in table.columns)
                    key = table.pk_of(row)
                    if keep is None or keep(table.name, key):
                        old = (table.owners(row, self.targets), key)
                if ch.after is not None:
                    row = tuple(ch.after.get(c) for c in table.columns)
                    key = table.pk_of(row)
                    if keep is None or keep(table.name, key):
                        new = (table.owners(row, self.targets), key, row)
                if old is not None:
                    for target in old[0]:
                        if new is None or new[1] != old[1] or target not in new[0]:
                            ops.setdefault(target, []).append(
                                ("delete", self.writers[(target, table.name)], old[1]))
                if new is not None:
                    for target in new[0]:
                        ops.setdefault(target, []).append(
                            ("upsert", self.writers[(target, table.name)], new[2]))
                self.applied += 1
        return ops

    async def apply(self, txs: Sequence[Transaction], keep: Keep | None = None) -> None:
        """Apply ``txs`` (in commit order) to the targets; each target in one transaction."""
        for target, ops in self._ops(txs, keep).items():
            backend = self.backends[target]
            conn = await backend.acquire()
            try:
                async with transaction(conn):
                    await self._pass.begin(backend, conn)
                    for kind, writer, rows in await self._plan(target, conn, ops):
                        if kind == "upsert":
                            await writer.upsert(conn, rows)
                        else:
                            await writer.delete(conn, rows)
                    await self._pass.end(backend, conn)
            except BaseException:
                self._pass.abandon(backend, conn)
                raise
            finally:
                await backend.release(conn)


    async def _plan(self, target: str, conn: Any, ops: Sequence[Op]
                    ) -> list[tuple[str, RowWriter, list[tuple[Any, ...]]]]:
        """The statements' worth of ``ops`` on one target, table by table (no foreign
        keys between moving tables: their order does not matter). A table whose only
        unique key is its primary key gets each key's last op alone (an upsert writes
        the whole image, so the last one wins): its deletes in one go, then its
        upserts, a few statements whatever the number of changes. Other tables keep
        the ops' order (:func:`_runs`): a row may take a unique value another row
        gives up in the same batch."""
        by_table: dict[str, list[Op]] = {}
        for op in ops:
            by_table.setdefault(op[1].table.name, []).append(op)
        out: list[tuple[str, RowWriter, list[tuple[Any, ...]]]] = []
        for name, table_ops in by_table.items():
            ordered = self._ordered.get((target, name))
            if ordered is None:
                ordered = self._ordered[(target, name)] = await has_secondary_unique(
                    conn, self.backends[target].dialect, name)
            if ordered:
                out += _runs(table_ops)
                continue
            last: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
            writer = table_ops[0][1]
            for kind, _, values in table_ops:
                key = values if kind == "delete" else writer.table.pk_of(values)
                last[key] = (kind, values)
            deletes = [v for k, v in last.values() if k == "delete"]
            upserts = [v for k, v in last.values() if k == "upsert"]
            if deletes:
                out.append(("delete", writer, deletes))
            if upserts:
                out.append(("upsert", writer, upserts))
        return out


def _runs(ops: Sequence[Op]) -> list[tuple[str, RowWriter, list[tuple[Any, ...]]]]:
    """Consecutive ops of one kind on one table, each key once, as one statement's worth:
    the order of the ops on any one key is kept, so the result is the same."""
    out: list[tuple[str, RowWriter, list[tuple[Any, ...]]]] = []
    keys: set[tuple[Any, ...]] = set()
    for kind, writer, values in ops:
        key = values if kind == "delete" else writer.table.pk_of(values)
        if not out or out[-1][0] != kind or out[-1][1] is not writer or key in keys:
            out.append((kind, writer, []))
            keys = set()
        out[-1][2].append(values)
        keys.add(key)
    return out


Report = Callable[[str, float], Awaitable[None]]


class LogCursor:
    """A change-log reader kept open between catch-ups (starting a reader can cost
    more than what it then reads: PostgreSQL decodes from its slot's restart point).

    ``position``: everything up to it has been handed out and applied; an item
    read past a bound is pushed back and handed out first next time.
    """

    def __init__(self, log: ChangeLog, start: str | None) -> None:
        self.log = log
        self.position = start
        self._reader: AsyncIterator[LogItem] | None = None
        self._held: LogItem | None = None

    async def next(self) -> LogItem:
        if self._held is not None:
            item, self._held = self._held, None
            return item
        if self._reader is None:
            self._reader = aiter(self.log.read(self.position, heartbeat_s=HEARTBEAT_S))
        return await anext(self._reader)

    def push_back(self, item: LogItem) -> None:
        self._held = item

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.aclose()  # type: ignore[attr-defined]


async def catch_up(cursor: LogCursor, dialect: Dialect, applier: Applier, *,
                   report: Report, until: str | None = None, keep: Keep | None = None,
                   deadline: float | None = None) -> tuple[str | None, bool]:
    """Replay the log after ``cursor.position`` on the targets.

    With ``until``: applies exactly the transactions whose position is at or
    below it, then stops (the position reached is then ``until``). Without:
    stops once the log is drained (a heartbeat: nothing more is committed).
    Either way stops at ``deadline`` (monotonic). Returns ``(position reached,
    whether it got there)``; ``report(position, lag seconds)`` runs after each
    applied batch and at each heartbeat.
    """
    pos = cursor.position
    limit = position_key(dialect, until) if until is not None else None
    if limit is not None and position_key(dialect, pos) >= limit:
        return pos, True
    batch: list[Transaction] = []
    batch_t0 = 0.0
    held: str | None = None  # a heartbeat's position read after the batch's transactions
    done = False

    async def flush() -> None:
        nonlocal batch, pos, held
        if batch:
            await applier.apply(batch, keep)
            pos = cursor.position = batch[-1].token.position
            if held is not None and position_key(dialect, held) > position_key(dialect, pos):
                pos = cursor.position = held
            held = None
            lag = max(0.0, time.time() - batch[-1].token.timestamp)
            batch = []
            await report(pos or "", lag)

    while True:
        item = await cursor.next()
        if isinstance(item, Heartbeat):
            at = position_key(dialect, item.position)
            if limit is not None and at >= limit:
                done = True
            elif limit is not None and batch and time.monotonic() - batch_t0 < HEARTBEAT_S:
                # A heartbeat also marks other databases' transactions (MariaDB's
                # server-wide binlog): keep gathering a batch for up to HEARTBEAT_S
                # rather than commit on the targets after every transaction.
                held = item.position
            else:
                await flush()
                if at > position_key(dialect, pos):
                    pos = cursor.position = item.position
                done = limit is None  # drained: nothing more is committed
        else:
            at = position_key(dialect, item.token.position)
            if limit is not None and at > limit:
                cursor.push_back(item)  # past the bound: not applied
                done = True
            else:
                if not batch:
                    batch_t0 = time.monotonic()
                batch.append(item)
                done = limit is not None and at == limit
                if done or len(batch) >= APPLY_BATCH:
                    await flush()
        if done:
            await flush()
            if until is not None:
                pos = cursor.position = until
            await report(pos or "", 0.0)
            return pos, True
        if deadline is not None and time.monotonic() >= deadline:
            await flush()
            return pos, False
