"""VDiff: the sources and the targets of a reshard compared at one consistent point.

:func:`diff_workflow` (for :meth:`shardgate.workflows.base.Workflow.vdiff`) opens
a snapshot on every source shard, has the targets caught up to exactly the
snapshots' positions, and compares every moving table (:func:`diff_table`). Each table is then
read in primary-key order from every source (one merged sequence) and from
every target (another), and the two sequences are walked side by side:

``processed``  keys seen on either side;
``matching``   keys on both sides with equal rows;
``mismatched`` keys on both sides with different rows;
``extra_source`` keys only the sources have (missing on the targets);
``extra_target`` keys only the targets have.

A reference table is compared between the first source and each target in
turn (every target holds all its rows), the reports summed
(:func:`merge_diffs`).
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardgate.backends.base import Backend, Connection
from shardgate.backends.changes import ChangeLog
from shardgate.sql.dialects import Dialect
from shardgate.workflows.coltypes import normal
from shardgate.workflows.rowcopy import open_snapshot
from shardgate.workflows.rowsql import MovingTable, select_after

PAGE = 1000
#: keys of differences kept per table in the report
SAMPLE = 10


@dataclass
class TableDiff:
    """What VDiff found in one table."""

    table: str
    processed: int = 0
    matching: int = 0
    mismatched: int = 0
    extra_source: int = 0
    extra_target: int = 0
    samples: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.mismatched or self.extra_source or self.extra_target)

    def to_doc(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


Side = tuple[Connection, Dialect, str]  # connection, dialect, placeholder


async def _rows(side: Side, table: MovingTable) -> AsyncIterator[tuple[Any, ...]]:
    conn, dialect, mark = side
    last: tuple[Any, ...] | None = None
    by_kind = [normal(k) for k in table.kinds] or [None] * len(table.columns)
    while True:
        sql, params = select_after(dialect, table, last, PAGE, mark)
        rows = (await conn.execute(sql, params)).rows
        for r in rows:
            yield tuple(_by_kind(f, v) for f, v in zip(by_kind, r, strict=True))
        if len(rows) < PAGE:
            return
        last = table.pk_of(rows[-1])


def _by_kind(f: Any, v: Any) -> Any:
    """``v`` normalised by its column's kind; a value not of that kind (SQLite keeps
    any value in any column) as :func:`_norm` has it."""
    if f is None or v is None:
        return _norm(v)
    try:
        return f(v)
    except (ValueError, TypeError, ArithmeticError):
        return _norm(v)


_STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")


def _norm(v: Any) -> Any:
    """One form for what backends of different kinds return for the same value, for a
    column of no known kind (:func:`shardgate.workflows.coltypes.normal` otherwise): bytes;
    a time as naive UTC (PostgreSQL's ``timestamptz`` is aware, MariaDB's naive, SQLite
    keeps ``CURRENT_TIMESTAMP`` as text)."""
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(datetime.UTC).replace(tzinfo=None)
    if isinstance(v, str) and _STAMP.fullmatch(v):
        return datetime.datetime.fromisoformat(v)
    return v


async def _merged(sides: Sequence[Side], table: MovingTable
                  ) -> AsyncIterator[tuple[Any, ...]]:
    """Rows of every side in one primary-key order (the sides hold disjoint keys)."""
    iters = [_rows(s, table) for s in sides]
    heads: list[tuple[Any, ...] | None] = [await anext(it, None) for it in iters]
    while True:
        live = [i for i, h in enumerate(heads) if h is not None]
        if not live:
            return
        i = min(live, key=lambda j: table.pk_of(heads[j]))  # type: ignore[arg-type]
        row = heads[i]
        assert row is not None
        yield row
        heads[i] = await anext(iters[i], None)


async def diff_table(sources: Sequence[Side], targets: Sequence[Side], table: MovingTable
                     ) -> TableDiff:
    """Compare one table (see the module docstring)."""
    report = TableDiff(table.name)
    src, dst = _merged(sources, table), _merged(targets, table)
    a, b = await anext(src, None), await anext(dst, None)
    while a is not None or b is not None:
        report.processed += 1
        ka = table.pk_of(a) if a is not None else None
        kb = table.pk_of(b) if b is not None else None
        if b is None or (ka is not None and kb is not None and ka < kb):
            report.extra_source += 1
            _sample(report, f"{ka}: only on the sources")
            a = await anext(src, None)
        elif a is None or (kb is not None and ka is not None and kb < ka):
            report.extra_target += 1
            _sample(report, f"{kb}: only on the targets")
            b = await anext(dst, None)
        else:
            if a == b:
                report.matching += 1
            else:
                report.mismatched += 1
                _sample(report, f"{ka}: source {a!r} != target {b!r}")
            a, b = await anext(src, None), await anext(dst, None)
    return report


def _sample(report: TableDiff, text: str) -> None:
    if len(report.samples) < SAMPLE:
        report.samples.append(text)


def merge_diffs(table: str, parts: Sequence[tuple[str, TableDiff]]) -> TableDiff:
    """One report for a reference table compared with each target in turn
    (``parts``: target name and its report): counts summed, samples named by target."""
    out = TableDiff(table)
    for target, part in parts:
        out.processed += part.processed
        out.matching += part.matching
        out.mismatched += part.mismatched
        out.extra_source += part.extra_source
        out.extra_target += part.extra_target
        for text in part.samples:
            _sample(out, f"[{target}] {text}")
    return out


async def diff_workflow(sources: Mapping[str, tuple[Backend, ChangeLog]],
                        targets: Mapping[str, Backend], tables: Iterable[MovingTable],
                        catch_up: Callable[[dict[str, str]], Awaitable[object]]
                        ) -> list[TableDiff]:
    """Compare ``tables`` on the ``sources`` (shard -> database and change log) and
    the ``targets`` at one point: a snapshot on every source, then ``catch_up`` with
    the snapshots' positions brings the targets there, then each table is diffed (a
    reference table between the first source and each target)."""
    async with contextlib.AsyncExitStack() as stack:
        snaps: dict[str, Connection] = {}
        positions: dict[str, str] = {}
        for name, (backend, log) in sources.items():
            conn, pos = await stack.enter_async_context(_snapshot(backend, log))
            snaps[name], positions[name] = conn, pos
        await catch_up(positions)
        tconns = {}
        for t, backend in targets.items():
            tconns[t] = await stack.enter_async_context(_connection(backend))
        reports = []
        for table in tables:
            if table.reference:  # the first source's rows, on every target
                first, (b, _) = next(iter(sources.items()))
                reports.append(merge_diffs(table.name, [
                    (t, await diff_table([(snaps[first], b.dialect, b.placeholder)],
                                         [(tconns[t], tb.dialect, tb.placeholder)], table))
                    for t, tb in targets.items()]))
                continue
            reports.append(await diff_table(
                [(snaps[s], b.dialect, b.placeholder) for s, (b, _) in sources.items()],
                [(tconns[t], b.dialect, b.placeholder) for t, b in targets.items()],
                table))
    return reports


@contextlib.asynccontextmanager
async def _snapshot(backend: Backend, log: ChangeLog) -> AsyncIterator[tuple[Connection, str]]:
    conn, pos = await open_snapshot(backend, log)
    try:
        yield conn, pos
    finally:
        try:
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
        finally:
            await backend.release(conn)


@contextlib.asynccontextmanager
async def _connection(backend: Backend) -> AsyncIterator[Connection]:
    conn = await backend.acquire()
    try:
        yield conn
    finally:
        await backend.release(conn)
