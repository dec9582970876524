"""Sequences for ``auto_increment`` columns of sharded tables (Vitess's design).

A sequence is a one-row table in an unsharded keyspace::

    CREATE TABLE user_seq (id INT PRIMARY KEY, next_id BIGINT, cache BIGINT);
    INSERT INTO user_seq (id, next_id, cache) VALUES (0, 1, 1000);

Invariants: the gate reserves blocks of ``max(cache, n)`` values in a short
transaction of its own (UPDATE first, so the row lock serialises gates, then
read the new ``next_id``); values in a block are handed out once, in order;
a block is never returned, so values may be skipped but never repeated, even
across gates and restarts, as long as the sequence's row is not reset. A
block is forgotten when its sequence leaves the served VSchema (``retain``) or
is restarted through this gate (``forget``: ``auto_shard`` starting the
sequence of a re-created table at 1).

One exception to the separate transaction: when the caller's transaction
already holds the sequence's database and that database has one writer at a
time (SQLite), a transaction of its own would wait for the caller's forever.
The caller then passes ``in_transaction``: exactly the values needed are
reserved inside the caller's transaction and never cached, so if it rolls
back, the values and the rows that used them go together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from shardgate.errors import FailedPrecondition

AllocateFn = Callable[[str, int], Awaitable[tuple[int, int]]]


class Sequences:
    """Hands out sequence values from reserved blocks."""

    def __init__(self, allocate: AllocateFn) -> None:
        # allocate(sequence, n) -> (first, end) reserves [first, end), end - first >= n
        self._allocate = allocate
        self._blocks: dict[str, tuple[int, int]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def forget(self, sequence: str) -> None:
        """Drop the cached block of ``sequence`` (its table was dropped or restarted)."""
        self._blocks.pop(sequence, None)

    def retain(self, sequences: set[str]) -> None:
        """Drop the cached blocks of sequences not in ``sequences`` (the VSchema's now)."""
        for name in [n for n in self._blocks if n not in sequences]:
            del self._blocks[name]

    async def next_values(
        self, sequence: str, count: int, *, in_transaction: AllocateFn | None = None
    ) -> int:
        """Reserve ``count`` consecutive values; return the first.

        ``in_transaction`` (see the module docstring) reserves in the caller's
        transaction when the cached block is too small; its values are not cached.
        """
        lock = self._locks.setdefault(sequence, asyncio.Lock())
        async with lock:
            nxt, end = self._blocks.get(sequence, (0, 0))
            if end - nxt < count and in_transaction is not None:
                first, stop = await in_transaction(sequence, count)
                if stop - first != count:
                    raise FailedPrecondition(
                        f"sequence {sequence} returned {stop - first} values, needed {count}"
                    )
                return first
            if end - nxt < count:
                first, end = await self._allocate(sequence, count)
                if end - first < count:
                    raise FailedPrecondition(
                        f"sequence {sequence} returned {end - first} values, needed {count}"
                    )
                nxt = first
            self._blocks[sequence] = (nxt + count, end)
            return nxt
