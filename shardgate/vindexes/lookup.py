"""``lookup`` (non-unique, cost 20) and ``lookup_unique`` (cost 10): vindexes backed by a table.

The table ``params['table']`` (``table`` or ``keyspace.table``) has the
``from`` columns (comma list) and the ``to`` column holding the owner row's
keyspace id (varbinary). It is read and written only through the
:class:`~shardgate.vindexes.base.VCursor`, in gate SQL (MySQL flavour) with
scalar ``:name`` bind variables, so the lookup table may itself be sharded.

Params: ``table``, ``from``, ``to`` (required); ``autocommit``, ``write_only``,
``ignore_nulls`` (``"true"``/``"false"``, default false). Other Vitess params
(``batch_lookup``, ``read_lock``, ``no_verify``, ``multi_shard_autocommit``...)
are refused.

The SQL each call sends (one statement per call; ``f``/``g`` are from
columns, ``k`` the ``to`` column; ``autocommit=`` is the ``autocommit`` param
unless said otherwise):

* ``map``: ``select f, k from t where f in (:v0, :v1, ...)`` over the distinct
  non-NULL values (only the first ``from`` column is used, as in Vitess);
  each value's keyspace ids come back sorted.
  Nothing is sent when every value is NULL. Rows are matched back to values
  by their SQL text (``5`` and ``'5'`` match); a row matching no value's text
  (the database's collation found it equal: ``'RED'`` for ``'red'`` on a
  case-insensitive MariaDB table) counts for every value asked, so routing
  reaches its shard. A unique vindex finding two rows with a value's own text
  raises :class:`Internal`.
* ``verify``: the same select; true where the row ``(value, ksid)`` came back.
* ``create``: ``insert into t(f, g, k) values (:f_0, :g_0, :k_0), (:f_1, ...)``,
  rows sorted (so concurrent inserts lock in the same order).
  ``insert ignore`` in ``ignore_mode``, and for a non-unique ``autocommit``
  vindex (Vitess upserts there; for a ``(from, to)`` key that is the same).
  A duplicate (the gate's :class:`AlreadyExists`) raises
  ``AlreadyExists("duplicate value for unique lookup vindex <name>: <value>")``
  after one more ``select`` to name the value (best effort).
  A NULL ``from`` value raises :class:`InvalidArgument` unless ``ignore_nulls``,
  which skips that row.
* ``delete``: ``delete from t where f in (:f_0, ...) and k = :k`` (one
  column) or ``... where ((f = :f_0 and g = :g_0) or ...) and k = :k``,
  ``autocommit=False``. With ``autocommit`` the delete is skipped, as Vitess
  does: a row committed outside the transaction cannot be safely removed.
* ``update``: ``delete`` then ``create``.

``write_only`` (backfill in progress): the vindex is maintained (create,
delete, update as usual) but cannot route. Vitess's ``Map`` returns the full
key range there (a scatter); here the planner must check
:attr:`~shardgate.vindexes.base.Lookup.write_only` and scatter
(:data:`shardgate.keys.FULL_RANGE`); ``map`` raises :class:`FailedPrecondition`
if called; ``verify`` returns true for every value, as in Vitess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from shardgate.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ShardgateError,
)
from shardgate.result import Result
from shardgate.vindexes._params import bool_param, check_params
from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId, Lookup, VCursor

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$")
LOOKUP_PARAMS = frozenset({"autocommit", "write_only", "ignore_nulls"})
LOOKUP_REQUIRED = frozenset({"table", "from", "to"})


def match_key(value: Any) -> bytes | None:
    """How a lookup value is matched to a row read back: its SQL text bytes."""
    if value is None:
        return None
    key = to_bytes(value)
    return key if key is not None else repr(value).encode()


def as_ksid(vindex: Lookup, value: Any) -> KeyspaceId:
    """A ``to`` column value read back, as bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise Internal(
        f"lookup vindex {vindex.name!r}: column {vindex.to_column!r} of {vindex.table!r} "
        f"holds {type(value).__name__} {value!r}; it must be varbinary keyspace ids"
    )


class LookupBase(Lookup):
    """What ``lookup``, ``lookup_unique`` and the consistent lookups share."""

    allowed_params: frozenset[str] = LOOKUP_PARAMS

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        check_params(
            self.type_name, name, params, allowed=self.allowed_params, required=LOOKUP_REQUIRED
        )
        for key in ("autocommit", "write_only", "ignore_nulls"):
            bool_param(self.type_name, name, params, key)
        super().__init__(name, params)
        if not TABLE_NAME.match(self.table):
            raise InvalidArgument(
                f"vindex {name!r} ({self.type_name}): param 'table' must be 'table' or "
                f"'keyspace.table', got {self.table!r}"
            )
        for column in [*self.from_columns, self.to_column]:
            if not IDENTIFIER.match(column):
                raise InvalidArgument(
                    f"vindex {name!r} ({self.type_name}): bad column name {column!r} in "
                    "param 'from' or 'to'"
                )
        self._from = self.from_columns
        self._to = self.to_column

    # -- reads ---------------------------------------------------------------

    def _select_sql(self, n: int) -> str:
        marks = ", ".join(f":v{i}" for i in range(n))
        f = self._from[0]
        return f"select {f}, {self._to} from {self.table} where {f} in ({marks})"

    async def _rows(
        self, cursor: VCursor, values: Sequence[Any], *, autocommit: bool
    ) -> tuple[dict[bytes, list[KeyspaceId]], list[KeyspaceId]]:
        """Rows for the non-NULL ``values``: those matching a value's :func:`match_key`,
        and the keyspace ids of the others (*strays*).

        The lookup table's database returns every row its collation finds equal
        (MariaDB's ``utf8mb4_general_ci``: ``'RED'`` and ``'red '`` for
        ``'red'``; MySQL: ``'05'`` for ``5``), which need not have the same bytes.
        """
        distinct: dict[bytes, Any] = {}
        for value in values:
            key = match_key(value)
            if key is not None:
                distinct.setdefault(key, value)
        if not distinct:
            return {}, []
        binds = {f"v{i}": v for i, v in enumerate(distinct.values())}
        result = await cursor.execute(self._select_sql(len(binds)), binds, autocommit=autocommit)
        found: dict[bytes, list[KeyspaceId]] = {}
        stray: list[KeyspaceId] = []
        for row in result.rows:
            key = match_key(row[0])
            if key is None:
                continue
            ksids = found.setdefault(key, []) if key in distinct else stray
            ksid = self._from_stored(row[1])
            if ksid is not None and ksid not in ksids:
                ksids.append(ksid)
        return found, stray

    async def _lookup(
        self, cursor: VCursor, values: Sequence[Any], *, autocommit: bool
    ) -> dict[bytes, list[KeyspaceId]]:
        """Keyspace ids per value key; a stray row (see :meth:`_rows`) counts for
        every value asked, as the database may have matched it to any of them."""
        found, stray = await self._rows(cursor, values, autocommit=autocommit)
        if stray:
            for value in values:
                key = match_key(value)
                if key is not None:
                    ksids = found.setdefault(key, [])
                    ksids.extend(k for k in stray if k not in ksids)
        return found

    def _to_stored(self, ksid: KeyspaceId) -> Any:
        """What the ``to`` column stores for ``ksid``: the keyspace id itself here."""
        return ksid

    def _from_stored(self, value: Any) -> KeyspaceId | None:
        """The keyspace id a ``to`` value read back stands for (None: it maps nowhere)."""
        return as_ksid(self, value)

    async def map(self, cursor: VCursor, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        if self.write_only:
            raise FailedPrecondition(
                f"lookup vindex {self.name!r} is write_only: it cannot route; "
                "scatter to every shard (the full key range) instead"
            )
        found, stray = await self._rows(cursor, values, autocommit=self.autocommit)
        out: list[list[KeyspaceId]] = []
        for value in values:
            key = match_key(value)
            ksids = list(found.get(key, [])) if key is not None else []
            if self.unique and len(ksids) > 1:
                raise Internal(
                    f"unique lookup vindex {self.name!r}: {self.table} has "
                    f"{len(ksids)} rows for {value!r}"
                )
            if key is not None:  # a stray may belong to this value: its shard is asked too
                ksids.extend(k for k in stray if k not in ksids)
            out.append(sorted(ksids))
        return out

    async def existing(self, cursor: VCursor, value: Any) -> list[KeyspaceId]:
        """The keyspace ids the table holds for one value, read in the caller's
        transaction (``write_only`` too: for maintaining it, not routing)."""
        found = await self._lookup(cursor, [value], autocommit=False)
        key = match_key(value)
        return sorted(found.get(key, [])) if key is not None else []

    async def verify(
        self, cursor: VCursor, values: Sequence[Any], ksids: Sequence[KeyspaceId]
    ) -> list[bool]:
        if len(values) != len(ksids):
            raise InvalidArgument(
                f"lookup vindex {self.name!r}: {len(values)} values but {len(ksids)} keyspace ids"
            )
        if self.write_only:
            return [True] * len(values)
        found = await self._lookup(cursor, values, autocommit=self._verify_autocommit)
        out: list[bool] = []
        for value, ksid in zip(values, ksids, strict=True):
            key = match_key(value)
            out.append(key is not None and ksid in found.get(key, []))
        return out

    @property
    def _verify_autocommit(self) -> bool:
        return self.autocommit

    # -- writes --------------------------------------------------------------

    def _keep_rows(
        self, rows: Sequence[Sequence[Any]], ksids: Sequence[KeyspaceId]
    ) -> list[tuple[Sequence[Any], KeyspaceId]]:
        """Check shapes, drop (ignore_nulls) or refuse rows with NULLs, sort."""
        if len(rows) != len(ksids):
            raise InvalidArgument(
                f"lookup vindex {self.name!r}: {len(rows)} rows but {len(ksids)} keyspace ids"
            )
        kept: list[tuple[Sequence[Any], KeyspaceId]] = []
        for i, (row, ksid) in enumerate(zip(rows, ksids, strict=True)):
            if len(row) != len(self._from):
                raise InvalidArgument(
                    f"lookup vindex {self.name!r}: row {i} has {len(row)} values for the "
                    f"{len(self._from)} columns {', '.join(self._from)}"
                )
            if any(v is None for v in row):
                if self.ignore_nulls:
                    continue
                col = self._from[next(j for j, v in enumerate(row) if v is None)]
                raise InvalidArgument(
                    f"lookup vindex {self.name!r}: row {i} has NULL in column {col!r}; "
                    "set ignore_nulls=true to skip such rows"
                )
            kept.append((row, ksid))
        kept.sort(key=lambda rk: (tuple(match_key(v) or b"" for v in rk[0]), rk[1]))
        return kept

    def _insert_sql(
        self, kept: Sequence[tuple[Sequence[Any], KeyspaceId]], *, ignore: bool
    ) -> tuple[str, dict[str, Any]]:
        binds: dict[str, Any] = {}
        tuples: list[str] = []
        for i, (row, ksid) in enumerate(kept):
            names: list[str] = []
            for col, value in zip(self._from, row, strict=True):
                binds[f"{col}_{i}"] = value
                names.append(f":{col}_{i}")
            binds[f"{self._to}_{i}"] = self._to_stored(ksid)
            names.append(f":{self._to}_{i}")
            tuples.append(f"({', '.join(names)})")
        verb = "insert ignore into" if ignore else "insert into"
        columns = ", ".join([*self._from, self._to])
        return f"{verb} {self.table}({columns}) values {', '.join(tuples)}", binds

    def _insert_ignores(self, ignore_mode: bool) -> bool:
        return ignore_mode or (self.autocommit and not self.unique)

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
        sql, binds = self._insert_sql(kept, ignore=self._insert_ignores(ignore_mode))
        try:
            await cursor.execute(sql, binds, autocommit=self.autocommit)
        except AlreadyExists as exc:
            raise await self._duplicate_error(cursor, kept) from exc

    async def _duplicate_error(
        self, cursor: VCursor, kept: Sequence[tuple[Sequence[Any], KeyspaceId]]
    ) -> AlreadyExists:
        """Name the value that already has a row (one more select; best effort)."""
        shown = [r for r, _ in kept]
        try:
            found = await self._lookup(cursor, [r[0] for r, _ in kept], autocommit=self.autocommit)
            dups = [r for r, _ in kept if match_key(r[0]) in found]
            shown = dups or shown
        except ShardgateError:
            pass  # the transaction may be unusable after the failed insert: name all rows
        what = ", ".join(show_row(r) for r in shown)
        kind = "unique lookup vindex" if self.unique else "lookup vindex"
        return AlreadyExists(f"duplicate value for {kind} {self.name}: {what}")

    def _delete_sql(self, rows: Sequence[Sequence[Any]]) -> tuple[str, dict[str, Any]]:
        binds: dict[str, Any] = {}
        if len(self._from) == 1:
            f = self._from[0]
            for i, row in enumerate(rows):
                binds[f"{f}_{i}"] = row[0]
            marks = ", ".join(f":{f}_{i}" for i in range(len(rows)))
            where = f"{f} in ({marks})"
        else:
            terms: list[str] = []
            for i, row in enumerate(rows):
                eqs: list[str] = []
                for col, value in zip(self._from, row, strict=True):
                    binds[f"{col}_{i}"] = value
                    eqs.append(f"{col} = :{col}_{i}")
                terms.append(" and ".join(eqs))
            if len(terms) == 1:
                where = terms[0]
            else:
                where = "(" + " or ".join(f"({t})" for t in terms) + ")"
        return f"delete from {self.table} where {where} and {self._to} = :{self._to}", binds

    async def delete(
        self, cursor: VCursor, rows: Sequence[Sequence[Any]], ksid: KeyspaceId
    ) -> None:
        if self.autocommit:
            return
        await self._delete(cursor, rows, ksid)

    async def _delete(
        self, cursor: VCursor, rows: Sequence[Sequence[Any]], ksid: KeyspaceId
    ) -> Result | None:
        for i, row in enumerate(rows):
            if len(row) != len(self._from):
                raise InvalidArgument(
                    f"lookup vindex {self.name!r}: row {i} has {len(row)} values for the "
                    f"{len(self._from)} columns {', '.join(self._from)}"
                )
        # Rows with a NULL were never created (or match nothing): skip them.
        live = [row for row in rows if all(v is not None for v in row)]
        if not live:
            return None
        sql, binds = self._delete_sql(live)
        binds[self._to] = self._to_stored(ksid)
        return await cursor.execute(sql, binds, autocommit=False)


def show_row(row: Sequence[Any]) -> str:
    """A row of ``from`` values for a message: the value alone, or the tuple."""
    return repr(row[0]) if len(row) == 1 else repr(tuple(row))


class LookupNonUnique(LookupBase):
    """``lookup``: a value may map to several keyspace ids (cost 20)."""

    type_name = "lookup"

    @property
    def cost(self) -> int:
        return 20

    @property
    def unique(self) -> bool:
        return False


class LookupUnique(LookupBase):
    """``lookup_unique``: a value maps to at most one keyspace id (cost 10)."""

    type_name = "lookup_unique"

    @property
    def cost(self) -> int:
        return 10

    @property
    def unique(self) -> bool:
        return True
