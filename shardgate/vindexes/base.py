"""The vindex protocol family.

A vindex maps column values to keyspace ids (ksids). As in Vitess's
``vindexes/vindex.go`` there is one base contract and small optional ones:

* :class:`Vindex` (all): ``name``, ``params``, ``cost``, ``unique``, ``needs_cursor``.
* :class:`SingleColumn`: functional, computed without I/O: ``map``.
* :class:`Reversible`: ksid -> value (``hash``, ``numeric``, ``reverse_bits``...),
  used to fill a column from a keyspace id.
* :class:`MultiColumn`: ``multicol``: maps tuples of values.
* :class:`Lookup`: backed by a table; maps, verifies and maintains rows through a
  :class:`VCursor` (the gate), so the lookup table may itself be sharded.

Contracts shared by every ``map``:

* the result has one entry per input value, in order;
* each entry is the list of ksids the value maps to: ``[]`` means "no row can
  have this value" (the route goes nowhere), a unique vindex returns at most
  one ksid per value;
* ``map`` never raises for a value it cannot map in a *read*: it returns ``[]``.
  Inserts use :meth:`SingleColumn.map_for_insert`-style checks in the planner
  (a value that maps to nothing is an insert error there).

``cost`` is used by the planner to choose among usable vindexes: lowest wins
(Vitess's scale: 0 identity-like, 1 functional, 10 unique lookup, 20 non-unique
lookup, 30 consistent lookup).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from shardgate.result import Result

KeyspaceId = bytes


@runtime_checkable
class VCursor(Protocol):
    """What a lookup vindex may do: run SQL through the gate.

    ``sql`` is gate SQL (MySQL flavour, ``:name`` bind variables) naming the
    lookup table, so it is routed like any other statement. ``autocommit`` runs
    it outside the caller's transaction (Vitess's ``autocommit`` lookup param).
    """

    async def execute(
        self, sql: str, bind_vars: Mapping[str, Any], *, autocommit: bool = False
    ) -> Result: ...


class Vindex(ABC):
    """Base of all vindexes. Instances are built from a VSchema entry."""

    #: The registry name of the family (``"hash"``, ``"lookup_unique"``...).
    type_name: str = ""

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        self.name = name
        self.params = dict(params)

    @property
    @abstractmethod
    def cost(self) -> int:
        """Used by the planner to prefer cheaper vindexes (lowest wins)."""

    @property
    @abstractmethod
    def unique(self) -> bool:
        """True when every value maps to at most one keyspace id."""

    @property
    def needs_cursor(self) -> bool:
        """True when mapping needs I/O (lookup vindexes)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SingleColumn(Vindex):
    """A functional vindex over one column: computed, no I/O."""

    @abstractmethod
    def map(self, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        """Map each value to its ksids (see the module docstring)."""

    def verify(self, values: Sequence[Any], ksids: Sequence[KeyspaceId]) -> list[bool]:
        """True where ``values[i]`` maps to ``ksids[i]``."""
        return [ksid in mapped for mapped, ksid in zip(self.map(values), ksids, strict=True)]


class Reversible(SingleColumn):
    """A functional vindex whose ksid gives the value back."""

    @abstractmethod
    def reverse_map(self, ksids: Sequence[KeyspaceId]) -> list[Any]:
        """The value each ksid came from."""


class MultiColumn(Vindex):
    """A functional vindex over several columns (``multicol``)."""

    @abstractmethod
    def map_multi(self, rows: Sequence[Sequence[Any]]) -> list[list[KeyspaceId]]:
        """Map each tuple of column values to its ksids.

        A tuple may be a *prefix* of the columns: then the result is the ksid
        of the prefix with the remaining bytes zero, and ``prefix_len`` bytes
        are significant (see :meth:`prefix_bytes`).
        """

    @abstractmethod
    def prefix_bytes(self, n_columns: int) -> int:
        """How many leading ksid bytes a prefix of ``n_columns`` columns fixes."""


class Lookup(Vindex):
    """A vindex backed by a table ``params['table']`` with columns ``from`` -> ``to``.

    ``to`` holds the keyspace id (bytes) of the owner row. All methods take the
    gate's :class:`VCursor`. ``write_only`` vindexes are maintained but never
    used for routing (backfill). ``ignore_nulls`` skips rows whose ``from``
    value is NULL on create, and maps NULL to nothing.
    """

    @property
    def needs_cursor(self) -> bool:
        return True

    @property
    def write_only(self) -> bool:
        return self.params.get("write_only", "false") == "true"

    @property
    def autocommit(self) -> bool:
        return self.params.get("autocommit", "false") == "true"

    @property
    def ignore_nulls(self) -> bool:
        return self.params.get("ignore_nulls", "false") == "true"

    @property
    def table(self) -> str:
        return self.params["table"]

    @property
    def from_columns(self) -> list[str]:
        return [c.strip() for c in self.params["from"].split(",")]

    @property
    def to_column(self) -> str:
        return self.params["to"]

    @abstractmethod
    async def map(self, cursor: VCursor, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        """Look each value up (one query for all values)."""

    @abstractmethod
    async def verify(
        self, cursor: VCursor, values: Sequence[Any], ksids: Sequence[KeyspaceId]
    ) -> list[bool]:
        """True where the lookup row ``values[i] -> ksids[i]`` exists."""

    @abstractmethod
    async def create(
        self,
        cursor: VCursor,
        rows: Sequence[Sequence[Any]],
        ksids: Sequence[KeyspaceId],
        *,
        ignore_mode: bool = False,
    ) -> None:
        """Insert lookup rows: ``rows[i]`` (one value per ``from`` column) -> ``ksids[i]``.

        Duplicate keys on a unique lookup raise :class:`AlreadyExists` unless
        ``ignore_mode`` (then existing rows are kept).
        """

    @abstractmethod
    async def delete(
        self, cursor: VCursor, rows: Sequence[Sequence[Any]], ksid: KeyspaceId
    ) -> None:
        """Delete the lookup rows ``rows[i] -> ksid``."""

    async def update(
        self,
        cursor: VCursor,
        old_values: Sequence[Any],
        ksid: KeyspaceId,
        new_values: Sequence[Any],
    ) -> None:
        """Move one owner row's lookup entry from ``old_values`` to ``new_values``."""
        await self.delete(cursor, [old_values], ksid)
        await self.create(cursor, [new_values], [ksid])
