"""Pulling out uncorrelated scalar and EXISTS subqueries (Vitess's PulloutValue/Exists).

``x = (SELECT MAX(a) FROM t)``, ``(SELECT ...)`` in the select list and
``EXISTS (SELECT ...)`` are planned on their own and run first; the outer
query reads the result from a bind variable (``x = :__sg_sv0``,
``:__sg_sv1 = 1``), so it can also route by it when ``x`` is a vindex column.
Correlated subqueries and subqueries in FROM are left in place.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from shardgate.engine.primitive import Primitive
from shardgate.engine.pullout import PulloutExists, PulloutValue
from shardgate.planner.join import correlated
from shardgate.sql.labels import label

VALUE_VAR = "__sg_sv{}"

PlanFn = Callable[[exp.Expression], Primitive]
#: (var, subquery plan, is EXISTS, select-list positions that are the subquery itself)
Pulled = tuple[str, Primitive, bool, tuple[int, ...]]


def _own_scope(node: exp.Expr, stmt: exp.Select) -> bool:
    """True if ``node`` lies in ``stmt``'s WHERE or select list, not deeper."""
    parent = node.parent
    while parent is not None and parent is not stmt:
        if isinstance(parent, exp.Select | exp.From | exp.Join):
            return False
        parent = parent.parent
    return parent is stmt


def pull_out_values(stmt: exp.Select, plan: PlanFn) -> tuple[exp.Select, list[Pulled]]:
    """Replace uncorrelated scalar and EXISTS subqueries by bind variables."""
    if next(stmt.find_all(exp.Exists, exp.Subquery), None) is None:
        return stmt, []  # nothing to pull out: no copy (a long IN list is a big tree)
    out = stmt.copy()
    pulled: list[Pulled] = []
    for node in list(out.find_all(exp.Exists, exp.Subquery)):
        if not _own_scope(node, out):
            continue
        if isinstance(node, exp.Exists):
            inner = node.this
            if not isinstance(inner, exp.Select) or correlated(inner):
                continue
            var = VALUE_VAR.format(len(pulled))
            probe = inner if inner.args.get("limit") is not None else inner.copy().limit(1)
            pulled.append((var, plan(probe), True, ()))
            node.replace(exp.EQ(this=exp.Placeholder(this=var), expression=exp.Literal.number(1)))
            continue
        if isinstance(node.parent, exp.In | exp.Exists | exp.Any | exp.All):
            continue  # list or quantified comparisons are not scalar
        inner = node.this
        if not isinstance(inner, exp.Select) or correlated(inner):
            continue
        var = VALUE_VAR.format(len(pulled))
        value: exp.Expr = exp.Placeholder(this=var)
        item = node.parent if isinstance(node.parent, exp.Alias) else node
        positions: tuple[int, ...] = ()
        if item.parent is out and item.arg_key == "expressions" and not any(
            isinstance(e, exp.Star) or e.is_star for e in out.expressions
        ):
            positions = (next(i for i, e in enumerate(out.expressions) if e is item),)
        if node.parent is out and node.arg_key == "expressions":
            # a select-list item keeps the name the database gives it: its text
            value = exp.alias_(value, label(node), quoted=True)
        pulled.append((var, plan(inner), False, positions))
        node.replace(value)
    return out, pulled


def wrap_values(outer: Primitive, pulled: list[Pulled]) -> Primitive:
    """The outer plan behind the pulled-out subqueries, run first to last."""
    for var, sub, exists, columns in reversed(pulled):
        outer = PulloutExists(sub, outer, var) if exists else PulloutValue(
            sub, outer, var, columns=columns)
    return outer
