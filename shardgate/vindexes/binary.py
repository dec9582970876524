"""``binary`` (identity, cost 0, reversible) and ``binary_md5`` (MD5, cost 1); both unique.

Both work on the value's bytes as Vitess's ``Value.ToBytes`` gives them:
bytes as-is, strings as UTF-8, ints as their decimal digits, NULL as ``b""``
(Vitess ``binary.go`` and ``binarymd5.go``). ``binary`` keeps byte order, so
the keyspace id *is* the value; ``binary_md5`` spreads values evenly with the
16-byte MD5 digest. Floats and booleans map to ``[]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId, Reversible
from shardgate.vindexes.functional import Hashing


class Binary(Hashing, Reversible):
    """The value's bytes are the keyspace id."""

    type_name = "binary"

    @property
    def cost(self) -> int:
        return 0

    def hash_value(self, value: Any) -> KeyspaceId | None:
        return to_bytes(value)

    def reverse_map(self, ksids: Sequence[KeyspaceId]) -> list[Any]:
        return [bytes(k) for k in ksids]


class BinaryMD5(Hashing):
    """MD5 of the value's bytes (16-byte keyspace ids)."""

    type_name = "binary_md5"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        data = to_bytes(value)
        return None if data is None else hashlib.md5(data, usedforsecurity=False).digest()
