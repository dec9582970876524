"""``reverse_bits``: the uint64 value with its 64 bits reversed (cost 1, unique, reversible).

Spreads sequential ids over all shards while staying reversible
(Vitess ``go/vt/vtgate/vindexes/reverse_bits.go``): 1 -> ``80 00 .. 00``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardgate.vindexes._values import ksid_uint64, to_uint64
from shardgate.vindexes.base import KeyspaceId, Reversible
from shardgate.vindexes.functional import Hashing

# Bit-reversal table for one byte; a uint64 reverses byte by byte.
_REV8 = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def reverse_bits64(n: int) -> int:
    """``n`` (a uint64) with bit 0 swapped with bit 63, 1 with 62, ..."""
    return int.from_bytes(n.to_bytes(8, "little").translate(_REV8), "big")


class ReverseBits(Hashing, Reversible):
    """Bit-reversed uint64, big-endian."""

    type_name = "reverse_bits"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        n = to_uint64(value)
        return None if n is None else reverse_bits64(n).to_bytes(8, "big")

    def reverse_map(self, ksids: Sequence[KeyspaceId]) -> list[Any]:
        return [reverse_bits64(ksid_uint64(self, k)) for k in ksids]
