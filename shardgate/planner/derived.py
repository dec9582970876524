"""Derived tables the gate finishes itself (Vitess's SimpleProjection over a plan).

``SELECT ... FROM (SELECT ...) AS d`` whose derived table cannot be sent whole
to the shards (it aggregates, sorts with LIMIT, or is itself a gate-side plan)
is planned on its own; the outer query then runs at the gate over its rows:
WHERE as a filter, aggregates from per-row partials, ORDER BY in memory, LIMIT,
and the select list. Outer columns name the derived table's output columns
(``d.a`` or ``a``), which must be distinct and not ``*``.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from shardgate.engine.postprocess import Filter
from shardgate.engine.primitive import Primitive
from shardgate.errors import Unsupported
from shardgate.evalengine.evaluate import compile_expr
from shardgate.planner.finish import finish_at_gate
from shardgate.planner.union import output_names

PlanFn = Callable[[exp.Expression], Primitive]


def _inside(node: exp.Expr, ancestor: exp.Expr) -> bool:
    parent = node.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def plan_derived_at_gate(stmt: exp.Select, plan: PlanFn, keyspace: str) -> Primitive | None:
    """The outer query over a planned derived table, evaluated at the gate."""
    frm = stmt.args.get("from_")
    if frm is None or stmt.args.get("joins") or not isinstance(frm.this, exp.Subquery):
        return None
    derived = frm.this
    inner = derived.this
    names = output_names(inner)
    if names is None or not isinstance(inner, exp.Expression):
        return None
    if any(n is not stmt and not _inside(n, derived) for n in stmt.find_all(exp.Select)):
        return None  # other subqueries of the outer query
    slots = {n: i for i, n in enumerate(names)}
    rows = plan(inner)
    if stmt.args.get("where") is not None:
        where = stmt.args["where"].this
        rows = Filter(rows, compile_expr(where, slots), where.sql(dialect="mysql"),
                      keyspace=keyspace)
    items = list(stmt.expressions)
    if len(items) == 1 and isinstance(items[0], exp.Star):
        items = [exp.column(n) for n in names]
    elif any(isinstance(e, exp.Star) for e in items):
        raise Unsupported("SELECT *, ... over a derived table across shards is not supported")
    return finish_at_gate(stmt, rows, slots, keyspace, items)
