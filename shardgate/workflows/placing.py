"""Which target shard owns each row of a copy batch, computed for the batch at once.

:func:`owners` gives, for the vindex column values of a batch, the name of
the target whose key range holds each row's keyspace id (None: no target
does, or the vindex maps the value nowhere). It answers exactly as
:meth:`~shardgate.workflows.rowsql.MovingTable.owners` would row by row; for a
``hash`` vindex over integers and targets bounded within 8 bytes it hashes the
whole batch in one DES call and compares keyspace ids as unsigned 64-bit
integers (a hash keyspace id has 8 bytes, and an 8-byte string compares with
a bound padded with zero bytes to 8 as their big-endian integers do).
"""

from __future__ import annotations

import itertools
import struct
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.keys import KeyRange
from shardgate.vindexes.hash import Hash
from shardgate.workflows.rowsql import MovingTable

_U64 = 1 << 64
_MASK = _U64 - 1
_I64_MIN = -(1 << 63)


def owners(table: MovingTable, values: Sequence[Any],
           targets: Sequence[tuple[str, KeyRange]]) -> list[str | None]:
    """The target owning each of ``values`` (the vindex column of the rows) of the
    sharded ``table`` (see the module docstring)."""
    vindex = table.vindex
    if vindex is None:
        raise InvalidArgument(f"table {table.name} is a reference table: every target owns it")
    if not values:
        return []
    fast = _uint64_bounds(targets)
    if type(vindex) is Hash and fast is not None and set(map(type, values)) == {int}:
        lo, hi = min(values), max(values)
        if lo >= _I64_MIN and hi < _U64:
            n = len(values)
            nums = values if lo >= 0 else [v & _MASK for v in values]
            hashed = struct.unpack(f">{n}Q", vindex.hash_blocks(struct.pack(f">{n}Q", *nums)))
            names, starts, ends = fast
            out: list[str | None] = []
            for k in hashed:
                i = bisect_right(starts, k) - 1
                end = ends[i] if i >= 0 else 0
                out.append(names[i] if i >= 0 and (end is None or k < end) else None)
            return out
    bounds = [(name, kr.start.rstrip(b"\x00"), kr.end.rstrip(b"\x00") if kr.end else None)
              for name, kr in targets]
    found: list[str | None] = []
    for mapped in vindex.map(list(values)):
        owner = None
        if mapped:
            k = mapped[0].rstrip(b"\x00")
            for name, start, stop in bounds:
                if start <= k and (stop is None or k < stop):
                    owner = name
                    break
        found.append(owner)
    return found


def _uint64_bounds(targets: Sequence[tuple[str, KeyRange]]
                   ) -> tuple[list[str], list[int], list[int | None]] | None:
    """The targets sorted by start with their bounds as uint64s (end None: unbounded),
    or None when a bound has more than 8 bytes or two ranges overlap."""
    rows: list[tuple[int, int | None, str]] = []
    for name, kr in targets:
        start, end = kr.start.rstrip(b"\x00"), kr.end.rstrip(b"\x00") if kr.end else None
        if len(start) > 8 or (end is not None and len(end) > 8):
            return None
        rows.append((int.from_bytes(start.ljust(8, b"\x00"), "big"), None if end is None
                     else int.from_bytes(end.ljust(8, b"\x00"), "big"), name))
    rows.sort(key=lambda r: r[0])
    for before, after in itertools.pairwise(rows):
        if before[1] is None or before[1] > after[0]:
            return None
    return [r[2] for r in rows], [r[0] for r in rows], [r[1] for r in rows]
