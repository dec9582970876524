"""Rows of a moving table: its shape, its keyspace id, and the SQL that writes it.

Shared by the copy, catch-up and VDiff steps of :mod:`shardgate.workflows.reshard`.
Every write is **idempotent by primary key**: an upsert sets the row to the
image it is given (whatever was there), a delete removes the row with that key
(if any). So replaying a stretch of the change log in commit order from any
position at or before the state a target already holds converges to the same
rows: the last image of each key wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardgate.backends.base import Backend, Connection
from shardgate.backends.copytext import TextRows
from shardgate.backends.copytext import data as copy_data
from shardgate.errors import AlreadyExists, NotFound, Unsupported
from shardgate.keys import KeyRange, KeyspaceId
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.vindexes import Lookup, SingleColumn
from shardgate.workflows.coltypes import writer as value_writer

#: the prefix of shardgate's own tables in a shard database (change capture, queues' state)
INTERNAL_PREFIX = "_sg_"
#: the temporary table a COPY text batch meeting keys already there is upserted from
_SCRATCH = "_sg_copy_in"


@dataclass(frozen=True)
class MovingTable:
    """A table a reshard moves: its columns, primary key and primary vindex.

    A **reference** table (VSchema ``type: reference``) has no vindex
    (``vindex`` and ``vindex_column`` are None): every shard holds all its rows,
    so every target gets every row (:meth:`owners`).
    """

    name: str
    columns: tuple[str, ...]
    pk: tuple[str, ...]
    vindex_column: str | None
    vindex: SingleColumn | None
    #: each column's kind (:mod:`shardgate.workflows.coltypes`); empty: not known,
    #: values are written as they come
    kinds: tuple[str | None, ...] = ()
    #: the sources' dialect: a target of the same kind gets values as they come
    dialect: Dialect | None = None

    @property
    def reference(self) -> bool:
        """Whether every target holds every row (a reference table)."""
        return self.vindex is None

    def pk_of(self, row: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(row[self.columns.index(c)] for c in self.pk)

    def owners(self, row: Sequence[Any], targets: Sequence[tuple[str, KeyRange]]) -> list[str]:
        """The targets that hold ``row``: all of them for a reference table, else the
        one whose key range holds its keyspace id (none when no target owns it)."""
        if self.reference:
            return [name for name, _ in targets]
        owner = owner_of(self.ksids([row])[0], targets)
        return [] if owner is None else [owner]

    def ksids(self, rows: Sequence[Sequence[Any]]) -> list[KeyspaceId | None]:
        """The keyspace id of each row (None when the vindex maps it nowhere; always
        None for a reference table)."""
        if self.vindex is None or self.vindex_column is None:
            return [None] * len(rows)
        i = self.columns.index(self.vindex_column)
        mapped = self.vindex.map([r[i] for r in rows])
        return [m[0] if m else None for m in mapped]


def quote(dialect: Dialect, name: str) -> str:
    """An identifier, always quoted, for ``dialect``."""
    return sql_dialect(dialect).quoted(name)


def primary_vindex(vschema_table: Any, keyspace: str) -> tuple[str, SingleColumn]:
    """The single column and functional vindex that place rows of a VSchema table."""
    primary = vschema_table.primary
    name = f"{keyspace}.{vschema_table.name}"
    if primary is not None and isinstance(primary.vindex, Lookup):
        raise Unsupported(
            f"table {name}: its primary vindex {primary.vindex.name!r} is a lookup vindex "
            "(the keyspace id of each row is read from another table): resharding computes "
            "keyspace ids row by row and needs a functional primary vindex (hash, "
            "xxhash, numeric, unicode_loose_md5, ...)")
    if primary is None or len(primary.columns) != 1 \
            or not isinstance(primary.vindex, SingleColumn):
        raise Unsupported(
            f"table {name}: resharding needs a functional "
            "single-column primary vindex (hash, xxhash, numeric, ...)")
    return primary.columns[0], primary.vindex


def lookup_tables(vschema: Any, keyspace: str) -> dict[str, list[str]]:
    """The tables of ``keyspace`` that lookup vindexes (of any keyspace) keep their
    rows in: ``{table: [keyspace.vindex, ...]}``."""
    found: dict[str, list[str]] = {}
    for ks in vschema.keyspaces.values():
        for vname, vindex in ks.vindexes.items():
            if not isinstance(vindex, Lookup):
                continue
            where, _, table = vindex.table.rpartition(".")
            if (where or ks.name) == keyspace:
                found.setdefault(table, []).append(f"{ks.name}.{vname}")
    return found


def placement(vschema: Any, keyspace: str, table: str, shard: str) -> tuple[str, SingleColumn]:
    """The column and functional vindex that place the rows of ``table`` of
    ``keyspace`` (found on ``shard``), or a coded error naming the table and why
    resharding cannot move it. A lookup vindex's table in the keyspace moves like
    any sharded table, by its own primary vindex (on the lookup column): the
    keyspace ids it stores do not change."""
    vt = vschema.keyspace(keyspace).tables.get(table)
    owners = lookup_tables(vschema, keyspace).get(table)
    if vt is None or (owners and vt.primary is None):
        what = (f"the lookup table of vindex {', '.join(owners)} but has no primary vindex "
                f"in the VSchema of keyspace {keyspace}: give it one on its lookup column "
                "(unicode_loose_md5, hash, ...) so its rows can be placed"
                if owners else
                f"not in the VSchema of keyspace {keyspace}: resharding moves sharded "
                "tables only")
        raise Unsupported(f"table {table!r} of shard {shard} is {what}")
    return primary_vindex(vt, keyspace)


async def user_tables(conn: Connection, dialect: Dialect) -> list[str]:
    """The user tables of a shard database (not shardgate's own ``_sg_*`` tables)."""
    match dialect:
        case Dialect.SQLITE:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        case Dialect.POSTGRES:
            sql = ("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        case _:
            sql = ("SELECT table_name FROM information_schema.tables "
                   "WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE'")
    rows = (await conn.execute(sql)).rows
    return sorted(str(r[0]) for r in rows if not str(r[0]).startswith(INTERNAL_PREFIX))


async def table_shape(conn: Connection, dialect: Dialect, table: str
                      ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(columns in order, primary key columns)`` of ``table`` in a shard database."""
    p = sql_dialect(dialect).placeholder
    match dialect:
        case Dialect.SQLITE:
            info = (await conn.execute(f"PRAGMA table_info({quote(dialect, table)})")).rows
            columns = tuple(str(r[1]) for r in info)
            pk = tuple(str(r[1]) for r in sorted(info, key=lambda r: r[5]) if r[5])
        case Dialect.POSTGRES:
            columns = tuple(str(r[0]) for r in (await conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                f"current_schema() AND table_name = {p} ORDER BY ordinal_position",
                (table,))).rows)
            pk = tuple(str(r[0]) for r in (await conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
                "i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indisprimary AND "
                f"i.indrelid = {p}::regclass ORDER BY array_position(i.indkey, a.attnum)",
                (quote(dialect, table),))).rows)
        case _:
            columns = tuple(str(r[0]) for r in (await conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                f"DATABASE() AND table_name = {p} ORDER BY ordinal_position", (table,))).rows)
            pk = tuple(str(r[0]) for r in (await conn.execute(
                "SELECT column_name FROM information_schema.key_column_usage WHERE "
                f"table_schema = DATABASE() AND table_name = {p} AND constraint_name = "
                "'PRIMARY' ORDER BY ordinal_position", (table,))).rows)
    if not columns:
        raise NotFound(f"table {table!r} is not in the shard database")
    if not pk:
        raise Unsupported(f"table {table!r} has no primary key: resharding copies and "
                          "replays rows by primary key")
    return columns, pk


class RowWriter:
    """Idempotent writes of one table's rows to one target database."""

    def __init__(self, backend: Backend, table: MovingTable) -> None:
        d, m = backend.dialect, backend.placeholder
        self.backend = backend
        self.table = table
        cols = ", ".join(quote(d, c) for c in table.columns)
        marks = ", ".join([m] * len(table.columns))
        keys = ", ".join(quote(d, c) for c in table.pk)
        rest = [quote(d, c) for c in table.columns if c not in table.pk]
        dx = sql_dialect(d)
        tail = dx.upsert(keys, ", ".join(f"{c} = {dx.excluded(c)}" for c in rest)) if rest \
            else dx.keep_existing([quote(d, c) for c in table.pk])
        self._quoted = (quote(d, table.name), tuple(quote(d, c) for c in table.columns))
        self.upsert_sql = f"INSERT INTO {quote(d, table.name)} ({cols}) VALUES ({marks}){tail}"
        self._head = f"INSERT INTO {quote(d, table.name)} ({cols}) VALUES "
        self._row = f"({marks})"
        self._tail = tail
        #: per column, the conversion of its values for this target (coltypes.writer)
        kinds = () if table.dialect is d else table.kinds
        self._conv = [(i, f) for i, f in enumerate(
            value_writer(k, d) for k in kinds) if f is not None]
        self._key_conv = [(table.pk.index(table.columns[i]), f) for i, f in self._conv
                          if table.columns[i] in table.pk]
        #: rows per multi-row upsert (within every backend's bound parameter limit)
        self.chunk = max(1, min(500, 30_000 // len(table.columns)))
        where = " AND ".join(f"{quote(d, c)} = {m}" for c in table.pk)
        self.delete_sql = f"DELETE FROM {quote(d, table.name)} WHERE {where}"
        self._delete_head = f"DELETE FROM {quote(d, table.name)} WHERE "
        self._key_match = (f"{quote(d, table.pk[0])} IN " if len(table.pk) == 1
                           else f"({where})")
        self._mark = m

    def convert(self, rows: Sequence[Sequence[Any]], *, keys: bool = False
                ) -> Sequence[Sequence[Any]]:
        """``rows`` (or primary ``keys``) with each value in the form the target's column
        takes (:func:`shardgate.workflows.coltypes.writer`); a value that cannot be is
        refused (``UNIMPLEMENTED``, naming the table and column)."""
        conv = self._key_conv if keys else self._conv
        if not conv:
            return rows
        out = []
        for r in rows:
            row = list(r)
            for i, f in conv:
                if row[i] is not None:
                    try:
                        row[i] = f(row[i])
                    except (ValueError, TypeError, ArithmeticError) as exc:
                        col = self.table.pk[i] if keys else self.table.columns[i]
                        raise Unsupported(
                            f"table {self.table.name}: column {col}: value {row[i]!r} cannot "
                            f"be written to a {self.backend.dialect} target ({exc})") from exc
            out.append(tuple(row))
        return out

    async def upsert(self, conn: Connection, rows: Sequence[Sequence[Any]]) -> None:
        """Upsert ``rows`` (distinct keys), many per statement."""
        rows = self.convert(rows)
        for i in range(0, len(rows), self.chunk):
            part = rows[i:i + self.chunk]
            sql = self._head + ", ".join([self._row] * len(part)) + self._tail
            await conn.execute(sql, [v for r in part for v in r])

    async def write_new(self, conn: Connection, rows: Sequence[Sequence[Any]]) -> bool:
        """Write ``rows`` (distinct keys), most likely absent from the target: by the
        database's bulk load where it has one, by :meth:`upsert` otherwise, or when
        a key is there already. Idempotent like :meth:`upsert`; inside a transaction.

        True when the bulk load wrote them.
        """
        if conn.supports_copy_in and rows:
            await conn.execute("SAVEPOINT sg_copy_in")
            try:
                await conn.copy_in(self._quoted[0], self._quoted[1], self.convert(rows))
            except AlreadyExists:
                # a row is there already (a batch retried in this process): upsert them
                await conn.execute("ROLLBACK TO SAVEPOINT sg_copy_in")
            else:
                await conn.execute("RELEASE SAVEPOINT sg_copy_in")
                return True
        await self.upsert(conn, rows)
        return False

    async def write_text(self, conn: Connection, source: Connection, rows: TextRows,
                         which: Sequence[int]) -> bool:
        """:meth:`write_new` of rows ``which`` of a COPY text batch read from
        ``source``: their lines as they are where the target reads them as the
        source meant them (:mod:`shardgate.backends.copytext`), else typed.

        True when the bulk load wrote them.
        """
        if not which:
            return False
        encoding = source.text_copy_encoding
        if conn.supports_text_copy and encoding is not None \
                and conn.text_copy_encoding == encoding:
            lines = rows.lines
            await conn.execute("SAVEPOINT sg_copy_in")
            try:
                await conn.copy_in_text(self._quoted[0], self._quoted[1],
                                        copy_data([lines[k] for k in which]))
            except AlreadyExists:
                # a key is there already (a batch retried in this process): the lines
                # go to a scratch table, and from there by the upsert's SQL
                await conn.execute("ROLLBACK TO SAVEPOINT sg_copy_in")
                await conn.execute(f"DROP TABLE IF EXISTS pg_temp.{_SCRATCH}")
                await conn.execute(f"CREATE TEMP TABLE {_SCRATCH} (LIKE {self._quoted[0]}) "
                                   "ON COMMIT DROP")
                await conn.copy_in_text(_SCRATCH, self._quoted[1],
                                        copy_data([lines[k] for k in which]))
                cols = ", ".join(self._quoted[1])
                await conn.execute(f"INSERT INTO {self._quoted[0]} ({cols}) SELECT {cols} "
                                   f"FROM {_SCRATCH}{self._tail}")
                await conn.execute(f"DROP TABLE pg_temp.{_SCRATCH}")
                return False
            await conn.execute("RELEASE SAVEPOINT sg_copy_in")
            return True
        return await self.write_new(conn, rows.rows(which))

    async def delete(self, conn: Connection, keys: Sequence[Sequence[Any]]) -> None:
        """Delete the rows of ``keys``, many per statement (one round trip for up to
        :attr:`chunk` keys, not one per key)."""
        keys = self.convert(keys, keys=True)
        n = len(self.table.pk)
        step = max(1, self.chunk * len(self.table.columns) // n)
        for i in range(0, len(keys), step):
            part = keys[i:i + step]
            if n == 1:
                sql = self._delete_head + self._key_match + "(" + ", ".join(
                    [self._mark] * len(part)) + ")"
            else:
                sql = self._delete_head + " OR ".join([self._key_match] * len(part))
            await conn.execute(sql, [v for k in part for v in k])


async def has_secondary_unique(conn: Connection, dialect: Dialect, table: str) -> bool:
    """Whether ``table`` has a unique key other than its primary key (then the order of
    writes to different rows matters: a row may take a value another gives up)."""
    match dialect:
        case Dialect.SQLITE:
            sql, args = ("SELECT COUNT(*) FROM pragma_index_list(?) WHERE \"unique\" "
                         "AND origin <> 'pk'", (table,))
        case Dialect.POSTGRES:
            sql, args = ("SELECT COUNT(*) FROM pg_index WHERE indrelid = %s::regclass AND "
                         "indisunique AND NOT indisprimary", (quote(dialect, table),))
        case _:
            sql, args = ("SELECT COUNT(*) FROM information_schema.statistics WHERE "
                         "table_schema = DATABASE() AND table_name = %s AND non_unique = 0 "
                         "AND index_name <> 'PRIMARY'", (table,))
    return bool(int((await conn.execute(sql, args)).rows[0][0]))


def select_after(dialect: Dialect, table: MovingTable, after: Sequence[Any] | None, limit: int,
                 placeholder: str) -> tuple[str, tuple[Any, ...]]:
    """The next ``limit`` rows in primary-key order after the key ``after``."""
    cols = ", ".join(quote(dialect, c) for c in table.columns)
    keys = ", ".join(quote(dialect, c) for c in table.pk)
    where, params = "", ()
    if after is not None:
        marks = ", ".join([placeholder] * len(table.pk))
        where = f" WHERE ({keys}) > ({marks})" if len(table.pk) > 1 \
            else f" WHERE {keys} > {placeholder}"
        params = tuple(after)
    order = ", ".join(quote(dialect, c) for c in table.pk)
    lim = f" LIMIT {int(limit)}" if limit else ""
    return f"SELECT {cols} FROM {quote(dialect, table.name)}{where} ORDER BY {order}{lim}", params


def owner_of(ksid: KeyspaceId | None, targets: Sequence[tuple[str, KeyRange]]) -> str | None:
    """The target shard whose key range holds ``ksid`` (None: no target owns it)."""
    if ksid is None:
        return None
    for name, kr in targets:
        if kr.contains(ksid):
            return name
    return None
