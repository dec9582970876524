"""MariaDB (sqlglot's ``mysql``): ``%s`` placeholders, ``ON DUPLICATE KEY``, no partial indexes."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from shardgate.sql.dialects.base import SQLDialect, TableComment
from shardgate.sql.dialects.names import Dialect


class MySQLDialect(SQLDialect):
    """MariaDB 10.11, spoken as sqlglot's ``mysql`` dialect."""

    name = Dialect.MYSQL
    now_ns_sql = "(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000000))"
    # Not RAND(): MariaDB's RAND() has 30 bits of state, so one bulk INSERT of
    # 200k events repeats ~900 ids. 60 bits of an MD5 of a (unique) UUID() do not.
    random_id_sql = "(CAST(CONV(SUBSTR(MD5(UUID()), 1, 15), 16, 10) AS SIGNED))"
    mysql_results = True
    in_subquery_range_false = True
    partial_indexes = False
    update_returning = False
    delete_limit = True
    index_names_per_table = True
    long_text = "LONGTEXT"
    upsert_changed_rows = 2

    def quoted(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def keep_existing(self, key: list[str]) -> str:
        return " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = {self.excluded(c)}" for c in key)

    def finish(self, sql: str) -> str:
        if sql.endswith(" FOR SHARE"):
            return sql[: -len(" FOR SHARE")] + " LOCK IN SHARE MODE"  # MariaDB's spelling
        return sql

    def insert_ignore(self) -> tuple[str, str]:
        return "INSERT IGNORE INTO", ""

    def upsert(self, key: str, sets: str) -> str:
        return f" ON DUPLICATE KEY UPDATE {sets}"  # any unique key: ``key`` is implied

    def excluded(self, column: str) -> str:
        return f"VALUES({column})"

    def on_duplicate_key_update(self, sets: Sequence[tuple[str, exp.Expr]]) -> str | None:
        body = ", ".join(f"{self.quote(c)} = {e.sql(dialect='mysql')}" for c, e in sets)
        return f" ON DUPLICATE KEY UPDATE {body}"

    def table_comment(self, table: str, comment: str) -> TableComment:
        return TableComment(suffix=f" COMMENT = '{comment}'")

    def comment_on_table(self, table: str, comment: str) -> str | None:
        return f"ALTER TABLE {table} COMMENT = '{comment}'"

    def replace_view(self, view: str, body: str) -> list[str]:
        return [f"CREATE OR REPLACE VIEW {view} AS {body}"]

    def tables_sql(self) -> str:
        return "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"

    def schema_columns_sql(self) -> str:
        return ("SELECT table_name, column_name, column_type FROM information_schema.columns "
                "WHERE table_schema = DATABASE() ORDER BY table_name, ordinal_position")

    def commented_tables_sql(self, prefix: str) -> str:
        return ("SELECT table_name, table_comment FROM information_schema.tables"
                f" WHERE table_schema = DATABASE() AND table_comment LIKE '{prefix}%%'")

    def table_sizes_sql(self) -> str | None:
        return ("SELECT table_name, data_length + index_length FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE %s")
