"""What the gate is running and has just run: live queries and the query log.

* :class:`LiveQueries`: statements in flight, each with its session, start
  time and the task running it; an operator can kill one (the task is
  cancelled and the client gets ``ABORTED: killed by an operator``).
* :class:`QueryLog`: the last ``capacity`` finished statements (time,
  keyspace, SQL, shard calls, duration, rows, error code) in a ring buffer,
  plus subscribers that receive every new entry (``/debug/querylog``).

Both cost a few dictionary and deque operations per statement; a slow
subscriber loses entries (its queue is bounded) rather than slowing the gate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

#: how many entries a subscriber may fall behind before it loses some
SUBSCRIBER_BACKLOG = 1000


@dataclass(frozen=True)
class LogEntry:
    """One finished statement."""

    at: float  # unix time it started
    keyspace: str | None
    sql: str
    seconds: float
    rows: int
    shard_calls: int
    error: str | None  # the error code, None if it succeeded
    session: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LiveQuery:
    """One statement in flight (``session``: the session's object id in hex)."""

    __slots__ = ("_session", "id", "keyspace", "killed", "sql", "started", "task")

    def __init__(self, id: int, session: object, keyspace: str | None, sql: str,
                 started: float, task: asyncio.Task[Any] | None) -> None:
        self.id = id
        self._session = id_of(session)
        self.keyspace = keyspace
        self.sql = sql
        self.started = started
        self.task = task
        self.killed = False

    @property
    def session(self) -> str:
        return f"{self._session:x}"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "session": self.session, "keyspace": self.keyspace,
                "sql": self.sql, "started": self.started,
                "seconds": round(time.time() - self.started, 6), "killed": self.killed}


@dataclass
class LiveQueries:
    """Statements in flight, by id."""

    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _live: dict[int, LiveQuery] = field(default_factory=dict)

    def start(self, session: Any, sql: str) -> LiveQuery:
        """Register a statement of ``session`` (any object with ``keyspace``)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        q = LiveQuery(next(self._ids), session, session.keyspace, sql, time.time(), task)
        self._live[q.id] = q
        return q

    def finish(self, q: LiveQuery) -> None:
        self._live.pop(q.id, None)

    def snapshot(self) -> list[LiveQuery]:
        return sorted(self._live.values(), key=lambda q: q.started)

    def kill(self, query_id: int) -> bool:
        """Cancel the statement ``query_id``; False if it is not running."""
        q = self._live.get(query_id)
        if q is None or q.task is None or q.task.done():
            return False
        q.killed = True
        q.task.cancel()
        return True


def id_of(session: object) -> int:
    """The number a session is shown by (in hex) in live queries and the query log."""
    return id(session)


#: A log entry's fields as recorded on the statement path (the session as ``id_of``).
_Raw = tuple[float, str | None, str, float, int, int, str | None, int]


class QueryLog:
    """The last ``capacity`` finished statements, and live subscribers.

    :meth:`record` keeps a statement's fields as a tuple (no object built on the
    statement path unless someone subscribes); :meth:`recent` builds the entries.
    """

    def __init__(self, capacity: int = 1000) -> None:
        self._entries: deque[LogEntry | _Raw] = deque(maxlen=capacity)
        self._subscribers: set[asyncio.Queue[LogEntry]] = set()

    def add(self, entry: LogEntry) -> None:
        self._entries.append(entry)
        for q in self._subscribers:
            if q.qsize() < SUBSCRIBER_BACKLOG:
                q.put_nowait(entry)

    def record(self, at: float, keyspace: str | None, sql: str, seconds: float, rows: int,
               shard_calls: int, error: str | None, session: object) -> None:
        """:meth:`add` the entry of these fields (``session``: the session object)."""
        if self._subscribers:
            self.add(LogEntry(at, keyspace, sql, seconds, rows, shard_calls, error,
                              f"{id_of(session):x}"))
        else:
            self._entries.append((at, keyspace, sql, seconds, rows, shard_calls, error,
                                  id_of(session)))

    def clear(self) -> None:
        """Forget the finished statements (subscribers stay)."""
        self._entries.clear()

    def recent(self, limit: int | None = None) -> list[LogEntry]:
        """Newest first."""
        out: list[LogEntry] = []
        for e in reversed(self._entries):
            if limit is not None and len(out) >= limit:
                break
            out.append(e if isinstance(e, LogEntry) else LogEntry(*e[:7], f"{e[7]:x}"))
        return out

    def subscribe(self) -> asyncio.Queue[LogEntry]:
        q: asyncio.Queue[LogEntry] = asyncio.Queue()
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[LogEntry]) -> None:
        self._subscribers.discard(q)


@dataclass
class StreamConsumer:
    """One change stream being read: where it is and how far behind."""

    id: int
    keyspace: str
    key_range: str | None
    started: float
    events: int = 0
    #: the last event's token, serialized (an exact restart point of its shard)
    position: str = ""
    #: the merge's safe timestamp: every change before it has been delivered
    safe_timestamp: float = 0.0

    @property
    def lag_seconds(self) -> float:
        return max(0.0, time.time() - self.safe_timestamp) if self.safe_timestamp else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "keyspace": self.keyspace, "key_range": self.key_range,
                "started": self.started, "events": self.events, "position": self.position,
                "safe_timestamp": self.safe_timestamp, "lag_seconds": self.lag_seconds}


@dataclass
class StreamConsumers:
    """The change streams being read through a gate."""

    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _live: dict[int, StreamConsumer] = field(default_factory=dict)

    def snapshot(self) -> list[StreamConsumer]:
        return sorted(self._live.values(), key=lambda c: c.id)

    async def follow(
        self, keyspace: str, key_range: str | None, events: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """Yield ``events`` (stream events) unchanged, keeping the consumer's figures."""
        c = StreamConsumer(next(self._ids), keyspace, key_range, time.time())
        self._live[c.id] = c
        try:
            async for ev in events:
                if not ev.heartbeat:
                    c.events += 1
                c.position = ev.token.serialize()
                c.safe_timestamp = ev.safe_timestamp
                yield ev
        finally:
            self._live.pop(c.id, None)
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
