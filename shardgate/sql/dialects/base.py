"""SQLDialect, the base of the per-dialect objects, and what they return.

A dialect is named by :class:`~shardgate.sql.dialects.Dialect`, a ``StrEnum``
whose values are the strings stored in topo records, sent on the wire and
understood by sqlglot (``"sqlite"``, ``"postgres"``, ``"mysql"``). Everything
that differs in SQL text between the shard databases lives in one
:class:`SQLDialect` subclass per dialect (``sqlite.py``, ``postgres.py``,
``mysql.py``, as sqlglot keeps a module per dialect);
:func:`shardgate.sql.dialects.sql_dialect` returns the object of a dialect.
Code that differs per dialect asks the object (a statement, a clause, a
capability flag), never ``dialect == "..."``.

The objects are stateless singletons: every attribute is a class constant and
every method a pure function of its arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from sqlglot import exp

from shardgate.sql.dialects.names import Dialect


def is_dual(node: exp.Expr) -> bool:
    """``FROM dual``: MySQL's table of one row that needs no FROM."""
    return (isinstance(node, exp.From) and isinstance(node.this, exp.Table)
            and node.this.name.lower() == "dual" and not node.this.db
            and not node.this.args.get("joins")
            and not (node.parent is not None and node.parent.args.get("joins")))


@dataclass(frozen=True, slots=True)
class TableComment:
    """Where a table's comment goes in its creation: inside the ``CREATE TABLE``
    body (``inner``, SQLite keeps it in ``sqlite_master``), after its closing
    parenthesis (``suffix``, MariaDB) or in statements of its own (``after``,
    PostgreSQL's ``COMMENT ON TABLE``)."""

    inner: str = ""
    suffix: str = ""
    after: tuple[str, ...] = ()


class SQLDialect:
    """What one SQL dialect writes differently: the base of the dialect objects.

    Class constants describe the dialect; methods build the SQL text that
    differs. Defaults here are the common (standard) forms; each subclass
    overrides what its database spells otherwise.
    """

    #: the dialect this object speaks
    name: ClassVar[Dialect]
    #: the driver's positional placeholder (``?`` or ``%s``)
    placeholder: ClassVar[str] = "%s"
    #: the database runs inside this process (SQLite): its clock is this
    #: process's clock, and a transaction holds the whole database's lock
    embedded: ClassVar[bool] = False
    #: the clause locking the rows a SELECT reads ("" where a transaction locks all)
    row_lock: ClassVar[str] = " FOR UPDATE"
    #: the database clock in nanoseconds since the epoch (an SQL expression)
    now_ns_sql: ClassVar[str]
    #: a random positive 60-bit or wider BIGINT (an SQL expression, fresh per row)
    random_id_sql: ClassVar[str]
    #: the name of the function returning the smaller of two values
    least: ClassVar[str] = "LEAST"
    #: SUM adds non-integer values, and AVG every value, as doubles (in the order it
    #: reads the rows: SQLite before 3.43), where the others sum exact decimals
    double_sums: ClassVar[bool] = False
    #: an integer SUM whose running total leaves BIGINT fails ("integer overflow",
    #: SQLite), where the others widen to a decimal
    sum_overflow_fails: ClassVar[bool] = False
    #: results as MariaDB/MySQL shows them: a quotient (AVG, ``/``) at its declared
    #: scale, a string constant's column named by its value
    mysql_results: ClassVar[bool] = False
    #: ``x IN (SELECT ...)`` may answer FALSE, not NULL, when the subquery returns a
    #: NULL and x lies outside the range of the subquery column's type (MariaDB)
    in_subquery_range_false: ClassVar[bool] = False
    #: comparing values of different types (text = integer) is an error, where the
    #: others convert (PostgreSQL): a join the gate runs is type-checked on a shard first
    strict_types: ClassVar[bool] = False
    #: ``CREATE INDEX ... WHERE`` (partial indexes)
    partial_indexes: ClassVar[bool] = True
    #: a list parameter binds as an array (``= ANY(%s::bigint[])``, ``unnest``)
    array_params: ClassVar[bool] = False
    #: ``UPDATE ... RETURNING``
    update_returning: ClassVar[bool] = True
    #: ``DELETE ... LIMIT n``
    delete_limit: ClassVar[bool] = False
    #: the suffix of ``DROP TABLE`` that also drops the views over the table
    drop_cascade: ClassVar[str] = ""
    #: a statement relaxing the session's commit durability (its log flush), if any
    relaxed_durability_sql: ClassVar[str | None] = None
    #: index names are per table (MariaDB), not per schema
    index_names_per_table: ClassVar[bool] = False
    #: the column type of a text document of any length (MariaDB's TEXT stops at 64 KiB)
    long_text: ClassVar[str] = "TEXT"
    #: the column addressing a row of any table (MySQL forms translated by row address:
    #: :mod:`~shardgate.sql.dialects.mysql_forms`)
    rowid: ClassVar[str] = "rowid"
    #: the function giving the session's last generated id (MySQL's ``LAST_INSERT_ID()``)
    last_insert_id: ClassVar[str] = "LAST_INSERT_ID"
    #: parenthesized UNION arms, ``(SELECT ...) UNION (SELECT ...)``, parse
    union_parens: ClassVar[bool] = True
    #: ``X'ff'`` is a blob literal
    hex_blob: ClassVar[bool] = True
    #: the rows an upsert reports for a row it updated and changed (MariaDB: 2; else 1,
    #: as for a row left unchanged or inserted)
    upsert_changed_rows: ClassVar[int] = 1

    @property
    def sqlglot(self) -> str:
        """sqlglot's name of this dialect (for ``Expression.sql(dialect=...)``)."""
        return self.name.value

    def quote(self, name: str) -> str:
        """``name`` as an identifier, quoted only where the dialect needs it."""
        return exp.to_identifier(name).sql(dialect=self.name.value)

    def quoted(self, name: str) -> str:
        """``name`` as an identifier, always quoted (any spelling, keywords too)."""
        return '"' + name.replace('"', '""') + '"'

    # -- rendering a gate AST (shardgate.sql.dialects.render) ---------------------------

    def fix(self, node: exp.Expr) -> exp.Expr | None:
        """``node`` patched where sqlglot's generator gets this dialect wrong (called
        on every node before generation; returns ``node`` itself when nothing changes,
        None to drop it). Here: ``FROM dual`` dropped (sqlglot quotes it in a subquery,
        which makes it a table of that name)."""
        return None if is_dual(node) else node

    def finish(self, sql: str) -> str:
        """Generated SQL text patched where sqlglot's spelling is not the database's."""
        return sql

    # -- inserts and upserts ----------------------------------------------------------

    def insert_ignore(self) -> tuple[str, str]:
        """``(head, tail)`` of an INSERT that skips rows whose key exists:
        ``f"{head} t ... {tail}"``."""
        return "INSERT INTO", " ON CONFLICT DO NOTHING"

    def upsert(self, key: str, sets: str) -> str:
        """The clause after an ``INSERT ... VALUES`` that updates the row whose
        ``key`` (a column list) exists instead: ``sets`` is ``col = expr, ...``
        written with :meth:`current` and :meth:`excluded`."""
        return f" ON CONFLICT ({key}) DO UPDATE SET {sets}"

    def current(self, table: str, column: str) -> str:
        """In an upsert's ``sets``: the existing row's value of ``column``."""
        return column

    def excluded(self, column: str) -> str:
        """In an upsert's ``sets``: the value the INSERT proposed for ``column``."""
        return f"excluded.{column}"

    def on_duplicate_key_update(self, sets: Sequence[tuple[str, exp.Expr]]) -> str | None:
        """MySQL's ``ON DUPLICATE KEY UPDATE col = expr, ...`` (it fires on any unique
        key; ``VALUES(col)`` in ``expr`` is the value the INSERT proposed) in this
        dialect, after an ``INSERT ... VALUES``; None where the dialect needs the
        conflicting key named, which the gate does not know (PostgreSQL)."""
        return None

    def keep_existing(self, key: list[str]) -> str:
        """The clause after an ``INSERT ... VALUES`` that leaves a row whose ``key``
        (quoted columns) exists as it is (no other error is ignored)."""
        return f" ON CONFLICT ({', '.join(key)}) DO NOTHING"

    # -- tables, comments, views ------------------------------------------------------

    def table_comment(self, table: str, comment: str) -> TableComment:
        """Where ``comment`` goes when creating ``table`` (quoted); the comment is
        a plain marker (no quotes, no ``*/``)."""
        return TableComment(after=(f"COMMENT ON TABLE {table} IS '{comment}'",))

    def comment_on_table(self, table: str, comment: str) -> str | None:
        """A statement setting an existing table's comment (None: the dialect keeps
        comments only in ``CREATE TABLE``)."""
        return f"COMMENT ON TABLE {table} IS '{comment}'"

    def set_default(self, table: str, column: str, expr: str) -> str | None:
        """A statement giving an existing column a default (None: the dialect cannot)."""
        return f"ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT {expr}"

    def replace_view(self, view: str, body: str) -> list[str]:
        """Statements (re)creating ``view`` as ``body``, run in one transaction."""
        return [f"DROP VIEW IF EXISTS {view}", f"CREATE VIEW {view} AS {body}"]

    def tables_sql(self) -> str:
        """SQL listing the names of the tables of the connection's schema."""
        raise NotImplementedError

    def schema_columns_sql(self) -> str:
        """SQL listing ``(table, column, declared type)`` of every table and view of the
        connection's schema, each table's columns in their order (the gate's schema
        tracking: :mod:`shardgate.sql.schema`)."""
        raise NotImplementedError

    def commented_tables_sql(self, prefix: str) -> str:
        """SQL listing ``(table, text)`` of the schema's tables whose comment may
        start with ``prefix`` (a plain word); :meth:`comment_from` reads the
        comment out of ``text``."""
        raise NotImplementedError

    def comment_from(self, text: str, prefix: str) -> str:
        """The comment starting with ``prefix`` out of what :meth:`commented_tables_sql`
        returned for one table ("" if there is none)."""
        return text

    def table_sizes_sql(self) -> str | None:
        """SQL giving ``(table, bytes on disk with indexes)`` of the schema's tables
        whose names are ``LIKE`` its one parameter; None where the database cannot
        tell."""
        return None
