"""Change capture: the common interface of the per-backend log readers.

A :class:`ChangeLog` follows one shard database's own replication log and
yields its committed transactions, in commit order:

=============  ============================================================
backend        source (module)
=============  ============================================================
PostgreSQL     logical decoding, ``pgoutput`` (``changes_postgres``)
MariaDB        the ROW binlog through ``mysql-replication`` (``changes_mysql``)
SQLite         triggers filling a change table (``changes_sqlite``)
=============  ============================================================

Contracts every implementation keeps:

* ``read(start)`` yields :class:`Transaction` objects for every transaction
  committed **after** position ``start`` (``None``: after the current end of
  the log), in commit order, each exactly once, with all its row changes and
  nothing else; nothing uncommitted or rolled back is ever yielded. Between
  transactions it yields :class:`Heartbeat` objects when the log is idle
  (at least every ``heartbeat_s``), so callers can advance watermarks.
* A ``start`` the log no longer holds raises ``ShardgateError`` with code
  ``OUT_OF_RANGE`` ("too old"), never a silent skip to the oldest position.
* Positions are strings (see :mod:`shardgate.event_token`); a transaction's
  position is the one to resume from to get the transactions after it.
  Timestamps never go backwards within one log.
* ``prepare()`` sets up capture (publication / slot / triggers) and is
  idempotent; ``drop()`` removes what ``prepare()`` created.

The factory that picks a database's log is :func:`shardgate.backends.changes.open.open_change_log`.
Drivers are imported only here, in ``backends/``.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardgate.errors import Unsupported
from shardgate.event_token import EventToken

#: Default interval of heartbeats on an idle log.
DEFAULT_HEARTBEAT_S = 1.0

INSERT = "insert"
UPDATE = "update"
DELETE = "delete"


@dataclass(slots=True)
class RowChange:
    """One row change: ``before`` is None for inserts, ``after`` None for deletes."""

    table: str
    op: str
    pk: tuple[Any, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(slots=True)
class Transaction:
    """A committed transaction: its commit token and its row changes, in order.

    A transaction with no changes (e.g. one that touched only tables outside
    the shard database, or DDL) may be yielded to advance the position.
    """

    token: EventToken
    changes: list[RowChange]
    #: where the transaction sits for its log's :class:`Visibility` (PostgreSQL: its
    #: transaction id; MariaDB: its binlog file number and end offset), or None
    mark: int | tuple[int, int] | None = None


class Visibility:
    """Whether a read's snapshot sees every transaction a log reader has read.

    A log that hands a commit over before new snapshots see it (PostgreSQL
    decodes a commit once its WAL is flushed, before the committing backend
    leaves the proc array; MariaDB sends a transaction once it is in the binlog,
    before the engine's commit) needs this for exact event tokens: the tablet
    runs such a read in the transaction opened by the log's ``snapshot_sql``,
    and the token is exact only if :meth:`all_visible` of that snapshot. This
    base, for logs whose commits are visible when read, says always.
    """

    async def started(self) -> None:
        """The reader starts at the log's end, just read: note the horizon of what
        committed before it (never read, yet it must be visible to an exact read)."""

    def note(self, tx: Transaction) -> None:
        """The reader read ``tx``."""

    def all_visible(self, snapshot: Sequence[Sequence[Any]]) -> bool:
        """Whether every transaction noted (and every one committed before the
        reader started) is visible in ``snapshot``: the rows of the last
        ``snapshot_sql`` statement."""
        return True


class DecodedXids:
    """The transaction ids a log reader has decoded (the most recent ``keep``),
    and the newest one in 32-bit wrap-around order (PostgreSQL's ``xid``)."""

    def __init__(self, keep: int = 65536) -> None:
        self.keep = keep
        self._ids: dict[int, None] = {}
        #: the newest id decoded (None before any)
        self.newest: int | None = None

    def add(self, xid: int) -> None:
        xid &= 0xFFFFFFFF
        self._ids[xid] = None
        if len(self._ids) > self.keep:
            del self._ids[next(iter(self._ids))]
        if self.newest is None or xid_precedes(self.newest, xid):
            self.newest = xid

    def __contains__(self, xid: int) -> bool:
        return (xid & 0xFFFFFFFF) in self._ids


def xid_precedes(a: int, b: int) -> bool:
    """``a < b`` in 32-bit wrap-around order."""
    return a != b and ((b - a) & 0xFFFFFFFF) < 0x80000000


@dataclass(slots=True)
class Heartbeat:
    """The log is idle. ``watermark``: every transaction committed before it was yielded.

    ``position`` is the last position read (resume from it loses nothing).
    """

    watermark: float
    position: str | None


LogItem = Transaction | Heartbeat


class ChangeLog(ABC):
    """One shard database's replication log (see the module docstring)."""

    #: SQL (one row, one column) giving the end of the log now, for the shard's own
    #: connections (the tablet runs it around ``include_event_token`` reads).
    position_sql: str = ""
    #: Statements opening a read transaction (they begin it) whose snapshot the last
    #: one describes, for a log whose :meth:`visibility` is not the base's (the
    #: tablet runs ``include_event_token`` reads in that transaction). Empty: the
    #: log's commits are visible when read.
    snapshot_sql: tuple[str, ...] = ()

    def visibility(self) -> Visibility:
        """A new tracker of what one reader of this log has read (see :class:`Visibility`)."""
        return Visibility()

    def __init__(self, url: str, shard: str) -> None:
        self.url = url
        #: qualified ``keyspace/shard``: the ``shard`` of the tokens.
        self.shard = shard

    @abstractmethod
    async def prepare(self) -> None:
        """Set up capture on the database; idempotent."""

    @abstractmethod
    async def current_position(self) -> str:
        """The position of the end of the log now (resume from it: only newer changes)."""

    @abstractmethod
    async def oldest_position(self) -> str:
        """The oldest position a read may start from (everything after it is held)."""

    @abstractmethod
    def read(
        self, start: str | None, *, heartbeat_s: float = DEFAULT_HEARTBEAT_S
    ) -> AsyncIterator[LogItem]:
        """Committed transactions after ``start`` (see the contract above)."""

    def exported_snapshot(self) -> contextlib.AbstractAsyncContextManager[tuple[str, str]]:
        """``(snapshot name, position)``: a database snapshot another connection can
        import, holding exactly the transactions at or before the position
        (PostgreSQL); other logs refuse with ``UNIMPLEMENTED``."""
        raise Unsupported(f"{type(self).__name__} cannot export a snapshot")

    async def position_at(self, timestamp: float) -> str | None:
        """A position before every commit at or after ``timestamp``, found in the log
        itself, or None when this log cannot tell (the caller then reads from the oldest
        position and skips older commits)."""
        return None

    #: whether the tablet's retention purges this log (False: the server's own
    #: settings do, as for MariaDB's server-wide binlog and ``binlog_expire_logs_seconds``)
    purged_by_tablet = True

    @abstractmethod
    async def purge(self, up_to: str, *, through: float | None = None) -> None:
        """Forget the log up to and including ``up_to`` (retention); later starts there fail.

        ``through``: a time no forgotten commit is later than (None: now); see
        :meth:`purged_through`.
        """

    async def purged_through(self) -> float | None:
        """A time no purged commit is later than, or None if nothing was ever purged.

        A start from a timestamp at or before it may have lost changes: the
        tablet refuses it (``OUT_OF_RANGE``) rather than starting at the oldest
        change it still holds.
        """
        return None

    @abstractmethod
    async def drop(self) -> None:
        """Remove the capture set up by :meth:`prepare` (slots, triggers, tables)."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what this object holds (not the capture on the database)."""


# --------------------------------------------------------- time -> position --


@dataclass
class TimeMap:
    """Timestamps -> positions, as the design asks: a start point for a start time.

    For every second with commits it keeps the position *before* the first
    commit of that second (resuming there delivers that second whole). After
    ``fine_s`` seconds, entries thin out to one per minute (the earliest of
    the minute, so lookups stay safe), and entries older than ``retention_s``
    go. :meth:`lookup` returns a position from which every commit at or after
    the given time follows, or None when the map does not reach back so far.
    """

    fine_s: float = 3600.0
    retention_s: float = 7 * 86400.0
    _times: list[float] = field(default_factory=list)
    _positions: list[str] = field(default_factory=list)
    _last_compact: float = 0.0

    def record(self, commit_ts: float, position_before: str) -> None:
        """Note that a commit at ``commit_ts`` follows ``position_before``."""
        second = float(int(commit_ts))
        if self._times and self._times[-1] >= second:
            return  # this second (or a later one, clock skew) already starts earlier
        self._times.append(second)
        self._positions.append(position_before)
        if second - self._last_compact >= 60.0:
            self.compact(second)

    def compact(self, now: float | None = None) -> None:
        """Thin old entries to one per minute; drop those past retention."""
        now = time.time() if now is None else now
        self._last_compact = now
        times: list[float] = []
        positions: list[str] = []
        for t, p in zip(self._times, self._positions, strict=True):
            if t < now - self.retention_s:
                continue
            if t < now - self.fine_s and times and int(times[-1] // 60) == int(t // 60):
                continue  # keep only the earliest entry of an old minute
            times.append(t)
            positions.append(p)
        self._times, self._positions = times, positions

    def lookup(self, timestamp: float) -> str | None:
        """A position before every commit at or after ``timestamp``, or None if unknown."""
        i = bisect.bisect_right(self._times, timestamp) - 1
        if i < 0:
            return None
        return self._positions[i]

    def oldest(self) -> float | None:
        return self._times[0] if self._times else None

    def __len__(self) -> int:
        return len(self._times)
