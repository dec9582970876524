"""``numeric``: the value itself as an 8-byte big-endian uint64 (cost 0, unique, reversible).

Keeps ids in key order, so ranges of ids go to ranges of shards. Values are
coerced as for ``hash`` (negative int64 as two's complement); others map to ``[]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardgate.vindexes._values import ksid_uint64, to_uint64
from shardgate.vindexes.base import KeyspaceId, Reversible
from shardgate.vindexes.functional import Hashing


class Numeric(Hashing, Reversible):
    """Identity on uint64 values."""

    type_name = "numeric"

    @property
    def cost(self) -> int:
        return 0

    def hash_value(self, value: Any) -> KeyspaceId | None:
        n = to_uint64(value)
        return None if n is None else n.to_bytes(8, "big")

    def reverse_map(self, ksids: Sequence[KeyspaceId]) -> list[Any]:
        return [ksid_uint64(self, k) for k in ksids]
