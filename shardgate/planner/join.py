"""Planning joins and subqueries across shards.

In order of preference:

1. **Pull-out**: an uncorrelated ``col IN (SELECT ...)`` is planned on its own,
   run first, and its values bound as a list (``col IN (:__sg_sqN)``), which
   also lets the outer query route by ``col`` when it is a vindex column.
2. **Pushdown**: when every pair of sharded tables is joined on their primary
   vindex columns with the same vindex (so matching rows live on the same
   shard), and the rest are reference tables of the keyspace, the whole query
   goes to the shards as one route, with the usual scatter post-processing.
3. **Nested loop** at the gate: the last table of the join chain is joined to
   the plan of the tables before it, on equalities of qualified columns;
   WHERE terms are pushed to the side they name. Columns must be qualified
   with their table (the gate has no schema to resolve them otherwise).

WHERE terms naming both sides, or the optional side of a LEFT JOIN, are
evaluated at the gate after joining; aggregates over a gate-side join are
computed from per-row partials. Correlated subqueries are refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlglot import exp

from shardgate.engine.evaluate import canonical, compile_expr
from shardgate.engine.join import NestedLoopJoin, PulloutSubquery
from shardgate.engine.postprocess import Filter, Limit, MemorySort, Projection, SortKey
from shardgate.engine.primitives import Opcode, Primitive
from shardgate.engine.values import from_expression
from shardgate.errors import Unsupported
from shardgate.planner.routing import RouteChoice, choose, conjuncts
from shardgate.planner.select import needs_aggregation, plan_aggregation, row_partials
from shardgate.vindexes import Lookup
from shardgate.vschema import Table, VSchema

JOIN_VAR = "__sg_join{}"
SUBQUERY_VAR = "__sg_sq{}"

PlanFn = Callable[[exp.Expression], Primitive]


@dataclass(frozen=True)
class TableRef:
    alias: str
    table: Table
    node: exp.Table
    join: exp.Join | None  # None for the FROM table


def pull_out_subqueries(stmt: exp.Select, plan: PlanFn) -> tuple[exp.Select, list[tuple[str,
                                                                                           Primitive]]]:
    """Replace uncorrelated ``x IN (SELECT ...)`` by list bind variables.

    Returns the rewritten statement and ``(var, subquery plan)`` pairs, in the
    order they must run.
    """
    pulled: list[tuple[str, Primitive]] = []
    # Only this statement's own IN terms: each subquery pulls out its own nested
    # ones when it is planned (visiting them here too made planning exponential).
    candidates = [n for n in own_nodes(stmt) if isinstance(n, exp.In) and n.args.get("query")]
    if not candidates:
        return stmt, pulled
    stmt = stmt.copy()
    candidates = [n for n in own_nodes(stmt) if isinstance(n, exp.In) and n.args.get("query")]
    for node in candidates:
        query = node.args.get("query")
        if isinstance(node.parent, exp.Not):
            continue
        inner = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(inner, exp.Select) or _correlated(inner):
            continue
        var = SUBQUERY_VAR.format(len(pulled))
        pulled.append((var, plan(inner)))
        node.replace(exp.In(this=node.this.copy(), expressions=[exp.Placeholder(this=var)]))
    return stmt, pulled


def own_nodes(stmt: exp.Expr) -> Iterator[exp.Expr]:
    """The nodes of ``stmt`` outside its subqueries, breadth first (as ``find_all``)."""
    queue: deque[exp.Expr] = deque([stmt])
    while queue:
        node = queue.popleft()
        yield node
        for child in node.iter_expressions():
            if not isinstance(child, exp.Query | exp.Subquery):
                queue.append(child)


def wrap_pulled(outer: Primitive, pulled: list[tuple[str, Primitive]]) -> Primitive:
    for var, sub in reversed(pulled):
        outer = PulloutSubquery(sub, outer, var)
    return outer


def _correlated(inner: exp.Select) -> bool:
    aliases = {(t.alias or t.name).lower() for t in inner.find_all(exp.Table)}
    return any(c.table and c.table.lower() not in aliases for c in inner.find_all(exp.Column))


def table_refs(stmt: exp.Select, vschema: VSchema, default_ks: str | None) -> list[TableRef]:
    """The FROM table and each joined table, in order."""
    frm = stmt.args.get("from_")
    if frm is None or not isinstance(frm.this, exp.Table):
        raise Unsupported("joins over derived tables are not supported across shards")
    nodes: list[tuple[exp.Table, exp.Join | None]] = [(frm.this, None)]
    for j in stmt.args.get("joins") or []:
        if not isinstance(j.this, exp.Table):
            raise Unsupported("joins with derived tables are not supported across shards")
        nodes.append((j.this, j))
    refs = []
    for node, join in nodes:
        table = vschema.find_table(node.name, node.db or None, default_ks)
        refs.append(TableRef((node.alias or node.name).lower(), table, node, join))
    return refs


def _equalities(terms: list[exp.Expr]) -> list[tuple[exp.Column, exp.Column]]:
    out = []
    for t in terms:
        if isinstance(t, exp.EQ) and isinstance(t.left, exp.Column) and \
                isinstance(t.right, exp.Column):
            out.append((t.left, t.right))
    return out


def _join_terms(refs: list[TableRef], inner_only: bool) -> list[exp.Expr]:
    terms: list[exp.Expr] = []
    for r in refs:
        if r.join is None:
            continue
        if r.join.args.get("using"):
            raise Unsupported("JOIN ... USING across shards is not supported: use ON")
        if inner_only and r.join.side:
            continue
        terms.extend(conjuncts(r.join.args.get("on")))
    return terms


def _same_vindex(a: Table, b: Table) -> bool:
    pa, pb = a.primary, b.primary
    if pa is None or pb is None or len(pa.columns) != 1 or len(pb.columns) != 1:
        return False
    if pa.vindex is pb.vindex:
        return True
    va, vb = pa.vindex, pb.vindex
    return (not isinstance(va, Lookup) and type(va) is type(vb) and va.params == vb.params)


def colocated(refs: list[TableRef], where: exp.Expr | None) -> bool:
    """True when all sharded tables are joined pairwise on their primary vindex."""
    for i, r in enumerate(refs):
        side = (r.join.side or "").upper() if r.join is not None else ""
        if side in ("RIGHT", "FULL"):
            return False
        # A preserved side made of reference tables only would emit its unmatched
        # rows once per shard: such a LEFT JOIN runs at the gate.
        if side == "LEFT" and r.table.type != "reference" and \
                all(p.table.type == "reference" for p in refs[:i]):
            return False
    sharded = [r for r in refs if r.table.type != "reference"]
    if len(sharded) <= 1:
        return True
    by_alias = {r.alias: r for r in sharded}
    parent = {r.alias: r.alias for r in sharded}

    def find(a: str) -> str:
        while parent[a] != a:
            a = parent[a]
        return a

    terms = _join_terms(refs, inner_only=False) + list(conjuncts(where))
    for left, right in _equalities(terms):
        la, ra = left.table.lower(), right.table.lower()
        if la not in by_alias or ra not in by_alias or la == ra:
            continue
        lt, rt = by_alias[la].table, by_alias[ra].table
        if not _same_vindex(lt, rt):
            continue
        assert lt.primary is not None and rt.primary is not None
        if left.name.lower() == lt.primary.columns[0] and \
                right.name.lower() == rt.primary.columns[0]:
            parent[find(la)] = find(ra)
    return len({find(a) for a in parent}) == 1


def best_route(refs: list[TableRef], stmt: exp.Select) -> tuple[RouteChoice, TableRef]:
    """The best route among the sharded tables of a pushed-down join."""
    terms = list(conjuncts(stmt.args.get("where"))) + _join_terms(refs, inner_only=True)
    where = exp.and_(*terms) if terms else None
    best: tuple[RouteChoice, TableRef] | None = None
    for r in refs:
        if r.table.type == "reference":
            continue
        if r.join is not None and (r.join.side or "").upper() == "LEFT":
            continue  # the optional side: its WHERE terms (IS NULL) do not filter rows
        choice = choose(r.table, where, {r.alias, r.table.name.lower()})
        if best is None or (choice.opcode.rank, _cost(choice)) < (best[0].opcode.rank,
                                                                   _cost(best[0])):
            best = (choice, r)
    assert best is not None
    return best


def _cost(choice: RouteChoice) -> int:
    return choice.vindex.cost if choice.vindex is not None else 1 << 20


def plan_nested_loop(
    stmt: exp.Select, refs: list[TableRef], plan: PlanFn
) -> Primitive:
    """Join the last table to the plan of the tables before it, at the gate."""
    aliases = {e.alias.lower() for e in stmt.expressions if isinstance(e, exp.Alias)}
    for e in stmt.find_all(exp.Column, exp.Star):
        if isinstance(e, exp.Star) and isinstance(e.parent, exp.Count):
            continue  # COUNT(*)
        if isinstance(e, exp.Column) and not e.table and e.name.lower() in aliases:
            continue  # a select alias, in ORDER BY or HAVING
        if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and (e.is_star or not e.table)):
            raise Unsupported(
                "a join across shards needs every column qualified with its table "
                "(and no *), so the gate can split the query"
            )
    right = refs[-1]
    left_refs = refs[:-1]
    left_aliases = {r.alias for r in left_refs}
    join = right.join
    assert join is not None
    outer = join.side.upper() == "LEFT" if join.side else False
    if join.side and not outer:
        raise Unsupported(f"{join.side} JOIN across shards is not supported")

    # Join keys: equalities between the right table and the left tables in ON.
    on_terms = list(conjuncts(join.args.get("on")))
    keys: list[tuple[exp.Column, exp.Column]] = []
    right_only: list[exp.Expr] = []
    for t in on_terms:
        sides = {c.table.lower() for c in t.find_all(exp.Column)}
        if sides <= {right.alias}:
            right_only.append(t)
            continue
        if isinstance(t, exp.EQ) and isinstance(t.left, exp.Column) and \
                isinstance(t.right, exp.Column):
            a, b = t.left, t.right
            if a.table.lower() == right.alias and b.table.lower() in left_aliases:
                a, b = b, a
            if b.table.lower() == right.alias and a.table.lower() in left_aliases:
                keys.append((a, b))
                continue
        if sides <= left_aliases and not outer:
            right_only.append(t)  # a left-only ON term of an inner join filters like WHERE
            continue
        raise Unsupported(
            f"join condition {t.sql(dialect='mysql')!r} cannot be split across shards: "
            "use equalities between columns of the two tables"
        )
    if not keys:
        raise Unsupported("a join across shards needs an equality between the two tables")

    left_where: list[exp.Expr] = []
    right_where: list[exp.Expr] = []
    gate_where: list[exp.Expr] = []  # both sides, or the optional side: after the join
    for t in conjuncts(stmt.args.get("where")):
        sides = {c.table.lower() for c in t.find_all(exp.Column)}
        if sides <= left_aliases:
            left_where.append(t)
        elif sides <= {right.alias} and not outer:
            right_where.append(t)
        else:
            gate_where.append(t)

    # Columns each side must return: everything the statement uses above the join.
    needed: dict[str, exp.Column] = {}
    order_node = stmt.args.get("order")
    order_terms = [o.this for o in order_node.expressions] if order_node is not None else []
    group_node = stmt.args.get("group")
    having_node = stmt.args.get("having")
    above = list(stmt.expressions) + order_terms + gate_where
    above += list(group_node.expressions) if group_node is not None else []
    above += [having_node.this] if having_node is not None else []
    for node in above:
        for c in node.find_all(exp.Column):
            if c.table:
                needed.setdefault(canonical(c), c)
    left_cols = [c for k, c in needed.items() if c.table.lower() in left_aliases]
    right_cols = [c for k, c in needed.items() if c.table.lower() == right.alias]
    left_key_pos = []
    for a, _b in keys:
        if canonical(a) not in {canonical(c) for c in left_cols}:
            left_cols.append(a)
        left_key_pos.append([canonical(c) for c in left_cols].index(canonical(a)))
    right_key_pos = []
    for _a, b in keys:
        if canonical(b) not in {canonical(c) for c in right_cols}:
            right_cols.append(b)
        right_key_pos.append([canonical(c) for c in right_cols].index(canonical(b)))

    # Left side: the tables before, with their joins and WHERE terms.
    left_stmt = exp.Select(expressions=[c.copy() for c in left_cols])
    left_stmt.set("from_", stmt.args["from_"].copy())
    left_stmt.set("joins", [r.join.copy() for r in left_refs if r.join is not None] or None)
    if left_where:
        left_stmt.set("where", exp.Where(this=exp.and_(*[t.copy() for t in left_where])))
    join_var = JOIN_VAR.format(len(refs) - 1)
    first_key = keys[0][1]
    right_terms = [t.copy() for t in right_only + right_where]
    right_terms.append(exp.In(this=first_key.copy(),
                              expressions=[exp.Placeholder(this=join_var)]))
    right_stmt = exp.Select(expressions=[c.copy() for c in right_cols]).from_(right.node.copy())
    right_stmt.set("where", exp.Where(this=exp.and_(*right_terms)))

    joined: Primitive = NestedLoopJoin(
        plan(left_stmt), plan(right_stmt), tuple(left_key_pos), tuple(right_key_pos),
        join_var, len(right_cols), outer,
    )
    slots = {canonical(c): i for i, c in enumerate(left_cols)}
    slots.update({canonical(c): len(left_cols) + i for i, c in enumerate(right_cols)})
    if gate_where:
        predicate = exp.and_(*[t.copy() for t in gate_where])
        joined = Filter(joined, compile_expr(predicate, slots), predicate.sql(dialect="mysql"))
    if needs_aggregation(stmt):
        return plan_aggregation(stmt, row_partials(joined, slots), refs[0].table.keyspace)
    order = stmt.args.get("order")
    if order is not None:
        joined = MemorySort(joined, tuple(
            SortKey(compile_expr(o.this, slots), bool(o.args.get("desc")),
                    bool(o.args.get("nulls_first")), o.this.sql(dialect="mysql"))
            for o in order.expressions))
    lim, off = stmt.args.get("limit"), stmt.args.get("offset")
    if lim is not None or off is not None:
        joined = Limit(joined, from_expression(lim.expression) if lim is not None else None,
                       from_expression(off.expression) if off is not None else None)
    names = tuple(e.alias if isinstance(e, exp.Alias) else
                  (e.name if isinstance(e, exp.Column) else e.sql(dialect="mysql"))
                  for e in stmt.expressions)
    columns = tuple(compile_expr(e.this if isinstance(e, exp.Alias) else e, slots)
                    for e in stmt.expressions)
    return Projection(joined, columns, names, tuple(e.sql(dialect="mysql")
                                                     for e in stmt.expressions))


def is_pushdown_opcode(op: Opcode) -> bool:
    return op in (Opcode.EQUAL_UNIQUE, Opcode.NONE)
