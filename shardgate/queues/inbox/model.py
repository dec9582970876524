"""The inbox store's pure parts: options, time buckets, message ids, pointers, delivery.

Nothing here does I/O; :mod:`shardgate.queues.inbox` runs the SQL. Times are
integers in **microseconds since the Unix epoch** (UTC) throughout.

Positions. A message's position is ``(ts, msg_id)``: ``ts`` is its writer's
clock at append time, ``msg_id`` a 64-bit id unique per inbox (time-ordered,
random low bits). Messages are read in position order.

Pointers. A :class:`Pointer` is what a consumer has consumed: the greatest
position delivered to it (``ts``, ``msg_id``) plus ``recent``, the positions of
every message delivered to it whose ``ts`` lies within the rescan window
below the pointer (``ts >= pointer.ts - window``). A read scans from
``pointer.ts - window`` upwards and delivers every message not in ``recent``;
:func:`deliver` keeps the invariant.

Delivery guarantee (written out in :func:`deliver`): a message is delivered
exactly once per consumer if it becomes visible (its append committed) before
the consumer's pointer moves more than one rescan window past the message's
``ts``, i.e. if writer clock skew plus commit delay stay below the window.
Messages later than that are not delivered (they lie below every future scan),
which is why the window must exceed the worst clock skew.
"""

from __future__ import annotations

import calendar
import itertools
import re
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from shardgate.errors import InvalidArgument

US = 1_000_000
DEFAULT_GRANULARITY = "day"
DEFAULT_RETENTION_S = 30 * 86_400.0
DEFAULT_RESCAN_WINDOW_S = 300.0
DEFAULT_PRECREATE = 1
DEFAULT_VINDEX = "hash"
DEFAULT_USER_TYPE = "bigint"
DEFAULT_MAX_RECENT = 1000
DEFAULT_BUCKET_REFRESH_S = 5.0
#: Longest consumer name (the pointer table's column is VARCHAR(64)).
MAX_CONSUMER_LEN = 64
#: Longest inbox name: bucket tables add ``_yyyymmddhh`` and MariaDB allows 64 characters.
MAX_NAME_LEN = 40

GRANULARITIES = ("hour", "day", "month")
USER_TYPES = ("bigint", "varchar")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_SUFFIX = {"hour": ("%Y%m%d%H", 10), "day": ("%Y%m%d", 8), "month": ("%Y%m", 6)}


@dataclass(frozen=True)
class InboxOptions:
    """Validated options of one inbox; keyword-only, with named module defaults.

    =====================  ==========  =================================================
    option                 default     meaning
    =====================  ==========  =================================================
    ``granularity``        ``day``     time span of one bucket table: ``hour``, ``day``
                                       or ``month`` (UTC); part of the table names, so
                                       every process of one inbox must agree
    ``retention_s``        30 days     buckets whose end is older than this are dropped
                                       whole by :meth:`InboxStore.maintain`
    ``rescan_window_s``    300         a read re-scans this far below its pointer; must
                                       exceed writer clock skew plus commit delay
    ``forward_insert``     False       also write messages of a bucket's last window
                                       into the next bucket, so a read touches only the
                                       pointer's bucket (and later ones)
    ``precreate``          1           buckets created ahead of the current one
    ``vindex``             ``hash``    the keyspace's vindex placing a user's rows
    ``user_type``          ``bigint``  the user column: ``bigint`` or ``varchar``
    ``max_recent``         1000        positions a pointer remembers at most; beyond
                                       it the oldest are forgotten and those messages
                                       may be delivered again (never missed)
    ``bucket_refresh_s``   5           how often a read looks for buckets other
                                       processes created or dropped
    =====================  ==========  =================================================
    """

    granularity: str = DEFAULT_GRANULARITY
    retention_s: float = DEFAULT_RETENTION_S
    rescan_window_s: float = DEFAULT_RESCAN_WINDOW_S
    forward_insert: bool = False
    precreate: int = DEFAULT_PRECREATE
    vindex: str = DEFAULT_VINDEX
    user_type: str = DEFAULT_USER_TYPE
    max_recent: int = DEFAULT_MAX_RECENT
    bucket_refresh_s: float = DEFAULT_BUCKET_REFRESH_S

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise InvalidArgument(
                f"inbox option granularity={self.granularity!r}: use one of {GRANULARITIES}"
            )
        if self.user_type not in USER_TYPES:
            raise InvalidArgument(
                f"inbox option user_type={self.user_type!r}: use one of {USER_TYPES}"
            )
        for name in ("retention_s", "rescan_window_s", "bucket_refresh_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"inbox option {name}={value!r}: must be a number >= 0")
        if self.retention_s <= self.rescan_window_s:
            raise InvalidArgument(
                f"inbox option retention_s={self.retention_s}: must exceed "
                f"rescan_window_s={self.rescan_window_s}"
            )
        if not isinstance(self.precreate, int) or not 0 <= self.precreate <= 100:
            raise InvalidArgument(f"inbox option precreate={self.precreate!r}: 0..100 buckets")
        if not isinstance(self.max_recent, int) or not 1 <= self.max_recent <= 1500:
            raise InvalidArgument(
                f"inbox option max_recent={self.max_recent!r}: 1..1500 positions"
            )
        if not isinstance(self.forward_insert, bool):
            raise InvalidArgument(
                f"inbox option forward_insert={self.forward_insert!r}: true or false"
            )

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], *, path: str = "inbox") -> InboxOptions:
        """Options from a mapping (a config file); unknown names are refused."""
        known = {f.name for f in fields(cls)}
        extra = sorted(set(doc) - known)
        if extra:
            raise InvalidArgument(f"{path}: unknown option(s) {extra}; known: {sorted(known)}")
        return cls(**dict(doc))

    @property
    def window_us(self) -> int:
        return int(self.rescan_window_s * US)

    def stored(self) -> dict[str, Any]:
        """The options stored with the inbox: all but :data:`LOCAL_OPTIONS` (JSON-ready)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in LOCAL_OPTIONS}

    def differences(self, other: InboxOptions) -> list[str]:
        """``name: mine != other's`` for each stored option that differs."""
        mine, theirs = self.stored(), other.stored()
        return [f"{k}={mine[k]!r} (stored: {theirs[k]!r})" for k in sorted(mine)
                if _norm(mine[k]) != _norm(theirs[k])]

    def with_stored(self, doc: Mapping[str, Any], *, path: str) -> InboxOptions:
        """These options' local ones with the stored ones of ``doc``."""
        local = {name: getattr(self, name) for name in LOCAL_OPTIONS}
        return InboxOptions.from_mapping({**dict(doc), **local}, path=path)


#: Options of one process, not of the inbox: never stored nor compared.
LOCAL_OPTIONS = ("bucket_refresh_s",)


def _norm(v: Any) -> Any:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


def check_name(name: str) -> str:
    """The inbox name if usable in table names (lower case letters, digits, ``_``)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_LEN:
        raise InvalidArgument(
            f"inbox name {name!r}: use 1..{MAX_NAME_LEN} lower-case letters, digits and "
            "underscores, starting with a letter"
        )
    return name


def check_consumer(consumer: str) -> str:
    if not isinstance(consumer, str) or not consumer or len(consumer) > MAX_CONSUMER_LEN:
        raise InvalidArgument(
            f"consumer {consumer!r}: give a non-empty name of at most {MAX_CONSUMER_LEN} characters"
        )
    return consumer


# ----------------------------------------------------------------- buckets --


@dataclass(frozen=True, order=True)
class Bucket:
    """One time bucket: ``[start, end)`` in microseconds, and its table name."""

    start: int
    end: int
    table: str = field(compare=False)


def bucket_of(name: str, granularity: str, ts: int) -> Bucket:
    """The bucket of inbox ``name`` holding time ``ts`` (µs since the epoch, UTC)."""
    dt = datetime.fromtimestamp(ts // US, tz=UTC)
    if granularity == "hour":
        start_dt = dt.replace(minute=0, second=0, microsecond=0)
        start = calendar.timegm(start_dt.timetuple()) * US
        end = start + 3600 * US
    elif granularity == "day":
        start_dt = dt.replace(hour=0, minute=0, second=0, microsecond=0)
        start = calendar.timegm(start_dt.timetuple()) * US
        end = start + 86_400 * US
    elif granularity == "month":
        start_dt = dt.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        start = calendar.timegm(start_dt.timetuple()) * US
        nxt = start_dt.replace(year=start_dt.year + start_dt.month // 12,
                               month=start_dt.month % 12 + 1)
        end = calendar.timegm(nxt.timetuple()) * US
    else:
        raise InvalidArgument(f"granularity {granularity!r}: use one of {GRANULARITIES}")
    return Bucket(start, end, f"{name}_{start_dt.strftime(_SUFFIX[granularity][0])}")


def next_bucket(name: str, granularity: str, bucket: Bucket) -> Bucket:
    return bucket_of(name, granularity, bucket.end)


def parse_bucket_table(name: str, granularity: str, table: str) -> Bucket | None:
    """The bucket a table name denotes, or None if it is not a bucket of this inbox.

    Raises :class:`InvalidArgument` for a bucket of another granularity (the
    inbox was created with different options).
    """
    prefix = name + "_"
    if not table.startswith(prefix):
        return None
    suffix = table[len(prefix):]
    if not suffix.isdigit():
        return None
    fmt, width = _SUFFIX[granularity]
    if len(suffix) != width:
        if len(suffix) in (6, 8, 10):
            other = {6: "month", 8: "day", 10: "hour"}[len(suffix)]
            raise InvalidArgument(
                f"inbox {name}: table {table} is a {other} bucket but the inbox is opened "
                f"with granularity {granularity!r}: open it with granularity={other!r}"
            )
        return None
    try:
        dt = datetime.strptime(suffix, fmt).replace(tzinfo=UTC)
    except ValueError:
        return None
    return bucket_of(name, granularity, calendar.timegm(dt.timetuple()) * US)


# ----------------------------------------------------------------- message ids --


class IdGenerator:
    """Time-ordered 64-bit message ids: ``ms << 22 | (random base + counter) mod 2**22``.

    Positive as a signed BIGINT until the year 2109. Ids of one generator are
    unique (up to 4M per millisecond); two generators collide only if they
    draw the same value in the same millisecond for the same user and
    timestamp, which the table's primary key refuses.
    """

    def __init__(self) -> None:
        self._base = secrets.randbits(22)
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next(self, ts: int) -> int:
        with self._lock:
            n = next(self._counter)
        return ((ts // 1000) << 22) | ((self._base + n) & 0x3FFFFF)

    def next_many(self, tss: Sequence[int]) -> list[int]:
        """One id per time in ``tss`` (a bulk load)."""
        with self._lock:
            first = next(self._counter)
            self._counter = itertools.count(first + len(tss))
        base = self._base + first
        return [((ts // 1000) << 22) | ((base + k) & 0x3FFFFF) for k, ts in enumerate(tss)]


# ----------------------------------------------------------------- messages --


@dataclass(frozen=True)
class Message:
    """One message of one user's inbox."""

    user: Any
    ts: int
    msg_id: int
    body: str | None

    @property
    def position(self) -> tuple[int, int]:
        return (self.ts, self.msg_id)


# ----------------------------------------------------------------- pointers --

_POINTER_VERSION = "p1"


@dataclass(frozen=True)
class Pointer:
    """What a consumer has consumed (see the module docstring).

    Invariants: every entry of ``recent`` is ``<= (ts, msg_id)`` and has a
    ``ts`` within the rescan window below ``ts``; ``recent`` is sorted and
    holds no duplicate ids.
    """

    ts: int
    msg_id: int
    recent: tuple[tuple[int, int], ...] = ()

    @property
    def position(self) -> tuple[int, int]:
        return (self.ts, self.msg_id)

    def scan_from(self, window_us: int) -> int:
        """The lowest ``ts`` a read after this pointer looks at."""
        return self.ts - window_us

    def encode(self) -> str:
        """A compact text form (what a client stores; :meth:`decode` reads it back)."""
        recent = ",".join(f"{t}.{i}" for t, i in self.recent)
        return f"{_POINTER_VERSION}:{self.ts}.{self.msg_id}:{recent}"

    @classmethod
    def decode(cls, text: str) -> Pointer:
        """The pointer :meth:`encode` gave; :class:`InvalidArgument` for anything else."""
        try:
            version, head, recent = text.split(":")
            if version != _POINTER_VERSION:
                raise ValueError(version)
            ts, msg_id = _pair(head)
            pairs = tuple(_pair(p) for p in recent.split(",")) if recent else ()
        except (ValueError, AttributeError):
            raise InvalidArgument(
                f"bad inbox pointer {str(text)[:60]!r}: pass a pointer a read returned"
            ) from None
        return cls.of(ts, msg_id, pairs)

    @classmethod
    def of(cls, ts: int, msg_id: int, recent: Iterable[tuple[int, int]] = ()) -> Pointer:
        """A pointer after checking the invariants (:class:`InvalidArgument` if broken)."""
        rec = tuple(sorted(set(recent)))
        if any(p > (ts, msg_id) for p in rec) or len({i for _, i in rec}) != len(rec):
            raise InvalidArgument(
                "bad inbox pointer: its recent positions must lie at or below the pointer "
                "and have distinct ids; pass a pointer a read returned"
            )
        return cls(ts, msg_id, rec)


def _pair(text: str) -> tuple[int, int]:
    a, b = text.split(".")
    return int(a), int(b)


class Delivery:
    """The messages one read delivers and the pointer after them (see :func:`deliver`).

    Feed candidates in position order with :meth:`offer` (it says when the
    read is full), then take :meth:`pointer`. State lives only for one read.
    """

    def __init__(self, after: Pointer | None, *, window_us: int, limit: int,
                 max_recent: int) -> None:
        self.after = after
        self.window_us = window_us
        self.limit = limit
        self.max_recent = max_recent
        self.messages: list[Message] = []
        self._seen = {i for _, i in after.recent} if after is not None else set()
        self._lo = after.scan_from(window_us) if after is not None else None

    @property
    def full(self) -> bool:
        return len(self.messages) >= self.limit

    def offer(self, m: Message) -> bool:
        """Take ``m`` unless it was delivered before; True once the read is full."""
        if self.full:
            return True
        if m.msg_id in self._seen or (self._lo is not None and m.ts < self._lo):
            return False
        self._seen.add(m.msg_id)
        self.messages.append(m)
        return self.full

    def pointer(self) -> Pointer | None:
        """The pointer after the messages taken (the old one if none was taken)."""
        after, out = self.after, self.messages
        if not out:
            return after
        top = max(m.position for m in out)
        if after is not None and after.position > top:
            top = after.position
        positions: list[tuple[int, int]] = list(after.recent) if after is not None else []
        positions += [m.position for m in out]
        floor = top[0] - self.window_us
        keep = sorted(p for p in set(positions) if p[0] >= floor)
        if len(keep) > self.max_recent:
            keep = keep[-self.max_recent:]
        return Pointer(top[0], top[1], tuple(keep))


def deliver(
    rows: Iterable[Message],
    after: Pointer | None,
    *,
    window_us: int,
    limit: int,
    max_recent: int,
) -> tuple[list[Message], Pointer | None, bool]:
    """Choose the messages a read delivers and the pointer after them.

    ``rows`` are the candidate messages in position order, all with ``ts >=
    after.ts - window_us`` (any, without a pointer); the same message may
    appear twice (a forward-insert copy). Returns ``(delivered, pointer,
    full)``: ``full`` is True if ``limit`` messages were delivered (the
    caller should stop scanning).

    Exactly once: a message is skipped iff its id is in ``after.recent`` (it
    was delivered before) or it was already taken in this read. Every message
    delivered before with ``ts`` within the window is in ``recent`` (the
    invariant), and the scan starts at the window's bottom, so nothing
    delivered is delivered again and nothing visible in the window is missed.
    The new pointer is the greatest of the old one and the positions
    delivered; its ``recent`` keeps the positions (old and new) within the
    window below it, at most ``max_recent`` of them (forgetting the oldest: they
    may then be delivered again, never missed).
    """
    d = Delivery(after, window_us=window_us, limit=limit, max_recent=max_recent)
    for m in rows:
        if d.offer(m):
            break
    return d.messages, d.pointer(), d.full


def buckets_to_read(
    buckets: Sequence[Bucket], after: Pointer | None, *, window_us: int, now: int,
    forward_insert: bool,
) -> list[Bucket]:
    """The buckets a read after ``after`` scans, oldest first.

    From the bucket of ``after.ts - window`` (of ``after.ts`` with forward insert,
    whose bucket holds copies of the window before it), or the oldest bucket
    without a pointer; up to the last bucket starting at or before ``now +
    window`` (a later bucket can only hold messages of writers whose clock runs
    ahead by more than the window; they are read once the time comes, and
    nothing below them can be delivered before, so they are delayed, not
    missed).
    """
    if after is None:
        lo = None
    elif forward_insert:
        lo = after.ts
    else:
        lo = after.ts - window_us
    horizon = now + window_us
    return [b for b in sorted(buckets)
            if (lo is None or b.end > lo) and b.start <= horizon]
