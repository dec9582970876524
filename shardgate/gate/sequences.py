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

from sqlglot import exp

from shardgate.errors import FailedPrecondition, ShardgateError
from shardgate.gate.failures import internal_failure, quiet_rollback
from shardgate.tablet import TabletClient

AllocateFn = Callable[[str, int], Awaitable[tuple[int, int]]]
#: keyspace -> ``(keyspace, shard)`` and tablet of its first shard
FirstShardFn = Callable[[str], tuple[tuple[str, str], TabletClient]]


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


class SequenceTables:
    """Where each sequence's row lives (the first shard of its keyspace) and how a
    block of its values is reserved there (the ``allocate`` of :class:`Sequences`)."""

    def __init__(self, first_shard: FirstShardFn) -> None:
        self._first_shard = first_shard

    def home(self, sequence: str) -> tuple[tuple[str, str], TabletClient, str]:
        """Where sequence ``ks.table`` lives: the first shard of ``ks``; and ``table``."""
        ks_name, table = sequence.split(".", 1)
        key, tablet = self._first_shard(ks_name)
        return key, tablet, table

    async def allocate(self, sequence: str, count: int) -> tuple[int, int]:
        """Reserve a block of ``max(cache, count)`` values in a transaction of its own."""
        key, tablet, table = self.home(sequence)
        tid = await tablet.begin()
        try:
            end, cache = await self._reserve(tablet, sequence, table, tid, count, cached=True)
            await tablet.commit(tid)
        except ShardgateError as exc:
            await quiet_rollback(tablet, tid)
            raise internal_failure(exc, f"{key[0]}/{key[1]}",
                                   f"allocating values of sequence {sequence}") from exc
        except BaseException:
            await quiet_rollback(tablet, tid)
            raise
        return end - max(cache, count), end

    async def allocate_in(self, tid: int, sequence: str, count: int) -> tuple[int, int]:
        """Reserve exactly ``count`` values inside the session's transaction ``tid``."""
        _, tablet, table = self.home(sequence)
        end, _ = await self._reserve(tablet, sequence, table, tid, count, cached=False)
        return end - count, end

    async def _reserve(
        self, tablet: TabletClient, sequence: str, table: str, tid: int, count: int,
        *, cached: bool,
    ) -> tuple[int, int]:
        """Move ``next_id`` on (UPDATE first: the row lock serialises gates); its new value."""
        ident = exp.to_identifier(table).sql(dialect=tablet.dialect)
        ph = tablet.placeholder
        if ph == "%s":  # a driver formatting its parameters: a % of the name is doubled
            ident = ident.replace("%", "%%")
        step = f"CASE WHEN cache > {ph} THEN cache ELSE {ph} END" if cached else ph
        await tablet.execute(
            f"UPDATE {ident} SET next_id = next_id + {step} WHERE id = 0",
            [count, count] if cached else [count],
            tid,
        )
        res = await tablet.execute(f"SELECT next_id, cache FROM {ident} WHERE id = 0", [], tid)
        if not res.rows:
            raise FailedPrecondition(
                f"sequence {sequence} has no row with id = 0: "
                f"INSERT INTO {table} (id, next_id, cache) VALUES (0, 1, 1000)"
            )
        return int(res.rows[0][0]), int(res.rows[0][1])
