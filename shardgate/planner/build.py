"""Statements to plans. Pure: no I/O, same input -> same plan.

What is refused (never mis-routed), among others: DML spanning keyspaces;
subqueries that can be neither pulled out, merged into one route, nor run
where their outer rows are; DML with joins or subqueries on a sharded keyspace
other than a co-located multi-table DELETE/UPDATE; UPDATE of a primary vindex
column (or of a lookup vindex column to a non-constant value); multi-shard DML
with LIMIT; INSERT ... SELECT into sharded tables without a column list; ON DUPLICATE KEY UPDATE of
a vindex column or into an owner of lookup vindexes. Each refusal's message
says what is supported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sqlglot import exp

from shardgate.engine.concat import Concatenate
from shardgate.engine.cursor import ShardQuery
from shardgate.engine.ddl import DDL
from shardgate.engine.dml import LookupChange, LookupDML
from shardgate.engine.explain import Explain
from shardgate.engine.insert import Insert, OwnedLookup
from shardgate.engine.insert_select import InsertSelect
from shardgate.engine.plan import Plan
from shardgate.engine.postprocess import Aggregate
from shardgate.engine.primitive import Opcode, OrderKey, Primitive
from shardgate.engine.probe import TypeChecked
from shardgate.engine.readswitch import ReadSwitch
from shardgate.engine.route import Route
from shardgate.engine.scalar import ScalarSubqueries
from shardgate.errors import InvalidArgument, ShardgateError, Unsupported
from shardgate.evalengine.values import SQLExpr, Value, from_expression
from shardgate.keys import KeyRange
from shardgate.planner.columns import expand_stars
from shardgate.planner.derived import plan_derived_at_gate
from shardgate.planner.dml_join import join_dml_as_exists
from shardgate.planner.finish import finish_at_gate
from shardgate.planner.insert import on_duplicate as on_duplicate_assignments
from shardgate.planner.insert import without_defaults
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
from shardgate.planner.routing import RouteChoice, choose, extract_keyrange, pinned_choice
from shardgate.planner.rules import apply_routing_rules
from shardgate.planner.select import (
    ORDERING,
    RouteTarget,
    find_selected,
    needs_aggregation,
    plan_multi_shard,
    row_wise_table,
)
from shardgate.planner.target import parse_target, statement_target, targeted_route
from shardgate.planner.union import (
    drop_dual,
    is_dual_select,
    output_names,
    union_parts,
    union_tail,
    without_dual_joins,
)
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.sql.rewrite import swapped, transform
from shardgate.sql.statements import StatementType
from shardgate.vindexes import Lookup
from shardgate.vindexes.consistent_lookup import ConsistentLookupBase
from shardgate.vindexes.lookup import LookupBase
from shardgate.vschema import ColumnVindex, Table, VSchema


@dataclass(frozen=True)
class _Ref:
    table: Table
    alias: str


def build_plan(
    stmt: exp.Expr, sql: str, vschema: VSchema, default_keyspace: str | None
) -> Plan:
    """Plan one parsed statement."""
    builder = _BUILDERS.get(type(stmt))
    if builder is None:
        raise Unsupported(
            f"statement type {stmt.key.upper()} is not supported by the gate: "
            "send SELECT, INSERT, UPDATE, DELETE or DDL"
        )
    kind, fn = builder
    _refuse_reserved_binds(stmt)
    if isinstance(stmt, _TARGETABLE):
        target = statement_target(stmt) or parse_target(default_keyspace)
        if target is not None:
            return Plan(kind, sql, targeted_route(stmt, vschema, target), normalize(stmt))
    routed = stmt if kind == "DDL" else apply_routing_rules(stmt, vschema, default_keyspace)
    prim = fn(routed, vschema, default_keyspace)
    if kind == "SELECT" and vschema.read_routing_rules:
        # reads outside transactions may route elsewhere (MoveTables' read switch)
        read = apply_routing_rules(stmt, vschema, default_keyspace, reads=True)
        if read.sql() != routed.sql():
            prim = ReadSwitch(fn(read, vschema, default_keyspace), prim)
    return Plan(kind, sql, prim, normalize(stmt))


_TARGETABLE = (exp.Select, exp.Union, exp.Subquery, exp.Insert, exp.Update, exp.Delete)


#: the prefix of the gate's own bind variables and hidden column aliases
RESERVED_PREFIX = "__sg_"


def _refuse_reserved_binds(stmt: exp.Expr) -> None:
    """Refuse user bind variables named like the gate's internal ones (``:__sg_vals``)."""
    for node in stmt.find_all(exp.Placeholder):
        if node.name.lower().startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"bind variable :{node.name} uses the prefix {RESERVED_PREFIX!r} reserved for "
                "the gate's own bind variables: rename it"
            )


def normalize(stmt: exp.Expr) -> str:
    """The statement with every literal and bind variable replaced by ``?`` (statistics
    group by it: ``id = 1``, ``id = :id`` and the MySQL listener's ``id = :_l0`` alike).

    Long IN lists of literals only are set aside while the statement is copied
    and generated, and written back as text: a 10,000-value list costs a join
    of strings, not 10,000 copied and generated nodes.
    """
    def lit(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Literal | exp.Placeholder):
            return exp.Placeholder()
        return node

    aside: list[tuple[exp.In, list[exp.Expr]]] = []
    try:
        for node in stmt.find_all(exp.In):
            items = node.expressions
            if len(items) > _ASIDE_MIN and all(type(x) is exp.Literal for x in items):
                aside.append((node, items))
                node.set("expressions", [exp.Var(this=_ASIDE.format(len(aside) - 1))])
        text = transform(stmt, lit).sql(dialect="mysql", copy=False)  # (a copy already)
    finally:
        for node, items in aside:
            node.set("expressions", items)
    for i, (_node, items) in enumerate(aside):
        text = text.replace(_ASIDE.format(i), ", ".join(["?"] * len(items)), 1)
    return text


_ASIDE = "\x00sgn{}\x00"
_ASIDE_MIN = 16


def _plan_explain(stmt: exp.Describe, vschema: VSchema, default_ks: str | None) -> Primitive:
    inner = stmt.this
    if not isinstance(inner, exp.Query | exp.Insert | exp.Update | exp.Delete):
        raise Unsupported("EXPLAIN takes a SELECT, INSERT, UPDATE or DELETE")
    built = build_plan(inner, inner.sql(dialect="mysql"), vschema, default_ks)
    return Explain(built.describe(), built.instructions)


def _refs(stmt: exp.Expression, vschema: VSchema, default_keyspace: str | None) -> list[_Ref]:
    refs = []
    nodes = list(stmt.find_all(exp.CTE, exp.Table))  # one walk (long IN lists)
    ctes = {c.alias_or_name.lower() for c in nodes if isinstance(c, exp.CTE)}
    for t in nodes:
        if not isinstance(t, exp.Table) or not t.name or t.name.lower() in ctes or is_dual(t):
            continue
        table = vschema.find_table(t.name, t.db or None, default_keyspace)
        refs.append(_Ref(table, (t.alias or t.name).lower()))
    return refs


def _only(keyspaces: set[str]) -> str | None:
    """The one keyspace of the set, if it has one."""
    return next(iter(keyspaces)) if len(keyspaces) == 1 else None


def _single_keyspace(refs: list[_Ref], what: str) -> str:
    keyspaces = {r.table.keyspace for r in refs}
    if len(keyspaces) > 1:
        raise Unsupported(
            f"{what} spans keyspaces {sorted(keyspaces)}: cross-keyspace statements "
            "cannot be routed as one query; split it"
        )
    return keyspaces.pop()


def _plan_select(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Primitive:
    # FROM dual (alone or joined) means no table: the shards' dialects all take a SELECT
    # without FROM, and a quoted `dual` would be a table name on MySQL.
    stmt = cast(exp.Expression, drop_dual(without_dual_joins(stmt)))
    refs = _refs(stmt, vschema, default_ks)
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
        return finish_at_gate(tail, _plan_select(bare, vschema, default_ks), columns,
                              next(iter(keyspaces)))
    if isinstance(stmt, exp.Union):
        return _concatenated(stmt, vschema, default_ks, _only(keyspaces) or "")
    if not isinstance(stmt, exp.Select):
        raise Unsupported("this statement cannot run across shards: send a SELECT or UNION")

    def plan(sub: exp.Expression) -> Primitive:
        return _plan_select(sub, vschema, default_ks)

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
        raise Unsupported(
            "this subquery cannot be routed across shards: only uncorrelated "
            "'col IN (SELECT ...)' subqueries, subqueries joined to the outer table on "
            "its primary vindex, subqueries that target the outer query's one shard, "
            "or any subquery within one unsharded keyspace are"
        )
    if nested:  # the subqueries run where their outer rows are: route by the outer tables
        refs = [_Ref(t.table, t.alias) for t in trefs]
    else:
        trefs = table_refs(stmt, vschema, default_ks)
    if len(keyspaces) > 1 or not colocated(trefs, stmt.args.get("where")):
        if len(trefs) < 2:
            raise Unsupported("this query cannot be routed across keyspaces")
        same_shard = single_shard(stmt, vschema, default_ks) if len(keyspaces) == 1 else None
        if same_shard is not None:  # every table pinned to one shard: join there
            return _route(same_shard, trefs[0].table.keyspace, strip_qualifiers(stmt),
                          trefs[0].table.name)
        expanded = expand_stars(stmt, trefs)
        if expanded is not stmt:
            stmt, trefs = expanded, table_refs(expanded, vschema, default_ks)
        joined = plan_nested_loop(stmt, trefs, plan)
        # one keyspace: every shard holds every table, so one can type-check the join
        one_ks = _only(keyspaces)
        return TypeChecked(joined, one_ks, stmt) if one_ks is not None else joined
    ks_name = next(iter(keyspaces))
    sharded = [r for r in refs if r.table.type != "reference"]
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
    return _routed_select(stmt, choice, ks_name, table_name)


def _routed_select(stmt: exp.Select, choice: RouteChoice, ks_name: str, table_name: str
                   ) -> Primitive:
    """``stmt`` routed by ``choice``: one route when one shard answers it all, else
    the shards' routes merged at the gate (:func:`plan_multi_shard`)."""
    single = choice.opcode in (Opcode.EQUAL_UNIQUE, Opcode.UNSHARDED) or (
        choice.opcode is Opcode.NONE and not needs_aggregation(stmt)
    )
    if single:
        return _route(choice, ks_name, strip_qualifiers(stmt), table_name)
    split_tree, in_var = _split_in(stmt, choice)
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
    if table.type == "reference":
        return None
    names = {(node.alias or node.name).lower(), table.name.lower(), ""}
    choice = choose(table, inner.args.get("where"), names)
    return _routed_select(stmt, choice, table.keyspace, table.name)


def _merged_route(
    stmt: exp.Expression, refs: list[_Ref], vschema: VSchema, default_ks: str | None
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
    if all(r.table.type == "reference" for r in refs):
        return Route(Opcode.REFERENCE, ks_name, True, ShardQuery(tree), table=refs[0].table.name)
    choice = single_shard(stmt, vschema, default_ks)
    if choice is not None:
        return _route(choice, ks_name, tree, refs[0].table.name)
    if not isinstance(stmt, exp.Union):
        return None
    parts = union_parts(stmt, distinct=False)
    if parts is not None and all(single_shard(p, vschema, default_ks) for p in parts):
        return _concatenated(stmt, vschema, default_ks, ks_name)  # each part on its one shard
    if parts is not None and not any(r.table.type == "reference" for r in refs) and all(
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
    both = Concatenate((_plan_select(left, vschema, default_ks),
                        _plan_select(right, vschema, default_ks)))
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


def _route(choice: RouteChoice, ks: str, tree: exp.Expr, table: str,
           write: bool = False, in_var: str | None = None) -> Route:
    return Route(choice.opcode, ks, True, ShardQuery(tree), table=table,
                 vindex=choice.vindex, values=choice.values, write=write, in_var=in_var,
                 columns=choice.columns)


IN_VAR = "__sg_vals"


def _split_in(tree: exp.Expression, choice: RouteChoice) -> tuple[exp.Expr, str | None]:
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


def _plan_parenthesized(
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
        if any(inner.args.get(a) is not None for a in outer_args):
            raise Unsupported(
                "ORDER BY / LIMIT both inside and outside parentheses is not supported"
            )
        inner = inner.copy()
        for arg, value in outer_args.items():
            if value is not None:
                inner.set(arg, value.copy())
        return _plan_select(inner, vschema, default_ks)
    if any(v is not None for v in outer_args.values()):
        return _plan_select(stmt, vschema, default_ks)
    assert isinstance(inner, exp.Expression)
    return _plan_select(inner, vschema, default_ks)


def _joined_dml(
    stmt: exp.Expression, vschema: VSchema, default_ks: str | None
) -> exp.Expression | None:
    """A multi-table DELETE/UPDATE on a sharded table, as one co-located statement."""
    target = stmt.this
    if not isinstance(target, exp.Table) or not target.args.get("joins"):
        return None
    table = vschema.find_table(target.name, target.db or None, default_ks)
    if not vschema.keyspace(table.keyspace).sharded:
        return None
    rewritten = join_dml_as_exists(stmt)
    if rewritten is None:
        return None
    probe = exp.Select(expressions=[exp.Literal.number(1)]).from_(rewritten.this.copy())
    probe.set("where", rewritten.args["where"].copy())
    if single_shard(probe, vschema, default_ks) is None and not \
            colocated_subqueries(probe, vschema, default_ks):
        raise Unsupported(
            "a multi-table DELETE/UPDATE across shards must join the target on its primary "
            "vindex (so matching rows share a shard) or pin every table to one shard"
        )
    return rewritten


def _dml_target(
    stmt: exp.Expression, vschema: VSchema, default_ks: str | None, verb: str,
    colocated_subquery: bool = False,
) -> tuple[list[_Ref], _Ref]:
    refs = _refs(stmt, vschema, default_ks)
    if not refs:
        raise InvalidArgument(f"{verb} needs a table")
    _single_keyspace(refs, verb)
    target = refs[0]
    ks = vschema.keyspace(target.table.keyspace)
    if ks.sharded and not colocated_subquery and (
        len(refs) > 1 or stmt.find(exp.Subquery) is not None
    ):
        raise Unsupported(
            f"{verb} with joins or subqueries on a sharded keyspace is not supported yet"
        )
    return refs, target


def _single_table_form(stmt: exp.Expression) -> exp.Expression:
    """``DELETE u FROM t AS u ...`` / ``UPDATE t AS u SET u.c ...`` without the alias.

    A one-table statement naming its table by an alias is rewritten to name
    the table itself, in the form every shard's engine accepts (SQLite takes
    neither ``DELETE u FROM`` nor qualified SET columns).
    """
    table = stmt.this
    targets = stmt.args.get("tables") or []
    if not isinstance(table, exp.Table) or table.args.get("joins") or \
            stmt.args.get("from_") or stmt.find(exp.Subquery) is not None:
        return stmt
    alias = table.alias.lower() if table.alias else ""
    names = {table.name.lower()} | ({alias} if alias else set())
    if any(not isinstance(t, exp.Table) or t.db or t.name.lower() not in names
           for t in targets):
        return stmt
    if not alias and not targets:
        return stmt
    out = stmt.copy()
    out.set("tables", None)
    bare = out.this
    bare.set("alias", None)

    def unqualify(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table.lower() in names and not node.args.get("db"):
            return exp.column(node.name, quoted=node.this.quoted if node.this else None)
        return node

    rewritten = out.transform(unqualify)
    assert isinstance(rewritten, exp.Expression)
    return rewritten


def _plan_update_delete(
    stmt: exp.Expression, vschema: VSchema, default_ks: str | None
) -> Primitive:
    verb = "UPDATE" if isinstance(stmt, exp.Update) else "DELETE"
    stmt = _single_table_form(stmt)
    merged = _joined_dml(stmt, vschema, default_ks)
    if merged is not None:
        stmt = merged
    _, target = _dml_target(stmt, vschema, default_ks, verb, merged is not None)
    table = target.table
    ks = vschema.keyspace(table.keyspace)
    tree = strip_qualifiers(stmt)
    if not ks.sharded:
        return Route(Opcode.UNSHARDED, ks.name, False, ShardQuery(tree), table=table.name,
                     write=True)
    if table.type == "reference":
        return Route(Opcode.REFERENCE, ks.name, True, ShardQuery(tree), table=table.name,
                     write=True)
    choice = choose(table, stmt.args.get("where"), {target.alias, table.name.lower(), ""})
    if stmt.args.get("limit") is not None and choice.opcode not in (
        Opcode.EQUAL_UNIQUE, Opcode.NONE
    ):
        raise Unsupported(f"{verb} with LIMIT on several shards is not supported: "
                          "target one shard with an equality on the primary vindex")
    changes = _lookup_changes(stmt, table)
    if not changes:
        split_tree, in_var = _split_in(stmt, choice)
        return _route(choice, ks.name, split_tree, table.name, write=True, in_var=in_var)
    route = _route(choice, ks.name, tree, table.name, write=True)
    primary = table.primary
    assert primary is not None
    columns: list[str] = list(primary.columns)
    lookup_changes = []
    for cv, new_values in changes:
        positions = []
        for c in cv.columns:
            positions.append(len(columns))
            columns.append(c)
        assert isinstance(cv.vindex, Lookup)
        lookup_changes.append(LookupChange(cv.vindex, tuple(positions), new_values, cv.columns))
    table_node = tree.this
    select = exp.Select(
        expressions=[exp.column(c) for c in columns],
        locks=[exp.Lock(update=True)],
    ).from_(table_node.copy())
    where = tree.args.get("where")
    if where is not None:
        select.set("where", where.copy())
    return LookupDML(route, ShardQuery(select), primary.vindex, len(primary.columns),
                     tuple(lookup_changes), "Update" if verb == "UPDATE" else "Delete")


def _lookup_changes(
    stmt: exp.Expression, table: Table
) -> list[tuple[ColumnVindex, tuple[Value | None, ...]]]:
    """The owned lookups a DML statement must maintain, with UPDATE's new values.

    Refuses changes the gate cannot keep consistent: the primary vindex column,
    a vindex column the table does not own, or a new value that is not a constant.
    """
    owned = [cv for cv in table.owned_vindexes if isinstance(cv.vindex, Lookup)]
    if isinstance(stmt, exp.Delete):
        return [(cv, ()) for cv in owned]
    assignments: dict[str, exp.Expr] = {}
    for a in stmt.expressions:
        if isinstance(a, exp.EQ) and isinstance(a.this, exp.Column):
            assignments[a.this.name.lower()] = a.expression
    primary = table.primary
    for col in assignments:
        if primary is not None and col in primary.columns:
            raise Unsupported(
                f"UPDATE of primary vindex column {table.name}.{col} is not supported: "
                "it would move the row to another shard; delete and insert it instead"
            )
        for cv in table.column_vindexes[1:]:
            if col in cv.columns and not (cv.owned and isinstance(cv.vindex, Lookup)):
                raise Unsupported(
                    f"UPDATE of column {table.name}.{col} of vindex {cv.name!r}, which "
                    f"{table.name} does not own, is not supported"
                )
    out = []
    for cv in owned:
        if not any(c in assignments for c in cv.columns):
            continue
        try:
            new = tuple(from_expression(assignments[c]) if c in assignments else None
                        for c in cv.columns)
        except InvalidArgument:
            raise Unsupported(
                f"UPDATE of lookup vindex column(s) {list(cv.columns)} needs constant new "
                "values (literals or bind variables)"
            ) from None
        if any(isinstance(v, SQLExpr) for v in new):
            raise Unsupported(
                f"UPDATE of lookup vindex column(s) {list(cv.columns)} needs constant new "
                "values (literals or bind variables)"
            )
        out.append((cv, new))
    return out


def _plan_insert(stmt: exp.Insert, vschema: VSchema, default_ks: str | None) -> Primitive:
    target = stmt.this
    columns_given: list[str] | None = None
    quoted: set[str] = set()
    if isinstance(target, exp.Schema):
        columns_given = [c.name.lower() for c in target.expressions]
        quoted = {c.name.lower() for c in target.expressions if c.args.get("quoted")}
        target = target.this
    if not isinstance(target, exp.Table):
        raise InvalidArgument("INSERT needs a table")
    table = vschema.find_table(target.name, target.db or None, default_ks)
    if columns_given is not None:
        _refuse_duplicates(columns_given, table)
    ks = vschema.keyspace(table.keyspace)
    pulled = _value_subqueries(stmt, table, vschema, default_ks)
    if pulled is not None:
        return pulled
    tree = strip_qualifiers(stmt)
    source = stmt.expression
    simple = isinstance(source, exp.Values) and stmt.args.get("conflict") is None
    # A SELECT reading another keyspace cannot run in this keyspace's database: the
    # gate runs it and inserts its rows (engine/insert_select.py).
    elsewhere = isinstance(source, exp.Query) and reads_other_keyspace(
        source, ks.name, vschema, default_ks)
    if not ks.sharded and (table.auto_increment is None or not simple) and not elsewhere:
        if table.auto_increment is not None:
            raise Unsupported(
                f"INSERT into {table.name} with a sequence needs a plain VALUES list"
            )
        return Route(Opcode.UNSHARDED, ks.name, False, ShardQuery(tree), table=table.name,
                     write=True)
    pinned = pinned_choice(table)
    if pinned is not None:
        if table.auto_increment is not None or table.column_vindexes:
            raise Unsupported(
                f"INSERT into pinned table {table.qualified} with column vindexes or an "
                "auto_increment sequence is not supported"
            )
        if not isinstance(source, exp.Values) or source.find(exp.Query) is not None:
            raise Unsupported(
                f"INSERT into pinned table {table.qualified} takes a VALUES list without "
                "subqueries (a SELECT would read the pinned shard only)"
            )
        return _route(pinned, ks.name, tree, table.name, write=True)
    selected: Primitive | None = None
    if isinstance(source, exp.Query):
        # The gate runs the SELECT, then inserts its rows as VALUES (engine/insert_select.py).
        if columns_given is None and table.authoritative_columns is None:
            raise InvalidArgument(
                f"INSERT ... SELECT into sharded table {table.qualified} must list its "
                f"columns: INSERT INTO {table.name} (col, ...) SELECT ..."
            )
        selected = _plan_select(cast(exp.Expression, source), vschema, default_ks)
        stmt = stmt.copy()
        source = exp.Values(expressions=[])
        stmt.set("expression", source)
    if not isinstance(source, exp.Values):
        raise Unsupported(f"INSERT ... SELECT into sharded table {table.name} is not supported")
    on_duplicate = on_duplicate_assignments(stmt, table)
    if columns_given is None and selected is None and all(
        isinstance(row, exp.Tuple) and not row.expressions for row in source.expressions
    ):
        columns_given = []  # INSERT INTO t VALUES (): every column takes its default
    if columns_given is None and table.authoritative_columns is not None:
        columns_given = list(table.authoritative_columns)
    if columns_given is None:
        raise InvalidArgument(
            f"INSERT into {table.qualified} must list its columns: "
            f"INSERT INTO {table.name} (col, ...) VALUES (...)"
        )
    raw_rows: list[list[exp.Expr]] = []
    for i, row in enumerate(source.expressions):
        items = row.expressions if isinstance(row, exp.Tuple) else [row]
        if len(items) != len(columns_given):
            raise InvalidArgument(
                f"INSERT row {i + 1} has {len(items)} values for {len(columns_given)} columns"
            )
        raw_rows.append(list(items))
    columns_given, rows = without_defaults(table, columns_given, raw_rows)
    primary = table.primary
    ai = table.auto_increment
    if ks.sharded and table.type != "reference" and primary is not None and any(
        c not in columns_given and (ai is None or ai.column != c) for c in primary.columns
    ):
        raise InvalidArgument(
            f"insert into {table.name} must give the primary vindex column(s) "
            f"{list(primary.columns)}"
        )
    owned = tuple(
        OwnedLookup(cv.columns, cv.vindex)
        for cv in table.owned_vindexes
        if isinstance(cv.vindex, Lookup)
    )
    if stmt.args.get("ignore") and ks.sharded:
        _check_ignorable(table, owned)
    secondary = tuple(
        (cv.columns, cv.vindex)
        for cv in table.column_vindexes[1:]
        if not (cv.owned and isinstance(cv.vindex, Lookup))
        and not (isinstance(cv.vindex, Lookup) and cv.vindex.write_only)
    )
    insert = Insert(
        keyspace=ks.name,
        sharded=ks.sharded and table.type != "reference",
        table=table.name,
        columns=tuple(columns_given),
        rows=tuple(rows),
        primary_columns=primary.columns if primary and ks.sharded else (),
        primary_vindex=primary.vindex if primary and ks.sharded else None,
        owned_lookups=owned if ks.sharded else (),
        secondary=secondary if ks.sharded else (),
        auto_increment=(ai.column, ai.sequence) if ai else None,
        ignore=bool(stmt.args.get("ignore")),
        broadcast=ks.sharded and table.type == "reference",
        on_duplicate=on_duplicate,
        quoted=frozenset(quoted | ({table.name} if target.this.args.get("quoted") else set())),
    )
    return insert if selected is None else InsertSelect(selected, insert)


def _check_ignorable(table: Table, owned: tuple[OwnedLookup, ...]) -> None:
    """INSERT IGNORE keeps owned lookups exact only if their writes join the statement's
    transaction (see shardgate.engine.insert_ignore)."""
    for lk in owned:
        v = lk.vindex
        if (not isinstance(v, LookupBase) or isinstance(v, ConsistentLookupBase)
                or v.autocommit or len(lk.columns) != 1):
            raise Unsupported(
                f"INSERT IGNORE into {table.name} is not supported with its lookup vindex "
                f"{v.name!r} ({v.type_name}{', autocommit' if v.autocommit else ''}, "
                f"{len(lk.columns)} column(s)): a skipped row's lookup rows could not be "
                "removed in the same transaction; use a plain INSERT"
            )


def _refuse_duplicates(columns: list[str], table: Table) -> None:
    """A column named twice: the row would be routed by one value and store the other."""
    seen: set[str] = set()
    for c in columns:
        if c in seen:
            raise InvalidArgument(f"INSERT into {table.name} names column {c!r} twice")
        seen.add(c)


VALUE_SUBQUERY_VAR = "__sg_vsq{}"


def _value_subqueries(
    stmt: exp.Insert, table: Table, vschema: VSchema, default_ks: str | None
) -> Primitive | None:
    """Plan subqueries in VALUES that cannot run where the row goes (engine/scalar.py).

    Into a sharded table a subquery would see one shard's rows; in an unsharded
    keyspace it may stay inline unless it reads another keyspace. Each pulled
    subquery is planned as a SELECT of its own and becomes a bind variable of
    the insert. None when there is nothing to pull.
    """
    source = stmt.expression
    if not isinstance(source, exp.Values) or source.find(exp.Query) is None:
        return None
    ks = vschema.keyspace(table.keyspace)
    if not ks.sharded and not reads_other_keyspace(source, ks.name, vschema, default_ks):
        return None
    stmt = stmt.copy()
    values = stmt.expression
    subqueries: list[tuple[str, Primitive]] = []
    while (sub := values.find(exp.Subquery)) is not None:
        alone = isinstance(sub.parent, exp.Tuple | exp.Values)
        if (ks.sharded and not alone) or not isinstance(sub.this, exp.Query):
            break  # refused below
        var = VALUE_SUBQUERY_VAR.format(len(subqueries))
        subqueries.append((var, build_plan(sub.this, "", vschema, default_ks).instructions))
        sub.replace(exp.Placeholder(this=var))
    if values.find(exp.Query) is not None:
        raise Unsupported(
            f"this subquery in the VALUES of an INSERT into {table.qualified} cannot be "
            "computed across shards: only a subquery alone as a value, (SELECT ...), is"
        )
    return ScalarSubqueries(tuple(subqueries), _plan_insert(stmt, vschema, default_ks))


def reads_other_keyspace(source: exp.Expr, keyspace: str, vschema: VSchema,
                         default_ks: str | None) -> bool:
    """Whether ``source`` (of a statement run in ``default_ks``, where its unqualified
    tables resolve) reads a table of another keyspace than ``keyspace``."""
    for t in source.find_all(exp.Table):
        try:
            found = vschema.find_table(t.name, t.db or None, default_ks or keyspace)
        except ShardgateError:
            continue  # not in the VSchema: the unsharded database resolves it
        if found.keyspace != keyspace:
            return True
    return False


def _plan_ddl(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Primitive:
    if isinstance(stmt, exp.Create) and stmt.find(exp.TemporaryProperty) is not None:
        raise Unsupported(
            "CREATE TEMPORARY TABLE: a temporary table lives in one database connection, and "
            "the gate runs each statement on a pooled connection of each shard (the next "
            "statement may not see it); create a regular table"
        )
    table = stmt.find(exp.Table)
    ks_name = (table.db if table is not None and table.db else None) or default_ks
    if ks_name is None:
        raise InvalidArgument(
            "DDL needs a keyspace: qualify the table (keyspace.table) or set a default keyspace"
        )
    ks = vschema.keyspace(ks_name)
    kind = str(stmt.args.get("kind", "")).upper()
    if isinstance(stmt, exp.Create) and kind == "VIEW" and ks.sharded:
        raise Unsupported(
            f"CREATE VIEW in sharded keyspace {ks.name}: a view is a query stored in each "
            "shard's database, where it would see only that shard's rows; create the view "
            "in an unsharded keyspace"
        )
    if isinstance(stmt, exp.Create) and isinstance(stmt.expression, exp.Query):
        for source in stmt.expression.find_all(exp.Table):
            if (source.db or default_ks or ks.name) != ks.name:
                raise Unsupported(
                    f"CREATE {kind} in keyspace {ks.name} from {source.db}.{source.name}: "
                    "the statement runs inside the keyspace's databases, which do not hold "
                    "other keyspaces' tables; create it, then INSERT ... SELECT through "
                    "the gate"
                )
    for ref in stmt.find_all(exp.Reference):
        for target in ref.find_all(exp.Table):
            if target.db and target.db != ks.name:
                raise Unsupported(
                    f"a foreign key from keyspace {ks.name} to {target.db}.{target.name}: "
                    "keyspaces are separate databases, which cannot check a foreign key "
                    "between them"
                )
    return DDL(ks.name, ks.sharded, ShardQuery(strip_qualifiers(stmt)))


_Builder = Callable[[Any, VSchema, str | None], Primitive]
_BUILDERS: dict[type[exp.Expr], tuple[StatementType, _Builder]] = {
    exp.Select: (StatementType.SELECT, _plan_select),
    exp.Union: (StatementType.SELECT, _plan_select),
    exp.Subquery: (StatementType.SELECT, _plan_parenthesized),
    exp.Insert: (StatementType.INSERT, _plan_insert),
    exp.Update: (StatementType.UPDATE, _plan_update_delete),
    exp.Delete: (StatementType.DELETE, _plan_update_delete),
    exp.Create: (StatementType.DDL, _plan_ddl),
    exp.Drop: (StatementType.DDL, _plan_ddl),
    exp.TruncateTable: (StatementType.DDL, _plan_ddl),
    exp.Alter: (StatementType.DDL, _plan_ddl),
    exp.Describe: (StatementType.EXPLAIN, _plan_explain),
}


def first_primary_key_column(stmt: exp.Create) -> str | None:
    """The first column of a CREATE TABLE's primary key (table or column constraint)."""
    pk = stmt.find(exp.PrimaryKey)
    if pk is not None and pk.expressions:
        first = pk.expressions[0]
        if isinstance(first, exp.Ordered):
            first = first.this
        return str(first.name)
    for constraint in stmt.find_all(exp.PrimaryKeyColumnConstraint):
        column = constraint.find_ancestor(exp.ColumnDef)
        if column is not None:
            return str(column.name)
    return None


_SERIAL_TYPES = (exp.DataType.Type.SERIAL, exp.DataType.Type.BIGSERIAL,
                 exp.DataType.Type.SMALLSERIAL)


def auto_increment_column(stmt: exp.Create) -> str | None:
    """The CREATE TABLE column the database numbers itself: ``AUTO_INCREMENT``,
    ``SERIAL`` (``BIGSERIAL``, ``SMALLSERIAL``) or ``GENERATED ... AS IDENTITY``; None
    when there is none. Only a primary key column counts (as the database's own
    counter, a sequence fills a key)."""
    if not isinstance(stmt.this, exp.Schema):
        return None
    pk = first_primary_key_column(stmt)
    keys = {pk.lower()} if pk is not None else set()
    found = stmt.find(exp.PrimaryKey)
    if found is not None:
        keys |= {str((e.this if isinstance(e, exp.Ordered) else e).name).lower()
                 for e in found.expressions}
    for column in stmt.this.expressions:
        if not isinstance(column, exp.ColumnDef) or column.name.lower() not in keys:
            continue
        kind = column.args.get("kind")
        if (isinstance(kind, exp.DataType) and kind.this in _SERIAL_TYPES) or column.find(
                exp.AutoIncrementColumnConstraint, exp.GeneratedAsIdentityColumnConstraint):
            return str(column.name)
    return None
