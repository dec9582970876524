"""PostgreSQL: ``%s`` placeholders, arrays as parameters, ``COMMENT ON``, ``ON CONFLICT``."""

from __future__ import annotations

from sqlglot import exp

from shardgate.sql.dialects.base import SQLDialect
from shardgate.sql.dialects.mysql_forms import translate
from shardgate.sql.dialects.names import Dialect
from shardgate.sql.rewrite import transform

_BINARY_TYPES = {
    exp.DataType.Type.VARBINARY,
    exp.DataType.Type.BINARY,
    exp.DataType.Type.BLOB,
    exp.DataType.Type.LONGBLOB,
    exp.DataType.Type.MEDIUMBLOB,
    exp.DataType.Type.TINYBLOB,
}


def _limited_dml(node: exp.Delete | exp.Update) -> exp.Expression:
    """PostgreSQL has no ``DELETE/UPDATE ... ORDER BY ... LIMIT``: pick the rows by ctid.

    ``DELETE FROM t WHERE w ORDER BY o LIMIT n`` becomes
    ``DELETE FROM t WHERE ctid IN (SELECT ctid FROM t WHERE w ORDER BY o LIMIT n)``.
    """
    node = node.copy()
    pick = exp.Select(expressions=[exp.column("ctid")]).from_(node.this.copy())
    for arg in ("where", "order", "limit"):
        pick.set(arg, node.args.get(arg))
        node.set(arg, None)
    node.set("where", exp.Where(this=exp.In(this=exp.column("ctid"), query=pick.subquery())))
    return node


class PostgresDialect(SQLDialect):
    """PostgreSQL 15."""

    name = Dialect.POSTGRES
    now_ns_sql = "((extract(epoch from clock_timestamp()) * 1000000000)::bigint)"
    random_id_sql = ("(('x' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 15))"
                     "::bit(60)::bigint)")
    array_params = True
    strict_types = True
    drop_cascade = " CASCADE"
    relaxed_durability_sql = "SET synchronous_commit = off"

    rowid = "ctid"
    last_insert_id = "lastval"
    hex_blob = False

    def fix(self, node: exp.Expr) -> exp.Expr | None:
        if isinstance(node, exp.DataType) and node.this in _BINARY_TYPES and node.expressions:
            # BYTEA takes no length: VARBINARY(16) -> BYTEA, not BYTEA(16).
            return exp.DataType.build("bytea", dialect="postgres")
        if isinstance(node, exp.Insert) and node.args.get("ignore"):
            node = node.copy()
            node.set("ignore", None)
            node.set("conflict", exp.OnConflict(action=exp.var("DO NOTHING")))
            return transform(node, self.fix, copy=False)  # its parts translated too
        if isinstance(node, exp.Delete | exp.Update) and (
            node.args.get("limit") is not None or node.args.get("order") is not None
        ):
            return transform(_limited_dml(node), self.fix, copy=False)
        return translate(node, self)

    def current(self, table: str, column: str) -> str:
        return f"{table}.{column}"  # unqualified, it would be ambiguous with EXCLUDED's

    def excluded(self, column: str) -> str:
        return f"EXCLUDED.{column}"

    def tables_sql(self) -> str:
        return "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"

    def schema_columns_sql(self) -> str:
        return ("SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")

    def commented_tables_sql(self, prefix: str) -> str:
        return ("SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r'"
                " AND n.nspname = current_schema()"
                f" AND obj_description(c.oid, 'pg_class') LIKE '{prefix}%%'")

    def table_sizes_sql(self) -> str | None:
        return ("SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace s ON s.oid = c.relnamespace "
                "WHERE s.nspname = current_schema() AND c.relkind = 'r' AND c.relname LIKE %s")
