"""``unicode_loose_md5`` and ``unicode_loose_xxhash``: hashes of a case- and accent-insensitive
collation key of text (cost 1, unique), Vitess's keyspace ids.

As Vitess's ``unicodeloosemd5.go`` and ``unicodeloosexxhash.go``: the value's
bytes (``Value.ToBytes``: UTF-8 text, bytes as-is, ints as decimal digits, NULL as
the empty string) lose their trailing U+0020 spaces, become the primary-level
collation key of CLDR 23's root collation (:func:`shardgate.vindexes.collation.collation_key`),
and the key is hashed: MD5 (16-byte keyspace id) or xxHash64 with seed 0 written
little-endian (8 bytes). So ``Test``, ``TEST``, ``Tést``, ``Te\u0301st`` and
``Test `` share a keyspace id, `` Test`` and ``Test\t`` do not, ``ø`` weighs as
``o``... exactly as in Vitess. Values that are not UTF-8 (Vitess: an error), floats
and booleans map to ``[]``.

Before shardgate had the collation table it hashed a folded string (NFKD, no
combining marks, casefold): rows placed that way must be moved (see CHANGELOG).
"""

from __future__ import annotations

import hashlib
from typing import Any

from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId
from shardgate.vindexes.collation import collation_key
from shardgate.vindexes.functional import Hashing
from shardgate.vindexes.xxhash64 import xxhash64_le


def loose_key(value: Any) -> bytes | None:
    """The bytes the ``unicode_loose_*`` vindexes hash, or None if ``value`` has none."""
    data = to_bytes(value)
    return None if data is None else collation_key(data)


def loose_md5(value: Any) -> bytes | None:
    """MD5 of :func:`loose_key` (None when the value has no key)."""
    key = loose_key(value)
    return None if key is None else hashlib.md5(key, usedforsecurity=False).digest()


class UnicodeLooseMD5(Hashing):
    """MD5 of the text's collation key."""

    type_name = "unicode_loose_md5"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        return loose_md5(value)


class UnicodeLooseXXHash(Hashing):
    """xxHash64 of the text's collation key, little-endian."""

    type_name = "unicode_loose_xxhash"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        key = loose_key(value)
        return None if key is None else xxhash64_le(key)
