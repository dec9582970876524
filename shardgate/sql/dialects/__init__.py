"""SQL dialects as objects: the :class:`Dialect` names and one object per dialect.

``Dialect`` values are the strings stored in topo records and on the wire
(``"sqlite"``, ``"postgres"``, ``"mysql"``). :func:`sql_dialect` gives the
:class:`~shardgate.sql.dialects.base.SQLDialect` that owns everything the
dialect writes differently (placeholders, render fixes, clocks, upserts,
comments, catalog queries): one module per dialect (``sqlite``, ``postgres``,
``mysql``). Rendering a gate AST for a shard is
:mod:`shardgate.sql.dialects.render`. See docs/dialects.md.

This module imports no sqlglot: a backend or a Spark task can name its
dialect without loading it. The dialect objects (which use sqlglot) are
created on the first :func:`sql_dialect` call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardgate.sql.dialects.names import AVG_SUM, Dialect

if TYPE_CHECKING:
    from shardgate.sql.dialects.base import SQLDialect

_OBJECTS: dict[Dialect, SQLDialect] = {}


def sql_dialect(dialect: Dialect) -> SQLDialect:
    """The object of ``dialect`` (parse a name with :meth:`Dialect.of` first)."""
    try:
        return _OBJECTS[dialect]
    except KeyError:
        _OBJECTS.update(_create())
        return _OBJECTS[dialect]


def _create() -> dict[Dialect, SQLDialect]:
    """The registry: one object per dialect."""
    from shardgate.sql.dialects.mysql import MySQLDialect
    from shardgate.sql.dialects.postgres import PostgresDialect
    from shardgate.sql.dialects.sqlite import SQLiteDialect

    return {Dialect.SQLITE: SQLiteDialect(), Dialect.POSTGRES: PostgresDialect(),
            Dialect.MYSQL: MySQLDialect()}


__all__ = ["AVG_SUM", "Dialect", "sql_dialect"]
