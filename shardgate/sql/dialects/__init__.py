"""SQL dialects as objects: the :class:`Dialect` names and one object per dialect.

``Dialect`` values are the strings stored in topo records and on the wire
(``"sqlite"``, ``"postgres"``, ``"mysql"``). :func:`sql_dialect` gives the
:class:`SQLDialect` that owns everything the dialect writes differently
(placeholders, render fixes, clocks, upserts, comments, queue DDL pieces):
one module per dialect (``sqlite``, ``postgres``, ``mysql``). Rendering a gate
AST for a shard is :mod:`shardgate.sql.dialects.render`. See docs/dialects.md.
"""

from __future__ import annotations

from shardgate.sql.dialects.base import AVG_SUM, Dialect, SQLDialect, TableComment
from shardgate.sql.dialects.mysql import MySQLDialect
from shardgate.sql.dialects.postgres import PostgresDialect
from shardgate.sql.dialects.sqlite import SQLiteDialect

_OBJECTS: dict[Dialect, SQLDialect] = {
    Dialect.SQLITE: SQLiteDialect(),
    Dialect.POSTGRES: PostgresDialect(),
    Dialect.MYSQL: MySQLDialect(),
}


def sql_dialect(dialect: Dialect) -> SQLDialect:
    """The object of ``dialect`` (parse a name with :meth:`Dialect.of` first)."""
    return _OBJECTS[dialect]


__all__ = ["AVG_SUM", "Dialect", "SQLDialect", "TableComment", "sql_dialect"]
