"""An LRU cache of plans keyed by (statement text, default keyspace).

The same text with bind variables is parsed and planned once; literals are
part of the key, so callers who want sharing use bind variables.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class PlanCache(Generic[V]):
    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str | None], V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str | None]) -> V | None:
        found = self._items.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return found

    def put(self, key: tuple[str, str | None], value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def items(self) -> list[tuple[tuple[str, str | None], V]]:
        """The cached entries, least recently used first (a copy)."""
        return list(self._items.items())

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
