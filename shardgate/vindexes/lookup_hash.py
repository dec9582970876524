"""Lookups that store keyspace ids as numbers: ``lookup_hash``, ``lookup_hash_unique``,
``lookup_unicodeloosemd5_hash`` and ``lookup_unicodeloosemd5_hash_unique``.

As Vitess ``lookup_hash.go`` and ``lookup_unicodeloosemd5_hash.go`` (both
deprecated there in favour of ``lookup``/``lookup_unique``, kept for existing
data). They behave like :mod:`shardgate.vindexes.lookup` (same params, SQL and
costs: 20 non-unique, 10 unique) except for what the table holds:

* the ``to`` column holds the *uint64 the owner's keyspace id unhashes to*
  under the ``hash`` vindex (its 8-byte DES keyspace id decrypted), not the
  keyspace id; reading it back, the number is hashed again, and a value that
  is no uint64 maps nowhere (Vitess skips it). Keyspace ids of other lengths
  than 8 cannot be stored: :class:`InvalidArgument`.
* ``lookup_unicodeloosemd5_hash*`` also store the ``from`` values hashed: the
  first 8 bytes, big-endian, of the value's ``unicode_loose_md5`` keyspace id,
  as a uint64 (so ``'Test'`` and ``'TEST '`` share a row; Vitess's numbers).
  NULL stays NULL
  (Vitess hashes NULL as the empty string; shardgate keeps ``ignore_nulls``
  meaningful), and a value that cannot be hashed (not UTF-8, a float) is
  refused on writes and maps nowhere on reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.vindexes.base import KeyspaceId, VCursor
from shardgate.vindexes.hash import Hash
from shardgate.vindexes.lookup import LookupBase, LookupNonUnique, LookupUnique
from shardgate.vindexes.unicode import loose_md5


class HashedKeyspaceIds(LookupBase):
    """Stores ``hash``-unhashed uint64s in the ``to`` column (see the module doc)."""

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        super().__init__(name, params)
        self._hash = Hash(name, {})

    def _to_stored(self, ksid: KeyspaceId) -> Any:
        value: int = self._hash.reverse_map([ksid])[0]
        return value

    def _from_stored(self, value: Any) -> KeyspaceId | None:
        # ``hash`` maps whatever is no uint64 (text, bytes of digits or not) to None
        return self._hash.hash_value(value)


class LookupHash(HashedKeyspaceIds, LookupNonUnique):
    """``lookup_hash``: non-unique (cost 20)."""

    type_name = "lookup_hash"


class LookupHashUnique(HashedKeyspaceIds, LookupUnique):
    """``lookup_hash_unique``: unique (cost 10)."""

    type_name = "lookup_hash_unique"


def unicode_md5_uint64(value: Any) -> int | None:
    """The number a ``lookup_unicodeloosemd5_hash`` stores for ``value`` (None: none)."""
    digest = loose_md5(value)
    return None if digest is None else int.from_bytes(digest[:8], "big")


class UnicodeHashedFrom(HashedKeyspaceIds):
    """Also stores the ``from`` values as :func:`unicode_md5_uint64` numbers."""

    def _read_values(self, values: Sequence[Any]) -> list[Any]:
        return [None if v is None else unicode_md5_uint64(v) for v in values]

    def _write_row(self, row: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for v in row:
            n = None if v is None else unicode_md5_uint64(v)
            if v is not None and n is None:
                raise InvalidArgument(
                    f"lookup vindex {self.name!r} ({self.type_name}): value {v!r} cannot be "
                    "hashed (it must be text in UTF-8, bytes or an integer)"
                )
            out.append(n)
        return out

    async def map(self, cursor: VCursor, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        return await super().map(cursor, self._read_values(values))

    async def verify(
        self, cursor: VCursor, values: Sequence[Any], ksids: Sequence[KeyspaceId]
    ) -> list[bool]:
        return await super().verify(cursor, self._read_values(values), ksids)

    async def existing(self, cursor: VCursor, value: Any) -> list[KeyspaceId]:
        return await super().existing(cursor, self._read_values([value])[0])

    async def create(
        self,
        cursor: VCursor,
        rows: Sequence[Sequence[Any]],
        ksids: Sequence[KeyspaceId],
        *,
        ignore_mode: bool = False,
    ) -> None:
        converted = [self._write_row(r) for r in rows]
        await super().create(cursor, converted, ksids, ignore_mode=ignore_mode)

    async def delete(
        self, cursor: VCursor, rows: Sequence[Sequence[Any]], ksid: KeyspaceId
    ) -> None:
        await super().delete(cursor, [self._write_row(r) for r in rows], ksid)


class LookupUnicodeLooseMD5Hash(UnicodeHashedFrom, LookupNonUnique):
    """``lookup_unicodeloosemd5_hash``: non-unique (cost 20)."""

    type_name = "lookup_unicodeloosemd5_hash"


class LookupUnicodeLooseMD5HashUnique(UnicodeHashedFrom, LookupUnique):
    """``lookup_unicodeloosemd5_hash_unique``: unique (cost 10)."""

    type_name = "lookup_unicodeloosemd5_hash_unique"
