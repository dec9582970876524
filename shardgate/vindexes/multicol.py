"""``multicol``: one keyspace id built from several columns' hashes (unique).

As Vitess ``multicol.go``. Params:

* ``column_count`` (required, 1..8): number of columns;
* ``column_bytes`` (optional, comma list): how many leading bytes of each
  column's hash go into the 8-byte keyspace id; blanks and missing entries
  share the bytes left, earlier columns first (``3`` columns -> ``3,3,2``);
  the total may not exceed 8;
* ``column_vindex`` (optional, comma list): the functional unique vindex
  type hashing each column (default ``hash``); the cost is the sum of theirs.

A full row maps to the concatenation of the truncated hashes. A *prefix* of
the columns maps to those bytes followed by zeros, with :meth:`prefix_bytes`
significant bytes: the rows it may match are in :meth:`prefix_key_range`. A row
a column vindex cannot map maps to ``[]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.keys import FULL_RANGE, KeyRange
from shardgate.vindexes._params import check_params
from shardgate.vindexes.base import KeyspaceId, MultiColumn
from shardgate.vindexes.functional import Hashing
from shardgate.vindexes.registry import create_vindex

_KSID_LEN = 8


class MultiCol(MultiColumn):
    """Keyspace id = leading bytes of each column's hash, in column order."""

    type_name = "multicol"

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        check_params(
            self.type_name,
            name,
            params,
            allowed={"column_bytes", "column_vindex"},
            required={"column_count"},
        )
        super().__init__(name, params)
        self._count = _column_count(name, params["column_count"])
        self._bytes = _column_bytes(name, params.get("column_bytes", ""), self._count)
        self._vindexes = _column_vindexes(name, params.get("column_vindex", ""), self._count)
        self._offsets = [sum(self._bytes[:i]) for i in range(self._count + 1)]

    @property
    def cost(self) -> int:
        return sum(v.cost for v in self._vindexes)

    @property
    def unique(self) -> bool:
        return True

    @property
    def column_count(self) -> int:
        """How many columns a full row has."""
        return self._count

    @property
    def column_bytes(self) -> list[int]:
        """Bytes of the keyspace id each column fills."""
        return list(self._bytes)

    def prefix_bytes(self, n_columns: int) -> int:
        if not 0 <= n_columns <= self._count:
            raise InvalidArgument(
                f"vindex {self.name!r} (multicol): {n_columns} columns given, it has {self._count}"
            )
        return self._offsets[n_columns]

    def _ksid(self, row: Sequence[Any]) -> bytes | None:
        if not 1 <= len(row) <= self._count:
            raise InvalidArgument(
                f"vindex {self.name!r} (multicol): {len(row)} column values given, "
                f"expected 1 to {self._count}"
            )
        ksid = b""
        for vindex, width, offset, value in zip(
            self._vindexes, self._bytes, self._offsets, row, strict=False
        ):
            hashed = vindex.hash_value(value)
            if hashed is None:
                return None
            # As Vitess: zero-fill up to this column's offset, then its leading bytes.
            ksid = ksid.ljust(offset, b"\x00") + hashed[:width]
        return ksid

    def map_multi(self, rows: Sequence[Sequence[Any]]) -> list[list[KeyspaceId]]:
        out: list[list[KeyspaceId]] = []
        for row in rows:
            ksid = self._ksid(row)
            if ksid is not None and len(row) < self._count:
                ksid = ksid.ljust(self._offsets[-1], b"\x00")
            out.append([] if ksid is None else [ksid])
        return out

    def prefix_key_range(self, row: Sequence[Any]) -> KeyRange | None:
        """The key range holding every row starting with these column values.

        As Vitess's ``NewKeyRangeFromPrefix``: ``[prefix, prefix + 1)``; None
        when a value cannot be mapped.
        """
        ksid = self._ksid(row)
        return None if ksid is None else prefix_range(ksid)

    def verify_multi(
        self, rows: Sequence[Sequence[Any]], ksids: Sequence[KeyspaceId]
    ) -> list[bool]:
        """True where the full row ``rows[i]`` maps to ``ksids[i]``."""
        return [self._ksid(r) == k for r, k in zip(rows, ksids, strict=True)]


def prefix_range(begin: bytes) -> KeyRange:
    """``[begin, begin + 1)`` as Vitess's ``NewKeyRangeFromPrefix``; empty is every shard.

    The end is ``begin`` plus one as a big-endian number of the same length (``03 7b ff``
    -> ``03 7c 00``), unbounded when ``begin`` is all ``ff``: every keyspace id starting
    with ``begin`` is in the range, and no other.
    """
    if not begin:
        return FULL_RANGE
    end = bytearray(begin)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 255:
            end[i] += 1
            return KeyRange(begin, bytes(end))
        end[i] = 0
    return KeyRange(begin, b"")


def _column_count(name: str, raw: str) -> int:
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= _KSID_LEN:
        raise InvalidArgument(
            f"vindex {name!r} (multicol): param 'column_count' must be an integer "
            f"from 1 to 8, got {raw!r}"
        )
    return count


def _column_bytes(name: str, raw: str, count: int) -> list[int]:
    given = [s.strip() for s in raw.split(",")] if raw.strip() else []
    if len(given) > count:
        raise InvalidArgument(
            f"vindex {name!r} (multicol): param 'column_bytes' lists {len(given)} entries "
            f"for {count} columns"
        )
    sizes: list[int | None] = [None] * count
    for i, text in enumerate(given):
        if not text:
            continue
        if not text.isdigit() or int(text) < 1:
            raise InvalidArgument(
                f"vindex {name!r} (multicol): param 'column_bytes' entry {text!r} "
                "is not a positive integer"
            )
        sizes[i] = int(text)
    used = sum(s for s in sizes if s is not None)
    pending = sizes.count(None)
    remaining = _KSID_LEN - used
    if used > _KSID_LEN or pending > remaining:
        raise InvalidArgument(
            f"vindex {name!r} (multicol): param 'column_bytes' exceeds the 8 bytes of a keyspace id"
        )
    out: list[int] = []
    for size in sizes:
        if size is None:
            size = -(-remaining // pending)  # ceil, as Vitess
            remaining -= size
            pending -= 1
        out.append(size)
    return out


def _column_vindexes(name: str, raw: str, count: int) -> list[Hashing]:
    given = [s.strip() for s in raw.split(",")] if raw.strip() else []
    if len(given) > count:
        raise InvalidArgument(
            f"vindex {name!r} (multicol): param 'column_vindex' lists {len(given)} vindexes "
            f"for {count} columns"
        )
    out: list[Hashing] = []
    for i in range(count):
        type_name = given[i] if i < len(given) and given[i] else "hash"
        try:
            vindex = create_vindex(type_name, f"{name}.col{i}", {})
        except InvalidArgument:
            vindex = None  # needs params: a lookup, not a hashing vindex
        if not isinstance(vindex, Hashing):
            raise InvalidArgument(
                f"vindex {name!r} (multicol): param 'column_vindex' names {type_name!r}; "
                "each column needs a unique functional vindex that hashes one value "
                "(hash, xxhash, numeric, binary, binary_md5, unicode_loose_md5, reverse_bits, null)"
            )
        out.append(vindex)
    return out
