"""Queue table options: what a ``type: "queue"`` VSchema table or a comment marker sets.

Durations are seconds (floats allowed). Every option has a named module
default; unknown names and bad values are refused with the option's path.

=====================  =======  ==============================================
option                 default  meaning
=====================  =======  ==============================================
``ack_wait``           30       seconds a fired event waits for its ack before
                                it is fired again
``min_backoff``        1        smallest extra delay added on a retry
``max_backoff``        300      largest extra delay (0: no maximum)
``window``             30       seconds ahead the manager keeps in memory and
                                the period of its full scan
``batch_size``         64       events per batch sent to one receiver
``cache_size``         10000    events held in memory at most (scan LIMIT)
``max_attempts``       0        fires before an event becomes ``failed``
                                (0: no limit)
``max_per_second``     0        events fired per second at most (0: no limit)
``max_in_flight``      0        fired, unacked events at most (0: no limit)
``retention``          3600     seconds an acked event is kept before purge
``collector_interval`` 5        period of the slow collector of old fired events
``ordering_key``       none     column: at most one event in flight per value
``group_key``          none     column: when every event of a group is acked,
                                a follow-up event is enqueued
``hot_key_threshold``  200      pending events of one key above which its
                                ordering is switched off (circuit breaker)
``hot_key_cooldown``   1200     seconds ordering stays off for a hot key
``storage``            table    ``table`` (the queue table, state in place) or
                                ``segmented`` (append-only datasets, see
                                :mod:`shardgate.queues.segmented`)
``dataset_max_rows``   100000   segmented: jobs per dataset table at most
``dataset_max_bytes``  300 MB   segmented: payload bytes per dataset at most
``merge_max_rows``     10000    segmented: pending jobs a merge copies at most
                                (bounds the consumer's pause)
=====================  =======  ==============================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from shardgate.errors import InvalidArgument

DEFAULT_ACK_WAIT_S = 30.0
DEFAULT_MIN_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 300.0
DEFAULT_WINDOW_S = 30.0
DEFAULT_BATCH_SIZE = 64
DEFAULT_CACHE_SIZE = 10_000
DEFAULT_RETENTION_S = 3600.0
DEFAULT_COLLECTOR_INTERVAL_S = 5.0
DEFAULT_HOT_KEY_THRESHOLD = 200
DEFAULT_HOT_KEY_COOLDOWN_S = 1200.0
DEFAULT_DATASET_MAX_ROWS = 100_000
DEFAULT_DATASET_MAX_BYTES = 300_000_000
DEFAULT_MERGE_MAX_ROWS = 10_000
#: The storage modes a queue can use (option ``storage``).
STORAGE_MODES = ("table", "segmented")

#: The comment marker that makes a table a queue table: ``shardgate_queue,ack_wait=30,...``.
COMMENT_MARKER = "shardgate_queue"


@dataclass(frozen=True)
class QueueOptions:
    """Validated options of one queue table (see the module docstring)."""

    ack_wait: float = DEFAULT_ACK_WAIT_S
    min_backoff: float = DEFAULT_MIN_BACKOFF_S
    max_backoff: float = DEFAULT_MAX_BACKOFF_S
    window: float = DEFAULT_WINDOW_S
    batch_size: int = DEFAULT_BATCH_SIZE
    cache_size: int = DEFAULT_CACHE_SIZE
    max_attempts: int = 0
    max_per_second: float = 0.0
    max_in_flight: int = 0
    retention: float = DEFAULT_RETENTION_S
    collector_interval: float = DEFAULT_COLLECTOR_INTERVAL_S
    ordering_key: str | None = None
    group_key: str | None = None
    hot_key_threshold: int = DEFAULT_HOT_KEY_THRESHOLD
    hot_key_cooldown: float = DEFAULT_HOT_KEY_COOLDOWN_S
    storage: str = "table"
    dataset_max_rows: int = DEFAULT_DATASET_MAX_ROWS
    dataset_max_bytes: int = DEFAULT_DATASET_MAX_BYTES
    merge_max_rows: int = DEFAULT_MERGE_MAX_ROWS

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], path: str = "queue") -> QueueOptions:
        """Validate ``doc`` (numbers may be given as strings, as in comment markers)."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in doc.items():
            f = known.get(key)
            if f is None:
                raise InvalidArgument(
                    f"{path}.{key}: unknown queue option; known: {sorted(known)}"
                )
            default = f.default
            if key in ("ordering_key", "group_key"):
                if raw is not None and (not isinstance(raw, str) or not raw):
                    raise InvalidArgument(f"{path}.{key}: must be a column name")
                values[key] = raw.lower() if isinstance(raw, str) else None
                continue
            if key == "storage":
                if not isinstance(raw, str) or raw.lower() not in STORAGE_MODES:
                    raise InvalidArgument(f"{path}.storage: must be one of {STORAGE_MODES}")
                values[key] = raw.lower()
                continue
            try:
                num = int(raw) if isinstance(default, int) else float(raw)
            except (TypeError, ValueError):
                kind = "an integer" if isinstance(default, int) else "a number of seconds"
                raise InvalidArgument(f"{path}.{key}: must be {kind}, not {raw!r}") from None
            if isinstance(raw, bool) or num < 0:
                raise InvalidArgument(f"{path}.{key}: must be >= 0, not {raw!r}")
            values[key] = num
        opts = cls(**values)
        if opts.ack_wait <= 0 or opts.window <= 0 or opts.batch_size < 1 or opts.cache_size < 1:
            raise InvalidArgument(
                f"{path}: ack_wait and window must be > 0, batch_size and cache_size >= 1"
            )
        if opts.dataset_max_rows < 1 or opts.dataset_max_bytes < 1:
            raise InvalidArgument(f"{path}: dataset_max_rows and dataset_max_bytes must be >= 1")
        if opts.max_backoff and opts.max_backoff < opts.min_backoff:
            raise InvalidArgument(f"{path}: max_backoff must be >= min_backoff (or 0)")
        return opts

    def to_mapping(self) -> dict[str, Any]:
        """The options that differ from the defaults."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v != f.default:
                out[f.name] = v
        return out

    def to_comment(self) -> str:
        """The table comment marker carrying these options."""
        parts = [COMMENT_MARKER] + [f"{k}={v}" for k, v in self.to_mapping().items()]
        return ",".join(parts)


def parse_comment(comment: str) -> QueueOptions | None:
    """The options of a comment marker, or None if ``comment`` is not one."""
    text = comment.strip()
    if not text.startswith(COMMENT_MARKER):
        return None
    doc: dict[str, str] = {}
    for part in text[len(COMMENT_MARKER) :].split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidArgument(f"queue comment marker {comment!r}: {part!r} is not key=value")
        doc[key.strip()] = value.strip()
    return QueueOptions.from_mapping(doc, path="comment")
