"""The window of a queue manager (:class:`Window`): the events due within the next
``window`` seconds, ordered by (due time, priority), and the scans that fill it.

It is a cache of the table: losing it loses nothing. The scans and their cursor are
described in :mod:`shardgate.queues.table.manager` (*Scans*); in short:

* a *new-event* scan reads ``to_be_fired`` events from the cursor (database clock) up to
  now + window, LIMIT the free room, and reaches back to the start of every committed
  write announced since the last scan (:meth:`Window.committed`);
* a *full* scan reads from the beginning (the backstop) and measures the clock offset;
* the *collector* reads fired-but-unacked events whose retry time falls in the window.

Invariants
----------
1. ``len(events) <= cache_size``: a scan that meets the limit sets ``pending_mode`` and
   leaves the cursor (or ``gap``) at the first row it may not have taken.
2. Every unfired row stamped before ``cursor`` and committed before the last complete scan
   began has been read, except those from ``gap`` on.
3. An event whose ack is being written (``skip``) is never admitted again.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from typing import Any

from shardgate.backends import Backend
from shardgate.queues.options import QueueOptions
from shardgate.queues.receivers import Receiver
from shardgate.queues.table.store import (
    EPOCH,
    ID,
    PRIORITY,
    STATE,
    TIME_NEXT,
    TIME_SCHEDULED,
    VALUES,
    QueueStore,
)

#: How far (ns: 2 s) a new-event scan reaches back before the cursor after a wake-up
#: that does not say when the committed writes started (``notify`` without ``since_ns``).
SCAN_SLACK_NS = 2_000_000_000
#: Allowance (ns) for the database clock's resolution and drift between two
#: measurements of its offset from ours (SQLite stamps whole milliseconds).
CLOCK_MARGIN_NS = 20_000_000
#: Nanoseconds per second.
NS = 1_000_000_000


class Event:
    """One event of the window: the scanned row (the driver's tuple, kept as is)
    and the manager's bookkeeping. A slotted class, built once per event admitted,
    never per row scanned."""

    __slots__ = ("deadline", "due", "epoch", "group", "id", "key", "priority", "receiver",
                 "row")

    def __init__(self, row: Sequence[Any], due: int, epoch: int) -> None:
        self.row = row
        self.id: int = row[ID]
        self.priority: int = row[PRIORITY] or 0
        self.due = due
        self.epoch = epoch
        self.key: Any = None
        self.group: Any = None
        self.receiver: Receiver | None = None
        self.deadline = 0


class Window:
    """The events of one queue table of one shard due soon (see the module docstring)."""

    def __init__(self, store: QueueStore, options: QueueOptions, reader: Backend,
                 clock: Callable[[], int]) -> None:
        self.store = store
        self.options = options
        self.reader = reader
        self._clock = clock
        self.events: dict[int, Event] = {}
        self.heap: list[tuple[int, int, int]] = []
        #: the last scan filled the window: the next one continues where it stopped
        self.pending_mode = False
        #: new-event scans start here (database clock, inclusive): every unfired row
        #: stamped earlier and committed before the last scan began has been read,
        #: except those from ``gap`` on
        self.cursor = 0
        #: when set, rows from here (inclusive) up to the cursor still need a re-read
        #: (a late commit's rows, read only in part because the window filled)
        self.gap: int | None = None
        #: earliest start (our clock) of a committed transaction's writes not scanned for yet
        self.rescan_from: int | None = None
        #: a lower bound of (database clock - our clock), measured at each full scan
        self.offset = 0
        #: the value positions of the ordering key and the group key (None: not used)
        self.key_idx: int | None = None
        self.group_idx: int | None = None

    def push(self, ev: Event) -> None:
        """Hold ``ev`` (again), due at ``ev.due``."""
        self.events[ev.id] = ev
        heapq.heappush(self.heap, (ev.due, ev.priority, ev.id))

    def clear(self) -> None:
        self.events.clear()
        self.heap.clear()

    def committed(self, since_ns: int | None) -> None:
        """A write committed whose first statement started at ``since_ns`` (our clock;
        None: unknown, reach back :data:`SCAN_SLACK_NS`): the next scan reaches back to it."""
        if since_ns is None:
            since_ns = self._clock() - SCAN_SLACK_NS
        self.rescan_from = (
            since_ns if self.rescan_from is None else min(self.rescan_from, since_ns)
        )

    def admit(self, rows: Sequence[Sequence[Any]], skip: Collection[int]) -> int:
        """Put the scanned ``rows`` not held yet (nor in ``skip``) into the window; return
        how many rows were taken or already held (fewer than ``len(rows)`` when the window
        filled)."""
        events = self.events
        cache_size = self.options.cache_size
        key_idx, group_idx = self.key_idx, self.group_idx
        for n, r in enumerate(rows):
            eid = r[ID]
            if eid in events or eid in skip:
                continue
            if len(events) >= cache_size:
                self.pending_mode = True
                return n
            ev = Event(r, r[TIME_NEXT] if r[STATE] == "fired" else r[TIME_SCHEDULED],
                       r[EPOCH] or 0)
            if key_idx is not None:
                ev.key = r[VALUES + key_idx]
            if group_idx is not None:
                ev.group = r[VALUES + group_idx]
            self.push(ev)
        return len(rows)

    async def scan(self, full: bool, skip: Collection[int]) -> None:
        """Read unfired events into the window: from the cursor (or, ``full``, from
        the beginning), and from the start of every write committed since the last
        scan (see the manager's module docstring, *Scans*)."""
        now = self._clock()
        horizon = now + int(self.options.window * NS)
        room = self.options.cache_size - len(self.events)
        if room <= 0:
            self.pending_mode = True
            return
        rescan_from, self.rescan_from = self.rescan_from, None
        conn = await self.reader.acquire()
        try:
            if full:
                self.offset = await self.store.clock_offset(conn)
            # No statement starting after `now` stamps its events earlier than `floor`.
            floor = now + self.offset - CLOCK_MARGIN_NS
            lower = 0 if full else self.cursor
            if self.gap is not None:
                lower = min(lower, self.gap)
            if rescan_from is not None:
                lower = min(lower, rescan_from + self.offset - CLOCK_MARGIN_NS)
            rows = await self.store.scan_new(conn, max(0, lower), horizon, room)
        finally:
            await self.reader.release(conn)
        taken = self.admit(rows, skip)
        if taken == len(rows) and len(rows) < room:
            # Everything from `lower` to the horizon was read.
            self.pending_mode = False
            self.gap = None
            self.cursor = max(self.cursor, floor)
            return
        # The window filled: rows from `reached` on (inclusive) may be unread.
        self.pending_mode = True
        reached = int(rows[min(taken, len(rows) - 1)][TIME_SCHEDULED])
        if reached >= self.cursor:
            self.gap = None
            self.cursor = max(self.cursor, min(reached, floor))
        else:
            self.gap = reached

    async def collect(self, skip: Collection[int]) -> None:
        """Read fired-but-unacked events whose retry time falls in the window."""
        now = self._clock()
        horizon = now + int(self.options.window * NS)
        room = self.options.cache_size - len(self.events)
        if room <= 0:
            return
        conn = await self.reader.acquire()
        try:
            rows = await self.store.scan_fired(conn, horizon, room)
        finally:
            await self.reader.release(conn)
        self.admit(rows, skip)
