"""INSERT values the gate resolves itself: ``DEFAULT`` and ON DUPLICATE KEY UPDATE."""

from __future__ import annotations

from sqlglot import exp

from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.values import Literal, SQLExpr, Value, from_expression
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.vschema import Table


def on_duplicate(stmt: exp.Insert, table: Table) -> tuple[tuple[str, SQLExpr], ...]:
    """The ``ON DUPLICATE KEY UPDATE`` assignments of an insert into a sharded table.

    The existing row stays on its shard, so the clause runs there as written,
    provided it changes no vindex column (that would move the row or stale a
    lookup) and the table owns no lookup (its rows would be created for a
    row that is then not inserted).
    """
    conflict = stmt.args.get("conflict")
    if conflict is None:
        return ()
    if not conflict.args.get("duplicate"):
        raise Unsupported("INSERT ... ON CONFLICT is not supported: use ON DUPLICATE KEY UPDATE")
    if table.owned_vindexes:
        raise Unsupported(
            f"INSERT ... ON DUPLICATE KEY UPDATE into {table.name}, which owns lookup "
            "vindexes, is not supported"
        )
    vindex_columns = {c for cv in table.column_vindexes for c in cv.columns}
    out: list[tuple[str, SQLExpr]] = []
    for a in conflict.expressions:
        if not (isinstance(a, exp.EQ) and isinstance(a.this, exp.Column)):
            raise InvalidArgument("ON DUPLICATE KEY UPDATE takes col = expr assignments")
        col = a.this.name.lower()
        if col in vindex_columns:
            raise Unsupported(
                f"ON DUPLICATE KEY UPDATE of vindex column {table.name}.{col} is not "
                "supported: it would move the row to another shard"
            )
        if a.expression.find(exp.Select) is not None:
            raise Unsupported("a subquery in ON DUPLICATE KEY UPDATE is not supported")
        out.append((a.this.name, SQLExpr(strip_qualifiers(a.expression))))
    return tuple(out)


def is_default(node: exp.Expr) -> bool:
    """Whether a VALUES item is the ``DEFAULT`` keyword."""
    return isinstance(node, exp.Var) and node.name.upper() == "DEFAULT"


def without_defaults(
    table: Table, columns: list[str], rows: list[list[exp.Expr]]
) -> tuple[list[str], list[tuple[Value, ...]]]:
    """Row values with ``DEFAULT`` resolved where the gate must know them.

    ``DEFAULT`` in the auto-increment column asks for the next sequence value
    (NULL does the same); a column that is ``DEFAULT`` in every row is left
    out (its default applies, and SQLite has no ``DEFAULT`` keyword in VALUES).
    ``DEFAULT`` in a vindex column otherwise is refused: the gate cannot route
    by a value only the shard knows.
    """
    ai = table.auto_increment.column if table.auto_increment is not None else None
    vindex_columns = {c for cv in table.column_vindexes for c in cv.columns}
    keep = [
        i for i, c in enumerate(columns)
        if c == ai or not rows or not all(is_default(r[i]) for r in rows)
    ]
    out_rows: list[tuple[Value, ...]] = []
    for r in rows:
        values: list[Value] = []
        for i in keep:
            if is_default(r[i]):
                if columns[i] == ai:
                    values.append(Literal(None))
                    continue
                if columns[i] in vindex_columns:
                    raise InvalidArgument(
                        f"DEFAULT for vindex column {table.name}.{columns[i]} cannot be "
                        "routed: give its value"
                    )
            values.append(from_expression(r[i]))
        out_rows.append(tuple(values))
    return [columns[i] for i in keep], out_rows
