"""The copy phase: a source shard's rows, under one consistent snapshot, to the targets.

A **copy cycle** (:func:`copy_cycle`) of one source shard:

1. opens a read snapshot of the source together with its change-log position
   ``P`` (:func:`open_snapshot`): every transaction committed at or before
   ``P`` is in the snapshot, none after it;
2. catches the targets up from the stream's saved position to exactly ``P``,
   keeping only changes of rows the copy already wrote (key at or below the
   table's last copied key): those rows now hold their state at ``P``;
3. reads the rows after the last copied key in primary-key order from one
   cursor on the snapshot, ``batch`` at a time, and writes each to the target
   owning its keyspace id (rows of no target's range are skipped and counted),
   a batch while the next is read: PostgreSQL targets by ``COPY`` (those keys
   are absent from the targets: see the unsaved tail below), others, or a
   ``COPY`` meeting a key already there, by upsert
   (:meth:`~shardgate.workflows.rowsql.RowWriter.write_new`);
4. after a batch is committed on the targets, saves ``(P, last key)`` (at
   most every ``SAVE_EVERY_S``, and at the end of a table and of a cycle).

A process resuming a stream first deletes from the targets this source's rows
after each table's saved last key (:func:`_clean_tail`): a batch written but
not saved before a crash is not covered by catch-up, so its rows must go and
be copied again.

Invariant (what a saved ``(position, last key)`` means): on the targets,
every row with a key at or below the last key holds its state at
``position``; so a crash anywhere redoes at most one batch, and catch-up
(:mod:`shardgate.workflows.catchup`) from ``position`` brings those rows
forward. A cycle ends after ``slice_s`` seconds (the snapshot is not held
longer) or when the tables are done; the next cycle takes a new snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from shardgate.backends.base import Backend, Connection, transaction
from shardgate.backends.changes import ChangeLog
from shardgate.backends.copytext import TextRows
from shardgate.errors import Unsupported
from shardgate.keys import KeyRange
from shardgate.sql.dialects import Dialect
from shardgate.workflows.catchup import Applier, LogCursor, catch_up
from shardgate.workflows.mariadb import begin_snapshot
from shardgate.workflows.placing import owners
from shardgate.workflows.rowsql import MovingTable, RowWriter, quote, select_after

#: rows read and written per batch
DEFAULT_BATCH = 10_000
#: how often the copy saves its position (at most; a crash redoes what was not saved)
SAVE_EVERY_S = 0.5
#: the longest one snapshot is held open (seconds)
SLICE_S = 30.0


async def open_snapshot(backend: Backend, log: ChangeLog) -> tuple[Connection, str]:
    """A connection in a read transaction and the change-log position of its snapshot.

    SQLite: a deferred read transaction whose first read is the change
    sequence itself (WAL: the snapshot is fixed by that read, and SQLite's
    one writer makes the sequence exactly the last commit in it).
    PostgreSQL: a ``REPEATABLE READ`` transaction importing the snapshot a
    new temporary logical slot exported, and that slot's consistent point
    (:meth:`~shardgate.backends.changes.ChangeLog.exported_snapshot`).
    MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and the GTID of its
    binlog position (:func:`shardgate.workflows.mariadb.begin_snapshot`).
    """
    begin = _SNAPSHOTS.get(backend.dialect)
    if begin is None:
        raise Unsupported(f"copying from a {backend.dialect} source is not supported")
    conn = await backend.acquire()
    try:
        pos = await begin(conn, log)
    except BaseException:
        await _end(backend, conn)
        raise
    return conn, pos


async def _sqlite_snapshot(conn: Connection, log: ChangeLog) -> str:
    await conn.execute("BEGIN")
    return str((await conn.execute(log.position_sql)).rows[0][0])


async def _postgres_snapshot(conn: Connection, log: ChangeLog) -> str:
    async with log.exported_snapshot() as (snapshot, pos):
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
    return pos


async def _mysql_snapshot(conn: Connection, log: ChangeLog) -> str:
    return await begin_snapshot(conn)


#: per dialect: open a read snapshot on a connection, return its change-log position
_SNAPSHOTS: dict[Dialect, Callable[[Connection, ChangeLog], Awaitable[str]]] = {
    Dialect.SQLITE: _sqlite_snapshot, Dialect.POSTGRES: _postgres_snapshot,
    Dialect.MYSQL: _mysql_snapshot}


async def _end(backend: Backend, conn: Connection) -> None:
    try:
        if conn.in_transaction:
            await conn.execute("ROLLBACK")
    finally:
        await backend.release(conn)


Save = Callable[[], Awaitable[None]]
Progress = Callable[[int], None]


async def copy_cycle(stream: dict[str, Any], *, source: Backend, log: ChangeLog,
                     cursor: Callable[[str], Awaitable[LogCursor]],
                     tables: Mapping[str, MovingTable], targets: list[tuple[str, KeyRange]],
                     target_backends: Mapping[str, Backend], applier: Applier, save: Save,
                     batch: int = DEFAULT_BATCH, slice_s: float = SLICE_S,
                     progress: Progress | None = None,
                     clean_tail: KeyRange | None = None,
                     placed: Mapping[str, MovingTable] | None = None) -> bool:
    """One copy cycle of ``stream`` (the source's record, updated in place; see the
    module docstring); True when every table is copied.

    ``clean_tail``: the source's key range, on the first cycle of a process that
    resumes the stream (see :func:`_clean_tail`); ``placed``: the tables with the
    vindexes that place their rows on the sources (default ``tables``: a reshard;
    a MoveTables' source keyspace may place them by another vindex).
    """
    if clean_tail is not None:
        await _clean_tail(stream, tables, clean_tail, target_backends, applier,
                          placed or tables)
    conn, snap_pos = await open_snapshot(source, log)
    try:
        if stream.get("pos") is not None:
            async def report(pos: str, lag: float) -> None:
                stream["lag_s"] = lag

            await catch_up(await cursor(stream["pos"]), source.dialect, applier, report=report,
                           until=snap_pos, keep=_copied_keep(stream, tables))
        stream["pos"] = snap_pos
        await save()
        saved = [time.monotonic()]
        ends = time.monotonic() + slice_s
        for name in sorted(tables):
            state = stream["tables"][name]
            if state["done"]:
                continue
            table = tables[name]
            started = time.monotonic()
            oids = await _text_types(conn, source, table, targets, target_backends)
            if oids is not None:
                finished = await _copy_text(conn, stream, state, table, targets,
                                            target_backends, applier, oids, batch=batch,
                                            ends=ends, save=save, saved=saved,
                                            progress=progress)
            else:
                finished = await _copy_rows(conn, source, stream, state, table, targets,
                                            target_backends, applier, batch=batch,
                                            ends=ends, save=save, saved=saved,
                                            progress=progress)
            state["done"] = finished
            stream["copy_s"] = float(stream.get("copy_s", 0.0)) + time.monotonic() - started
            await save()  # after the rows it covers are committed on the targets
            if not state["done"]:
                return False
        return True
    finally:
        await _end(source, conn)


async def _text_types(conn: Connection, source: Backend, table: MovingTable,
                      targets: list[tuple[str, KeyRange]],
                      target_backends: Mapping[str, Backend]) -> list[int] | None:
    """The column types of ``table`` if its rows can move as COPY text (a source
    connection that copies text, PostgreSQL's, targets of its kind, portable column
    types), else None."""
    if not conn.supports_text_copy \
            or any(target_backends[t].dialect is not source.dialect for t, _ in targets):
        return None
    sql, params = select_after(source.dialect, table, None, 0, source.placeholder)
    return await conn.text_copy_types(sql, params)


async def _copy_text(conn: Connection, stream: dict[str, Any], state: dict[str, Any],
                     table: MovingTable, targets: list[tuple[str, KeyRange]],
                     target_backends: Mapping[str, Backend], applier: Applier,
                     oids: list[int], *, batch: int, ends: float, save: Save,
                     saved: list[float], progress: Progress | None) -> bool:
    """Copy ``table`` as COPY text lines, ``batch`` rows per ``COPY (SELECT ... LIMIT)``,
    a batch written while the next is read; True when the table is done."""
    last = saved_key(state)
    columns = [quote(Dialect.POSTGRES, c) for c in table.columns]
    order = [quote(Dialect.POSTGRES, c) for c in table.pk]
    writing: asyncio.Future[Any] | None = None
    written: tuple[int, tuple[Any, ...] | None] = (0, None)
    try:
        while True:
            sql, params = select_after(Dialect.POSTGRES, table, last, batch, "%s")
            rows = await conn.copy_out_text(sql, params, columns, oids, order)
            if writing is not None:
                await writing
                writing = None
                await _after_batch(state, table, *written, save, saved, progress)
            if not rows:
                return True
            parts = _split_text(stream, table, rows, targets)
            last = table.pk_of(rows.row(len(rows) - 1))
            written = (len(rows), last)
            writing = asyncio.gather(*(
                _write_text(target_backends[t], applier.writers[(t, table.name)], conn,
                            rows, which)
                for t, which in parts.items()))
            if len(rows) < batch or time.monotonic() >= ends:
                await writing
                writing = None
                await _after_batch(state, table, *written, save, saved, progress)
                return len(rows) < batch
    except BaseException:
        if writing is not None:
            writing.cancel()
            with contextlib.suppress(BaseException):
                await writing
        raise


async def _copy_rows(conn: Connection, source: Backend, stream: dict[str, Any],
                     state: dict[str, Any], table: MovingTable,
                     targets: list[tuple[str, KeyRange]],
                     target_backends: Mapping[str, Backend], applier: Applier, *,
                     batch: int, ends: float, save: Save, saved: list[float],
                     progress: Progress | None) -> bool:
    """Copy ``table`` as typed rows from one cursor, a batch written while the next is
    read; True when the table is done."""
    sql, params = select_after(source.dialect, table, saved_key(state), 0,
                               source.placeholder)
    # Each batch is written while the next one is read (the source's
    # snapshot connection and the targets' connections are distinct).
    writing: asyncio.Future[Any] | None = None
    written: tuple[int, tuple[Any, ...] | None] = (0, None)
    finished = False
    async with _closing(conn.stream(sql, params, batch_size=batch)) as batches:
        try:
            async for _, rows in batches:
                parts = _split(stream, table, rows, targets)
                if writing is not None:
                    await writing
                    await _after_batch(state, table, *written, save, saved, progress)
                written = (len(rows), table.pk_of(rows[-1]) if rows else None)
                writing = asyncio.gather(*(
                    _write(target_backends[t], applier.writers[(t, table.name)], part)
                    for t, part in parts.items()))
                if time.monotonic() >= ends:
                    break
            else:
                finished = True
            if writing is not None:
                await writing
                writing = None
                await _after_batch(state, table, *written, save, saved, progress)
        except BaseException:
            if writing is not None:
                writing.cancel()
                with contextlib.suppress(BaseException):
                    await writing
            raise
    return finished


@contextlib.asynccontextmanager
async def _closing(it: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """``it``, closed (its cursor with it) however the block ends."""
    try:
        yield it
    finally:
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


def _split(stream: dict[str, Any], table: MovingTable, rows: list[tuple[Any, ...]],
           targets: list[tuple[str, KeyRange]]) -> dict[str, list[tuple[Any, ...]]]:
    """``rows`` by the target owning each (rows no target owns are counted as skipped;
    a reference table's rows go to every target)."""
    if table.reference:
        return {name: rows for name, _ in targets} if rows else {}
    column = table.columns.index(table.vindex_column or "")
    by_target: dict[str, list[tuple[Any, ...]]] = {}
    for row, owner in zip(rows, owners(table, [r[column] for r in rows], targets),
                          strict=True):
        if owner is not None:
            by_target.setdefault(owner, []).append(row)
    _skipped(stream, len(rows) - sum(len(p) for p in by_target.values()))
    return by_target


def _split_text(stream: dict[str, Any], table: MovingTable, rows: TextRows,
                targets: list[tuple[str, KeyRange]]) -> dict[str, list[int]]:
    """:func:`_split` of a COPY text batch: the indexes of the rows of each target."""
    if table.reference:
        return {name: list(range(len(rows))) for name, _ in targets} if len(rows) else {}
    values = rows.column(table.columns.index(table.vindex_column or ""))
    by_target: dict[str, list[int]] = {}
    for k, owner in enumerate(owners(table, values, targets)):
        if owner is not None:
            by_target.setdefault(owner, []).append(k)
    _skipped(stream, len(rows) - sum(len(p) for p in by_target.values()))
    return by_target


def _skipped(stream: dict[str, Any], skipped: int) -> None:
    if skipped:
        stream["skipped"] = int(stream.get("skipped", 0)) + skipped


async def _after_batch(state: dict[str, Any], table: MovingTable, count: int,
                       last: tuple[Any, ...] | None, save: Save, saved: list[float],
                       progress: Progress | None) -> None:
    """Account a batch of ``count`` rows (the last with key ``last``) committed on every
    target; save at most every ``SAVE_EVERY_S`` (``saved[0]``: when last)."""
    state["rows"] += count
    if last is not None:
        state["last"] = [_key_doc(v) for v in last]
    now = time.monotonic()
    if now - saved[0] >= SAVE_EVERY_S:
        await save()
        saved[0] = now
    if progress is not None:
        progress(count)


async def _write_text(backend: Backend, writer: RowWriter, source: Connection,
                      rows: TextRows, which: list[int]) -> None:
    conn = await backend.acquire()
    try:
        async with transaction(conn):
            await writer.write_text(conn, source, rows, which)
    finally:
        await backend.release(conn)


async def _write(backend: Backend, writer: RowWriter, rows: list[tuple[Any, ...]]) -> None:
    conn = await backend.acquire()
    try:
        async with transaction(conn):
            await writer.write_new(conn, rows)
    finally:
        await backend.release(conn)


async def _clean_tail(stream: dict[str, Any], tables: Mapping[str, MovingTable],
                      source_range: KeyRange, targets: Mapping[str, Backend],
                      applier: Applier, placed: Mapping[str, MovingTable]) -> None:
    """Delete from the targets the rows of this source after each table's last saved key.

    A process killed between writing a batch and saving its last key leaves
    such rows behind; catch-up skips changes after the last key (the copy will
    read those rows again), so a row deleted on the source meanwhile would stay
    on the target for ever. Only rows whose keyspace id is in the source's
    range go (in a merge a target also holds other sources' rows); ``placed[name]``
    computes a row's keyspace id in the source's keyspace.
    """
    for name, table in tables.items():
        owner = placed[name]
        state = stream["tables"][name]
        if state["done"]:
            continue
        for target, backend in targets.items():
            conn = await backend.acquire()
            try:
                stale: list[tuple[Any, ...]] = []
                last = saved_key(state)
                while True:
                    sql, params = select_after(backend.dialect, table, last, DEFAULT_BATCH,
                                               backend.placeholder)
                    rows = (await conn.execute(sql, params)).rows
                    stale.extend(table.pk_of(r) for r, k in zip(rows, owner.ksids(rows),
                                                                strict=True)
                                 if owner.reference
                                 or (k is not None and source_range.contains(k)))
                    if len(rows) < DEFAULT_BATCH:
                        break
                    last = table.pk_of(rows[-1])
                if stale:
                    async with transaction(conn):
                        await applier.writers[(target, name)].delete(conn, stale)
            finally:
                await backend.release(conn)


def _copied_keep(stream: dict[str, Any], tables: Mapping[str, MovingTable]
                 ) -> Callable[[str, tuple[Any, ...]], bool]:
    """Keep the changes of rows the copy already wrote (see the module docstring)."""
    def keep(table: str, key: tuple[Any, ...]) -> bool:
        state = stream["tables"].get(table)
        if state is None:
            return False
        if state["done"]:
            return True
        last = saved_key(state)
        return last is not None and _comparable(key) <= last
    return keep


def saved_key(state: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A table's last copied key as saved in the stream's record (None: nothing yet)."""
    last = state["last"]
    if last is None:
        return None
    return tuple(bytes.fromhex(v["hex"]) if isinstance(v, dict) else v for v in last)


def _key_doc(value: Any) -> Any:
    """A key column's value as the record (JSON) holds it: binary as ``{"hex": ...}``
    (lookup tables keyed by ``(value, keyspace id)``, say); bytes compare as the
    databases order them (memcmp), so the saved key keeps its place in key order."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"hex": bytes(value).hex()}
    return value


def _comparable(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray | memoryview) else v for v in key)
