"""``cfc``: Concatenated Fixed-width Composite keys (cost 1, unique).

As Vitess ``go/vt/vtgate/vindexes/cfc.go``: the column holds a key made of
components laid end to end (``s1 s2 ... sN``); each component but the last has
a fixed width, given by ``offsets``, a JSON list of sorted positive byte offsets
(``"[2,4]"``: bytes 0-1, 2-3 and 4-end). Params:

* ``hash`` (optional): ``md5`` or ``xxhash64``. Without it the key's bytes *are*
  the keyspace id (``offsets`` is then ignored). With it the keyspace id is the
  concatenation of each component's hash, each hash cut to the component's
  length (MD5 16 bytes, xxHash64 8 bytes little-endian), and ``offsets`` is
  required.
* ``offsets``: see above; duplicates in a sorted list are refused, as Vitess does.

A value shorter than the last offset cannot be mapped (Vitess: "insufficient
size"): it maps to nothing for a read and is refused for an insert by the
planner's one-keyspace-id check. NULL is ``b""``; ints are their decimal digits.

What Vitess adds and shardgate does not do (yet): ``col LIKE 'prefix%'`` routed
to the key range of the prefix (``PrefixVindex``). :meth:`CFC.prefix_key_range`
computes that range (Vitess's ``findPrefix`` unescaping and ``[prefix,
prefix+1)``), but the planner routes LIKE on a ``cfc`` column as a scatter: the
range is right only where LIKE compares bytes (SQLite's LIKE ignores ASCII case,
MariaDB's ``_ci`` collations case and accents).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.keys import KeyRange
from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId
from shardgate.vindexes.functional import Hashing
from shardgate.vindexes.multicol import prefix_range
from shardgate.vindexes.xxhash64 import xxhash64_le

#: MySQL's backslash escapes (Vitess ``sqltypes.SQLDecodeMap``); others stand for themselves
_UNESCAPE = {ord("0"): 0, ord("b"): 8, ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("Z"): 26}


def _md5(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()[: len(data)]


def _xxhash64(data: bytes) -> bytes:
    return xxhash64_le(data)[: len(data)]


_HASHES: dict[str, Callable[[bytes], bytes]] = {"md5": _md5, "xxhash64": _xxhash64}


def like_prefix(pattern: bytes) -> bytes:
    """The literal prefix of a LIKE pattern: up to the first unescaped ``%`` or ``_``."""
    out = bytearray()
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c in b"%_":
            break
        if c == ord("\\"):
            if i == len(pattern) - 1:
                out.append(c)
                break
            nxt = pattern[i + 1]
            out.append(_UNESCAPE.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


class CFC(Hashing):
    """Keyspace id from a concatenated fixed-width composite key."""

    type_name = "cfc"
    allowed_params = frozenset({"hash", "offsets"})

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        super().__init__(name, params)
        self._hash: Callable[[bytes], bytes] | None = None
        self._offsets: list[int] = []
        hash_name = params.get("hash", "")
        if not hash_name:
            return
        if hash_name not in _HASHES:
            raise InvalidArgument(
                f"vindex {name!r} (cfc): invalid hash {hash_name!r}; use md5 or xxhash64"
            )
        self._hash = _HASHES[hash_name]
        raw = params.get("offsets", "")
        if not raw:
            raise InvalidArgument(f"vindex {name!r} (cfc): offsets are required with a hash")
        try:
            offsets = json.loads(raw)
        except ValueError:
            offsets = None
        good = (
            isinstance(offsets, list)
            and offsets
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and offsets[0] > 0
            and all(b > a for a, b in pairwise(offsets))
        )
        if not good:
            raise InvalidArgument(
                f"vindex {name!r} (cfc): invalid offsets {raw}: expected sorted positive "
                "ints in brackets, e.g. [2,4]"
            )
        self._offsets = list(offsets)

    @property
    def cost(self) -> int:
        return 1

    @property
    def offsets(self) -> list[int]:
        """The component boundaries (empty without a hash)."""
        return list(self._offsets)

    def compute_ksid(self, key: bytes, *, prefix: bool = False) -> bytes | None:
        """The keyspace id of ``key``; for a ``prefix``, of its whole components only.

        None when a full key is shorter than the last offset.
        """
        if self._hash is None:
            return key
        if not prefix and len(key) < self._offsets[-1]:
            return None
        out = bytearray()
        start = 0
        for off in self._offsets:
            if len(key) < off:
                return bytes(out)
            out += self._hash(key[start:off])
            start = off
        if start < len(key):
            out += self._hash(key[start:])
        return bytes(out)

    def hash_value(self, value: Any) -> KeyspaceId | None:
        data = to_bytes(value)
        return None if data is None else self.compute_ksid(data)

    def prefix_key_range(self, pattern: Any) -> KeyRange | None:
        """The key range of the rows ``col LIKE pattern`` may match (Vitess's prefix mode)."""
        data = to_bytes(pattern)
        if data is None:
            return None
        begin = self.compute_ksid(like_prefix(data), prefix=True)
        return prefix_range(begin or b"")
