"""``xxhash``: xxHash64 (seed 0) of the value's bytes (cost 1, unique).

As Vitess ``go/vt/vtgate/vindexes/xxhash.go``: the input is the value's SQL
text bytes (ints as decimal digits, strings as UTF-8, bytes as-is; NULL is the
empty string) and the keyspace id is the 64-bit hash written **little-endian**
(8 bytes). Floats and booleans map to ``[]``.
"""

from __future__ import annotations

from typing import Any

import xxhash

from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId
from shardgate.vindexes.functional import Hashing


def xxhash64_le(data: bytes) -> bytes:
    """xxHash64 (seed 0) of ``data``, the 8 bytes little-endian (Vitess's ``vhash``)."""
    digest: int = xxhash.xxh64_intdigest(data)
    return digest.to_bytes(8, "little")


class XXHash(Hashing):
    """xxHash64 of the value's bytes, little-endian."""

    type_name = "xxhash"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        data = to_bytes(value)
        return None if data is None else xxhash64_le(data)
