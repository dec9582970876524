"""The end of a SELECT evaluated at the gate over rows it already has.

Gate-side joins and derived tables produce rows whose columns ``slots`` names;
the rest of the statement (aggregates from per-row partials, or ORDER BY in
memory, LIMIT/OFFSET and the select list) is computed here.
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.engine.postprocess import Limit, MemorySort, Projection, SortKey
from shardgate.engine.primitive import Primitive
from shardgate.errors import InvalidArgument
from shardgate.evalengine.evaluate import compile_expr
from shardgate.evalengine.values import from_expression
from shardgate.planner.select import (
    find_selected,
    mysql_names,
    needs_aggregation,
    plan_aggregation,
    row_partials,
    select_names,
)


def finish_at_gate(
    stmt: exp.Select,
    rows: Primitive,
    slots: dict[str, int],
    keyspace: str,
    items: list[exp.Expr] | None = None,
) -> Primitive:
    """Aggregate, sort, limit and project ``rows`` as ``stmt`` says."""
    if needs_aggregation(stmt):
        return plan_aggregation(stmt, row_partials(rows, slots, keyspace), keyspace)
    order = stmt.args.get("order")
    if order is not None:
        rows = MemorySort(rows, tuple(
            SortKey(compile_expr(_order_term(stmt, o.this), slots), bool(o.args.get("desc")),
                    bool(o.args.get("nulls_first")), o.this.sql(dialect="mysql"))
            for o in order.expressions), keyspace=keyspace)
    lim, off = stmt.args.get("limit"), stmt.args.get("offset")
    if lim is not None or off is not None:
        rows = Limit(rows, from_expression(lim.expression) if lim is not None else None,
                     from_expression(off.expression) if off is not None else None)
    shown = list(stmt.expressions) if items is None else items
    columns = tuple(compile_expr(e.this if isinstance(e, exp.Alias) else e, slots)
                    for e in shown)
    return Projection(rows, columns, tuple(select_names(shown)),
                      tuple(e.sql(dialect="mysql") for e in shown), mysql_names(shown),
                      keyspace=keyspace)


def _order_term(stmt: exp.Select, node: exp.Expr) -> exp.Expr:
    """What an ORDER BY term sorts on: a position or an alias names a select expression."""
    index = find_selected(stmt, node)
    if index is None:
        if isinstance(node, exp.Literal) and node.is_int:
            raise InvalidArgument(f"ORDER BY position {node.this} is not in the select list")
        return node
    picked = stmt.expressions[index]
    term: exp.Expr = picked.this if isinstance(picked, exp.Alias) else picked
    return term
