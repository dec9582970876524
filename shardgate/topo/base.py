"""What every topo store is: versioned records with compare-and-swap writes.

The store interface (:class:`TopoStore`), its record (:class:`Record`) and
conflict error, shared by the SQL and memory stores (:mod:`shardgate.topo.store`,
whose docstring states the invariants every store keeps) and the etcd store
(:mod:`shardgate.topo.etcd`).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from shardgate.errors import Aborted, InvalidArgument

KINDS = ("keyspace", "cluster", "workflow", "tablet")


class TopoConflict(Aborted):
    """A compare-and-swap lost: the record changed since it was read."""


@dataclass(frozen=True)
class Record:
    """One record; ``doc`` is None for a deleted record (a tombstone)."""

    kind: str
    name: str
    doc: dict[str, Any] | None
    version: int


class TopoStore(ABC):
    """Versioned records with compare-and-swap writes (see the module docstring)."""

    #: where the store lives, password redacted (for messages)
    location: str = ""
    #: whether records can be tied to a lease (:meth:`grant_lease`)
    has_leases: bool = False

    @abstractmethod
    async def get(self, kind: str, name: str) -> Record | None:
        """The live record, or None if it does not exist (or was deleted)."""

    @abstractmethod
    async def list_records(self, kind: str) -> list[Record]:
        """Every live record of ``kind``, by name."""

    @abstractmethod
    async def put(
        self, kind: str, name: str, doc: dict[str, Any], *, expect: int | None = None,
        lease: int | None = None,
    ) -> int:
        """Write ``doc``; return its new version.

        ``expect``: None writes unconditionally, 0 only creates, N only
        replaces version N; otherwise :class:`TopoConflict`. ``lease``: a
        lease from :meth:`grant_lease` the record goes with (stores with
        ``has_leases`` only; InvalidArgument elsewhere).
        """

    @abstractmethod
    async def delete(self, kind: str, name: str, *, expect: int | None = None) -> int:
        """Delete (leave a tombstone); return the tombstone's version.

        Deleting a record that does not exist is a no-op returning the clock.
        """

    @abstractmethod
    async def clock(self) -> int:
        """The version of the newest write (0 for an empty store)."""

    @abstractmethod
    async def changes_since(self, version: int) -> tuple[int, list[Record]]:
        """``(clock, records written after version)``, tombstones included."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""

    async def changed(self, version: int, timeout: float) -> None:
        """Wait until the store may hold writes newer than ``version``, at most ``timeout``.

        Here: sleep ``timeout`` (watchers poll); a store that can watch returns early.
        """
        await asyncio.sleep(timeout)

    async def grant_lease(self, ttl: float) -> int | None:
        """A lease expiring ``ttl`` seconds after its last :meth:`keep_alive`, or None
        where the store has no leases (``has_leases`` false)."""
        return None

    async def keep_alive(self, lease: int) -> bool:
        """Renew ``lease``; False if it expired (its records are gone) or is unknown."""
        return False

    async def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now; the store deletes its records (nothing where none exist)."""
        no_lease(self.location, lease)


def no_lease(location: str, lease: int | None) -> None:
    if lease is not None:
        raise InvalidArgument(f"the topo store at {location} has no leases")


def check_record(kind: str, name: str) -> None:
    if kind not in KINDS:
        raise InvalidArgument(f"topo record kind {kind!r} is not one of {list(KINDS)}")
    if not name or len(name) > 255:
        raise InvalidArgument(f"topo record name {name!r} must be 1 to 255 characters")


def conflict(kind: str, name: str, expect: int, found: int | None) -> TopoConflict:
    have = "does not exist" if found is None else f"is at version {found}"
    want = "to be new" if expect == 0 else f"at version {expect}"
    return TopoConflict(
        f"topo record {kind}/{name} changed concurrently: expected it {want}, but it {have}; "
        "read it again and retry"
    )
