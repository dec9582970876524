"""Turning SQL values into the numbers and bytes functional vindexes hash.

Values arrive as Python objects from bind variables or literals: ``int``,
``str``, ``bytes`` (or ``bytearray``/``memoryview``) and ``None``. ``bool`` and
``float`` are never coerced: a vindex maps them to nothing rather than guess.
"""

from __future__ import annotations

from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.keys import ksid_hex
from shardgate.vindexes.base import KeyspaceId, Vindex

_U64 = 1 << 64
_I64_MIN = -(1 << 63)


def to_uint64(value: Any) -> int | None:
    """The uint64 a numeric vindex hashes, or None when ``value`` has none.

    As Vitess's ``hash``: a signed value in the int64 range is taken as its
    two's complement (``-1`` -> ``2**64 - 1``); strings and bytes of decimal
    digits (optionally signed) are parsed the same way. Anything else, and
    numbers outside ``[-2**63, 2**64)``, map to None.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        n = value
    elif isinstance(value, (str, bytes, bytearray, memoryview)):
        text = value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
        text = text.strip()
        body = text[1:] if text[:1] in "+-" else text
        if not body.isascii() or not body.isdigit():
            return None
        n = int(text)
    else:
        return None
    if 0 <= n < _U64:
        return n
    if _I64_MIN <= n < 0:
        return n + _U64
    return None


def to_bytes(value: Any) -> bytes | None:
    """The bytes Vitess's ``Value.ToBytes`` gives: raw bytes, UTF-8 text, decimal ints.

    ``None`` (SQL NULL) is ``b""`` as in Vitess; ``bool``/``float`` and other
    types are None (unmappable).
    """
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    return None


def ksid_uint64(vindex: Vindex, ksid: KeyspaceId) -> int:
    """The uint64 in an 8-byte keyspace id; other lengths are refused naming ``vindex``."""
    if len(ksid) != 8:
        raise InvalidArgument(
            f"vindex {vindex.name!r} ({vindex.type_name}): invalid keyspace id "
            f"{ksid_hex(ksid)}: expected 8 bytes"
        )
    return int.from_bytes(ksid, "big")
