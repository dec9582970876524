"""UNIONs and ``dual`` in statements sent to the shards.

* :func:`union_parts`: the row-wise selects of a UNION whose levels are all
  UNION ALL (or all UNION), so the shards can run it whole: each shard's share
  of a UNION ALL of single-table selects is the union of its shares; a UNION
  also needs the duplicates between shards removed at the gate.
* ``dual`` has one row and no table on SQLite or PostgreSQL:
  :func:`drop_dual` removes ``FROM dual``, :func:`without_dual_joins` a dual
  cross-joined with tables.
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.planner.merge import is_dual
from shardgate.planner.select import ORDERING, row_wise


def union_parts(stmt: exp.Union, distinct: bool) -> list[exp.Select] | None:
    """The row-wise selects of a UNION whose every level is (``distinct``) UNION or UNION ALL."""

    def walk(node: exp.Expr) -> list[exp.Select] | None:
        if isinstance(node, exp.Subquery) and not any(
            node.args.get(a) is not None for a in ORDERING
        ):
            return walk(node.this)
        if isinstance(node, exp.Union):
            if bool(node.args.get("distinct")) != distinct or any(
                node.args.get(a) is not None for a in ORDERING
            ):
                return None
            left, right = walk(node.left), walk(node.right)
            return None if left is None or right is None else left + right
        return [node] if row_wise(node) else None

    return walk(stmt)


def is_dual_select(node: exp.Select) -> bool:
    """A SELECT with no FROM or ``FROM dual``."""
    frm = node.args.get("from_")
    return frm is None or (isinstance(frm.this, exp.Table) and is_dual(frm.this))


def drop_dual(node: exp.Expr) -> exp.Expr:
    """``SELECT 1 FROM dual`` as ``SELECT 1`` (SQLite and PostgreSQL have no dual)."""
    if isinstance(node, exp.Select) and not node.args.get("joins") and node.args.get("from_") \
            is not None and is_dual_select(node):
        node = node.copy()
        node.set("from_", None)
    return node


def without_dual_joins(stmt: exp.Expression) -> exp.Expression:
    """``FROM dual, t`` is ``FROM t``: a cross join with dual's one row changes nothing."""
    if not isinstance(stmt, exp.Select) or not stmt.args.get("joins"):
        return stmt
    frm = stmt.args.get("from_")
    sources = [frm.this if frm is not None else None] + [j.this for j in stmt.args["joins"]]
    duals = [i for i, t in enumerate(sources) if isinstance(t, exp.Table) and is_dual(t)]
    joins = stmt.args["joins"]
    if not duals or len(duals) == len(sources) or any(
        joins[i - 1].args.get("on") or joins[i - 1].args.get("using") or joins[i - 1].side
        for i in duals if i > 0
    ):
        return stmt
    out = stmt.copy()
    keep = [j for i, j in enumerate(out.args["joins"], 1) if i not in duals]
    if 0 in duals:
        first = keep.pop(0)
        if first.args.get("on") or first.args.get("using") or first.side:
            return stmt
        out.set("from_", exp.From(this=first.this))
    out.set("joins", keep or None)
    return out


def output_names(query: exp.Expr) -> list[str] | None:
    """The column names a query returns (its first SELECT's), or None if unknown (``*``)."""
    while isinstance(query, exp.Union | exp.Subquery):
        query = query.left if isinstance(query, exp.Union) else query.this
    if not isinstance(query, exp.Select):
        return None
    frm = query.args.get("from_")
    if len(query.expressions) == 1 and isinstance(query.expressions[0], exp.Star) and \
            frm is not None and isinstance(frm.this, exp.Subquery) and \
            not query.args.get("joins"):
        return output_names(frm.this.this)  # SELECT * FROM (...) AS d: d's columns
    names = []
    for e in query.expressions:
        if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star):
            return None
        names.append((e.alias_or_name or e.sql(dialect="mysql")).lower())
    return names if len(set(names)) == len(names) else None


def union_tail(stmt: exp.Union) -> tuple[exp.Union, exp.Select] | None:
    """A UNION with ORDER BY/LIMIT split into the bare UNION and a gate-side tail.

    The tail is ``SELECT <columns> ORDER BY ... LIMIT ...`` over the union's
    output columns (positions in ORDER BY become the columns they name).
    """
    if all(stmt.args.get(a) is None for a in ORDERING):
        return None
    names = output_names(stmt)
    if names is None:
        return None
    bare = stmt.copy()
    tail = ordering_tail(names, {a: bare.args.get(a) for a in ORDERING})
    for arg in ORDERING:
        bare.set(arg, None)
    return bare, tail


def ordering_tail(names: list[str], ordering: dict[str, exp.Expr | None]) -> exp.Select:
    """``SELECT <names> ORDER BY ... LIMIT ...``: the ``ordering`` clauses (ORDER BY,
    LIMIT, OFFSET) of a query over rows of columns ``names``, evaluated at the gate
    (positions in ORDER BY become the columns they name)."""
    tail = exp.Select(expressions=[exp.column(n) for n in names])
    for arg, value in ordering.items():
        if value is not None:
            tail.set(arg, value.copy())
    order = tail.args.get("order")
    if order is not None:
        for o in order.expressions:
            if isinstance(o.this, exp.Literal) and o.this.is_int and \
                    1 <= int(o.this.this) <= len(names):
                o.set("this", exp.column(names[int(o.this.this) - 1]))
    return tail


#: the alias of a parenthesized UNION arm with its own ORDER BY / LIMIT, as a derived table
ARM_ALIAS = "__sg_u{}"


def flat_arms(stmt: exp.Union) -> exp.Union:
    """A UNION whose parenthesized arms every database parses (SQLite takes none).

    ``(SELECT ...)`` without ORDER BY or LIMIT is the SELECT; an arm with its own
    (``(SELECT ... ORDER BY x LIMIT 3)``) becomes ``SELECT * FROM (...) AS
    __sg_uN``, which keeps its rows and column names. ``stmt`` itself when no
    arm is parenthesized.
    """
    if not any(isinstance(a, exp.Subquery) for u in stmt.find_all(exp.Union)
               for a in (u.left, u.right)):
        return stmt
    out = stmt.copy()
    count = 0
    for union in list(out.find_all(exp.Union)):
        for key in ("this", "expression"):
            arm = union.args.get(key)
            if not isinstance(arm, exp.Subquery) or arm.alias or any(
                    arm.args.get(a) is not None for a in ORDERING):
                continue  # a derived table, or ordering on the parentheses: left alone
            inner = arm.this
            plain = all(inner.args.get(a) is None for a in ORDERING)
            if plain and (isinstance(inner, exp.Select) or (
                    key == "this" and isinstance(inner, exp.Union))):
                # a left arm's union groups the same without parentheses
                union.set(key, inner)
                continue
            derived = exp.Subquery(this=inner, alias=exp.TableAlias(
                this=exp.to_identifier(ARM_ALIAS.format(count))))
            count += 1
            union.set(key, exp.Select(expressions=[exp.Star()]).from_(derived))
    return out
