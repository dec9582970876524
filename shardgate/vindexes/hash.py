"""``hash``: Vitess's DES hash of a uint64 (cost 1, unique, reversible).

The keyspace id is single DES with the all-zero 8-byte key, in ECB mode, of
the value as an 8-byte big-endian uint64 (Vitess ``go/vt/vtgate/vindexes/hash.go``;
its former null-key 3DES is the same function, and is how it is computed here:
OpenSSL's 3DES with three equal keys through ``cryptography``, about 8x faster per
call than pycryptodome's DES, which the tests keep as an independent reference;
whole batches go through single DES from OpenSSL's legacy provider when the
system has it, three times less work, see :mod:`shardgate.vindexes._des`).
Decrypting gives the value
back. Values: ints in ``[-2**63, 2**64)`` (negatives as their two's
complement, as Vitess does for signed values) and strings/bytes of decimal
digits; anything else (NULL, text, floats) maps to ``[]``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
from cryptography.hazmat.primitives.ciphers import Cipher, modes

from shardgate.errors import InvalidArgument
from shardgate.keys import ksid_hex
from shardgate.vindexes._des import bulk_des
from shardgate.vindexes._values import to_uint64
from shardgate.vindexes.base import KeyspaceId, Reversible
from shardgate.vindexes.functional import Hashing

#: from this many bytes on, ``hash_blocks`` uses single DES (:mod:`._des`) if it can
_BULK_BYTES = 4096


class Hash(Hashing, Reversible):
    """Null-key DES of the 8-byte big-endian value."""

    type_name = "hash"

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        super().__init__(name, params)
        # ECB contexts are reused (building one costs more than using it), one per
        # thread: an OpenSSL context must not be driven by two threads at once.
        self._local = threading.local()

    def _contexts(self) -> tuple[Any, Any]:
        ctx: tuple[Any, Any] | None = getattr(self._local, "ctx", None)
        if ctx is None:
            cipher = Cipher(TripleDES(bytes(24)), modes.ECB())
            ctx = self._local.ctx = (cipher.encryptor(), cipher.decryptor())
        return ctx

    def _encrypt(self, plain: bytes) -> bytes:
        out: bytes = self._contexts()[0].update(plain)
        return out

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        n = to_uint64(value)
        if n is None:
            return None
        return self._encrypt(n.to_bytes(8, "big"))

    def map(self, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        if len(values) == 1:  # the common point query
            ksid = self.hash_value(values[0])
            return [[] if ksid is None else [ksid]]
        nums = [to_uint64(v) for v in values]
        plain = b"".join(n.to_bytes(8, "big") for n in nums if n is not None)
        # ECB encrypts each 8-byte block on its own: one call for the whole batch.
        hashed = self._encrypt(plain) if plain else b""
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
        if not plain:
            return b""
        bulk = bulk_des() if len(plain) >= _BULK_BYTES else None
        return bulk.encrypt(plain) if bulk is not None else self._encrypt(plain)

    def hash_inplace(self, buf: bytearray | memoryview) -> None:
        """:meth:`hash_blocks` into the writable buffer that holds the values."""
        bulk = bulk_des()
        if bulk is not None:
            bulk.encrypt_inplace(buf)
        else:
            view = memoryview(buf).cast("B")
            view[:] = self._encrypt(bytes(view))

    def reverse_map(self, ksids: Sequence[KeyspaceId]) -> list[Any]:
        for ksid in ksids:
            if len(ksid) != 8:
                raise InvalidArgument(
                    f"vindex {self.name!r} (hash): invalid keyspace id {ksid_hex(ksid)}: "
                    "a hash keyspace id has 8 bytes"
                )
        plain: bytes = self._contexts()[1].update(b"".join(ksids)) if ksids else b""
        return [int.from_bytes(plain[i : i + 8], "big") for i in range(0, len(plain), 8)]
