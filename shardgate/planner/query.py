"""SELECT and UNION planning: which route, or which routes merged at the gate.

A statement of one unsharded keyspace is one route; otherwise the planner tries,
in order: one route for a statement of several scopes (every table on one shard,
or a UNION each shard answers its share of), a UNION's parts apart, subqueries
pulled out or run where their outer rows are, derived tables, a join at the gate
(nested loop) and, for one sharded table, the route its WHERE chooses
(:func:`~shardgate.planner.routing.choose`), merged by
:func:`~shardgate.planner.select.plan_multi_shard` when it reaches several shards.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from sqlglot import exp

from shardgate.engine.concat import Concatenate
from shardgate.engine.cursor import ShardQuery
from shardgate.engine.postprocess import Aggregate
from shardgate.engine.primitive import Opcode, OrderKey, Primitive
from shardgate.engine.probe import TypeChecked
from shardgate.engine.route import Route
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.keys import KeyRange
from shardgate.planner.columns import (
    declare_integer_types,
    expand_stars,
    name_star_positions,
    qualify_columns,
)
from shardgate.planner.derived import plan_derived_at_gate
from shardgate.planner.finish import finish_at_gate
from shardgate.planner.join import (
    best_route,
    colocated,
    plan_nested_loop,
    pull_out_subqueries,
    table_refs,
    wrap_pulled,
)
from shardgate.planner.merge import (
    colocated_subqueries,
    is_dual,
    only_derived_tables,
    single_shard,
)
from shardgate.planner.pullout import pull_out_values, wrap_values
from shardgate.planner.routing import RouteChoice, choose, extract_keyrange
from shardgate.planner.select import (
    ORDERING,
    RouteTarget,
    find_selected,
    needs_aggregation,
    plan_multi_shard,
    row_wise_table,
)
from shardgate.planner.semijoin import plan_semijoins
from shardgate.planner.union import (
    drop_dual,
    flat_arms,
    is_dual_select,
    ordering_tail,
    output_names,
    union_parts,
    union_tail,
    without_dual_joins,
)
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.sql.rewrite import swapped, transform
from shardgate.vschema import Table, TableType, VSchema


@dataclass(frozen=True)
class Ref:
    """A table a statement names, and the (lowercase) name it is known by there."""

    table: Table
    alias: str


def refs_of(stmt: exp.Expression, vschema: VSchema, default_keyspace: str | None) -> list[Ref]:
    """The VSchema tables ``stmt`` names at any depth (CTE names and ``dual`` left out)."""
    refs = []
    nodes = list(stmt.find_all(exp.CTE, exp.Table))  # one walk (long IN lists)
    ctes = {c.alias_or_name.lower() for c in nodes if isinstance(c, exp.CTE)}
    for t in nodes:
        if not isinstance(t, exp.Table) or not t.name or t.name.lower() in ctes or is_dual(t):
            continue
        table = vschema.find_table(t.name, t.db or None, default_keyspace)
        refs.append(Ref(table, (t.alias or t.name).lower()))
    return refs


def _only(keyspaces: set[str]) -> str | None:
    """The one keyspace of the set, if it has one."""
    return next(iter(keyspaces)) if len(keyspaces) == 1 else None


def single_keyspace(refs: list[Ref], what: str) -> str:
    """The one keyspace of ``refs``; refused when they span several."""
    keyspaces = {r.table.keyspace for r in refs}
    if len(keyspaces) > 1:
        raise Unsupported(
            f"{what} spans keyspaces {sorted(keyspaces)}: cross-keyspace statements "
            "cannot be routed as one query; split it"
        )
    return keyspaces.pop()


def plan_select(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Primitive:
    """Plan a SELECT or UNION (see the module docstring for the order tried)."""
    # FROM dual (alone or joined) means no table: the shards' dialects all take a SELECT
    # without FROM, and a quoted `dual` would be a table name on MySQL.
    stmt = cast(exp.Expression, drop_dual(without_dual_joins(stmt)))
    if isinstance(stmt, exp.Union):
        stmt = flat_arms(stmt)  # (SELECT ...) UNION ...: arms SQLite parses too
    refs = refs_of(stmt, vschema, default_ks)
    if not refs:
        return _no_table_route(stmt, vschema, default_ks)
    keyspaces = {r.table.keyspace for r in refs}
    if len(keyspaces) == 1:
        ks = vschema.keyspace(next(iter(keyspaces)))
        if not ks.sharded:  # one unsharded database takes anything
            return Route(Opcode.UNSHARDED, ks.name, False, ShardQuery(strip_qualifiers(stmt)),
                         table=refs[0].table.name)
    nested = any(n is not stmt for n in stmt.find_all(exp.Select))
    if len(keyspaces) == 1 and (nested or not isinstance(stmt, exp.Select)) and \
            not stmt.find(exp.CTE):
        merged = _merged_route(stmt, refs, vschema, default_ks)
        if merged is not None:
            return merged
    split = union_tail(stmt) if isinstance(stmt, exp.Union) else None
    if split is not None and len(keyspaces) == 1:
        bare, tail = split
        columns = {e.name: i for i, e in enumerate(tail.expressions)}
        return finish_at_gate(tail, plan_select(bare, vschema, default_ks), columns,
                              next(iter(keyspaces)))
    if isinstance(stmt, exp.Union):
        return _concatenated(stmt, vschema, default_ks, _only(keyspaces) or "")
    if isinstance(stmt, exp.Subquery) and len(keyspaces) == 1:
        return _ordered_at_gate(stmt.this, {a: stmt.args.get(a) for a in ORDERING},
                                vschema, default_ks)
    if not isinstance(stmt, exp.Select):
        raise Unsupported("this statement cannot run across shards: send a SELECT or UNION")

    def plan(sub: exp.Expression) -> Primitive:
        return plan_select(sub, vschema, default_ks)

    outer, pulled = pull_out_subqueries(stmt, plan)
    if pulled:
        return wrap_pulled(plan(outer), pulled, tuple(sorted(keyspaces)))
    outer, values = pull_out_values(stmt, plan)
    if values:
        return wrap_values(plan(outer), values)
    derived = _derived_select(stmt, vschema, default_ks) if nested else None
    if derived is None and nested:
        # Values computed at the gate follow the first table's keyspace.
        gate_ks = next(iter(keyspaces)) if len(keyspaces) == 1 else refs[0].table.keyspace
        derived = plan_derived_at_gate(stmt, plan, gate_ks)
    if derived is not None:
        return derived
    trefs = table_refs(stmt, vschema, default_ks) if nested else []
    pushdown = len(keyspaces) == 1 and colocated(trefs, stmt.args.get("where"))
    # A gate-side join plans each side alone: a subquery naming one side goes
    # with it (and must be answerable there); one naming both sides is refused.
    gate_join = len(trefs) > 1 and not pushdown
    if nested and not only_derived_tables(stmt) and not gate_join and not (
        pushdown and colocated_subqueries(stmt, vschema, default_ks)
    ):
        # correlated subqueries answered at the gate (semi-joins), when the shards cannot
        semi = plan_semijoins(stmt, trefs, plan, trefs[0].table.keyspace,
                              len(keyspaces) == 1)
        if semi is not None:
            return semi
        raise Unsupported(
            "this subquery cannot be routed across shards: only uncorrelated "
            "'col IN (SELECT ...)' subqueries, subqueries joined to the outer table on "
            "its primary vindex, subqueries that target the outer query's one shard, "
            "or any subquery within one unsharded keyspace are"
        )
    if nested:  # the subqueries run where their outer rows are: route by the outer tables
        refs = [Ref(t.table, t.alias) for t in trefs]
    else:
        trefs = table_refs(stmt, vschema, default_ks)
    if len(keyspaces) > 1 or not colocated(trefs, stmt.args.get("where")):
        if len(trefs) < 2:
            raise Unsupported("this query cannot be routed across keyspaces")
        same_shard = single_shard(stmt, vschema, default_ks) if len(keyspaces) == 1 else None
        if same_shard is not None:  # every table pinned to one shard: join there
            return route_for(same_shard, trefs[0].table.keyspace, strip_qualifiers(stmt),
                          trefs[0].table.name)
        resolved = qualify_columns(expand_stars(stmt, trefs, vschema), trefs, vschema)
        if resolved is not stmt:
            stmt, trefs = resolved, table_refs(resolved, vschema, default_ks)
            # qualified, a term may pin every table to one shard
            same_shard = single_shard(stmt, vschema, default_ks) if len(keyspaces) == 1 \
                else None
            if same_shard is not None:
                return route_for(same_shard, trefs[0].table.keyspace, strip_qualifiers(stmt),
                                 trefs[0].table.name)
        joined = plan_nested_loop(declare_integer_types(stmt, trefs, vschema), trefs, plan)
        # one keyspace: every shard holds every table, so one can type-check the join
        one_ks = _only(keyspaces)
        return TypeChecked(joined, one_ks, stmt) if one_ks is not None else joined
    ks_name = next(iter(keyspaces))
    sharded = [r for r in refs if r.table.type != TableType.REFERENCE]
    if not sharded:
        return Route(Opcode.REFERENCE, ks_name, True, ShardQuery(strip_qualifiers(stmt)),
                     table=refs[0].table.name)
    if len(sharded) > 1:
        choice, ref = best_route(trefs, stmt)
        table_name = ref.table.name
    else:
        only = sharded[0]
        names = {only.alias}  # an aliased table's columns are named by its alias only
        if len(refs) == 1:
            names.add("")
        stmt, key_range = extract_keyrange(stmt)
        choice = choose(only.table, stmt.args.get("where"), names)
        if key_range is not None:
            return _keyrange_select(stmt, key_range, only.table, choice, len(refs))
        table_name = only.table.name
    return _routed_select(stmt, choice, ks_name, table_name,
                          lambda s: declare_integer_types(name_star_positions(s, trefs, vschema),
                                                          trefs, vschema))


def _routed_select(stmt: exp.Select, choice: RouteChoice, ks_name: str, table_name: str,
                   merged: Callable[[exp.Select], exp.Select] | None = None) -> Primitive:
    """``stmt`` routed by ``choice``: one route when one shard answers it all, else
    the shards' routes merged at the gate (:func:`plan_multi_shard`), ``stmt``
    rewritten by ``merged`` first (``ORDER BY`` positions under ``SELECT *`` named)."""
    single = choice.opcode in (Opcode.EQUAL_UNIQUE, Opcode.UNSHARDED) or (
        choice.opcode is Opcode.NONE and not needs_aggregation(stmt)
    )
    if single:
        return route_for(choice, ks_name, strip_qualifiers(stmt), table_name)
    if merged is not None:
        stmt = merged(stmt)
    split_tree, in_var = split_in(stmt, choice)
    assert isinstance(split_tree, exp.Select)
    target = RouteTarget(choice.opcode, ks_name, table_name, choice.vindex, choice.values,
                         in_var, choice.columns)
    return plan_multi_shard(stmt, split_tree, target)


def _derived_select(
    stmt: exp.Select, vschema: VSchema, default_ks: str | None
) -> Primitive | None:
    """``SELECT ... FROM (SELECT ... FROM t WHERE ...) AS d``, one sharded table inside.

    When the derived table is row-wise (no aggregates, DISTINCT, ORDER BY or
    LIMIT), each shard's derived rows are its share of all derived rows, so the
    outer query is planned like a select over ``t``: routed by the inner WHERE,
    with the outer ORDER BY, LIMIT and aggregates merged at the gate.
    """
    frm = stmt.args.get("from_")
    if frm is None or stmt.args.get("joins") or not isinstance(frm.this, exp.Subquery):
        return None
    inner = frm.this.this
    node = row_wise_table(inner)
    if node is None or any(n is not stmt and n is not inner for n in stmt.find_all(exp.Select)):
        return None
    table = vschema.find_table(node.name, node.db or None, default_ks)
    if table.type == TableType.REFERENCE:
        return None
    names = {(node.alias or node.name).lower(), table.name.lower(), ""}
    choice = choose(table, inner.args.get("where"), names)
    return _routed_select(stmt, choice, table.keyspace, table.name)


def _merged_route(
    stmt: exp.Expression, refs: list[Ref], vschema: VSchema, default_ks: str | None
) -> Primitive | None:
    """One route for a statement of several scopes (UNION, derived tables, subqueries).

    Either every sharded table targets the same shard; or (UNION ALL) every
    part is a row-wise select of one sharded table, so each shard's share of
    the union is the union of its shares; or (UNION, all distinct) every part
    is row-wise: the shards run the UNION and the gate removes the duplicates
    between shards.
    """
    ks_name = refs[0].table.keyspace
    tree = strip_qualifiers(stmt)
    if all(r.table.type == TableType.REFERENCE for r in refs):
        return Route(Opcode.REFERENCE, ks_name, True, ShardQuery(tree), table=refs[0].table.name)
    choice = single_shard(stmt, vschema, default_ks)
    if choice is not None:
        return route_for(choice, ks_name, tree, refs[0].table.name)
    if not isinstance(stmt, exp.Union):
        return None
    parts = union_parts(stmt, distinct=False)
    if parts is not None and all(single_shard(p, vschema, default_ks) for p in parts):
        return _concatenated(stmt, vschema, default_ks, ks_name)  # each part on its one shard
    if parts is not None and not any(r.table.type == TableType.REFERENCE for r in refs) and all(
        not p.args.get("joins") and not is_dual_select(p) for p in parts
    ):
        return Route(Opcode.SCATTER, ks_name, True, ShardQuery(_flat_union(parts, False)),
                     table=refs[0].table.name)
    parts = union_parts(stmt, distinct=True)
    if parts is None or any(p.args.get("joins") for p in parts) or any(
        isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
        for e in parts[0].expressions
    ):
        return None  # a join in a part could match rows of different shards
    route = Route(Opcode.SCATTER, ks_name, True, ShardQuery(_flat_union(parts, True)),
                  table=refs[0].table.name)
    return Aggregate(route, tuple(range(len(parts[0].expressions))), (), keyspace=ks_name)


def _concatenated(
    stmt: exp.Union, vschema: VSchema, default_ks: str | None, keyspace: str
) -> Primitive:
    """A UNION whose parts are planned apart: concatenated, UNION's duplicates removed
    as ``keyspace``'s database compares values ("": the gate's MySQL semantics, for
    parts in several keyspaces)."""
    width = output_names(stmt)
    if width is None:
        raise Unsupported("a UNION across shards needs named columns, not *, in its first part")
    left, right = stmt.left, stmt.right
    assert isinstance(left, exp.Expression) and isinstance(right, exp.Expression)
    both = Concatenate((plan_select(left, vschema, default_ks),
                        plan_select(right, vschema, default_ks)))
    if not stmt.args.get("distinct"):
        return both
    return Aggregate(both, tuple(range(len(width))), (), keyspace=keyspace)


def _flat_union(parts: list[exp.Select], distinct: bool) -> exp.Expr:
    """UNION [ALL] is associative: flat, without the parentheses SQLite does not accept."""
    flat = [strip_qualifiers(p).transform(drop_dual) for p in parts]
    tree: exp.Expr = flat[0]
    for part in flat[1:]:
        tree = exp.union(tree, part, distinct=distinct)
    return tree


def _keyrange_select(
    stmt: exp.Select, key_range: KeyRange, table: Table, choice: RouteChoice, n_tables: int
) -> Route:
    """A select restricted to a key range: its shards, and its rows by keyspace id."""
    if n_tables > 1 or needs_aggregation(stmt) or stmt.args.get("limit") is not None:
        raise Unsupported(
            "keyrange(...) works on single-table selects without aggregates or LIMIT "
            "(rows are filtered by keyspace id after the shards answer)"
        )
    primary = table.primary
    if primary is None:
        raise Unsupported(f"keyrange(...) on {table.qualified}, which has no primary vindex "
                          "(a pinned table), is not supported")
    tree = strip_qualifiers(stmt)
    assert isinstance(tree, exp.Select)
    tree = tree.copy()
    star = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
               for e in tree.expressions)
    selected = {e.name.lower() for e in tree.expressions if isinstance(e, exp.Column)}
    ksid_columns: list[str] = []
    hidden = 0
    for col in primary.columns:
        if star or col in selected:
            ksid_columns.append(col)
            continue
        alias = f"__sg_k{hidden}"
        tree.append("expressions", exp.alias_(exp.column(col), alias))
        ksid_columns.append(alias)
        hidden += 1
    order_items = tree.args["order"].expressions if tree.args.get("order") else []
    keys: list[OrderKey] = []
    for o in order_items:
        if star and isinstance(o.this, exp.Column):
            name = o.this.name
        else:
            index = find_selected(tree, o.this)
            if index is None:
                raise Unsupported("ORDER BY with keyrange(...) needs selected columns")
            name = tree.expressions[index].alias_or_name
        keys.append(OrderKey(name, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
    order = tuple(keys)
    return Route(choice.opcode, table.keyspace, True, ShardQuery(tree), table=table.name,
                 vindex=choice.vindex, values=choice.values, order_by=order,
                 key_range=key_range, ksid_columns=tuple(ksid_columns),
                 ksid_vindex=primary.vindex, hidden=hidden, columns=choice.columns)


def route_for(choice: RouteChoice, ks: str, tree: exp.Expr, table: str,
           write: bool = False, in_var: str | None = None) -> Route:
    """The route ``choice`` gives ``tree`` over ``table`` of keyspace ``ks``."""
    return Route(choice.opcode, ks, True, ShardQuery(tree), table=table,
                 vindex=choice.vindex, values=choice.values, write=write, in_var=in_var,
                 columns=choice.columns)


IN_VAR = "__sg_vals"


def split_in(tree: exp.Expression, choice: RouteChoice) -> tuple[exp.Expr, str | None]:
    """Rewrite the IN term that chose the route to read each shard's own values.

    ``id IN (1, 2, 3)`` (or ``id = 1 OR id = 2``) becomes ``id IN (:__sg_vals)``;
    the route binds ``__sg_vals`` per shard to the values mapping there.
    """
    term = choice.term
    if choice.opcode is not Opcode.IN or term is None:
        return strip_qualifiers(tree), None
    if term.root() is tree:
        # Copy the statement with the short term in place of the long one (a
        # 10,000-value list is then never copied).
        with swapped(term, _in_var_term(term)):
            return strip_qualifiers(tree), IN_VAR
    term.meta["sg_in"] = True
    try:
        def swap(node: exp.Expr) -> exp.Expr:
            return _in_var_term(node) if node.meta.get("sg_in") else node

        rewritten = transform(strip_qualifiers(tree), swap, copy=False)
    finally:
        term.meta.pop("sg_in", None)
    return rewritten, IN_VAR


def _in_var_term(term: exp.Expr) -> exp.In:
    """``col IN (:__sg_vals)`` for the IN list or OR of equalities ``term`` on ``col``."""
    col = term.this if isinstance(term, exp.In) else term.find(exp.Column)
    assert col is not None
    return exp.In(this=col.copy(), expressions=[exp.Placeholder(this=IN_VAR)])


def _no_table_route(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Route:
    ks_name = default_ks if default_ks in vschema.keyspaces else None
    if ks_name is None:
        unsharded = [k for k in vschema.keyspaces.values() if not k.sharded]
        pool = unsharded or list(vschema.keyspaces.values())
        if not pool:
            raise InvalidArgument("no keyspace to run this statement in")
        ks_name = pool[0].name
    ks = vschema.keyspace(ks_name)
    opcode = Opcode.REFERENCE if ks.sharded else Opcode.UNSHARDED
    return Route(opcode, ks_name, ks.sharded,
                 ShardQuery(strip_qualifiers(stmt).transform(drop_dual)))


def _ordered_at_gate(inner: exp.Expr, ordering: dict[str, exp.Expr | None],
                     vschema: VSchema, default_ks: str | None) -> Primitive:
    """``(<query>) ORDER BY ... LIMIT ...``: the query planned on its own, its rows
    sorted and cut at the gate (by its output columns)."""
    names = output_names(inner)
    if names is None or not isinstance(inner, exp.Query) or \
            not isinstance(inner, exp.Expression):
        raise Unsupported("ORDER BY / LIMIT outside parentheses across shards needs the "
                          "inner query's columns named (no *) and distinct")
    refs = refs_of(inner, vschema, default_ks)
    keyspace = refs[0].table.keyspace if refs else ""
    tail = ordering_tail(names, ordering)
    return finish_at_gate(tail, plan_select(inner, vschema, default_ks),
                          {n: i for i, n in enumerate(names)}, keyspace)


def plan_parenthesized(
    stmt: exp.Subquery, vschema: VSchema, default_ks: str | None
) -> Primitive:
    """``(SELECT ...) ORDER BY ... LIMIT ...``: the ORDER BY and LIMIT apply to the select."""
    inner = stmt.this
    while isinstance(inner, exp.Subquery) and not any(
        inner.args.get(a) is not None for a in ORDERING
    ):
        inner = inner.this
    if stmt.alias or not isinstance(inner, exp.Query):
        raise Unsupported("a parenthesized statement must be a SELECT or UNION")
    outer_args = {a: stmt.args.get(a) for a in ORDERING}
    if isinstance(inner, exp.Select) and any(v is not None for v in outer_args.values()):
        if any(inner.args.get(a) is not None for a in ("limit", "offset")):
            # (SELECT ... ORDER BY x LIMIT 3) ORDER BY y: the inner rows, sorted again
            return _ordered_at_gate(inner, outer_args, vschema, default_ks)
        inner = inner.copy()  # an inner ORDER BY without LIMIT is replaced by the outer one
        if outer_args.get("order") is not None:
            inner.set("order", None)
        for arg, value in outer_args.items():
            if value is not None:
                inner.set(arg, value.copy())
        return plan_select(inner, vschema, default_ks)
    if any(v is not None for v in outer_args.values()):
        return plan_select(stmt, vschema, default_ks)
    assert isinstance(inner, exp.Expression)
    return plan_select(inner, vschema, default_ks)
