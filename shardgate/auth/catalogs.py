"""Catalog views: which a caller below admin may read, and how they are kept to the keyspace.

A *catalog reference* is a table reference into the database server's own
catalogs: anything qualified by ``information_schema``, ``pg_catalog``,
``pg_toast``, ``mysql``, ``performance_schema`` or ``sys``, an unqualified
``pg_*`` name (PostgreSQL looks in ``pg_catalog`` first, before any schema),
SQLite's ``sqlite_*`` tables (also qualified by ``main`` or ``temp``), and
SQLite's ``pragma_*`` table-valued functions. These name no keyspace table,
so no table ACL applies to them; instead:

* callers below admin may read only :data:`READABLE` of the shard's dialect:
  the ``information_schema`` views that describe tables, columns, indexes,
  keys, constraints and views, and SQLite's ``sqlite_master`` /
  ``sqlite_schema`` and the ``pragma_table_info``-style functions about one
  table. Every other catalog (``pg_stat_activity``, ``pg_shadow``,
  ``pg_stats``, ``pg_settings``, ``pg_authid``, ``mysql.user``,
  ``performance_schema.*``, ``pragma_database_list``, ``sqlite_stat1``...) is
  PERMISSION_DENIED, naming it; admins may read them;
* for everyone, a readable ``information_schema`` view in a statement sent to
  a shard is rewritten (:func:`for_shard`) into a derived table kept to the
  shard's own schema, as Vitess answers ``information_schema`` for the
  keyspace only: ``(SELECT * FROM information_schema.tables WHERE
  table_schema = DATABASE()) AS tables`` on MariaDB (whose
  ``information_schema`` shows every database of the server),
  ``current_schema()`` on PostgreSQL. A SQLite shard is a file of its own.
"""

from __future__ import annotations

from sqlglot import exp

#: Schemas whose tables are the server's catalogs.
CATALOG_SCHEMAS = frozenset({"information_schema", "pg_catalog", "pg_toast", "mysql",
                             "performance_schema", "sys"})
#: ``information_schema`` views a caller below admin may read, with the column that
#: names each row's schema (the rewrite filters on it), per dialect.
_INFO_SCHEMA: dict[str, dict[str, str]] = {
    "mysql": {"tables": "table_schema", "columns": "table_schema",
              "statistics": "table_schema", "key_column_usage": "table_schema",
              "table_constraints": "table_schema", "views": "table_schema",
              "referential_constraints": "constraint_schema",
              "check_constraints": "constraint_schema"},
    "postgres": {"tables": "table_schema", "columns": "table_schema",
                 "key_column_usage": "table_schema", "table_constraints": "table_schema",
                 "views": "table_schema", "referential_constraints": "constraint_schema",
                 "check_constraints": "constraint_schema",
                 "constraint_column_usage": "table_schema"},
}
#: SQLite catalogs a caller below admin may read (the shard's file is its own).
_SQLITE = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master",
                     "sqlite_temp_schema", "pragma_table_info", "pragma_table_xinfo",
                     "pragma_index_list", "pragma_index_info", "pragma_index_xinfo",
                     "pragma_foreign_key_list"})
#: What each dialect's shard answers for its own schema.
_OWN_SCHEMA = {"mysql": "DATABASE()", "postgres": "current_schema()"}

#: Catalog references a caller below admin may read, per dialect, as
#: :func:`catalog_name` spells them.
READABLE: dict[str, frozenset[str]] = {
    "mysql": frozenset(f"information_schema.{v}" for v in _INFO_SCHEMA["mysql"]),
    "postgres": frozenset(f"information_schema.{v}" for v in _INFO_SCHEMA["postgres"]),
    "sqlite": _SQLITE,
}


def catalog_name(table: exp.Table) -> str | None:
    """``schema.name`` (or ``name``) of a catalog reference, lower-cased; None if not one."""
    this = table.this
    if isinstance(this, exp.Func):  # a table-valued function (SQLite's pragma_* ones)
        name = str(this.name if isinstance(this, exp.Anonymous) else this.sql_name()).lower()
        return name if name.startswith("pragma_") else None
    if not isinstance(this, exp.Identifier):
        return None
    name, db = str(this.this).lower(), table.db.lower()
    if db in CATALOG_SCHEMAS:
        return f"{db}.{name}"
    if name.startswith(("sqlite_", "pragma_")) and db in ("", "main", "temp"):
        return name
    if not db and name.startswith("pg_"):
        return f"pg_catalog.{name}"
    return None


def readable(name: str, dialects: frozenset[str]) -> bool:
    """True when a caller below admin may read catalog ``name`` on shards of ``dialects``."""
    return bool(dialects) and all(name in READABLE.get(d, frozenset()) for d in dialects)


def for_shard(stmt: exp.Expr, dialect: str) -> exp.Expr:
    """``stmt`` as a shard-targeted session sends it: keyspace qualifiers dropped (catalog
    schemas kept), and each readable ``information_schema`` view kept to the shard's own
    schema (see the module docstring)."""
    views = _INFO_SCHEMA.get(dialect, {})
    own = _OWN_SCHEMA.get(dialect, "")

    def fix(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.args.get("db") is not None:
            node = node.copy()
            node.set("db", None)
            node.set("catalog", None)
            return node
        if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
            return node
        db = node.db.lower()
        if db == "information_schema" and node.name.lower() in views:
            column = views[node.name.lower()]
            inner = exp.select("*").from_(exp.table_(node.name, db="information_schema"))
            return inner.where(f"{column} = {own}", dialect=dialect).subquery(
                node.alias or node.name)
        if db in CATALOG_SCHEMAS or node.args.get("db") is None:
            return node
        node = node.copy()
        node.set("db", None)
        node.set("catalog", None)
        return node

    return stmt.transform(fix)
