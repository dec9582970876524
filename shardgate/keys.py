"""Keyspace ids, key ranges and shard names.

A keyspace id (ksid) is a ``bytes`` value that places a row. Shards own
contiguous, half-open key ranges ``[start, end)``; an empty bound is unbounded.

Comparison follows Vitess's ``go/vt/key/key.go``: ids and bounds are compared
byte-wise after dropping trailing zero bytes, so ``80`` and ``8000`` are the
same bound and ``b"\\x80"`` is the first id of the shard ``80-``.

Shard names are the hex of both bounds around a dash: ``-80``, ``40-80``,
``80-``; ``-`` (and the unsharded name ``0``) is the full range.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from shardgate.errors import InvalidArgument

KeyspaceId = bytes

_SHARD_NAME = re.compile(r"^([0-9a-fA-F]*)-([0-9a-fA-F]*)$")
_NAME_FORMS = "'-80', '40-80', '80-', '-' or '0' (hex bounds, even number of digits)"


@dataclass(frozen=True, slots=True, order=True)
class ShardId:
    """One shard of one keyspace; ``str()`` is ``"keyspace/shard"`` (the form in event
    tokens, positions and logs), which :meth:`parse` reads back."""

    keyspace: str
    shard: str

    @classmethod
    def parse(cls, text: str) -> ShardId:
        """``"ks/shard"`` -> ``ShardId("ks", "shard")``; InvalidArgument without the slash."""
        keyspace, slash, shard = text.partition("/")
        if not slash or not keyspace or not shard:
            raise InvalidArgument(f"{text!r} is not a shard id: write it 'keyspace/shard'")
        return cls(keyspace, shard)

    def __str__(self) -> str:
        return f"{self.keyspace}/{self.shard}"


def ksid_hex(ksid: KeyspaceId) -> str:
    """Lower-case hex of a keyspace id (``b"\\x16k"`` -> ``"166b"``)."""
    return ksid.hex()


def uint64_to_ksid(n: int) -> KeyspaceId:
    """The 8-byte big-endian keyspace id of ``0 <= n < 2**64``."""
    if not 0 <= n < 1 << 64:
        raise InvalidArgument(f"value {n} is out of the uint64 range [0, 2**64)")
    return n.to_bytes(8, "big")


def ksid_to_uint64(ksid: KeyspaceId) -> int:
    """The first 8 bytes of ``ksid`` as a big-endian uint64 (shorter ids are zero-padded)."""
    return int.from_bytes(ksid[:8].ljust(8, b"\x00"), "big")


def _norm(b: bytes) -> bytes:
    """Drop trailing zero bytes: ``80``, ``8000`` and ``800000`` are the same bound."""
    return b.rstrip(b"\x00")


@dataclass(frozen=True, slots=True)
class KeyRange:
    """The half-open range ``[start, end)`` of keyspace ids; ``b""`` is unbounded."""

    start: bytes = b""
    end: bytes = b""

    @classmethod
    def full(cls) -> KeyRange:
        """The whole keyspace (``-``)."""
        return cls(b"", b"")

    @property
    def is_full(self) -> bool:
        """True when both ends are unbounded."""
        return not _norm(self.start) and not self.end

    @property
    def name(self) -> str:
        """The Vitess shard name: ``-80``, ``40-80``, ``80-``, or ``-`` for the full range."""
        if self.is_full:
            return "-"
        return f"{self.start.hex()}-{self.end.hex()}"

    def __str__(self) -> str:
        return self.name

    def contains(self, ksid: KeyspaceId) -> bool:
        """True when ``start <= ksid < end`` (unbounded ends always pass)."""
        k = _norm(ksid)
        if k < _norm(self.start):
            return False
        return not self.end or k < _norm(self.end)

    def intersects(self, other: KeyRange) -> bool:
        """True when the two ranges share at least one keyspace id."""
        return self.intersect(other) is not None

    def intersect(self, other: KeyRange) -> KeyRange | None:
        """The common part of both ranges, or None when they are disjoint."""
        start = max(self.start, other.start, key=_norm)
        if not self.end:
            end = other.end
        elif not other.end:
            end = self.end
        else:
            end = min(self.end, other.end, key=_norm)
        if end and _norm(start) >= _norm(end):
            return None
        return KeyRange(start, end)

    def split(self, n: int) -> list[KeyRange]:
        """``n`` contiguous ranges of (nearly) equal size covering this one.

        Bounds are computed in the 64-bit space (or the width of the longer
        bound when it is wider) and printed without trailing zero bytes, so the
        full range split in 4 gives ``-40``, ``40-80``, ``80-c0``, ``c0-`` as
        Vitess names them; ``n`` need not be a power of two (3 gives
        ``-5555555555555555``, ``5555555555555555-aaaaaaaaaaaaaaaa``, ...).
        """
        if n < 1:
            raise InvalidArgument(
                f"cannot split key range {self.name} into {n} parts: n must be >= 1"
            )
        width = max(8, len(self.start), len(self.end))
        lo = int.from_bytes(self.start.ljust(width, b"\x00"), "big")
        hi = int.from_bytes(self.end.ljust(width, b"\x00"), "big") if self.end else 1 << (8 * width)
        if hi - lo < n:
            raise InvalidArgument(f"key range {self.name} is too small to split into {n} parts")
        cuts = [lo + (hi - lo) * i // n for i in range(1, n)]
        bounds = [self.start, *(_bound(c, width) for c in cuts), self.end]
        return [KeyRange(bounds[i], bounds[i + 1]) for i in range(n)]


def _bound(value: int, width: int) -> bytes:
    return value.to_bytes(width, "big").rstrip(b"\x00") or b"\x00"


FULL_RANGE = KeyRange()


def parse_shard_name(name: str) -> KeyRange:
    """Parse a shard name (``-80``, ``40-80``, ``80-``, ``-``, or ``0`` for unsharded)."""
    if name == "0":
        return FULL_RANGE
    m = _SHARD_NAME.match(name)
    if m is None or len(m.group(1)) % 2 or len(m.group(2)) % 2:
        raise InvalidArgument(f"bad shard name or key range {name!r}: use {_NAME_FORMS}")
    start, end = bytes.fromhex(m.group(1)), bytes.fromhex(m.group(2))
    if end and _norm(start) >= _norm(end):
        raise InvalidArgument(f"bad key range {name!r}: start must be below end; use {_NAME_FORMS}")
    return KeyRange(start, end)


def parse_key_range(s: str) -> KeyRange:
    """Same as :func:`parse_shard_name`."""
    return parse_shard_name(s)


def validate_partition(ranges: Sequence[KeyRange]) -> None:
    """Raise :class:`InvalidArgument` unless ``ranges`` cover the keyspace exactly once."""
    if not ranges:
        raise InvalidArgument("no key ranges: a keyspace needs shards covering '-'")
    ordered = sorted(ranges, key=lambda r: _norm(r.start))
    expected = b""
    for i, kr in enumerate(ordered):
        if _norm(kr.start) != _norm(expected):
            what = "gap" if _norm(kr.start) > _norm(expected) else "overlap"
            raise InvalidArgument(
                f"key ranges do not partition the keyspace: {what} between "
                f"{expected.hex() or '(start)'} and {kr.start.hex() or '(start)'} "
                f"at shard {kr.name}"
            )
        if not kr.end:
            if i != len(ordered) - 1:
                raise InvalidArgument(
                    f"key ranges do not partition the keyspace: overlap after shard {kr.name}, "
                    f"which already reaches the end"
                )
            return
        expected = kr.end
    raise InvalidArgument(
        f"key ranges do not partition the keyspace: gap from {expected.hex()} to the end"
    )


class ShardMap:
    """Shard names in key order with O(log n) lookup of the shard owning a ksid."""

    __slots__ = ("_names", "_ranges", "_starts")

    def __init__(self, shards: Sequence[tuple[str, KeyRange]]) -> None:
        validate_partition([kr for _, kr in shards])
        ordered = sorted(shards, key=lambda s: _norm(s[1].start))
        self._names = [name for name, _ in ordered]
        self._ranges = [kr for _, kr in ordered]
        self._starts = [_norm(kr.start) for kr in self._ranges]

    @classmethod
    def from_names(cls, names: Sequence[str]) -> ShardMap:
        """Build from shard names alone (``["-80", "80-"]``)."""
        return cls([(n, parse_shard_name(n)) for n in names])

    @property
    def names(self) -> list[str]:
        """Shard names in key order."""
        return list(self._names)

    def find(self, ksid: KeyspaceId) -> str:
        """The name of the shard whose range contains ``ksid``."""
        return self._names[bisect.bisect_right(self._starts, _norm(ksid)) - 1]

    def shards_for_range(self, kr: KeyRange) -> list[str]:
        """Names of the shards intersecting ``kr``, in key order."""
        first = bisect.bisect_right(self._starts, _norm(kr.start)) - 1
        out: list[str] = []
        for i in range(first, len(self._names)):
            if kr.end and self._starts[i] >= _norm(kr.end):
                break
            if self._ranges[i].intersects(kr):
                out.append(self._names[i])
        return out

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"ShardMap({self._names!r})"
