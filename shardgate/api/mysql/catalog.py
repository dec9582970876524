"""The answers MySQL clients and ORMs read a schema from, built from the gate's catalog.

``SHOW DATABASES/TABLES/COLUMNS/INDEX/CREATE TABLE``, ``DESCRIBE`` and queries
on ``information_schema`` (``TABLES``, ``COLUMNS``, ``STATISTICS``,
``KEY_COLUMN_USAGE``, ``TABLE_CONSTRAINTS``, ``SCHEMATA``) get MySQL's column
names and shapes, from :meth:`shardgate.gate.Gate.catalog`, which reads the
shards' own catalogs (SQLite, PostgreSQL or MariaDB) and speaks MySQL types.
Keyspaces are the databases. ``information_schema`` queries run on an
in-memory copy with sqlglot's executor (mysql-mimic's ``InfoSchema``).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from mysql_mimic.charset import CharacterSet
from mysql_mimic.constants import INFO_SCHEMA
from mysql_mimic.results import ResultColumn, infer_type
from mysql_mimic.schema import InfoSchema
from mysql_mimic.types import ColumnType, str_len
from sqlglot.executor.table import Table

from shardgate.gate.catalog import ColumnInfo, TableInfo
from shardgate.sql.statements import like_match

Rows = list[tuple[Any, ...]]


def show_columns(table: TableInfo, full: bool = False, like: str | None = None) -> tuple[
        list[str], Rows]:
    """``SHOW [FULL] COLUMNS FROM t`` / ``DESCRIBE t``."""
    fields = ["Field", "Type", "Null", "Key", "Default", "Extra"]
    if full:
        fields = ["Field", "Type", "Collation", "Null", "Key", "Default", "Extra",
                  "Privileges", "Comment"]
    rows: Rows = []
    for c in table.columns:
        if like is not None and not _like(c.name, like):
            continue
        key = _column_key(table, c.name)
        extra = "auto_increment" if c.auto_increment else ""
        null = "YES" if c.nullable else "NO"
        if full:
            collation = "utf8mb4_general_ci" if _is_text(c) else None
            rows.append((c.name, c.column_type, collation, null, key, c.default, extra,
                         "select,insert,update,references", ""))
        else:
            rows.append((c.name, c.column_type, null, key, c.default, extra))
    return fields, rows


def show_index(table: TableInfo) -> tuple[list[str], Rows]:
    """``SHOW INDEX FROM t``: one row per index column."""
    fields = ["Table", "Non_unique", "Key_name", "Seq_in_index", "Column_name", "Collation",
              "Cardinality", "Sub_part", "Packed", "Null", "Index_type", "Comment",
              "Index_comment", "Ignored"]
    nullable = {c.name: c.nullable for c in table.columns}
    rows: Rows = [
        (table.name, 0 if index.unique else 1, index.name, seq, col, "A", None, None, None,
         "YES" if nullable.get(col, True) else "", "BTREE", "", "", "NO")
        for index in table.indexes for seq, col in enumerate(index.columns, 1)
    ]
    return fields, rows


def show_create_table(table: TableInfo) -> str:
    """``SHOW CREATE TABLE``'s text, in MySQL's layout (what SQLAlchemy's reflection parses)."""
    lines = []
    for c in table.columns:
        parts = [f"  `{c.name}` {c.column_type}"]
        if not c.nullable:
            parts.append("NOT NULL")
        if c.default is not None:
            parts.append(f"DEFAULT {_literal(c)}")
        elif c.nullable:
            parts.append("DEFAULT NULL")
        if c.auto_increment:
            parts.append("AUTO_INCREMENT")
        lines.append(" ".join(parts))
    for index in table.indexes:
        cols = ",".join(f"`{c}`" for c in index.columns)
        if index.name == "PRIMARY":
            lines.append(f"  PRIMARY KEY ({cols})")
        else:
            kind = "UNIQUE KEY" if index.unique else "KEY"
            lines.append(f"  {kind} `{index.name}` ({cols})")
    body = ",\n".join(lines)
    return (f"CREATE TABLE `{table.name}` (\n{body}\n) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci")


def info_schema(catalogs: dict[str, list[TableInfo]]) -> InfoSchema:
    """An ``information_schema`` holding every keyspace's tables (keyspace -> tables)."""
    data: dict[str, dict[str, list[dict[str, Any]]]] = {"information_schema": {
        "schemata": [], "tables": [], "columns": [], "statistics": [],
        "key_column_usage": [], "table_constraints": [],
    }}
    ischema = data["information_schema"]
    for db in ["information_schema", *sorted(catalogs)]:
        ischema["schemata"].append({
            "catalog_name": "def", "schema_name": db, "default_character_set_name": "utf8mb4",
            "default_collation_name": "utf8mb4_general_ci"})
    for db, tables in sorted(catalogs.items()):
        for t in tables:
            _add_table(ischema, db, t)
    for name, cols in INFO_SCHEMA["information_schema"].items():
        ischema["tables"].append({
            "table_catalog": "def", "table_schema": "information_schema", "table_name": name,
            "table_type": "SYSTEM VIEW", "engine": "MEMORY"})
        for pos, col in enumerate(cols, 1):
            ischema["columns"].append({
                "table_catalog": "def", "table_schema": "information_schema",
                "table_name": name, "column_name": col, "ordinal_position": pos,
                "is_nullable": "YES", "data_type": str(cols[col]).lower(),
                "column_type": str(cols[col]).lower()})
    executor_tables = {
        db: {name: _table(INFO_SCHEMA[db][name], rows) for name, rows in by_name.items()}
        for db, by_name in data.items()
    }
    for db, names in INFO_SCHEMA.items():
        for name, cols in names.items():
            executor_tables.setdefault(db, {}).setdefault(name, _table(cols, []))
    return InfoSchema(executor_tables)


def _add_table(ischema: dict[str, list[dict[str, Any]]], db: str, t: TableInfo) -> None:
    base = {"table_catalog": "def", "table_schema": db, "table_name": t.name}
    ischema["tables"].append({
        **base, "table_type": "BASE TABLE", "engine": "InnoDB", "version": "10",
        "row_format": "Dynamic", "table_collation": "utf8mb4_general_ci", "table_comment": ""})
    for pos, c in enumerate(t.columns, 1):
        text = _is_text(c)
        ischema["columns"].append({
            **base, "column_name": c.name, "ordinal_position": pos,
            "column_default": c.default, "is_nullable": "YES" if c.nullable else "NO",
            "data_type": c.data_type, "character_maximum_length": c.length(),
            "character_set_name": "utf8mb4" if text else None,
            "collation_name": "utf8mb4_general_ci" if text else None,
            "column_type": c.column_type, "column_key": _column_key(t, c.name),
            "extra": "auto_increment" if c.auto_increment else "",
            "privileges": "select,insert,update,references", "column_comment": "",
            "generation_expression": ""})
    for index in t.indexes:
        for seq, col in enumerate(index.columns, 1):
            ischema["statistics"].append({
                **base, "non_unique": 0 if index.unique else 1, "index_schema": db,
                "index_name": index.name, "seq_in_index": seq, "column_name": col,
                "collation": "A", "nullable": "", "index_type": "BTREE", "comment": "",
                "index_comment": "", "is_visible": "YES"})
            if index.unique:
                ischema["key_column_usage"].append({
                    **base, "constraint_catalog": "def", "constraint_schema": db,
                    "constraint_name": index.name, "column_name": col,
                    "ordinal_position": seq})
        if index.unique:
            ischema["table_constraints"].append({
                "constraint_catalog": "def", "constraint_schema": db,
                "constraint_name": index.name, "table_schema": db, "table_name": t.name,
                "constraint_type": "PRIMARY KEY" if index.name == "PRIMARY" else "UNIQUE"})


_TYPES = {
    "tinyint": ColumnType.TINY, "smallint": ColumnType.SHORT, "mediumint": ColumnType.INT24,
    "int": ColumnType.LONG, "integer": ColumnType.LONG, "bigint": ColumnType.LONGLONG,
    "float": ColumnType.FLOAT, "double": ColumnType.DOUBLE, "decimal": ColumnType.NEWDECIMAL,
    "date": ColumnType.DATE, "datetime": ColumnType.DATETIME, "timestamp": ColumnType.TIMESTAMP,
    "time": ColumnType.TIME, "year": ColumnType.YEAR, "json": ColumnType.JSON,
    "varchar": ColumnType.VAR_STRING, "char": ColumnType.STRING, "text": ColumnType.BLOB,
    "varbinary": ColumnType.VAR_STRING, "binary": ColumnType.STRING, "blob": ColumnType.BLOB,
    "longblob": ColumnType.LONG_BLOB, "longtext": ColumnType.LONG_BLOB,
}


def result_columns(fields: list[str], table: TableInfo) -> list[ResultColumn | str]:
    """Column definitions for ``fields`` from ``table``'s declared types (a result without
    rows has no values to infer them from); names the table lacks stay names."""
    declared = {c.name.lower(): c for c in table.columns}
    out: list[ResultColumn | str] = []
    for name in fields:
        c = declared.get(name.lower())
        kind = _TYPES.get(c.data_type) if c is not None else None
        if c is None or kind is None:
            out.append(name)
            continue
        binary = "binary" in c.data_type or "blob" in c.data_type
        out.append(ResultColumn(name, kind, CharacterSet.binary if binary else
                                CharacterSet.utf8mb4))
    return out


def value_columns(fields: list[str], rows: list[tuple[Any, ...]]) -> list[ResultColumn | str]:
    """Column definitions for a result with rows: ``Decimal`` columns as MySQL's DECIMAL
    (sent in plain notation, never ``1E+1``); other names stay names, their types
    inferred from the values by mysql-mimic."""
    out: list[ResultColumn | str] = list(fields)
    # mysql-mimic infers by name: a name used twice (``SELECT a, a AS a``) is typed here
    repeated = len({f.lower() for f in fields}) < len(fields)
    for i, name in enumerate(fields):
        value = next((r[i] for r in rows if r[i] is not None), None)
        if isinstance(value, Decimal):
            out[i] = ResultColumn(name, ColumnType.NEWDECIMAL, text_encoder=_decimal_text,
                                  binary_encoder=_decimal_binary)
        elif repeated:
            out[i] = ResultColumn(name, ColumnType.VARCHAR if value is None else
                                  infer_type(value))
    return out


def _decimal_text(column: ResultColumn, value: Any) -> bytes:
    return format(value, "f").encode() if isinstance(value, Decimal) else str(value).encode()


def _decimal_binary(column: ResultColumn, value: Any) -> bytes:
    return bytes(str_len(_decimal_text(column, value)))


def _table(columns: dict[str, str], rows: Iterable[dict[str, Any]]) -> Table:
    names = tuple(columns)
    table = Table(names)
    for row in rows:
        table.append(tuple(row.get(n) for n in names))
    return table


def _column_key(table: TableInfo, column: str) -> str:
    for index in table.indexes:
        if index.columns and index.columns[0] == column:
            if index.name == "PRIMARY":
                return "PRI"
            return "UNI" if index.unique and len(index.columns) == 1 else "MUL"
    return ""


def _is_text(c: ColumnInfo) -> bool:
    return any(k in c.data_type for k in ("char", "text", "enum", "set"))


def _literal(c: ColumnInfo) -> str:
    d = c.default or ""
    if d.upper() in ("NULL", "CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP()") or (_is_number(d) and \
            not _is_text(c)):
        return d
    return "'" + d.replace("'", "''") + "'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _like(text: str, pattern: str) -> bool:
    return like_match(text, pattern)
