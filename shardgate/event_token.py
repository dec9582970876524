"""Event tokens: ``{timestamp, shard, position}`` of a change, and how to compare them.

An :class:`EventToken` says "this shard's data, as of this point of its
replication log". ``timestamp`` is the commit time of the transaction in
seconds since the epoch (float; MariaDB has 1-second resolution), ``shard``
is the qualified shard name ``keyspace/shard`` and ``position`` is the
backend's own log position as text:

=============  ==========================  ===========================
backend        position                    example
=============  ==========================  ===========================
PostgreSQL     commit ``end_lsn``          ``0/16B3748``
MariaDB        GTID (``domain-server-seq``)  ``0-1-123``
SQLite         change-table sequence       ``4711``
=============  ==========================  ===========================

Comparison follows the Update Stream design exactly (:func:`compare`):

1. different timestamps: the later timestamp is the newer token;
2. same timestamp and same shard: the positions decide;
3. otherwise: :attr:`Freshness.UNKNOWN`.

For rule 1 to hold within a shard, log readers never let a shard's
timestamps go backwards in log order (a commit stamped earlier than the one
before it gets the previous stamp).

Tokens are opaque to clients: :meth:`EventToken.serialize` gives a short,
URL-safe string and :meth:`EventToken.parse` reads it back exactly.
"""

from __future__ import annotations

import base64
import enum
import json
import re
from dataclasses import dataclass

from shardgate.errors import InvalidArgument

_PREFIX = "et1."


class Freshness(enum.Enum):
    """The result of comparing token ``a`` with token ``b``."""

    OLDER = -1
    EQUAL = 0
    NEWER = 1
    UNKNOWN = 2


_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def position_key(position: str) -> tuple[int, ...]:
    """A sortable key for a log position of any backend (same shard only).

    PostgreSQL LSNs (``X/Y``) become one integer, MariaDB GTID lists become
    ``(domain, seq)`` pairs (the server id does not order transactions),
    SQLite sequences their integer. Raises ``InvalidArgument`` for anything else.
    """
    if position.isdigit():
        return (int(position),)
    m = _LSN.match(position)
    if m is not None:
        return ((int(m.group(1), 16) << 32) | int(m.group(2), 16),)
    key: list[int] = []
    for part in sorted(position.split(",")):
        g = _GTID.match(part.strip())
        if g is None:
            raise InvalidArgument(
                f"bad log position {position!r}: expected an LSN (0/16B3748), "
                "a GTID (0-1-123) or a sequence number"
            )
        key.extend((int(g.group(1)), int(g.group(3))))
    return tuple(key)


@dataclass(frozen=True, slots=True)
class EventToken:
    """Where a change (or a read) sits in one shard's replication log."""

    timestamp: float
    shard: str
    position: str

    def serialize(self) -> str:
        """An opaque, URL-safe string that :meth:`parse` turns back into this token."""
        raw = json.dumps([self.timestamp, self.shard, self.position], separators=(",", ":"))
        return _PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def parse(cls, text: str) -> EventToken:
        """Read a token written by :meth:`serialize`; ``InvalidArgument`` if it is not one."""
        if not isinstance(text, str) or not text.startswith(_PREFIX):
            raise InvalidArgument(f"not an event token: {str(text)[:40]!r}")
        body = text[len(_PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            ts, shard, position = json.loads(raw)
            if not isinstance(shard, str) or not isinstance(position, str):
                raise TypeError("shard and position must be strings")
            return cls(float(ts), shard, position)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"corrupt event token {text[:40]!r}: {exc}") from exc

    def to_dict(self) -> dict[str, object]:
        return {"timestamp": self.timestamp, "shard": self.shard, "position": self.position}


def compare(a: EventToken | None, b: EventToken | None) -> Freshness:
    """How ``a`` relates to ``b``: timestamps first, then positions on the same shard.

    A missing token compares as ``UNKNOWN``.
    """
    if a is None or b is None:
        return Freshness.UNKNOWN
    if a.timestamp != b.timestamp:
        return Freshness.NEWER if a.timestamp > b.timestamp else Freshness.OLDER
    if a.shard != b.shard:
        return Freshness.UNKNOWN
    ka, kb = position_key(a.position), position_key(b.position)
    if ka == kb:
        return Freshness.EQUAL
    return Freshness.NEWER if ka > kb else Freshness.OLDER


def is_fresher(a: EventToken | None, b: EventToken | None) -> bool:
    """True when ``a`` is known to include everything ``b`` does (newer or equal)."""
    return compare(a, b) in (Freshness.NEWER, Freshness.EQUAL)
