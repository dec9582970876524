"""``hash``: Vitess's DES hash of a uint64 (cost 1, unique, reversible).

The keyspace id is single DES with the all-zero 8-byte key, in ECB mode, of
the value as an 8-byte big-endian uint64 (Vitess ``go/vt/vtgate/vindexes/hash.go``;
its former null-key 3DES is the same function). Decrypting gives the value
back. Values: ints in ``[-2**63, 2**64)`` (negatives as their two's
complement, as Vitess does for signed values) and strings/bytes of decimal
digits; anything else (NULL, text, floats) maps to ``[]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from Crypto.Cipher import DES

from shardgate.errors import InvalidArgument
from shardgate.keys import ksid_hex
from shardgate.vindexes._values import to_uint64
from shardgate.vindexes.base import KeyspaceId, Reversible
from shardgate.vindexes.functional import Hashing


class Hash(Hashing, Reversible):
    """Null-key DES of the 8-byte big-endian value."""

    type_name = "hash"

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        super().__init__(name, params)
        # One cipher per vindex: building it costs more than using it.
        self._cipher: Any = DES.new(bytes(8), DES.MODE_ECB)

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        n = to_uint64(value)
        if n is None:
            return None
        ksid: bytes = self._cipher.encrypt(n.to_bytes(8, "big"))
        return ksid

    def map(self, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        if len(values) == 1:  # the common point query
            ksid = self.hash_value(values[0])
            return [[] if ksid is None else [ksid]]
        nums = [to_uint64(v) for v in values]
        plain = b"".join(n.to_bytes(8, "big") for n in nums if n is not None)
        # ECB encrypts each 8-byte block on its own: one call for the whole batch.
        hashed: bytes = self._cipher.encrypt(plain) if plain else b""
        out: list[list[KeyspaceId]] = []
        pos = 0
        for n in nums:
            if n is None:
                out.append([])
            else:
                out.append([hashed[pos : pos + 8]])
                pos += 8
        return out

    def hash_blocks(self, plain: bytes) -> bytes:
        """Keyspace ids of many values at once: ``plain`` is their 8-byte big-endian
        uint64 forms concatenated; the result is their ksids concatenated (one DES call)."""
        out: bytes = self._cipher.encrypt(plain) if plain else b""
        return out

    def reverse_map(self, ksids: Sequence[KeyspaceId]) -> list[Any]:
        for ksid in ksids:
            if len(ksid) != 8:
                raise InvalidArgument(
                    f"vindex {self.name!r} (hash): invalid keyspace id {ksid_hex(ksid)}: "
                    "a hash keyspace id has 8 bytes"
                )
        plain: bytes = self._cipher.decrypt(b"".join(ksids)) if ksids else b""
        return [int.from_bytes(plain[i : i + 8], "big") for i in range(0, len(plain), 8)]
