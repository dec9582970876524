"""Planning SELECTs that may reach several shards.

Two shapes:

* **plain**: the shards run the query (with LIMIT n+offset), the gate merges
  their sorted streams on ORDER BY and cuts LIMIT/OFFSET. ORDER BY terms
  missing from the select list travel as hidden trailing columns, dropped at
  the end.
* **aggregating** (GROUP BY, aggregates, HAVING or DISTINCT): the shards run a
  rewritten query returning one row per group with partial aggregates
  (``SELECT g..., COUNT(*), SUM(x), ... GROUP BY g...``); the gate combines
  them (:class:`~shardgate.engine.postprocess.Aggregate`), then applies
  HAVING, ORDER BY, LIMIT/OFFSET and the select list.

Anything the gate cannot compute exactly is refused (``UNIMPLEMENTED``):
aggregates other than COUNT/SUM/MIN/MAX/AVG, window functions, select-list expressions that mix raw
columns with aggregates outside GROUP BY.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from sqlglot import exp

from shardgate.engine.cursor import ShardQuery
from shardgate.engine.postprocess import (
    AggOp,
    Aggregate,
    AggSpec,
    Filter,
    Limit,
    MemorySort,
    Projection,
    SortKey,
    slot,
)
from shardgate.engine.primitive import Opcode, OrderKey, Primitive
from shardgate.engine.probe import TypeChecked
from shardgate.engine.route import Route
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.evaluate import Evaluator, Row, Unresolved, canonical, compile_expr
from shardgate.evalengine.sqlsem import Semantics
from shardgate.evalengine.values import BindVar, Value, from_expression, is_constant
from shardgate.sql.dialects.render import AVG_SUM, strip_qualifiers
from shardgate.sql.labels import label
from shardgate.vindexes import Vindex

UPPER_LIMIT_VAR = "__sg_upper_limit"
_HIDDEN = "__sg_h{}"


@dataclass(frozen=True)
class RouteTarget:
    """Where the route goes: what :func:`plan_multi_shard` wraps."""

    opcode: Opcode
    keyspace: str
    table: str
    vindex: Vindex | None
    values: tuple[Value | tuple[Value, ...], ...]
    in_var: str | None = None
    #: the vindex's columns, which ``values`` are compared with
    columns: tuple[str, ...] = ()


def needs_aggregation(stmt: exp.Select) -> bool:
    return bool(
        stmt.args.get("group")
        or stmt.args.get("having")
        or stmt.args.get("distinct")
        or any(_own_aggregate(e, stmt) for e in stmt.expressions)
    )


#: the clauses that order or cut a query's rows
ORDERING = ("order", "limit", "offset")


def row_wise(node: exp.Expr) -> TypeGuard[exp.Select]:
    """A SELECT giving rows one by one from its tables' rows: no aggregate, GROUP BY,
    HAVING, DISTINCT, ORDER BY, LIMIT, OFFSET or subquery. Over sharded tables,
    each shard's rows are then its share of all the rows."""
    return (
        isinstance(node, exp.Select)
        and not needs_aggregation(node)
        and all(node.args.get(a) is None for a in ORDERING)
        and not any(n is not node for n in node.find_all(exp.Select))
    )


def row_wise_table(node: exp.Expr) -> exp.Table | None:
    """The one table a :func:`row_wise` SELECT without joins reads, else None."""
    if not row_wise(node) or node.args.get("joins"):
        return None
    frm = node.args.get("from_")
    return frm.this if frm is not None and isinstance(frm.this, exp.Table) else None


def _own_aggregate(node: exp.Expr, stmt: exp.Select) -> bool:
    """An aggregate of ``stmt`` itself (not of a subquery inside ``node``)."""
    for agg in node.find_all(exp.AggFunc):
        scope = agg.find_ancestor(exp.Select)
        if scope is stmt or scope is None:
            return True
    return False


def plan_multi_shard(stmt: exp.Select, tree: exp.Select, target: RouteTarget) -> Primitive:
    """Plan ``stmt`` (original) whose shard form is ``tree`` (qualifiers stripped).

    ``tree`` must be a fresh copy: the plan owns it and may edit it.
    """
    if any(e.find(exp.Window) for e in stmt.expressions):
        raise Unsupported("window functions across shards are not supported")
    if stmt.args.get("locks"):
        raise Unsupported("SELECT ... FOR UPDATE across shards is not supported")
    sent: list[exp.Expr] = []
    plan = _aggregating(tree, target, sent) if needs_aggregation(stmt) else _plain(tree, target)
    if isinstance(plan, Route) or _as_sent(stmt, sent):
        return plan  # the shards see the statement itself: they check it
    return TypeChecked(plan, target.keyspace, stmt)


def _as_sent(stmt: exp.Select, sent: list[exp.Expr]) -> bool:
    """Whether the one shard query in ``sent`` is ``stmt`` itself (no LIMIT/OFFSET)."""
    if len(sent) != 1:
        return False
    bare = strip_qualifiers(stmt)
    bare.set("limit", None)
    bare.set("offset", None)
    return bool(bare.sql(dialect="mysql") == sent[0].sql(dialect="mysql"))


def _limits(tree: exp.Select) -> tuple[Value | None, Value | None]:
    lim = tree.args.get("limit")
    off = tree.args.get("offset")
    limit = from_expression(lim.expression) if lim is not None else None
    offset = from_expression(off.expression) if off is not None else None
    for v in (limit, offset):
        if isinstance(v, BindVar) and v.name.startswith("__sg_"):
            raise InvalidArgument(f"bind variable :{v.name} is reserved")
    return limit, offset


def _is_star(e: exp.Expr) -> bool:
    return isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)


def _plain(tree: exp.Select, target: RouteTarget) -> Primitive:
    # ``tree`` is the caller's fresh shard form (plan_multi_shard's contract): edited in place.
    names = select_names(tree.expressions)
    star = any(_is_star(e) for e in tree.expressions)
    keys: list[OrderKey] = []
    hidden = 0
    order = tree.args.get("order")
    order_terms = order.expressions if order is not None else []
    for n, o in enumerate(order_terms):
        node = o.this
        desc, nulls_first = bool(o.args.get("desc")), bool(o.args.get("nulls_first"))
        if star:
            # Positions are unknown before the shards answer, and names may repeat
            # (``SELECT *`` over a join): every sort term travels as a trailing
            # hidden column, read from the end of the row.
            if isinstance(node, exp.Literal) and node.is_int:
                raise Unsupported(
                    "ORDER BY a position together with SELECT * is not supported across "
                    "shards: order by the column's name"
                )
            found = find_selected(tree, node)
            picked = tree.expressions[found] if found is not None else node
            term = picked.this if isinstance(picked, exp.Alias) else picked
            tree.append("expressions", exp.alias_(term.copy(), _HIDDEN.format(hidden)))
            hidden += 1
            keys.append(OrderKey(_HIDDEN.format(hidden - 1), desc, nulls_first,
                                 n - len(order_terms)))
            continue
        index = find_selected(tree, node)
        if index is None and isinstance(node, exp.Literal) and node.is_int:
            raise InvalidArgument(f"ORDER BY position {node.this} is not in the select list")
        if index is None:
            index = len(tree.expressions)
            tree.append("expressions", exp.alias_(node.copy(), _HIDDEN.format(hidden)))
            hidden += 1
        keys.append(OrderKey(names[index] if index < len(names) else _HIDDEN.format(hidden - 1),
                             desc, nulls_first, index))
    limit, offset = _limits(tree)
    upper = None
    if limit is not None:
        tree.set("limit", exp.Limit(expression=exp.Placeholder(this=UPPER_LIMIT_VAR)))
        tree.set("offset", None)
        upper = UPPER_LIMIT_VAR
    route = Route(
        target.opcode, target.keyspace, True, ShardQuery(tree), table=target.table,
        vindex=target.vindex, values=target.values, order_by=tuple(keys), limit=limit,
        offset=offset, upper_limit_var=upper, in_var=target.in_var, columns=target.columns,
        hidden=hidden if star else 0,
    )
    if hidden and not star:
        return Projection(route, tuple(slot(i) for i in range(len(names))), tuple(names),
                          keyspace=target.keyspace, mysql_names=mysql_names(tree.expressions))
    return route


def select_names(items: Sequence[exp.Expr]) -> list[str]:
    """The result column names of select-list ``items``: alias, column name, or the
    expression's text as the database gives it (:func:`label`)."""
    out = []
    for e in items:
        if isinstance(e, exp.Alias):
            out.append(e.alias)
        elif isinstance(e, exp.Column):
            out.append(e.name)
        else:
            out.append(label(e))
    return out


def mysql_names(items: Sequence[exp.Expr]) -> tuple[str, ...]:
    """The names on MySQL/MariaDB where they differ: a string constant is named by
    its value there (``SELECT 'x'`` is column ``x``); empty when none differ."""
    if not any(isinstance(e, exp.Literal) and e.is_string for e in items):
        return ()
    return tuple(e.this if isinstance(e, exp.Literal) and e.is_string else name
                 for e, name in zip(items, select_names(items), strict=True))


def find_selected(tree: exp.Select, node: exp.Expr) -> int | None:
    """The select-list position of ``node`` (an expression, alias or ordinal), if selected.

    A bare column name matches a selected column of that name only when exactly
    one does (``c.id`` and ``r.id`` are both named ``id``).
    """
    exprs = tree.expressions
    if isinstance(node, exp.Literal) and node.is_int:  # always a position in ORDER BY
        n = int(node.this)
        return n - 1 if 1 <= n <= len(exprs) else None
    if isinstance(node, exp.Column) and not node.table:  # an alias first, as SQL resolves it
        for i, e in enumerate(exprs):
            if isinstance(e, exp.Alias) and e.alias.lower() == node.name.lower():
                return i
    text = canonical(node)
    for i, e in enumerate(exprs):
        inner = e.this if isinstance(e, exp.Alias) else e
        if canonical(inner) == text:
            return i
    if isinstance(node, exp.Column):
        same = [i for i, e in enumerate(exprs) if isinstance(e, exp.Column)
                and e.name.lower() == node.name.lower() and (not node.table or not e.table)]
        if len(same) == 1:
            return same[0]
    return None


_PARTIALS = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg, exp.AnyValue)


InputFactory = Callable[[list[exp.Expr], list[exp.Expr]], Primitive]


def _aggregating(tree: exp.Select, target: RouteTarget, sent: list[exp.Expr]) -> Primitive:
    """Aggregation whose partials the shards compute in one rewritten query
    (appended to ``sent``)."""

    def shard_query(items: list[exp.Expr], groups: list[exp.Expr]) -> Primitive:
        shard = tree.copy()
        shard.set("expressions", items)
        for arg in ("distinct", "having", "order", "limit", "offset"):
            shard.set(arg, None)
        shard.set("group", exp.Group(expressions=groups) if groups else None)
        sent.append(shard)
        return Route(target.opcode, target.keyspace, True, ShardQuery(shard),
                     table=target.table, vindex=target.vindex, values=target.values,
                     in_var=target.in_var, columns=target.columns)

    return plan_aggregation(tree, shard_query, target.keyspace)


def _position_if_constant(node: exp.Expr, index: int) -> exp.Expr:
    """A shard GROUP BY term: a constant travels as its select-list position.

    ``GROUP BY 5`` would name the fifth column, and PostgreSQL refuses
    ``GROUP BY 'a'``; the shard select list holds the constant at ``index``.
    """
    if is_constant(node):
        return exp.Literal.number(index + 1)
    return node.copy()


def row_partials(source: Primitive, slots: Mapping[str, int], keyspace: str) -> InputFactory:
    """Partial-aggregate rows computed at the gate, one per input row (gate-side joins)."""

    def make(items: list[exp.Expr], _groups: list[exp.Expr]) -> Primitive:
        columns: list[Evaluator] = []
        for e in items:
            if isinstance(e, exp.Count) and isinstance(e.this, exp.Star):
                columns.append(lambda row, sem: 1)
            elif isinstance(e, exp.Count):
                columns.append(_counts(compile_expr(e.this, slots)))
            elif isinstance(e, exp.Sum):
                columns.append(_summand(compile_expr(e.this, slots)))
            elif isinstance(e, exp.Min | exp.Max):
                columns.append(compile_expr(e.this, slots))
            else:
                columns.append(compile_expr(e, slots))
        return Projection(source, tuple(columns), tuple(e.sql(dialect="mysql") for e in items),
                          keyspace=keyspace)

    return make


def _summand(value: Evaluator) -> Evaluator:
    """SUM(x)'s partial for one row: x as a number (a string sums as a double)."""

    def number(row: Row, sem: Semantics) -> Any:
        v = value(row, sem)
        if v is None:
            return None
        return float(sem.number(v)) if isinstance(v, str | bytes) else sem.number(v)

    return number


def _counts(value: Evaluator) -> Evaluator:
    """COUNT(x)'s partial for one row: 1 unless x is NULL."""
    return lambda row, sem: 0 if value(row, sem) is None else 1


def _any_values(items: list[exp.Expr], groups: list[exp.Expr]) -> list[exp.Expr]:
    """Select-list columns neither grouped nor aggregated read as ``ANY_VALUE(col)``.

    MySQL (without ONLY_FULL_GROUP_BY), SQLite and Vitess return a value of
    some row of the group for such a column.
    """
    keys = {canonical(g) for g in groups}
    keys |= {g.name.lower() for g in groups if isinstance(g, exp.Column)}

    def wrap(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Column):
            if canonical(node) in keys and not node.find(exp.AggFunc):
                return node.copy()  # a grouped expression: its columns stay (a copy prunes)
            return node
        if node.find_ancestor(exp.AggFunc, exp.Select):
            return node
        if canonical(node) in keys or node.name.lower() in keys:
            return node
        return exp.AnyValue(this=node.copy())

    out: list[exp.Expr] = []
    for e in items:
        body = e.this if isinstance(e, exp.Alias) else e
        if isinstance(body, exp.Star) or (isinstance(body, exp.Column) and body.is_star):
            out.append(e)
            continue
        new = body.copy().transform(wrap)
        out.append(exp.alias_(new, e.alias, quoted=e.args["alias"].quoted)
                   if isinstance(e, exp.Alias) else new)
    return out


def plan_aggregation(tree: exp.Select, make_input: InputFactory, keyspace: str) -> Primitive:
    """GROUP BY / aggregates / HAVING / DISTINCT over partial rows from ``make_input``.

    ``make_input(items, groups)`` returns rows with the group expressions then the
    partial aggregates listed in ``items``, grouped by ``groups`` where it can.
    """
    if any(_is_star(e) for e in tree.expressions):
        raise Unsupported("SELECT * with GROUP BY or aggregates across shards is not supported")
    items = list(tree.expressions)
    aliases = {e.alias.lower(): e.this for e in items if isinstance(e, exp.Alias)}
    # Names the statement uses as columns of its tables: GROUP BY resolves a
    # name to such a column before a select alias of the same name (SQL's rule).
    where = tree.args.get("where")
    column_names = {c.name.lower() for e in items + ([where] if where is not None else [])
                    for c in e.find_all(exp.Column)}

    def unalias(node: exp.Expr) -> exp.Expr:
        """Replace references to select aliases by their expressions."""
        if isinstance(node, exp.Column) and not node.table and node.name.lower() in aliases:
            found: exp.Expr = aliases[node.name.lower()].copy()
            return found
        return node

    def unalias_outside_aggregates(node: exp.Expr) -> exp.Expr:
        """HAVING / ORDER BY: inside an aggregate a name is the table's column when
        the table has one (MIN(k) with ``n AS k`` is MIN of column k), else the alias."""
        if isinstance(node, exp.Column) and not node.table and \
                node.name.lower() in aliases and node.find_ancestor(exp.AggFunc) is not None:
            if node.name.lower() in column_names:
                return node
            raise Unsupported(
                f"{node.name!r} inside an aggregate in HAVING / ORDER BY names a table column "
                "if the table has one, else the select alias, and the gate does not know the "
                "table's columns: qualify it with the table or rename the alias"
            )
        return unalias(node)

    def unalias_group(node: exp.Expr) -> exp.Expr:
        # A column the statement uses, or an alias of an aggregate (nothing groups
        # by an aggregate): the name is the table's column.
        if isinstance(node, exp.Column) and not node.table and (
            node.name.lower() in column_names
            or aliases.get(node.name.lower(), node).find(exp.AggFunc) is not None
        ):
            return node
        return unalias(node)

    def item(node: exp.Expr) -> exp.Expr:
        """A whole GROUP BY / ORDER BY item: an ordinal names a select expression."""
        if isinstance(node, exp.Literal) and node.is_int:
            n = int(node.this)
            if 1 <= n <= len(items):
                picked = items[n - 1]
                chosen: exp.Expr = (
                    picked.this if isinstance(picked, exp.Alias) else picked
                ).copy()
                return chosen
            raise InvalidArgument(f"unknown column '{n}' in GROUP BY / ORDER BY: the select "
                                  f"list has {len(items)} columns")
        return node

    group_node = tree.args.get("group")
    groups: list[exp.Expr] = (
        [item(g).transform(unalias_group) for g in group_node.expressions] if group_node else []
    )
    if any(g.find(exp.AggFunc) for g in groups):
        raise InvalidArgument("cannot GROUP BY an aggregate: group by columns or expressions")
    one_row = group_node is None and any(_own_aggregate(e, tree) for e in items)
    if tree.args.get("distinct") and not one_row:  # one aggregate row is already distinct
        if group_node is not None:
            raise Unsupported("SELECT DISTINCT with GROUP BY across shards is not supported")
        groups = [(e.this if isinstance(e, exp.Alias) else e).copy() for e in items]
    items = _any_values(items, groups)
    having = tree.args.get("having")
    having_expr = having.this.copy() if having is not None else None
    order = tree.args.get("order")
    order_items = list(order.expressions) if order is not None else []

    # Every aggregate the gate must compute, from select list, HAVING and ORDER BY.
    exprs: list[exp.Expr] = [(e.this if isinstance(e, exp.Alias) else e) for e in items]
    if having_expr is not None:
        # HAVING takes a name GROUP BY uses as a column before a select alias.
        grouped = {g.name.lower() for g in groups if isinstance(g, exp.Column) and not g.table}
        having_expr = having_expr.transform(
            lambda n: n if isinstance(n, exp.Column) and n.name.lower() in grouped
            else unalias_outside_aggregates(n))
        exprs.append(having_expr)
    order_exprs = [item(o.this).transform(unalias_outside_aggregates) for o in order_items]
    exprs.extend(order_exprs)
    aggs: dict[str, exp.AggFunc] = {}
    for e in exprs:
        for a in e.find_all(exp.AggFunc):
            if not isinstance(a, _PARTIALS):
                raise Unsupported(
                    f"aggregate {a.sql(dialect='mysql')} across shards is not supported: "
                    "use COUNT, SUM, MIN, MAX or AVG"
                )
            aggs.setdefault(canonical(a), a)

    # The shard query: group expressions, then partial aggregates.
    shard_items: list[exp.Expr] = [g.copy() for g in groups]
    specs: list[AggSpec] = []
    # DISTINCT aggregates: the shards also group by each distinct expression, so
    # every partial stays decomposable and the gate keeps the distinct values.
    distinct_cols: dict[str, int] = {}
    distinct_exprs: list[exp.Expr] = []
    for text, a in aggs.items():
        inner = a.this
        if isinstance(inner, exp.Distinct) and isinstance(a, exp.Min | exp.Max) and \
                len(inner.expressions) == 1:
            inner = inner.expressions[0]  # MIN(DISTINCT x) is MIN(x)
            a = type(a)(this=inner.copy())
        if isinstance(inner, exp.Distinct):
            if not isinstance(a, exp.Count | exp.Sum):
                raise Unsupported(f"{a.sql(dialect='mysql')} across shards is not supported")
            if len(inner.expressions) != 1:
                raise Unsupported("COUNT(DISTINCT a, b) across shards is not supported")
            arg = inner.expressions[0]
            col = distinct_cols.get(canonical(arg))
            if col is None:
                col = distinct_cols[canonical(arg)] = len(shard_items)
                shard_items.append(arg.copy())
                distinct_exprs.append(arg.copy())
            op = AggOp.COUNT_DISTINCT if isinstance(a, exp.Count) else AggOp.SUM_DISTINCT
            specs.append(AggSpec(op, col, name=text))
            continue
        col = len(shard_items)
        if isinstance(a, exp.Avg):
            total = exp.Sum(this=inner.copy())
            total.meta[AVG_SUM] = True  # SQLite sums it as TOTAL(x): no integer overflow
            shard_items.append(total)
            shard_items.append(exp.Count(this=inner.copy()))
            specs.append(AggSpec(AggOp.AVG, col, col + 1, name=text))
            continue
        # ANY_VALUE(x) may return any value of its group: the least one will do.
        shard_items.append(exp.Min(this=inner.copy()) if isinstance(a, exp.AnyValue)
                           else a.copy())
        op = {exp.Count: AggOp.COUNT, exp.Sum: AggOp.SUM, exp.Min: AggOp.MIN,
              exp.Max: AggOp.MAX, exp.AnyValue: AggOp.MIN}[type(a)]
        specs.append(AggSpec(op, col, name=text))

    shard_groups = [
        _position_if_constant(g, i) for i, g in enumerate(groups)
    ] + [_position_if_constant(d, distinct_cols[canonical(d)]) for d in distinct_exprs]
    source = make_input(shard_items, shard_groups)

    agg = Aggregate(source, tuple(range(len(groups))), tuple(specs), scalar=not groups,
                    keyspace=keyspace)
    # Slots after aggregation: group values, then aggregate results.
    slots: dict[str, int] = {canonical(g): i for i, g in enumerate(groups)}
    for g in groups:
        if isinstance(g, exp.Column):
            slots.setdefault(g.name.lower(), slots[canonical(g)])
    for j, text in enumerate(aggs):
        slots[text] = len(groups) + j

    def compile_(node: exp.Expr) -> Evaluator:
        try:
            return compile_expr(node, slots)
        except Unresolved:
            raise Unsupported(
                f"{node.sql(dialect='mysql')!r} is neither grouped nor aggregated, "
                "so it cannot be computed across shards: add it to GROUP BY"
            ) from None

    out: Primitive = agg
    if having_expr is not None:
        out = Filter(out, compile_(having_expr), having_expr.sql(dialect="mysql"),
                     keyspace=keyspace)
    if order_items:
        keys = tuple(
            SortKey(compile_(e), bool(o.args.get("desc")), bool(o.args.get("nulls_first")),
                    e.sql(dialect="mysql"))
            for o, e in zip(order_items, order_exprs, strict=True)
        )
        out = MemorySort(out, keys, keyspace=keyspace)
    limit, offset = _limits(tree)
    if limit is not None or offset is not None:
        out = Limit(out, limit, offset)
    columns = tuple(compile_(e.this if isinstance(e, exp.Alias) else e) for e in items)
    return Projection(out, columns, tuple(select_names(tree.expressions)),
                      tuple(e.sql(dialect="mysql") for e in items),
                      mysql_names(tree.expressions), keyspace=keyspace)
