"""The columns of each keyspace's tables, as the gate tracked them from the shards.

Pure data for the planner (Vitess's vtgate schema tracking): the gate
(:class:`~shardgate.gate.schema_tracker.SchemaTracker`) reads every table's
columns from a keyspace's first shard, and the planner receives the result as
a :class:`Schema` inside its planning context
(:meth:`shardgate.vschema.VSchema.with_schema`); it never reads a database.

A keyspace is in one of three states in a :class:`Schema`: absent (not read
yet: the planner asks for it by raising :class:`ColumnsUnknown`), read
(:class:`KeyspaceSchema` with ``tables``), or unavailable (``error`` says why,
e.g. its first shard is down: statements that need its columns are refused).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shardgate.errors import Unsupported


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column: its name as the database spells it, and its declared type
    (the catalog's ``data_type``, lower-cased: ``integer``, ``bigint``,
    ``character varying``; SQLite's declared type as written)."""

    name: str
    type: str = ""


@dataclass(frozen=True, slots=True)
class TableColumns:
    """A table's (or view's) columns, in their order."""

    name: str
    columns: tuple[ColumnInfo, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def find(self, column: str) -> ColumnInfo | None:
        """The column named ``column`` (names compare without case, as every
        shard database compares unquoted names), or None."""
        low = column.lower()
        for c in self.columns:
            if c.name.lower() == low:
                return c
        return None


@dataclass(frozen=True)
class KeyspaceSchema:
    """The tables of one keyspace, keyed by lower-case name; or, when ``error``
    is set, why they could not be read (no table is then known)."""

    tables: Mapping[str, TableColumns] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, tables: Iterable[TableColumns]) -> KeyspaceSchema:
        return cls({t.name.lower(): t for t in tables})


@dataclass(frozen=True)
class Schema:
    """Tracked columns per keyspace (see the module docstring). Immutable: the
    tracker publishes a new one whenever a keyspace is read or forgotten."""

    keyspaces: Mapping[str, KeyspaceSchema] = field(default_factory=dict)

    def table(self, keyspace: str, table: str) -> TableColumns | None:
        """The columns of ``keyspace.table``.

        Raises :class:`ColumnsUnknown` when the keyspace was not read yet, and
        :class:`~shardgate.errors.Unsupported` when it could not be read; None
        when it was read and has no such table.
        """
        ks = self.keyspaces.get(keyspace)
        if ks is None:
            raise ColumnsUnknown(keyspace, table)
        if ks.error is not None:
            raise Unsupported(
                f"the columns of {keyspace}.{table} are not known ({ks.error}): qualify every "
                "column with its table and name the columns instead of *"
            )
        return ks.tables.get(table.lower())

    def with_keyspace(self, keyspace: str, found: KeyspaceSchema) -> Schema:
        """This schema with ``keyspace``'s tables replaced by ``found``."""
        return Schema({**self.keyspaces, keyspace: found})


EMPTY = Schema()


class ColumnsUnknown(Unsupported):
    """The planner needs the columns of a keyspace the tracker has not read yet.

    A coded refusal (``UNIMPLEMENTED``) for callers that cannot wait; the gate's
    asynchronous paths catch it, read ``keyspace``'s columns and plan again.
    """

    def __init__(self, keyspace: str, table: str) -> None:
        super().__init__(
            f"the columns of {keyspace}.{table} have not been read from its shards yet: "
            "qualify every column with its table and name the columns instead of *, "
            "or run the statement (not EXPLAIN) once so the gate reads them"
        )
        self.keyspace = keyspace
        self.table = table
