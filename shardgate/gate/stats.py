"""Per-normalized-query statistics: what a status page shows.

Statements are grouped by their normalized text (literals replaced by ``?``),
so ``WHERE id = 1`` and ``WHERE id = 2`` count together, as do bind-variable
forms. Recording is a dictionary update per statement.
"""

from __future__ import annotations

from dataclasses import dataclass


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
