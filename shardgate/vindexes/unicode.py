"""``unicode_loose_md5`` and ``unicode_loose_xxhash``: hashes of a case- and accent-insensitive
form of text (cost 1, unique).

Vitess (``unicodeloosemd5.go``) hashes the *collation weights* of the value
under a MySQL Unicode collation (``utf8mb4_unicode_ci``-like, UCA 4.0.0), so
that strings the collation calls equal share a keyspace id. shardgate has no
UCA weight tables; it hashes a normalized string instead:

1. decode as UTF-8 (bytes that are not valid UTF-8 map to ``[]``);
2. Unicode NFKD (compatibility decomposition: ``é`` -> ``e`` + U+0301,
   ``ﬁ`` -> ``fi``, full-width letters -> ASCII);
3. drop combining marks (``unicodedata.combining(c) != 0``);
4. ``str.casefold()`` (``ß`` -> ``ss``, final and medial Greek sigma alike);
5. strip trailing spaces (U+0020 only: PAD SPACE), keep leading spaces, tabs
   and other whitespace;
6. MD5 of the UTF-8 of the result (16-byte keyspace id); ``unicode_loose_xxhash``
   takes xxHash64 (seed 0) of the same bytes, written little-endian (8 bytes), as
   Vitess's ``unicodeloosexxhash.go`` writes its digest.

So ``Test``, ``TEST``, ``Tést``, ``Te\\u0301st`` and ``Test `` share a keyspace id,
while `` Test`` and ``Test\\t`` do not, as in Vitess. It differs from a full
Unicode collation in that: the keyspace ids are **not** Vitess's (Vitess hashes
weights, we hash text), so data sharded by Vitess's ``unicode_loose_md5`` is
not found by ours; characters UCA ignores (controls, some punctuation) still
count here; characters UCA makes equal without a decomposition (e.g. ``ø``/``o``,
``æ``/``ae``, ``đ``/``d``) stay distinct here; and the fold is Unicode's
default case folding, not a locale's. Use it only for data sharded by
shardgate. NULL hashes as the empty string; ints as their decimal digits.
Only the empty string (and NULL) gets Vitess's keyspace id, since its collation
key is empty in both.

Why not Vitess's bytes: Vitess hashes the primary weights of
``golang.org/x/text/collate`` (``language.English``, ``collate.Loose``), whose
table is CLDR 23's root collation (UCA 6.2.0's ``allkeys_CLDR.txt``), not the
DUCET: ``T``, ``e``, ``s``, ``B`` weigh ``0x1816``, ``0x164C``, ``0x17F3``,
``0x1605`` there, but ``0x1812``, ``0x1648``, ``0x17EF``, ``0x1601`` in pyuca's
DUCET 6.3.0 (and more in later DUCETs), and CLDR renumbers whitespace (tab
``0x0100``, space ``0x0109`` against ``0x0201``/``0x0209``). No package from PyPI
or Debian ships that table, so an exact port is left undone (see docs/vindexes.md).
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

import xxhash

from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId
from shardgate.vindexes.functional import Hashing


def loose_normalize(text: str) -> str:
    """NFKD, drop combining marks, casefold, strip trailing spaces (see the module doc)."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(c for c in decomposed if not unicodedata.combining(c))
    return stripped.casefold().rstrip(" ")


def loose_key(value: Any) -> bytes | None:
    """The bytes the ``unicode_loose_*`` vindexes hash, or None if ``value`` has none."""
    data = to_bytes(value)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return loose_normalize(text).encode("utf-8")


def loose_md5(value: Any) -> bytes | None:
    """MD5 of :func:`loose_key` (None when the value has no key)."""
    key = loose_key(value)
    return None if key is None else hashlib.md5(key, usedforsecurity=False).digest()


class UnicodeLooseMD5(Hashing):
    """MD5 of :func:`loose_normalize` of the text."""

    type_name = "unicode_loose_md5"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        return loose_md5(value)


class UnicodeLooseXXHash(Hashing):
    """xxHash64 of :func:`loose_normalize` of the text, little-endian."""

    type_name = "unicode_loose_xxhash"

    @property
    def cost(self) -> int:
        return 1

    def hash_value(self, value: Any) -> KeyspaceId | None:
        key = loose_key(value)
        if key is None:
            return None
        digest: int = xxhash.xxh64_intdigest(key)
        return digest.to_bytes(8, "little")
