"""``SELECT *`` expanded from VSchema ``columns`` marked ``column_list_authoritative``.

A join the gate runs itself needs every selected column named with its table.
When every table a star stands for has an authoritative column list, ``*`` (all
tables, FROM order) and ``t.*`` become the qualified columns, in VSchema order,
as Vitess expands them; their result names are the bare column names, as the
database gives them for ``*``. A star over a table without such a list is left
as it is (the planner then refuses the join, as before), and so are joins with
``USING`` or ``NATURAL``, whose ``*`` merges the joined columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from shardgate.planner.join import TableRef
from shardgate.planner.union import output_names


def expand_stars(stmt: exp.Select, refs: Sequence[TableRef]) -> exp.Select:
    """``stmt`` with its select-list stars expanded, or ``stmt`` itself if it cannot be."""
    stars = [e for e in stmt.expressions
             if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)]
    if not stars:
        return stmt
    for join in stmt.args.get("joins") or []:
        if join.args.get("using") or join.args.get("method"):
            return stmt  # USING / NATURAL merge columns
    by_alias = {r.alias: r for r in refs}
    expressions: list[exp.Expr] = []
    for e in stmt.expressions:
        if isinstance(e, exp.Star):
            tables = list(refs)
        elif isinstance(e, exp.Column) and e.is_star:
            found = by_alias.get(e.table.lower())
            if found is None:
                return stmt
            tables = [found]
        else:
            expressions.append(e)
            continue
        for ref in tables:
            # a derived table's columns are its select list, not its table's
            columns = output_names(ref.node.this) if isinstance(ref.node, exp.Subquery) \
                else ref.table.authoritative_columns
            if columns is None:
                return stmt
            expressions.extend(
                exp.Column(this=exp.to_identifier(c), table=exp.to_identifier(ref.alias))
                for c in columns
            )
    out = stmt.copy()
    out.set("expressions", expressions)
    return out
