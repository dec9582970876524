"""Rows sorted by keys computed once per value, as the shards' database orders them.

The gate sorts rows itself after merging shards (a scatter's ORDER BY, DISTINCT,
GROUP BY). Sorting with a comparison function calls
:meth:`~shardgate.evalengine.sqlsem.Semantics.compare` for every pair the sort
compares, about n log n times, each weighing both strings by the collation
again: sysbench's ``SELECT DISTINCT c ... ORDER BY c`` of 100 CHAR(120) rows
spent two thirds of its gate time there.

:func:`sort_rows` gives each value one key instead, when the column's non-NULL
values are all numbers, all strings or all bytes (the keys then order exactly as
``compare`` does: numbers by value, bytes bytewise, strings by their collation's
weights, PAD SPACE collations padded with spaces to the longest). A column of
mixed kinds gives None: the caller compares pairwise, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, cast

from shardgate.evalengine.sqlsem import Semantics
from shardgate.result import Row

#: one sort term: the row's value, descending, NULLs first in the output
Term = tuple[Callable[[Row], Any], bool, bool]


def column_keys(values: Sequence[Any], sem: Semantics) -> list[Any] | None:
    """Keys that order ``values`` (none NULL) as ``sem.compare`` does; None when the
    values are not all of one kind."""
    if all(isinstance(v, int | float | Decimal) for v in values):
        return [int(v) if isinstance(v, bool) else v for v in values]
    if all(isinstance(v, str) for v in values):
        collation = sem.collation
        if collation.unknown:  # refused when two strings are compared, not before
            return None
        keys = [cast(str, collation.key(v)) for v in values]
        if collation.pad_space and keys:
            width = max(len(k) for k in keys)
            keys = [k.ljust(width) for k in keys]
        return keys
    if all(isinstance(v, bytes) for v in values):
        return list(values)
    return None


def sort_rows(rows: Sequence[Row], terms: Sequence[Term], sem: Semantics) -> list[Row] | None:
    """``rows`` sorted by ``terms`` (stable: equal rows keep their order), or None when a
    term's values are not all of one kind (see :func:`column_keys`)."""
    order = list(range(len(rows)))
    passes = []
    for value_of, descending, nulls_first in terms:
        values = [value_of(r) for r in rows]
        keys = column_keys([v for v in values if v is not None], sem)
        if keys is None:
            return None
        # NULLs by a rank of their own; the pass is reversed when descending, and NULLs
        # keep their place in the output whatever the direction
        null_rank = 0 if nulls_first != descending else 1
        found = iter(keys)
        full = [(null_rank, 0) if v is None else (1 - null_rank, next(found)) for v in values]
        passes.append((full, descending))
    for full, descending in reversed(passes):  # least significant term first
        order.sort(key=full.__getitem__, reverse=descending)
    return [rows[i] for i in order]
