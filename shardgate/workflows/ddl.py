"""The definition of a moving table, read from the source's catalog, for its targets.

A reshard (and MoveTables) creates the moving tables on targets that lack
them, with the source table's whole definition: column types, ``NOT NULL``,
``DEFAULT`` values, the primary key, ``UNIQUE`` constraints and unique
indexes, secondary indexes (multi-column too) and ``CHECK`` constraints.
:func:`source_table` reads it from the source's catalog:

* SQLite: the table's and its indexes' statements in ``sqlite_master``
  (index columns from ``pragma_index_xinfo`` for other kinds);
* PostgreSQL: columns, types, collations and defaults from ``pg_attribute`` /
  ``pg_attrdef``, constraints by ``pg_get_constraintdef``, indexes not backing
  a constraint by ``pg_get_indexdef`` (columns from ``pg_index``);
* MariaDB: ``SHOW CREATE TABLE`` (it holds the keys and checks), the keys'
  columns from ``information_schema.STATISTICS``.

A target of the source's kind gets those statements as they are. For another
kind (:meth:`TableDef.statements`) the ``CREATE TABLE`` is parsed with sqlglot
in the source's dialect and written in the target's; the indexes are written
from their columns (``CREATE [UNIQUE] INDEX``; a MariaDB key named ``k`` of
table ``t`` becomes ``t_k`` unless its name starts with ``t_``: index names
are per schema on PostgreSQL and SQLite). On the way:

* integer types lose MariaDB's display width (``int(11)``); SQLite's
  ``INTEGER`` (64-bit) becomes ``BIGINT``; for MariaDB a ``VARBINARY`` /
  ``VARCHAR`` without a length (PostgreSQL's ``bytea``) gets length 255; a
  PostgreSQL default ``'x'::type`` is the constant ``'x'``, a PostgreSQL time
  type keeps its microseconds on MariaDB (precision 6), and a default
  expression is parenthesized (SQLite and MariaDB want it so);
* dropped: table options (engine, character set, collation), column
  comments, collations, character sets and ``AUTO_INCREMENT`` / PostgreSQL
  ``serial`` defaults and identity (the gates' sequences give ids; also for
  targets of the source's kind).

Refused (:class:`~shardgate.errors.Unsupported`, naming the table and the
construct, at ``create`` before the workflow is recorded), whatever the
target: foreign keys (the referenced rows may live on other shards, and the
copy writes tables in no particular order), generated columns (the copy writes
every column), PostgreSQL ``EXCLUDE`` constraints. For another kind only: an
expression, partial, prefix, ``INCLUDE``, full-text, spatial or non-btree
index, MariaDB's ``ON UPDATE``, a construct sqlglot cannot write in the target's
dialect, a statement sqlglot cannot read. A table already on a target is left
as it is: create it there first to go past a refusal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from shardgate.backends.base import Backend, Connection
from shardgate.errors import DeadlineExceeded, NotFound, ShardgateError, Unavailable, Unsupported
from shardgate.queues.ddl import queue_table_extras
from shardgate.queues.options import QueueOptions
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.workflows.coltypes import is_json_check, kind_of, target_type
from shardgate.workflows.rowsql import MovingTable, quote, user_tables

_DIALECTS = {"sqlite": "sqlite", "postgres": "postgres", "mysql": "mysql"}
#: dialects whose catalog's ``CREATE TABLE`` (MariaDB's ``SHOW CREATE TABLE``) carries
#: a queue table's comment marker and defaults: a copy to a target of the same kind
#: needs no :func:`~shardgate.queues.ddl.queue_table_extras`
_CREATE_KEEPS_QUEUE = frozenset({Dialect.MYSQL})
_INTEGERS = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT,
             exp.DataType.Type.MEDIUMINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT}
#: types MariaDB refuses without a length, and the length they get when the source
#: gave none (a lookup table's ``keyspace_id BYTEA`` key column, for one)
_NEED_LENGTH = {exp.DataType.Type.VARBINARY, exp.DataType.Type.VARCHAR}
MYSQL_DEFAULT_LENGTH = 255
_TIMES = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ,
          exp.DataType.Type.DATETIME, exp.DataType.Type.TIME}
#: column constraints a target of another kind does not get (see the module docstring)
_DROPPED_CONSTRAINTS = (exp.AutoIncrementColumnConstraint, exp.CommentColumnConstraint,
                        exp.CollateColumnConstraint, exp.CharacterSetColumnConstraint)
#: column constraints carried as they are
_KEPT_CONSTRAINTS = (exp.NotNullColumnConstraint, exp.DefaultColumnConstraint,
                     exp.CheckColumnConstraint, exp.UniqueColumnConstraint,
                     exp.PrimaryKeyColumnConstraint)
#: what a default may be without parentheses
_SIMPLE_DEFAULTS = (exp.Literal, exp.Null, exp.Boolean, exp.CurrentTimestamp,
                    exp.CurrentDate, exp.CurrentTime)


@dataclass(frozen=True)
class IndexDef:
    """A secondary index (unique or not) outside the ``CREATE TABLE`` statement."""

    name: str
    unique: bool
    #: its key columns in order, with True for a descending one
    columns: tuple[tuple[str, bool], ...]
    #: the source's own statement (None on MariaDB: the keys are in ``SHOW CREATE TABLE``)
    sql: str | None = None
    #: why it cannot be written for another kind ("" : it can)
    not_portable: str = ""


@dataclass(frozen=True)
class TableDef:
    """A source table's definition (see the module docstring)."""

    name: str
    dialect: Dialect
    #: ``CREATE TABLE`` in the source's dialect
    create: str
    indexes: tuple[IndexDef, ...] = ()
    #: constructs no target gets (foreign keys, generated columns, ...)
    refused: tuple[str, ...] = ()

    def statements(self, target: str, where: str, *, queue: bool = False) -> list[str]:
        """The statements creating the table on a ``target`` dialect database named
        ``where`` in errors. A ``queue`` table gets its columns, keys and checks only
        (:func:`~shardgate.queues.ddl.queue_table_extras` gives it its defaults and
        scan indexes). Raises :class:`Unsupported` for what cannot be carried."""
        if self.refused:
            raise Unsupported(
                f"table {self.name}: {'; '.join(self.refused)}: a reshard or MoveTables does "
                f"not carry it to {where}; create the table on the target first")
        if target == self.dialect:
            return [self.create, *(i.sql for i in self.indexes if i.sql and not queue)]
        keyed = frozenset(c for i in self.indexes for c, _ in i.columns)
        out = [translate_ddl(self.create, self.dialect, target, where, table=self.name,
                             queue=queue, keyed=keyed)]
        if not queue:
            out += [self._index_sql(i, target, where) for i in self.indexes]
        return out

    def _index_sql(self, index: IndexDef, target: str, where: str) -> str:
        if index.not_portable:
            raise Unsupported(
                f"table {self.name}: index {index.name} is {index.not_portable}, which "
                f"{where} ({target}) cannot be given; create the table on the target first")
        name = index.name
        if sql_dialect(self.dialect).index_names_per_table \
                and not name.startswith(f"{self.name}_"):
            name = f"{self.name}_{name}"  # MariaDB's key names are per table

        def q(ident: str) -> str:
            return exp.to_identifier(ident, quoted=True).sql(dialect=_DIALECTS[target])

        cols = ", ".join(q(c) + (" DESC" if desc else "") for c, desc in index.columns)
        unique = "UNIQUE " if index.unique else ""
        return f"CREATE {unique}INDEX {q(name)} ON {q(self.name)} ({cols})"


async def create_tables(source: Backend, targets: Mapping[str, Backend],
                        tables: Mapping[str, MovingTable], queues: Mapping[str, QueueOptions],
                        *, check_only: bool = False) -> None:
    """Create ``tables`` on the ``targets`` (shard name -> database) lacking them, with
    ``source``'s definitions; the ``queues`` among them become queue tables there.
    ``check_only``: only compute the statements, so that what cannot be carried is
    refused before anything is done."""
    conn = await source.acquire()
    try:
        for name in tables:
            table = await source_table(conn, source.dialect, name)
            for t, backend in targets.items():
                tconn = await backend.acquire()
                try:
                    if name in await user_tables(tconn, backend.dialect):
                        continue
                    stmts = table.statements(backend.dialect, f"target {t}",
                                             queue=name in queues)
                    if not check_only:
                        await _run_ddl(tconn, backend.dialect, name, t, stmts)
                        if name in queues:
                            await _make_queue(tconn, source.dialect, backend.dialect, name,
                                              queues[name])
                finally:
                    await backend.release(tconn)
    finally:
        await source.release(conn)


async def _run_ddl(conn: Connection, dialect: Dialect, table: str, target: str,
                   stmts: list[str]) -> None:
    """Run ``stmts`` (the table, then its indexes); a statement the target refuses
    drops the table again (MariaDB's DDL is not transactional), so that the next
    attempt does not take a half-made table for one created on purpose."""
    for i, sql in enumerate(stmts):
        try:
            await conn.execute(sql)
        except (Unavailable, DeadlineExceeded):
            raise
        except ShardgateError as exc:
            if i:
                with contextlib.suppress(ShardgateError):
                    await conn.execute(f"DROP TABLE {quote(dialect, table)}")
            raise Unsupported(f"table {table}: target {target} ({dialect}) refused "
                              f"{sql!r}: {exc}; create the table on the target "
                              "first") from exc


async def _make_queue(conn: Connection, source_dialect: Dialect, dialect: Dialect, name: str,
                      options: QueueOptions) -> None:
    """Make a target's new copy of queue table ``name`` a queue table: defaults,
    comment marker and scan indexes (:func:`~shardgate.queues.ddl.queue_table_extras`;
    SQLite's ``CREATE TABLE`` copied from a SQLite source and MariaDB's ``SHOW
    CREATE TABLE`` carry the marker and defaults already)."""
    if dialect is source_dialect and dialect in _CREATE_KEEPS_QUEUE:
        return
    for sql in queue_table_extras(name, options, dialect):
        await conn.execute(sql)


async def source_table(conn: Connection, dialect: Dialect, table: str) -> TableDef:
    """``table``'s definition as the source database's catalog has it."""
    match dialect:
        case Dialect.SQLITE:
            return await _sqlite_table(conn, table)
        case Dialect.POSTGRES:
            return await _postgres_table(conn, table)
        case _:
            return await _mysql_table(conn, table)


async def _sqlite_table(conn: Connection, table: str) -> TableDef:
    rows = (await conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))).rows
    if not rows:
        raise NotFound(f"table {table!r} is not in the shard database")
    refused = []
    if (await conn.execute("SELECT COUNT(*) FROM pragma_foreign_key_list(?)",
                           (table,))).rows[0][0]:
        refused.append("a foreign key")
    generated = [str(r[0]) for r in (await conn.execute(
        "SELECT name FROM pragma_table_xinfo(?) WHERE hidden IN (2, 3)", (table,))).rows]
    if generated:
        refused.append(f"generated column(s) {', '.join(generated)}")
    indexes = []
    for name, sql, unique, partial in (await conn.execute(
            "SELECT m.name, m.sql, l.\"unique\", l.partial FROM sqlite_master m JOIN "
            "pragma_index_list(?) l ON l.name = m.name WHERE m.type = 'index' AND "
            "m.sql IS NOT NULL AND l.origin = 'c' ORDER BY m.name", (table,))).rows:
        cols = (await conn.execute(
            "SELECT cid, name, \"desc\" FROM pragma_index_xinfo(?) WHERE key = 1 "
            "ORDER BY seqno", (str(name),))).rows
        why = ("a partial index (WHERE)" if partial else
               "an expression index" if any(int(c[0]) < 0 for c in cols) else "")
        indexes.append(IndexDef(str(name), bool(unique),
                                tuple((str(c[1]), bool(c[2])) for c in cols if int(c[0]) >= 0),
                                str(sql), why))
    return TableDef(table, Dialect.SQLITE, str(rows[0][0]), tuple(indexes), tuple(refused))


def _pq(ident: str) -> str:
    return exp.to_identifier(ident, quoted=True).sql(dialect="postgres")


async def _postgres_table(conn: Connection, table: str) -> TableDef:
    rel = _pq(table)
    cols = (await conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text, "
        "CASE WHEN a.attcollation <> t.typcollation THEN (SELECT quote_ident(c.collname) "
        "FROM pg_collation c WHERE c.oid = a.attcollation) END "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_attrdef d "
        "ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = %s::regclass "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (rel,))).rows
    if not cols:
        raise NotFound(f"table {table!r} is not in the shard database")
    refused: list[str] = []
    parts = []
    for name, typ, notnull, default, _identity, generated, collation in cols:
        col = f"{_pq(str(name))} {typ}"
        if collation:
            col += f" COLLATE {collation}"
        if generated:
            refused.append(f"generated column {name}")
        elif default is not None and not str(default).startswith("nextval("):
            col += f" DEFAULT {default}"
        if notnull:
            col += " NOT NULL"
        parts.append(col)
    for name, kind, definition in (await conn.execute(
            "SELECT conname, contype::text, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass ORDER BY contype = 'p' DESC, conname",
            (rel,))).rows:
        match str(kind):
            case "p" | "u" | "c":
                parts.append(f"CONSTRAINT {_pq(str(name))} {definition}")
            case "f":
                refused.append(f"foreign key {name}")
            case "x":
                refused.append(f"EXCLUDE constraint {name}")
            case _:
                pass  # a NOT NULL (attnotnull above) or a constraint trigger
    create = f"CREATE TABLE {rel} ({', '.join(parts)})"
    indexes = []
    for oid, name, unique, sql, qualified, method, partial, nkey, nall in (await conn.execute(
            "SELECT i.indexrelid::bigint, c.relname, i.indisunique, "
            "pg_get_indexdef(i.indexrelid), quote_ident(n.nspname) || '.' || "
            "quote_ident(r.relname), am.amname, i.indpred IS NOT NULL, i.indnkeyatts, "
            "i.indnatts FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_class r ON r.oid = i.indrelid JOIN pg_namespace n ON "
            "n.oid = r.relnamespace JOIN pg_am am ON am.oid = c.relam "
            "WHERE i.indrelid = %s::regclass AND NOT i.indisprimary AND NOT EXISTS "
            "(SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) "
            "ORDER BY c.relname", (rel,))).rows:
        keys = (await conn.execute(
            "SELECT a.attname, (i.indoption[k.o - 1] & 1) = 1 FROM pg_index i CROSS JOIN "
            "LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(num, o) LEFT JOIN pg_attribute a "
            "ON a.attrelid = i.indrelid AND a.attnum = k.num WHERE i.indexrelid = %s "
            "AND k.o <= i.indnkeyatts ORDER BY k.o", (oid,))).rows
        why = ("a partial index (WHERE)" if partial else
               "an expression index" if any(k[0] is None for k in keys) else
               "an index with INCLUDE columns" if nall != nkey else
               f"a {method} index" if method != "btree" else "")
        own = str(sql).replace(f" ON {qualified} ", f" ON {rel} ", 1).replace(
            f" ON ONLY {qualified} ", f" ON ONLY {rel} ", 1)
        indexes.append(IndexDef(str(name), bool(unique),
                                tuple((str(k[0]), bool(k[1])) for k in keys if k[0] is not None),
                                own, why))
    return TableDef(table, Dialect.POSTGRES, create, tuple(indexes), tuple(refused))


async def _mysql_table(conn: Connection, table: str) -> TableDef:
    rows = (await conn.execute(
        "SHOW CREATE TABLE " + exp.to_identifier(table, quoted=True).sql(dialect="mysql"))).rows
    refused = [f"foreign key {r[0]}" for r in (await conn.execute(
        "SELECT constraint_name FROM information_schema.referential_constraints WHERE "
        "constraint_schema = DATABASE() AND table_name = %s ORDER BY 1", (table,))).rows]
    refused += [f"generated column {r[0]}" for r in (await conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
        "AND table_name = %s AND generation_expression IS NOT NULL ORDER BY ordinal_position",
        (table,))).rows]
    keys: dict[str, tuple[bool, list[tuple[str, bool]], list[str]]] = {}
    for name, non_unique, column, sub_part, index_type, collation in (await conn.execute(
            "SELECT index_name, non_unique, column_name, sub_part, index_type, collation "
            "FROM information_schema.statistics WHERE table_schema = DATABASE() AND "
            "table_name = %s AND index_name <> 'PRIMARY' ORDER BY index_name, seq_in_index",
            (table,))).rows:
        _, cols, why = keys.setdefault(str(name), (not int(non_unique), [], []))
        cols.append((str(column), collation == "D"))
        if sub_part is not None:
            why.append(f"a prefix index ({column}({sub_part}))")
        elif str(index_type) in ("FULLTEXT", "SPATIAL"):
            why.append(f"a {index_type} index")
    indexes = tuple(IndexDef(n, u, tuple(c), None, why[0] if why else "")
                    for n, (u, c, why) in keys.items())
    return TableDef(table, Dialect.MYSQL, str(rows[0][1]), indexes, tuple(refused))


def translate_ddl(ddl: str, source: str, target: str, where: str, *, table: str = "",
                  queue: bool = False, keyed: frozenset[str] = frozenset()) -> str:
    """``ddl`` (a ``CREATE TABLE`` of a ``source`` dialect database) for ``target``
    (see the module docstring); ``where`` names the target in errors. A MariaDB
    table's keys are left out (:meth:`TableDef.statements` writes them as indexes);
    a ``queue`` table's defaults too. ``keyed``: columns of indexes written apart
    (a MariaDB binary key column must have a length). Column types follow
    :mod:`shardgate.workflows.coltypes`; a type it does not carry is refused."""
    what = f"table {table}" if table else "the source's table"
    try:
        tree = sqlglot.parse_one(ddl, read=_DIALECTS[source])
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, KeyError) as exc:
        raise Unsupported(f"{where} is {target} and the sources {source}: {what} could not "
                          f"be translated ({exc}); create it on the target first") from exc
    if not isinstance(tree, exp.Create) or not isinstance(tree.this, exp.Schema):
        raise Unsupported(f"{where}: {ddl[:60]!r} is not a CREATE TABLE with columns; create "
                          "the table on the target first")

    def refuse(construct: str) -> Unsupported:
        return Unsupported(f"{what}: {construct} cannot be translated from {source} for "
                           f"{where} ({target}); create the table on the target first")

    tree.set("properties", None)
    schema = tree.this
    keyed = keyed | _key_columns(schema)
    kept: list[exp.Expression] = []
    for part in schema.expressions:
        if isinstance(part, exp.IndexColumnConstraint | exp.UniqueColumnConstraint) \
                and source == "mysql":
            continue  # a key: written as an index (TableDef.statements)
        if isinstance(part, exp.ColumnDef):
            _column(part, source, target, queue, refuse, part.name in keyed)
        elif isinstance(part, exp.Constraint):
            for inner in part.expressions:
                if not isinstance(inner, exp.CheckColumnConstraint | exp.UniqueColumnConstraint
                                  | exp.PrimaryKey | exp.PrimaryKeyColumnConstraint):
                    raise refuse(part.sql(dialect=_DIALECTS[source]))
        elif not isinstance(part, exp.PrimaryKey | exp.UniqueColumnConstraint
                            | exp.CheckColumnConstraint):
            raise refuse(part.sql(dialect=_DIALECTS[source]))
        kept.append(part)
    schema.set("expressions", kept)
    try:
        return tree.sql(dialect=_DIALECTS[target], unsupported_level=sqlglot.ErrorLevel.RAISE)
    except sqlglot.errors.UnsupportedError as exc:
        raise refuse(str(exc)) from exc


def _key_columns(schema: exp.Schema) -> frozenset[str]:
    """Columns of the primary key and of the keys inside ``CREATE TABLE``."""
    out = set()
    for part in schema.expressions:
        if isinstance(part, exp.ColumnDef):
            if any(isinstance(c.args.get("kind"), exp.PrimaryKeyColumnConstraint
                              | exp.UniqueColumnConstraint)
                   for c in part.args.get("constraints") or []):
                out.add(part.name)
            continue
        if part.find(exp.CheckColumnConstraint) is None:
            out.update(i.name for i in part.find_all(exp.Identifier))
    return frozenset(out)


def _column(col: exp.ColumnDef, source: str, target: str, queue: bool,
            refuse: Callable[[str], Unsupported], keyed: bool = False) -> None:
    dtype = col.args.get("kind")
    ckind = kind_of(col)
    if ckind == "other" and isinstance(dtype, exp.DataType):
        raise refuse(f"column {col.name}: type {dtype.sql(dialect=_DIALECTS[source])} (its "
                     "values would not be carried faithfully; see docs/resharding.md, "
                     "\"Column types across backends\")")
    mapped = target_type(ckind, target)
    if mapped is not None and not (
            ckind == "bytes" and target == "mysql"
            and (keyed or (isinstance(dtype, exp.DataType) and dtype.expressions))):
        col.set("kind", mapped)  # a MariaDB key column keeps VARBINARY(n) (a length)
    constraints = []
    for c in col.args.get("constraints") or []:
        kind = c.args.get("kind")
        if isinstance(kind, _DROPPED_CONSTRAINTS):
            continue
        if ckind == "json" and target != "mysql" and isinstance(
                kind, exp.CheckColumnConstraint) and is_json_check(kind):
            continue  # MariaDB's JSON mark: the target's JSON type checks it
        if not isinstance(kind, _KEPT_CONSTRAINTS):
            raise refuse(f"column {col.name}: {c.sql(dialect=_DIALECTS[source])}")
        if isinstance(kind, exp.DefaultColumnConstraint):
            if queue:
                continue  # queue_table_extras sets the target's own
            value = kind.this
            if isinstance(value, exp.Cast) and isinstance(value.this, exp.Literal | exp.Null):
                value = value.this  # PostgreSQL's 'x'::character varying
            if not isinstance(value, _SIMPLE_DEFAULTS) and not (
                    isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal)):
                value = exp.Paren(this=value)
            kind.set("this", value)
        constraints.append(c)
    col.set("constraints", constraints)
    kind = col.args.get("kind")
    if isinstance(kind, exp.DataType) and kind.this in _INTEGERS:
        if source == "sqlite" and kind.this == exp.DataType.Type.INT:
            kind = exp.DataType.build("BIGINT")
            col.set("kind", kind)
        kind.set("expressions", [])
    if (target == "mysql" and isinstance(kind, exp.DataType)
            and kind.this in _NEED_LENGTH and not kind.expressions):
        # PostgreSQL's ``bytea`` / ``varchar``: MariaDB needs a length
        kind.set("expressions", [exp.DataTypeParam(
            this=exp.Literal.number(MYSQL_DEFAULT_LENGTH))])
    if (target == "mysql" and source != "mysql" and isinstance(kind, exp.DataType)
            and kind.this in _TIMES):
        # PostgreSQL keeps microseconds by default, MariaDB whole seconds
        if not kind.expressions:
            kind.set("expressions", [exp.DataTypeParam(this=exp.Literal.number(6))])
        for c in col.args.get("constraints") or []:
            default = c.args.get("kind")
            if isinstance(default, exp.DefaultColumnConstraint) \
                    and isinstance(default.this, exp.CurrentTimestamp) \
                    and not default.this.this:
                default.this.set("this", exp.Literal.number(6))
