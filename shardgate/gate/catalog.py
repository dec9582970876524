"""A keyspace's tables, columns and indexes, read from its first shard's own catalog.

The MySQL listener answers ``SHOW TABLES``, ``DESCRIBE``, ``SHOW CREATE TABLE``,
``SHOW INDEX`` and ``information_schema`` queries from this, whatever database
the shards run: SQLite's ``pragma_*`` tables, PostgreSQL's
``information_schema`` and ``pg_index``, MariaDB's ``information_schema``.
Column types come back in MySQL's shapes (``varchar(128)``, ``bigint``,
``tinyint(1)``...) so MySQL clients and ORMs read them as from one MySQL server.

Every shard of a keyspace has the same schema (DDL goes through the gate to all
of them), so the first shard speaks for the keyspace. Nothing is cached but column kinds
(:class:`Catalog`, until the next DDL through the gate): each call reads the
catalog, so an answer is never older than the last DDL.
Tables shardgate keeps for itself (its queue, change-log and two-phase commit
bookkeeping, SQLite's own) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardgate.errors import NotFound
from shardgate.evalengine.coerce import Kind, column_types_sql, kind_of_type
from shardgate.sql.dialects import Dialect
from shardgate.tablet import TabletClient
from shardgate.topo.model import Topology
from shardgate.vindexes import Vindex
from shardgate.vschema import VSchema

#: Name prefixes of the tables shardgate and the databases keep for themselves.
INTERNAL_PREFIXES = ("sqlite_", "sg_", "_sg", "shardgate_", "_shardgate")


@dataclass(frozen=True)
class ColumnInfo:
    """One column, in MySQL's terms.

    ``column_type`` is the full type (``varchar(128)``), ``data_type`` its name
    only (``varchar``); ``default`` is the default expression's text or None.
    """

    name: str
    column_type: str
    nullable: bool = True
    default: str | None = None
    auto_increment: bool = False

    @property
    def data_type(self) -> str:
        return self.column_type.split("(", 1)[0].split(" ", 1)[0]

    def length(self) -> int | None:
        """The declared length of a character or binary type, else None."""
        m = re.match(r"^(?:var)?(?:char|binary)\((\d+)\)", self.column_type)
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class IndexInfo:
    """One index: ``PRIMARY`` for the primary key, its columns in order."""

    name: str
    unique: bool
    columns: tuple[str, ...]


@dataclass(frozen=True)
class TableInfo:
    """A table with its columns (in order) and indexes (the primary key first)."""

    name: str
    columns: tuple[ColumnInfo, ...]
    indexes: tuple[IndexInfo, ...] = field(default=())

    @property
    def primary_key(self) -> tuple[str, ...]:
        for index in self.indexes:
            if index.name == "PRIMARY":
                return index.columns
        return ()


async def read_catalog(tablet: TabletClient, table: str | None = None) -> list[TableInfo]:
    """The user tables of the shard behind ``tablet`` (or only ``table``), sorted by name."""
    tables = await _READERS.get(tablet.dialect, _mysql)(tablet, table)
    return sorted((t for t in tables if not is_internal(t.name)), key=lambda t: t.name)


def is_internal(name: str) -> bool:
    """True for a table shardgate or the database keeps for itself."""
    return name.lower().startswith(INTERNAL_PREFIXES)


async def _rows(
    tablet: TabletClient, sql: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    sql = sql.replace("%s", tablet.placeholder)
    return [tuple(r) for r in (await tablet.execute(sql, list(params))).rows]


# -- SQLite ----------------------------------------------------------------------------


async def _sqlite(tablet: TabletClient, only: str | None) -> list[TableInfo]:
    sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    names = [str(r[0]) for r in await _rows(tablet, sql)]
    if only is not None:
        names = [n for n in names if n.lower() == only.lower()]
    out = []
    for name in names:
        cols = await _rows(tablet, 'SELECT name, type, "notnull", dflt_value, pk '
                                   "FROM pragma_table_info(%s) ORDER BY cid", [name])
        pk = tuple(str(c[0]) for c in sorted((c for c in cols if c[4]), key=lambda c: c[4]))
        columns = tuple(
            ColumnInfo(
                name=str(c[0]),
                column_type=sqlite_type(str(c[1] or "")),
                nullable=not c[3] and not c[4],
                default=None if c[3] is None else _unquote(str(c[3])),
                # INTEGER PRIMARY KEY is the rowid: it numbers rows it is not given
                auto_increment=len(pk) == 1 and c[4] == 1 and str(c[1]).upper() == "INTEGER",
            )
            for c in cols
        )
        indexes: list[IndexInfo] = [IndexInfo("PRIMARY", True, pk)] if pk else []
        for idx in await _rows(tablet, 'SELECT name, "unique", origin FROM pragma_index_list(%s)',
                               [name]):
            if idx[2] == "pk":
                continue
            parts = await _rows(tablet, "SELECT name FROM pragma_index_info(%s) ORDER BY seqno",
                                [idx[0]])
            indexes.append(IndexInfo(str(idx[0]), bool(idx[1]), tuple(str(p[0]) for p in parts)))
        out.append(TableInfo(name, columns, tuple(indexes)))
    return out


_SQLITE_TYPES = {
    "": "text", "integer": "bigint", "int": "int", "real": "double", "float": "float",
    "double": "double", "numeric": "decimal(65,30)", "boolean": "tinyint(1)", "bool": "tinyint(1)",
    "blob": "blob", "clob": "text", "string": "text",
}


def sqlite_type(declared: str) -> str:
    """A SQLite declared type as MySQL would show it (most are MySQL's own already)."""
    t = " ".join(declared.lower().split())
    m = re.match(r"^text\((\d+)\)$", t)  # the gate renders VARCHAR(n) as TEXT(n) for SQLite
    if m:
        return f"varchar({m.group(1)})"
    return _SQLITE_TYPES.get(t, t)


def _unquote(default: str) -> str:
    if len(default) >= 2 and default[0] == default[-1] == "'":
        return default[1:-1].replace("''", "'")
    return default


# -- PostgreSQL ------------------------------------------------------------------------

_PG_COLUMNS = (
    "SELECT table_name, column_name, data_type, is_nullable, column_default, "
    "character_maximum_length, numeric_precision, numeric_scale "
    "FROM information_schema.columns WHERE table_schema = current_schema() "
    "AND table_name IN (SELECT table_name FROM information_schema.tables "
    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE') "
    "ORDER BY table_name, ordinal_position"
)
_PG_INDEXES = (
    "SELECT t.relname, i.relname, ix.indisunique, ix.indisprimary, a.attname "
    "FROM pg_index ix JOIN pg_class i ON i.oid = ix.indexrelid "
    "JOIN pg_class t ON t.oid = ix.indrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace "
    "CROSS JOIN LATERAL unnest(ix.indkey) WITH ORDINALITY AS k(attnum, ord) "
    "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum "
    "WHERE n.nspname = current_schema() ORDER BY t.relname, ix.indisprimary DESC, i.relname, k.ord"
)


async def _postgres(tablet: TabletClient, only: str | None) -> list[TableInfo]:
    columns: dict[str, list[ColumnInfo]] = {}
    for table, name, dtype, nullable, default, length, precision, scale in await _rows(
        tablet, _PG_COLUMNS
    ):
        serial = isinstance(default, str) and default.startswith("nextval(")
        columns.setdefault(str(table), []).append(ColumnInfo(
            name=str(name),
            column_type=postgres_type(str(dtype), length, precision, scale),
            nullable=nullable == "YES",
            default=None if default is None or serial else _pg_default(str(default)),
            auto_increment=serial,
        ))
    indexes: dict[str, dict[str, IndexInfo]] = {}
    for table, index, unique, primary, column in await _rows(tablet, _PG_INDEXES):
        name = "PRIMARY" if primary else str(index)
        found = indexes.setdefault(str(table), {}).get(name)
        cols = (found.columns if found else ()) + (str(column),)
        indexes[str(table)][name] = IndexInfo(name, bool(unique), cols)
    return [
        TableInfo(t, tuple(cols), tuple(indexes.get(t, {}).values()))
        for t, cols in columns.items()
        if only is None or t.lower() == only.lower()
    ]


_PG_TYPES = {
    "integer": "int", "bigint": "bigint", "smallint": "smallint", "boolean": "tinyint(1)",
    "text": "text", "double precision": "double", "real": "float", "bytea": "longblob",
    "date": "date", "timestamp without time zone": "datetime",
    "timestamp with time zone": "timestamp", "time without time zone": "time",
    "time with time zone": "time", "json": "json", "jsonb": "json", "uuid": "char(36)",
}


def postgres_type(data_type: str, length: Any, precision: Any, scale: Any) -> str:
    """A PostgreSQL ``information_schema`` type in MySQL's shape."""
    if data_type == "character varying":
        return f"varchar({length})" if length else "text"
    if data_type == "character":
        return f"char({length or 1})"
    if data_type == "numeric":
        return f"decimal({precision},{scale or 0})" if precision else "decimal(65,30)"
    return _PG_TYPES.get(data_type, "text")


def _pg_default(default: str) -> str:
    """``'x'::character varying`` -> ``x``; other expressions as they are."""
    m = re.match(r"^'(.*)'::[\w ]+$", default, re.S)
    return m.group(1).replace("''", "'") if m else default


# -- MariaDB / MySQL --------------------------------------------------------------------

_MY_COLUMNS = (
    "SELECT c.table_name, c.column_name, c.column_type, c.is_nullable, c.column_default, "
    "c.extra FROM information_schema.columns c JOIN information_schema.tables t "
    "ON t.table_schema = c.table_schema AND t.table_name = c.table_name "
    "WHERE c.table_schema = DATABASE() AND t.table_type = 'BASE TABLE' "
    "ORDER BY c.table_name, c.ordinal_position"
)
_MY_INDEXES = (
    "SELECT table_name, index_name, non_unique, column_name FROM information_schema.statistics "
    "WHERE table_schema = DATABASE() "
    "ORDER BY table_name, index_name <> 'PRIMARY', index_name, seq_in_index"
)


async def _mysql(tablet: TabletClient, only: str | None) -> list[TableInfo]:
    columns: dict[str, list[ColumnInfo]] = {}
    for table, name, ctype, nullable, default, extra in await _rows(tablet, _MY_COLUMNS):
        columns.setdefault(str(table), []).append(ColumnInfo(
            name=str(name),
            column_type=str(ctype),
            nullable=nullable == "YES",
            default=None if default is None or default == "NULL" else _unquote(str(default)),
            auto_increment="auto_increment" in str(extra or "").lower(),
        ))
    indexes: dict[str, dict[str, IndexInfo]] = {}
    for table, index, non_unique, column in await _rows(tablet, _MY_INDEXES):
        found = indexes.setdefault(str(table), {}).get(str(index))
        cols = (found.columns if found else ()) + (str(column),)
        indexes[str(table)][str(index)] = IndexInfo(str(index), not int(non_unique), cols)
    return [
        TableInfo(t, tuple(cols), tuple(indexes.get(t, {}).values()))
        for t, cols in columns.items()
        if only is None or t.lower() == only.lower()
    ]


# -- the VSchema, as Vitess's SHOW VSCHEMA shows it ----------------------------------------


#: how each dialect's catalog is read (another dialect reads MySQL's information_schema)
_READERS: dict[Dialect, Callable[[TabletClient, str | None], Awaitable[list[TableInfo]]]] = {
    Dialect.SQLITE: _sqlite, Dialect.POSTGRES: _postgres, Dialect.MYSQL: _mysql}


def vschema_tables(vschema: VSchema, keyspace: str) -> list[str]:
    """``SHOW VSCHEMA TABLES``: the keyspace's VSchema tables, sorted."""
    return sorted(vschema.keyspace(keyspace).tables)


def vschema_vindexes(
    vschema: VSchema, keyspace: str | None, table: str | None = None
) -> tuple[list[str], list[tuple[str, ...]]]:
    """``SHOW VSCHEMA VINDEXES [ON t]``: every keyspace's (or ``keyspace``'s) vindexes,
    or the column vindexes of ``table`` (Vitess's two shapes).

    ``Params`` are ``k=v`` pairs joined with ``; ``, sorted by key.
    """
    def params(v: Vindex) -> str:
        return "; ".join(f"{k}={v.params[k]}" for k in sorted(v.params))

    if table is not None:
        if keyspace is None:
            raise NotFound(f"table {table!r}: no keyspace selected (USE a keyspace)")
        t = vschema.keyspace(keyspace).tables.get(table.lower()) or \
            vschema.keyspace(keyspace).tables.get(table)
        if t is None:
            raise NotFound(f"table {table!r} is not in the VSchema of keyspace {keyspace!r}")
        return (["Columns", "Name", "Type", "Params", "Owner"], [
            (", ".join(cv.columns), cv.name, cv.vindex.type_name, params(cv.vindex),
             t.name if cv.owned else "")
            for cv in t.column_vindexes
        ])
    names = [keyspace] if keyspace is not None else sorted(vschema.keyspaces)
    owners = {(ks, cv.name): t.name for ks in names
              for t in vschema.keyspace(ks).tables.values()
              for cv in t.column_vindexes if cv.owned}
    return (["Keyspace", "Name", "Type", "Params", "Owner"], [
        (ks, name, v.type_name, params(v), owners.get((ks, name), ""))
        for ks in names for name, v in sorted(vschema.keyspace(ks).vindexes.items())
    ])


# -- views and the shard's own CREATE text (MariaDB / MySQL shards) ------------------------

_VIEWS = {
    Dialect.SQLITE: "SELECT name FROM sqlite_master WHERE type = 'view'",
    Dialect.POSTGRES: "SELECT table_name FROM information_schema.views "
                      "WHERE table_schema = current_schema()",
    Dialect.MYSQL: "SELECT table_name FROM information_schema.tables "
                   "WHERE table_schema = DATABASE() AND table_type = 'VIEW'",
}
#: the dialects whose shards answer ``DESCRIBE`` and ``SHOW CREATE TABLE`` as MySQL does
_NATIVE = frozenset({Dialect.MYSQL})


async def read_views(tablet: TabletClient) -> list[str]:
    """The names of the views of the shard behind ``tablet``, sorted."""
    sql = _VIEWS.get(tablet.dialect, _VIEWS[Dialect.MYSQL])
    return sorted(str(r[0]) for r in await _rows(tablet, sql) if not is_internal(str(r[0])))


def quote_mysql(name: str) -> str:
    """``name`` as a MySQL quoted identifier."""
    return "`" + name.replace("`", "``") + "`"


async def database_name(tablet: TabletClient) -> str | None:
    """The MariaDB/MySQL database a shard lives in (None for other dialects)."""
    if tablet.dialect not in _NATIVE:
        return None
    rows = await _rows(tablet, "SELECT DATABASE()")
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


async def native_create(tablet: TabletClient, table: str) -> str | None:
    """A MariaDB/MySQL shard's own ``SHOW CREATE TABLE`` text of ``table`` (or view).

    The shard's text is what a MySQL server would answer, with everything the
    catalog above does not model: foreign keys, check constraints, comments,
    table options and view definitions. None for other dialects, and when the
    shard has no such table or view.
    """
    rows = await _native(tablet, "SHOW CREATE TABLE", table)
    return str(rows[0][1]) if rows else None


async def native_describe(tablet: TabletClient, table: str) -> list[tuple[Any, ...]] | None:
    """A MariaDB/MySQL shard's own ``DESCRIBE`` of ``table`` or a view (the catalog above
    reads base tables only); None for other dialects and when not found."""
    return await _native(tablet, "DESCRIBE", table)


async def _native(tablet: TabletClient, statement: str, table: str) -> list[tuple[Any, ...]] | None:
    if tablet.dialect not in _NATIVE:
        return None
    sql = f"{statement} {quote_mysql(table)}"
    if tablet.placeholder == "%s":  # the driver formats the text: a % is written %%
        sql = sql.replace("%", "%%")
    try:
        return [tuple(r) for r in (await tablet.execute(sql, [])).rows]
    except NotFound:
        return None


def rename_databases(text: str, names: dict[str, str]) -> str:
    """``text`` with each quoted database name of ``names`` (shard database -> keyspace)
    replaced where it qualifies an object (`` `db`.``), so clients see keyspaces."""
    for db, keyspace in names.items():
        if db != keyspace:
            text = text.replace(f"{quote_mysql(db)}.", f"{quote_mysql(keyspace)}.")
    return text


class CatalogGate(Protocol):
    """What :class:`Catalog` needs of the gate: the served topology and first shards."""

    @property
    def topology(self) -> Topology: ...

    def first_shard(self, keyspace: str) -> tuple[tuple[str, str], TabletClient]: ...


class Catalog:
    """The gate's reads of its keyspaces' schemas, each from the keyspace's first shard.

    Invariant: :meth:`column_kinds` answers from a cache that is emptied
    (:meth:`forget`, which also calls ``on_forget``: the schema tracker's) on
    every DDL through the gate and every topology change; everything else is
    read anew on each call.
    """

    def __init__(self, gate: CatalogGate, on_forget: Callable[[], None] | None = None) -> None:
        self._gate = gate
        self._on_forget = on_forget
        #: (keyspace, lower-case table) -> column kinds, read from the first shard
        self.kinds: dict[tuple[str, str], dict[str, Kind]] = {}

    def forget(self) -> None:
        """Drop the cached column kinds (a DDL or a new topology may have changed them)."""
        self.kinds.clear()
        if self._on_forget is not None:
            self._on_forget()

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        """How each column of ``table`` converts values, from its first shard's schema.

        Cached until the next DDL through the gate; a table the shard does not
        know (yet) gives an empty mapping, which is not cached.
        """
        key = (keyspace, table.lower())
        found = self.kinds.get(key)
        if found is not None:
            return found
        _, tablet = self._gate.first_shard(keyspace)
        res = await tablet.execute(column_types_sql(tablet.dialect, tablet.placeholder), [table])
        found = {str(r[0]).lower(): kind_of_type(str(r[1] or ""), tablet.dialect)
                 for r in res.rows}
        if found:
            self.kinds[key] = found
        return found

    async def tables(self, keyspace: str, table: str | None = None) -> list[TableInfo]:
        """The tables of ``keyspace`` (or only ``table``) with columns and indexes."""
        return await read_catalog(self._gate.first_shard(keyspace)[1], table)

    async def views(self, keyspace: str) -> list[str]:
        """The views of ``keyspace`` (its first shard's), sorted."""
        return await read_views(self._gate.first_shard(keyspace)[1])

    async def native_describe(self, keyspace: str, table: str) -> list[tuple[Any, ...]] | None:
        """The first shard's own ``DESCRIBE`` (MariaDB/MySQL; None elsewhere or not found)."""
        return await native_describe(self._gate.first_shard(keyspace)[1], table)

    async def native_create(self, keyspace: str, table: str) -> str | None:
        """The first shard's own ``SHOW CREATE TABLE`` (MariaDB/MySQL), database names
        turned into keyspace names; None on other dialects or when not found."""
        text = await native_create(self._gate.first_shard(keyspace)[1], table)
        if text is None:
            return None
        names: dict[str, str] = {}
        for ks in self._gate.topology.keyspaces:
            db = await database_name(self._gate.first_shard(ks)[1])
            if db is not None:
                names[db] = ks
        return rename_databases(text, names)
