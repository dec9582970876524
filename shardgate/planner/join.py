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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from sqlglot import exp

from shardgate.engine.join import NestedLoopJoin, PulloutSubquery
from shardgate.engine.postprocess import Filter
from shardgate.engine.primitive import Primitive
from shardgate.errors import Unsupported
from shardgate.evalengine.evaluate import canonical, compile_expr
from shardgate.planner.finish import finish_at_gate
from shardgate.planner.merge import same_vindex
from shardgate.planner.routing import RouteChoice, choose, conjuncts
from shardgate.planner.select import row_wise_table
from shardgate.sql.labels import label
from shardgate.vschema import Table, TableType, VSchema

JOIN_VAR = "__sg_join{}"
SUBQUERY_VAR = "__sg_sq{}"
HAS_VALUES_VAR = "__sg_sq{}_has"

PlanFn = Callable[[exp.Expression], Primitive]


@dataclass(frozen=True)
class Pulled:
    """A pulled-out subquery: its plan, its values' variable, and its emptiness flag."""

    var: str
    plan: Primitive
    has_values: str | None = None
    #: select-list items (position, text as written) whose name holds bind variables
    labels: tuple[tuple[int, exp.Expr], ...] = ()


@dataclass(frozen=True)
class TableRef:
    alias: str
    table: Table
    node: exp.Table | exp.Subquery
    join: exp.Join | None  # None for the FROM table
    #: a row-wise derived table over ``table``: its WHERE, which also routes it
    inner_where: exp.Expr | None = None
    #: any other derived table (aggregates, joins, ...): planned on its own and
    #: joined at the gate; ``table`` is only the first table it reads
    opaque: bool = False


def pull_out_subqueries(stmt: exp.Select, plan: PlanFn) -> tuple[exp.Select, list[Pulled]]:
    """Replace uncorrelated ``x IN (SELECT ...)`` by list bind variables.

    A WHERE conjunct becomes ``x IN (:__sg_sqN)`` (which can route by ``x``);
    anywhere else, ``(:__sg_sqN_has = 1 AND x IN (:__sg_sqN))``, with the
    subquery's NULL kept, so NOT, OR and the select list see SQL's value.
    Returns the rewritten statement and the subqueries, in the order they run.
    """
    pulled: list[Pulled] = []
    # Only this statement's own IN terms: each subquery pulls out its own nested
    # ones when it is planned (visiting them here too made planning exponential).
    if not any(isinstance(n, exp.In) and n.args.get("query") for n in own_nodes(stmt)):
        return stmt, pulled
    stmt = stmt.copy()
    candidates = [n for n in own_nodes(stmt) if isinstance(n, exp.In) and n.args.get("query")]
    labels = keep_labels(stmt, candidates)
    for node in candidates:
        query = node.args.get("query")
        if query is None:
            continue
        inner = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(inner, exp.Select) or correlated(inner):
            continue
        var = SUBQUERY_VAR.format(len(pulled))
        member = exp.In(this=node.this.copy(), expressions=[exp.Placeholder(this=var)])
        if _filters_rows(node):
            pulled.append(Pulled(var, plan(inner)))
            node.replace(member)
            continue
        # Anywhere else (NOT, OR, the select list) IN's value matters, NULL
        # included: ``x IN (empty)`` is FALSE, ``2 IN (1, NULL)`` is NULL.
        has = HAS_VALUES_VAR.format(len(pulled))
        pulled.append(Pulled(var, plan(inner), has))
        node.replace(exp.Paren(this=exp.and_(
            exp.EQ(this=exp.Placeholder(this=has), expression=exp.Literal.number(1)), member)))
    if pulled and labels:  # the first runs outermost: it names the result's columns
        pulled[0] = replace(pulled[0], labels=labels)
    return stmt, pulled


def keep_labels(
    stmt: exp.Select, rewritten: Sequence[exp.Expr]
) -> tuple[tuple[int, exp.Expr], ...]:
    """Alias each unaliased select-list item containing a node of ``rewritten``
    by its text, in place, so the column keeps the name the database gives it
    (the expression as written), not that of its rewrite.

    Returns the items whose text holds bind variables, by position: the
    database names those with the values, known only at execution.
    """
    ids = {id(n) for n in rewritten}
    items = []
    bound: list[tuple[int, exp.Expr]] = []
    star = any(isinstance(e, exp.Star) or e.is_star for e in stmt.expressions)
    for i, item in enumerate(stmt.expressions):
        if not isinstance(item, exp.Alias) and any(id(n) in ids for n in item.walk()):
            if not star and item.find(exp.Placeholder) is not None:
                bound.append((i, item.copy()))
            item = exp.alias_(item, label(item), quoted=True, copy=False)
        items.append(item)
    stmt.set("expressions", items)
    return tuple(bound)


def _filters_rows(node: exp.Expr) -> bool:
    """Whether ``node`` is a conjunct of WHERE: only its truth decides, NULL is FALSE."""
    parent = node.parent
    while isinstance(parent, exp.And | exp.Paren):
        parent = parent.parent
    return isinstance(parent, exp.Where)


def own_nodes(stmt: exp.Expr) -> Iterator[exp.Expr]:
    """The nodes of ``stmt`` outside its subqueries, breadth first (as ``find_all``)."""
    queue: deque[exp.Expr] = deque([stmt])
    while queue:
        node = queue.popleft()
        yield node
        for child in node.iter_expressions():
            if not isinstance(child, exp.Query | exp.Subquery):
                queue.append(child)


def wrap_pulled(outer: Primitive, pulled: list[Pulled], keyspaces: tuple[str, ...]) -> Primitive:
    """The outer plan (over ``keyspaces``) behind the pulled-out subqueries."""
    for p in reversed(pulled):
        outer = PulloutSubquery(p.plan, outer, p.var, p.has_values, keyspaces, p.labels)
    return outer


def correlated(inner: exp.Select) -> bool:
    """Whether ``inner`` names a table alias it does not define (an outer one)."""
    aliases = {(t.alias or t.name).lower() for t in inner.find_all(exp.Table)}
    return any(c.table and c.table.lower() not in aliases for c in inner.find_all(exp.Column))


def table_refs(stmt: exp.Select, vschema: VSchema, default_ks: str | None) -> list[TableRef]:
    """The FROM table and each joined table, in order."""
    frm = stmt.args.get("from_")
    if frm is None:
        raise Unsupported("joins over derived tables are not supported across shards")
    nodes: list[tuple[exp.Expr, exp.Join | None]] = [(frm.this, None)]
    nodes.extend((j.this, j) for j in stmt.args.get("joins") or [])
    refs = []
    for node, join in nodes:
        if isinstance(node, exp.Subquery):
            refs.append(_derived_ref(node, join, vschema, default_ks))
            continue
        if not isinstance(node, exp.Table):
            raise Unsupported("joins with derived tables are not supported across shards")
        table = vschema.find_table(node.name, node.db or None, default_ks)
        refs.append(TableRef((node.alias or node.name).lower(), table, node, join))
    return refs


def _derived_ref(
    node: exp.Subquery, join: exp.Join | None, vschema: VSchema, default_ks: str | None
) -> TableRef:
    """A row-wise derived table over one table, joined like that table.

    Its output columns named like a vindex column of the table must be that
    column, so routing and co-location read them as the table's own.
    """
    inner = node.this
    refused = Unsupported(
        "joins with derived tables across shards need a row-wise derived table over one "
        "table (no aggregates, DISTINCT, ORDER BY, LIMIT, joins or subqueries)"
    )
    base = row_wise_table(inner)
    if not node.alias:
        raise refused
    if base is None:
        first = next(iter(inner.find_all(exp.Table)), None) if isinstance(
            inner, exp.Select) else None
        if first is None or not first.name:
            raise refused
        # Planned on its own (any SELECT the gate can answer) and joined at the gate.
        stand_in = vschema.find_table(first.name, first.db or None, default_ks)
        return TableRef(node.alias.lower(), stand_in, node, join, opaque=True)
    table = vschema.find_table(base.name, base.db or None, default_ks)
    vindex_columns = {c for cv in table.column_vindexes for c in cv.columns}
    for item in inner.expressions:
        name = item.alias_or_name.lower()
        source = item.this if isinstance(item, exp.Alias) else item
        if name in vindex_columns and not (
            isinstance(source, exp.Column) and source.name.lower() == name
        ):
            raise Unsupported(
                f"derived column {name!r} is named like a vindex column of {table.name} "
                "but is not that column: rename it to join across shards"
            )
    return TableRef(node.alias.lower(), table, node, join, inner.args.get("where"))


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


def colocated(refs: list[TableRef], where: exp.Expr | None) -> bool:
    """True when all sharded tables are joined pairwise on their primary vindex."""
    if any(r.opaque for r in refs):
        return False  # a derived table planned on its own: joined at the gate
    for i, r in enumerate(refs):
        side = (r.join.side or "").upper() if r.join is not None else ""
        if side in ("RIGHT", "FULL"):
            return False
        # A preserved side made of reference tables only would emit its unmatched
        # rows once per shard: such a LEFT JOIN runs at the gate.
        if side == "LEFT" and r.table.type != TableType.REFERENCE and \
                all(p.table.type == TableType.REFERENCE for p in refs[:i]):
            return False
    sharded = [r for r in refs if r.table.type != TableType.REFERENCE]
    if len(sharded) <= 1:
        return True
    pins = {r.table.pinned for r in sharded}
    if len(pins) == 1 and None not in pins:  # tables pinned to one keyspace id: one shard
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
        if not same_vindex(lt, rt):
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
        if r.table.type == TableType.REFERENCE:
            continue
        if r.join is not None and (r.join.side or "").upper() == "LEFT":
            continue  # the optional side: its WHERE terms (IS NULL) do not filter rows
        choice = choose(r.table, where, {r.alias})  # an aliased table: by its alias only
        if r.inner_where is not None and isinstance(r.node, exp.Subquery):
            base = r.node.this.args["from_"].this
            inside = choose(r.table, r.inner_where,
                            {"", r.table.name.lower(), (base.alias or base.name).lower()})
            if inside.opcode.rank < choice.opcode.rank:
                choice = inside
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
        if e.find_ancestor(exp.Select) is not stmt:
            continue  # inside a derived table, which its own plan resolves
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
    all_aliases = left_aliases | {right.alias}
    join = right.join
    assert join is not None
    outer = join.side.upper() == "LEFT" if join.side else False
    if join.side and not outer:
        raise Unsupported(f"{join.side} JOIN across shards is not supported")

    # Join keys: equalities between the right table and the left tables in ON.
    on_terms = list(conjuncts(join.args.get("on")))
    keys: list[tuple[exp.Column, exp.Column]] = []
    right_only: list[exp.Expr] = []
    mixed_on: list[exp.Expr] = []
    left_on: list[exp.Expr] = []
    for t in on_terms:
        sides = _sides(t, all_aliases)
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
            left_on.append(t)  # a left-only ON term of an inner join filters like WHERE
            continue
        if not outer:
            mixed_on.append(t)  # an inner join's ON term filters like WHERE: at the gate
            continue
        raise Unsupported(
            f"join condition {t.sql(dialect='mysql')!r} cannot be split across shards: "
            "use equalities between columns of the two tables"
        )
    # A LEFT JOIN without keys has only right-side ON terms here (others were refused):
    # each left row meets every right row that passes them, or NULLs if none does.

    left_where: list[exp.Expr] = list(left_on)
    right_where: list[exp.Expr] = []
    gate_where: list[exp.Expr] = []  # both sides, or the optional side: after the join
    for t in conjuncts(stmt.args.get("where")):
        sides = _sides(t, all_aliases)
        if sides <= left_aliases:
            left_where.append(t)
        elif sides <= {right.alias} and not outer:
            right_where.append(t)
        elif not outer and not keys and _join_key(t, right.alias, left_aliases) is not None:
            keys.append(_join_key(t, right.alias, left_aliases))  # type: ignore[arg-type]
        else:
            gate_where.append(t)
    gate_where = mixed_on + gate_where

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
    left_items: list[exp.Expr] = [c.copy() for c in left_cols] or [exp.Literal.number(1)]
    left_stmt = exp.Select(expressions=left_items)
    left_stmt.set("from_", stmt.args["from_"].copy())
    left_stmt.set("joins", [r.join.copy() for r in left_refs if r.join is not None] or None)
    if left_where:
        left_stmt.set("where", exp.Where(this=exp.and_(*[t.copy() for t in left_where])))
    join_var = JOIN_VAR.format(len(refs) - 1)
    right_terms = [t.copy() for t in right_only + right_where]
    # Without keys (a cross join) the right side runs once, unfiltered; so does a
    # derived table planned on its own (the gate cannot filter its rows by a list).
    if keys and not right.opaque:
        right_terms.append(exp.In(this=keys[0][1].copy(),
                                  expressions=[exp.Placeholder(this=join_var)]))
    # A cross join that reads no right column still needs one per right row.
    right_items: list[exp.Expr] = [c.copy() for c in right_cols] or [exp.Literal.number(1)]
    right_stmt = exp.Select(expressions=right_items).from_(right.node.copy())
    if right_terms:
        right_stmt.set("where", exp.Where(this=exp.and_(*right_terms)))

    # Values computed at the gate follow the database of the first table's keyspace.
    keyspace = refs[0].table.keyspace
    joined: Primitive = NestedLoopJoin(
        plan(left_stmt), plan(right_stmt), tuple(left_key_pos), tuple(right_key_pos),
        join_var, len(right_items), outer, keyspace=keyspace, right_filtered=not right.opaque,
    )
    slots = {canonical(c): i for i, c in enumerate(left_cols)}
    slots.update({canonical(c): len(left_items) + i for i, c in enumerate(right_cols)})
    if gate_where:
        predicate = exp.and_(*[t.copy() for t in gate_where])
        joined = Filter(joined, compile_expr(predicate, slots), predicate.sql(dialect="mysql"),
                        keyspace=keyspace)
    return finish_at_gate(stmt, joined, slots, keyspace)


def _sides(term: exp.Expr, aliases: set[str]) -> set[str]:
    """The join's tables a term names (not the tables of a subquery inside it)."""
    scope = term.find_ancestor(exp.Select)
    return {c.table.lower() for c in term.find_all(exp.Column)
            if c.find_ancestor(exp.Select) is scope or c.table.lower() in aliases}


def _join_key(
    term: exp.Expr, right: str, left: set[str]
) -> tuple[exp.Column, exp.Column] | None:
    """``left.a = right.b`` as (left column, right column), for a join given in WHERE."""
    if not (isinstance(term, exp.EQ) and isinstance(term.left, exp.Column)
            and isinstance(term.right, exp.Column)):
        return None
    a, b = term.left, term.right
    if a.table.lower() == right and b.table.lower() in left:
        a, b = b, a
    if b.table.lower() == right and a.table.lower() in left:
        return a, b
    return None
