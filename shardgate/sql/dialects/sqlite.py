"""SQLite: ``?`` placeholders, no row locks, comments kept in ``sqlite_master``."""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlglot
from sqlglot import exp

from shardgate.sql.dialects.base import SQLDialect, TableComment
from shardgate.sql.dialects.mysql_forms import translate
from shardgate.sql.dialects.names import AVG_SUM, Dialect

_AVG_SUM_SQLITE = sqlglot.parse_one(
    "CASE WHEN COUNT(__sg_x) = SUM(typeof(__sg_x) = 'integer') "
    "THEN CAST(SUM(__sg_x >> 32) AS TEXT) || ':' || CAST(SUM(__sg_x & 4294967295) AS TEXT) "
    "|| ':' || CAST(TOTAL(ABS(CAST(__sg_x AS REAL))) AS TEXT) "
    "ELSE TOTAL(__sg_x) END",
    dialect="sqlite",
)


def _avg_sum(x: exp.Expression) -> exp.Expression:
    """AVG's partial sum on SQLite, which SUM would overflow on large integers.

    Integers: the exact sum as text ``'hi:lo:magnitude'`` (the sums of their
    high and low 32 bits, which cannot overflow, and the sum of their absolute
    values as a double; :func:`~shardgate.sql.dialects.render.avg_partial` and
    :func:`~shardgate.sql.dialects.render.avg_magnitude` read it); otherwise
    ``TOTAL(x)``, a double, as SQLite's AVG sums.
    """
    return _AVG_SUM_SQLITE.transform(
        lambda n: exp.Paren(this=x.copy())
        if isinstance(n, exp.Column) and n.name == "__sg_x" else n
    )


class SQLiteDialect(SQLDialect):
    """SQLite (the embedded shards): in this process, one lock per database."""

    name = Dialect.SQLITE
    placeholder = "?"
    embedded = True
    row_lock = ""
    now_ns_sql = "(CAST((julianday('now') - 2440587.5) * 86400000000000.0 AS INTEGER))"
    random_id_sql = "(random() & 9223372036854775807)"
    least = "min"
    double_sums = True
    sum_overflow_fails = True

    rowid = "rowid"
    last_insert_id = "last_insert_rowid"
    union_parens = False

    def fix(self, node: exp.Expr) -> exp.Expr | None:
        if isinstance(node, exp.Sum) and node.meta.get(AVG_SUM):
            return _avg_sum(node.this)
        if isinstance(node, exp.Select) and node.args.get("locks"):
            # SQLite has no row locks: a transaction already holds the database lock.
            node.set("locks", None)  # (render walks its own copy of the tree)
            return node
        return translate(node, self)

    def insert_ignore(self) -> tuple[str, str]:
        return "INSERT OR IGNORE INTO", ""

    def on_duplicate_key_update(self, sets: Sequence[tuple[str, exp.Expr]]) -> str | None:
        # An upsert without a conflict target fires on any unique constraint, as
        # MySQL's clause does; VALUES(col) is excluded.col there.
        def excluded(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Anonymous) and str(node.this).upper() == "VALUES" and \
                    len(node.expressions) == 1:
                return exp.column(node.expressions[0].name, table="excluded")
            return node

        body = ", ".join(f"{self.quote(c)} = {e.transform(excluded).sql(dialect='sqlite')}"
                         for c, e in sets)
        return f" ON CONFLICT DO UPDATE SET {body}"

    def table_comment(self, table: str, comment: str) -> TableComment:
        return TableComment(inner=f"/* {comment} */")

    def comment_on_table(self, table: str, comment: str) -> str | None:
        return None

    def set_default(self, table: str, column: str, expr: str) -> str | None:
        return None

    def tables_sql(self) -> str:
        return "SELECT name FROM sqlite_master WHERE type = 'table'"

    def schema_columns_sql(self) -> str:
        return ("SELECT m.name, p.name, p.type FROM sqlite_master m "
                "JOIN pragma_table_info(m.name) p WHERE m.type IN ('table', 'view') "
                "ORDER BY m.name, p.cid")

    def commented_tables_sql(self, prefix: str) -> str:
        # the comment is inside the CREATE TABLE statement SQLite keeps
        return f"SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql LIKE '%{prefix}%'"

    def comment_from(self, text: str, prefix: str) -> str:
        m = re.search(r"/\*\s*(" + re.escape(prefix) + r"[^*]*)\*/", text)
        return m.group(1).strip() if m else ""
