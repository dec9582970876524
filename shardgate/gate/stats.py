"""Per-normalized-query statistics: what a status page shows.

Statements are grouped by their normalized text (literals replaced by ``?``),
so ``WHERE id = 1`` and ``WHERE id = 2`` count together, as do bind-variable
forms. Recording is a dictionary update per statement.

:class:`Timeline` keeps the same kind of figures per time window instead: calls,
errors and latency per keyspace and per shard over the last minutes.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class QueryStats:
    """Counters for one normalized query."""

    query: str
    count: int = 0
    errors: int = 0
    total_seconds: float = 0.0
    max_seconds: float = 0.0
    rows: int = 0
    shard_calls: int = 0

    @property
    def mean_seconds(self) -> float:
        return self.total_seconds / self.count if self.count else 0.0


class Stats:
    """The gate's table of :class:`QueryStats`, bounded in size."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._by_query: dict[str, QueryStats] = {}

    def record(
        self, query: str, seconds: float, rows: int, shard_calls: int, error: bool
    ) -> None:
        st = self._by_query.get(query)
        if st is None:
            if len(self._by_query) >= self.capacity:
                return  # a full table keeps the queries it has
            st = self._by_query[query] = QueryStats(query)
        st.count += 1
        st.errors += error
        st.total_seconds += seconds
        st.max_seconds = max(st.max_seconds, seconds)
        st.rows += rows
        st.shard_calls += shard_calls

    def snapshot(self) -> list[QueryStats]:
        """All queries, the most time-consuming first."""
        return sorted(self._by_query.values(), key=lambda s: s.total_seconds, reverse=True)

    def reset(self) -> None:
        self._by_query.clear()


#: the timeline's bucket width (seconds) and how many buckets each series keeps
#: (10 s x 60: the last ten minutes, as VTAdmin's and River's small charts show)
BUCKET_S = 10
BUCKETS_KEPT = 60
#: latency histogram bounds of a bucket: 1.25x apart from 50 µs (the last ~63 s)
LATENCY_BOUNDS: tuple[float, ...] = tuple(5e-5 * 1.25 ** i for i in range(64))


class _Bucket:
    """One window of one series: calls, failed calls, a sparse latency histogram."""

    __slots__ = ("count", "errors", "hist", "start", "total")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.errors = 0
        self.total = 0.0
        self.hist: dict[int, int] = {}

    def quantile(self, q: float) -> float:
        """The latency (seconds) below which ``q`` of the calls finished (a bound's
        geometric middle: within 12% of the true value)."""
        want, seen = q * self.count, 0
        for i in sorted(self.hist):
            seen += self.hist[i]
            if seen >= want:
                upper = LATENCY_BOUNDS[min(i, len(LATENCY_BOUNDS) - 1)]
                return upper if i == 0 else upper / 1.25 ** 0.5
        return 0.0


class Timeline:
    """Calls, errors and latencies per ``BUCKET_S`` seconds over the last minutes, per
    series: ``(keyspace, "")`` counts statements through the gate, ``(keyspace, shard)``
    the gate's calls to one shard. The console's charts read it (:meth:`series`).

    Recording appends to the series' ring of buckets (a new bucket when the clock
    has passed the last one's window); buckets older than ``kept`` windows fall off.
    Called on the gate's event loop, like :class:`Stats` (no lock).
    """

    def __init__(self, bucket_s: float = BUCKET_S, kept: int = BUCKETS_KEPT,
                 clock: Callable[[], float] = time.time) -> None:
        self.bucket_s = bucket_s
        self.kept = kept
        self._clock = clock
        self._rings: dict[tuple[str, str], deque[_Bucket]] = {}

    def record(self, key: tuple[str, str], seconds: float, error: bool) -> None:
        now = self._clock()
        start = now - now % self.bucket_s
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = deque(maxlen=self.kept)
        if not ring or ring[-1].start != start:
            ring.append(_Bucket(start))
        b = ring[-1]
        b.count += 1
        b.errors += error
        b.total += seconds
        i = bisect.bisect_left(LATENCY_BOUNDS, seconds)
        b.hist[i] = b.hist.get(i, 0) + 1

    def series(self, minutes: float = 5.0) -> dict[str, Any]:
        """Every series over the last ``minutes``: one point per bucket, oldest first,
        empty windows as zeros. ``qps`` divides by the part of the current window
        that has passed; ``p50_ms``/``p99_ms`` are None for a window without calls."""
        now = self._clock()
        current = now - now % self.bucket_s
        n = max(1, min(self.kept, math.ceil(minutes * 60 / self.bucket_s)))
        starts = [current - (n - 1 - i) * self.bucket_s for i in range(n)]
        out: list[dict[str, Any]] = []
        for (keyspace, shard), ring in sorted(self._rings.items()):
            by_start = {b.start: b for b in ring}
            points = [by_start.get(s) for s in starts]
            counts = [b.count if b else 0 for b in points]
            errors = [b.errors if b else 0 for b in points]
            spans = [self.bucket_s] * (n - 1) + [max(1.0, now - current)]
            out.append({
                "keyspace": keyspace, "shard": shard,
                "count": counts, "errors": errors,
                "qps": [round(c / s, 3) for c, s in zip(counts, spans, strict=True)],
                "error_rate": [round(e / c, 4) if c else 0.0
                               for e, c in zip(errors, counts, strict=True)],
                "p50_ms": [round(b.quantile(0.5) * 1000, 3) if b else None for b in points],
                "p99_ms": [round(b.quantile(0.99) * 1000, 3) if b else None for b in points],
                "total": {"count": sum(counts), "errors": sum(errors)},
            })
        return {"bucket_s": self.bucket_s, "now": now, "starts": starts,
                "keyspaces": [s for s in out if not s["shard"]],
                "shards": [s for s in out if s["shard"]]}
