"""``consistent_lookup`` (non-unique, cost 20) and ``consistent_lookup_unique`` (cost 10).

Lookup vindexes that stay consistent with their owner table without two-phase
commit (Vitess ``consistent_lookup.go``). The trick is write *ordering*:

* lookup rows are **created first**, in a separate "pre" transaction that
  commits before the caller's (here: ``autocommit=True``), so a committed
  owner row always has its lookup row;
* lookup rows are **deleted last** ("post": after the owner row's change
  commits), so a lookup row may outlive its owner, never the reverse;
* an *orphan* lookup row (its owner gone, e.g. a rolled-back insert) is taken
  over by the next create of the same value.

So a lookup row can point at a missing owner (readers verify against the owner
table anyway) but an owner row is never missing its lookup row.

Params: ``table``, ``from``, ``to`` (required), ``ignore_nulls``,
``write_only`` as for ``lookup``; ``autocommit`` may only be ``false`` (these
vindexes order their writes themselves). shardgate additions, which Vitess
takes from the VSchema table owning the vindex: ``owner_table``
(``table`` or ``keyspace.table``) and ``owner_columns`` (comma list, one per
``from`` column); :meth:`ConsistentLookupBase.set_owner` sets them later.
They are needed only to take over a duplicate row.

What each call sends through the VCursor (``f`` a from column, ``k`` the
``to`` column, ``o`` an owner column):

* ``map``: as ``lookup`` (``select f, k from t where f in (:v0, ...)``),
  ``autocommit=False`` (the caller's transaction).
* ``verify``: the same select with ``autocommit=True`` (Vitess: "pre").
* ``create``: ``insert into t(f, k) values (:f_0, :k_0), ...`` with
  ``autocommit=True`` ("pre"; ``insert ignore`` in ignore mode). If the gate
  raises :class:`AlreadyExists`, each row is then handled on its own:

  1. ``select k from t where f = :f for update`` (unique) or
     ``select k from t where f = :f and k = :k for update`` (non-unique),
     ``autocommit=True`` ("pre"): lock the lookup row;
  2. no row: ``insert into t(f, k) values (:f, :k)``, ``autocommit=True``;
  3. a non-unique vindex with its row already there: done;
  4. a unique row pointing at ``existing``: ``select o from owner where o = :f
     lock in share mode`` with ``autocommit=False`` (the caller's transaction,
     so the owner row is locked until it commits; Vitess sends it to the shard
     of ``existing``, our gate routes it by the owner table's vindexes). An
     owner row found raises ``AlreadyExists("duplicate value for unique lookup
     vindex <name>: <value>")``. Otherwise the row is an orphan: if
     ``existing`` is the new ksid nothing is left to do, else
     ``update t set k = :k where f = :f`` with ``autocommit=True`` takes it over.

* ``delete``: ``delete from t where f in (:f_0, ...) and k = :k`` with
  ``autocommit=False``: "post" — **the gate must commit the lookup table's
  shard transaction after the owner table's** (a lookup delete committed
  before a failed owner delete would leave a live owner without its row).
* ``update``: nothing when the values are equal (NULL equal to NULL), else
  ``delete`` then ``create`` as above.

With ``autocommit=True`` "pre" writes commit at once; Vitess keeps its pre
transaction (and the ``for update`` lock) open until just before the caller
commits, which a plain ``VCursor.execute`` cannot express.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardgate.errors import AlreadyExists, FailedPrecondition, Internal, InvalidArgument
from shardgate.vindexes._params import bool_param
from shardgate.vindexes.base import KeyspaceId, VCursor
from shardgate.vindexes.lookup import (
    IDENTIFIER,
    LOOKUP_PARAMS,
    TABLE_NAME,
    LookupBase,
    as_ksid,
    match_key,
    show_row,
)


class ConsistentLookupBase(LookupBase):
    """Shared code of the two consistent lookup families."""

    allowed_params = LOOKUP_PARAMS | {"owner_table", "owner_columns"}

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        super().__init__(name, params)
        if bool_param(self.type_name, name, params, "autocommit"):
            raise InvalidArgument(
                f"vindex {name!r} ({self.type_name}): param 'autocommit' must be false: "
                "consistent lookups order their writes themselves"
            )
        self.owner_table: str | None = None
        self.owner_columns: list[str] = []
        table = params.get("owner_table", "").strip()
        columns = params.get("owner_columns", "").strip()
        if bool(table) != bool(columns):
            raise InvalidArgument(
                f"vindex {name!r} ({self.type_name}): params 'owner_table' and "
                "'owner_columns' go together"
            )
        if table:
            self.set_owner(table, [c.strip() for c in columns.split(",")])

    def set_owner(self, table: str, columns: Sequence[str]) -> None:
        """Name the owner table and its columns matching ``from`` (Vitess ``SetOwnerInfo``)."""
        if not TABLE_NAME.match(table):
            raise InvalidArgument(
                f"vindex {self.name!r} ({self.type_name}): param 'owner_table' must be "
                f"'table' or 'keyspace.table', got {table!r}"
            )
        if len(columns) != len(self._from) or not all(IDENTIFIER.match(c) for c in columns):
            raise InvalidArgument(
                f"vindex {self.name!r} ({self.type_name}): param 'owner_columns' needs "
                f"{len(self._from)} column names (one per 'from' column), got {list(columns)}"
            )
        self.owner_table = table
        self.owner_columns = list(columns)

    @property
    def _verify_autocommit(self) -> bool:
        return True  # Vitess: CommitOrder_PRE

    def _insert_ignores(self, ignore_mode: bool) -> bool:
        return ignore_mode

    def _where(self, columns: Sequence[str]) -> str:
        return " and ".join(f"{c} = :{f}" for c, f in zip(columns, self._from, strict=True))

    async def create(
        self,
        cursor: VCursor,
        rows: Sequence[Sequence[Any]],
        ksids: Sequence[KeyspaceId],
        *,
        ignore_mode: bool = False,
    ) -> None:
        kept = self._keep_rows(rows, ksids)
        if not kept:
            return
        sql, binds = self._insert_sql(kept, ignore=ignore_mode)
        try:
            await cursor.execute(sql, binds, autocommit=True)
        except AlreadyExists:
            for row, ksid in kept:
                await self._handle_duplicate(cursor, row, ksid)

    async def _handle_duplicate(
        self, cursor: VCursor, row: Sequence[Any], ksid: KeyspaceId
    ) -> None:
        binds: dict[str, Any] = dict(zip(self._from, row, strict=True))
        binds[self._to] = ksid
        where = self._where(self._from)
        if not self.unique:
            where += f" and {self._to} = :{self._to}"
        lock = f"select {self._to} from {self.table} where {where} for update"
        found = await cursor.execute(lock, binds, autocommit=True)
        if not found.rows:
            columns = ", ".join([*self._from, self._to])
            marks = ", ".join(f":{c}" for c in [*self._from, self._to])
            insert = f"insert into {self.table}({columns}) values ({marks})"
            await cursor.execute(insert, binds, autocommit=True)
            return
        if not self.unique:
            return  # the (value, ksid) row is already there
        if len(found.rows) > 1:
            raise Internal(
                f"unique lookup vindex {self.name!r}: {self.table} has "
                f"{len(found.rows)} rows for {show_row(row)}"
            )
        existing = as_ksid(self, found.rows[0][0])
        if self.owner_table is None:
            raise FailedPrecondition(
                f"consistent lookup vindex {self.name!r}: {show_row(row)} already has a row; "
                "set params 'owner_table' and 'owner_columns' so it can check the owner"
            )
        owner_sql = (
            f"select {self.owner_columns[0]} from {self.owner_table} "
            f"where {self._where(self.owner_columns)} lock in share mode"
        )
        owners = await cursor.execute(owner_sql, binds, autocommit=False)
        if owners.rows:
            raise AlreadyExists(
                f"duplicate value for unique lookup vindex {self.name}: {show_row(row)}"
            )
        if existing == ksid:
            return
        update = f"update {self.table} set {self._to} = :{self._to} where {where}"
        await cursor.execute(update, binds, autocommit=True)

    async def delete(
        self, cursor: VCursor, rows: Sequence[Sequence[Any]], ksid: KeyspaceId
    ) -> None:
        await self._delete(cursor, rows, ksid)

    async def update(
        self,
        cursor: VCursor,
        old_values: Sequence[Any],
        ksid: KeyspaceId,
        new_values: Sequence[Any],
    ) -> None:
        if len(old_values) == len(new_values) and all(
            match_key(a) == match_key(b) for a, b in zip(old_values, new_values, strict=True)
        ):
            return
        await self.delete(cursor, [old_values], ksid)
        await self.create(cursor, [new_values], [ksid])


class ConsistentLookup(ConsistentLookupBase):
    """``consistent_lookup``: non-unique (cost 20)."""

    type_name = "consistent_lookup"

    @property
    def cost(self) -> int:
        return 20

    @property
    def unique(self) -> bool:
        return False


class ConsistentLookupUnique(ConsistentLookupBase):
    """``consistent_lookup_unique``: unique (cost 10)."""

    type_name = "consistent_lookup_unique"

    @property
    def cost(self) -> int:
        return 10

    @property
    def unique(self) -> bool:
        return True
