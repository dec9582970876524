"""INSERT IGNORE into a table owning lookup vindexes, kept exact row by row.

One database with the owner table would skip a row that conflicts with a
unique key (its primary key, or the unique value a ``lookup_unique`` vindex
stands for) and insert the others. The gate does the same, inside the
statement's transaction, one row at a time and in order (earlier rows win,
as in the database):

1. for each owned lookup, the rows the lookup table already holds for the
   value: any row of a unique lookup means the value is taken (also when it
   points at this keyspace id: another owner row with the same keyspace id
   holds it), so the row is skipped; a non-unique lookup's row already
   pointing at this keyspace id is kept (it is not the statement's to
   remove); otherwise the lookup row is created (lookup rows first, as for
   every insert);
2. the owner row alone, with the shard's own IGNORE;
3. if the shard skipped it (0 rows affected: a primary or unique key
   conflict), the lookup rows step 1 created are deleted again.

So no lookup row is left without its owner row, and a unique lookup never
gets a second row for a value. Only lookups whose writes join the caller's
transaction qualify (``lookup`` / ``lookup_unique``, one column, no
``autocommit``); the planner refuses the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shardgate.vindexes import KeyspaceId, VCursor
from shardgate.vindexes.lookup import LookupBase

#: run the owner row ``i`` alone on its shard; returns the rows it affected
InsertRow = Callable[[int], Awaitable[int]]


async def insert_ignoring(
    cursor: VCursor,
    lookups: Sequence[LookupBase],
    values: Sequence[Sequence[Any]],
    ksids: Sequence[KeyspaceId],
    insert_row: InsertRow,
) -> int:
    """Insert each row unless it conflicts; ``values[i][j]`` is row i's value of lookup j.

    Returns how many rows were inserted.
    """
    inserted = 0
    for i, (row_values, ksid) in enumerate(zip(values, ksids, strict=True)):
        created = await _claim(cursor, lookups, row_values, ksid)
        if created is None:
            continue
        if await insert_row(i):
            inserted += 1
            continue
        await _release(cursor, created, ksid)
    return inserted


async def _claim(
    cursor: VCursor, lookups: Sequence[LookupBase], row_values: Sequence[Any], ksid: KeyspaceId
) -> list[tuple[LookupBase, Any]] | None:
    """Create the row's missing lookup rows; None (and nothing left) when a value is taken."""
    created: list[tuple[LookupBase, Any]] = []
    for lookup, value in zip(lookups, row_values, strict=True):
        if value is None and lookup.ignore_nulls:
            continue
        held = await lookup.existing(cursor, value) if value is not None else []
        if lookup.unique and held:
            # taken, also by a row of this keyspace id (t2's vindex is k, not
            # the primary key: two rows with one k share it): the database's
            # unique key refuses the row, the shard alone (no such key) would not
            await _release(cursor, created, ksid)
            return None
        if ksid in held:
            continue
        await lookup.create(cursor, [[value]], [ksid])
        created.append((lookup, value))
    return created


async def _release(
    cursor: VCursor, created: Sequence[tuple[LookupBase, Any]], ksid: KeyspaceId
) -> None:
    for lookup, value in created:
        await lookup.delete(cursor, [[value]], ksid)
