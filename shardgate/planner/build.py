"""Statements to plans. Pure: no I/O, same input -> same plan.

What is refused (never mis-routed): statements mixing keyspaces; joins and
subqueries that are not confined to one unsharded keyspace or to one sharded
table plus reference tables; aggregates, GROUP BY and DISTINCT across shards;
DML that changes a vindex column; multi-shard DML with LIMIT; INSERT ... SELECT
and ON DUPLICATE KEY UPDATE into sharded tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from shardgate.engine.dml import LookupChange, LookupDML
from shardgate.engine.explain import Explain
from shardgate.engine.primitives import (
    DDL,
    Insert,
    Opcode,
    OrderKey,
    OwnedLookup,
    Primitive,
    Route,
    ShardQuery,
)
from shardgate.engine.values import SQLExpr, Value, from_expression
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.keys import KeyRange
from shardgate.planner.join import (
    best_route,
    colocated,
    plan_nested_loop,
    pull_out_subqueries,
    table_refs,
    wrap_pulled,
)
from shardgate.planner.routing import RouteChoice, choose, extract_keyrange
from shardgate.planner.select import (
    RouteTarget,
    find_selected,
    needs_aggregation,
    plan_multi_shard,
)
from shardgate.sql.dialect import strip_qualifiers
from shardgate.sql.rewrite import swapped, transform
from shardgate.vindexes import Lookup
from shardgate.vschema import ColumnVindex, Table, VSchema


@dataclass(frozen=True)
class Plan:
    """A planned statement: its type, the original text and the primitive tree."""

    statement_type: str
    original: str
    instructions: Primitive
    #: the statement with literals replaced by ``?``: the key of query statistics
    normalized: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "QueryType": self.statement_type,
            "Original": self.original,
            "Instructions": self.instructions.describe(),
        }


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
    return Plan(kind, sql, fn(stmt, vschema, default_keyspace), normalize(stmt))


def normalize(stmt: exp.Expr) -> str:
    """The statement with every literal replaced by ``?`` (statistics group by it).

    Long IN lists of literals only are set aside while the statement is copied
    and generated, and written back as text: a 10,000-value list costs a join
    of strings, not 10,000 copied and generated nodes.
    """
    def lit(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Literal):
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
    return Explain(build_plan(inner, inner.sql(dialect="mysql"), vschema, default_ks).describe())


def _refs(stmt: exp.Expression, vschema: VSchema, default_keyspace: str | None) -> list[_Ref]:
    refs = []
    nodes = list(stmt.find_all(exp.CTE, exp.Table))  # one walk (long IN lists)
    ctes = {c.alias_or_name.lower() for c in nodes if isinstance(c, exp.CTE)}
    for t in nodes:
        if not isinstance(t, exp.Table) or not t.name or t.name.lower() in ctes:
            continue
        table = vschema.find_table(t.name, t.db or None, default_keyspace)
        refs.append(_Ref(table, (t.alias or t.name).lower()))
    return refs


def _single_keyspace(refs: list[_Ref], what: str) -> str:
    keyspaces = {r.table.keyspace for r in refs}
    if len(keyspaces) > 1:
        raise Unsupported(
            f"{what} spans keyspaces {sorted(keyspaces)}: cross-keyspace statements "
            "cannot be routed as one query; split it"
        )
    return keyspaces.pop()


def _plan_select(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Primitive:
    refs = _refs(stmt, vschema, default_ks)
    if not refs:
        return _no_table_route(stmt, vschema, default_ks)
    keyspaces = {r.table.keyspace for r in refs}
    if len(keyspaces) == 1:
        ks = vschema.keyspace(next(iter(keyspaces)))
        if not ks.sharded:  # one unsharded database takes anything
            return Route(Opcode.UNSHARDED, ks.name, False, ShardQuery(strip_qualifiers(stmt)),
                         table=refs[0].table.name)
    if not isinstance(stmt, exp.Select):
        raise Unsupported("UNION and other set operations across shards are not supported yet")

    def plan(sub: exp.Expression) -> Primitive:
        return _plan_select(sub, vschema, default_ks)

    outer, pulled = pull_out_subqueries(stmt, plan)
    if pulled:
        return wrap_pulled(plan(outer), pulled)
    if any(n is not stmt for n in stmt.find_all(exp.Select)):
        raise Unsupported(
            "this subquery cannot be routed across shards: only uncorrelated "
            "'col IN (SELECT ...)' subqueries are, or any subquery within one unsharded keyspace"
        )
    trefs = table_refs(stmt, vschema, default_ks)
    if len(keyspaces) > 1 or not colocated(trefs, stmt.args.get("where")):
        if len(trefs) < 2:
            raise Unsupported("this query cannot be routed across keyspaces")
        return plan_nested_loop(stmt, trefs, plan)
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
        names = {only.alias, only.table.name.lower()}
        if len(refs) == 1:
            names.add("")
        stmt, key_range = extract_keyrange(stmt)
        choice = choose(only.table, stmt.args.get("where"), names)
        if key_range is not None:
            return _keyrange_select(stmt, key_range, only.table, choice, len(refs))
        table_name = only.table.name
    single = choice.opcode in (Opcode.EQUAL_UNIQUE, Opcode.UNSHARDED) or (
        choice.opcode is Opcode.NONE and not needs_aggregation(stmt)
    )
    if single:
        return _route(choice, ks_name, strip_qualifiers(stmt), table_name)
    split_tree, in_var = _split_in(stmt, choice)
    assert isinstance(split_tree, exp.Select)
    target = RouteTarget(choice.opcode, ks_name, table_name, choice.vindex, choice.values,
                         in_var)
    return plan_multi_shard(stmt, split_tree, target)


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
    assert primary is not None
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
                 ksid_vindex=primary.vindex, hidden=hidden)


def _route(choice: RouteChoice, ks: str, tree: exp.Expr, table: str,
           write: bool = False, in_var: str | None = None) -> Route:
    return Route(choice.opcode, ks, True, ShardQuery(tree), table=table,
                 vindex=choice.vindex, values=choice.values, write=write, in_var=in_var)


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
    return Route(opcode, ks_name, ks.sharded, ShardQuery(strip_qualifiers(stmt)))


def _dml_target(
    stmt: exp.Expression, vschema: VSchema, default_ks: str | None, verb: str
) -> tuple[list[_Ref], _Ref]:
    refs = _refs(stmt, vschema, default_ks)
    if not refs:
        raise InvalidArgument(f"{verb} needs a table")
    _single_keyspace(refs, verb)
    target = refs[0]
    ks = vschema.keyspace(target.table.keyspace)
    if ks.sharded and (len(refs) > 1 or stmt.find(exp.Subquery) is not None):
        raise Unsupported(
            f"{verb} with joins or subqueries on a sharded keyspace is not supported yet"
        )
    return refs, target


def _plan_update_delete(
    stmt: exp.Expression, vschema: VSchema, default_ks: str | None
) -> Primitive:
    verb = "UPDATE" if isinstance(stmt, exp.Update) else "DELETE"
    _, target = _dml_target(stmt, vschema, default_ks, verb)
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
        lookup_changes.append(LookupChange(cv.vindex, tuple(positions), new_values))
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
    if isinstance(target, exp.Schema):
        columns_given = [c.name.lower() for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table):
        raise InvalidArgument("INSERT needs a table")
    table = vschema.find_table(target.name, target.db or None, default_ks)
    ks = vschema.keyspace(table.keyspace)
    tree = strip_qualifiers(stmt)
    source = stmt.expression
    simple = isinstance(source, exp.Values) and stmt.args.get("conflict") is None
    if not ks.sharded and (table.auto_increment is None or not simple):
        if table.auto_increment is not None:
            raise Unsupported(
                f"INSERT into {table.name} with a sequence needs a plain VALUES list"
            )
        return Route(Opcode.UNSHARDED, ks.name, False, ShardQuery(tree), table=table.name,
                     write=True)
    if not isinstance(source, exp.Values):
        raise Unsupported(f"INSERT ... SELECT into sharded table {table.name} is not supported")
    if stmt.args.get("conflict") is not None:
        raise Unsupported(
            f"INSERT ... ON DUPLICATE KEY UPDATE into sharded table {table.name} "
            "is not supported yet"
        )
    if columns_given is None:
        raise InvalidArgument(
            f"INSERT into {table.qualified} must list its columns: "
            f"INSERT INTO {table.name} (col, ...) VALUES (...)"
        )
    rows: list[tuple[Value, ...]] = []
    for i, row in enumerate(source.expressions):
        items = row.expressions if isinstance(row, exp.Tuple) else [row]
        if len(items) != len(columns_given):
            raise InvalidArgument(
                f"INSERT row {i + 1} has {len(items)} values for {len(columns_given)} columns"
            )
        rows.append(tuple(from_expression(x) for x in items))
    primary = table.primary
    owned = tuple(
        OwnedLookup(cv.columns, cv.vindex)
        for cv in table.owned_vindexes
        if isinstance(cv.vindex, Lookup)
    )
    ai = table.auto_increment
    secondary = tuple(
        (cv.columns, cv.vindex)
        for cv in table.column_vindexes[1:]
        if not (cv.owned and isinstance(cv.vindex, Lookup))
        and not (isinstance(cv.vindex, Lookup) and cv.vindex.write_only)
    )
    return Insert(
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
    )


def _plan_ddl(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Primitive:
    table = stmt.find(exp.Table)
    ks_name = (table.db if table is not None and table.db else None) or default_ks
    if ks_name is None:
        raise InvalidArgument(
            "DDL needs a keyspace: qualify the table (keyspace.table) or set a default keyspace"
        )
    ks = vschema.keyspace(ks_name)
    return DDL(ks.name, ks.sharded, ShardQuery(strip_qualifiers(stmt)))


_Builder = Callable[[Any, VSchema, str | None], Primitive]
_BUILDERS: dict[type[exp.Expr], tuple[str, _Builder]] = {
    exp.Select: ("SELECT", _plan_select),
    exp.Union: ("SELECT", _plan_select),
    exp.Insert: ("INSERT", _plan_insert),
    exp.Update: ("UPDATE", _plan_update_delete),
    exp.Delete: ("DELETE", _plan_update_delete),
    exp.Create: ("DDL", _plan_ddl),
    exp.Drop: ("DDL", _plan_ddl),
    exp.TruncateTable: ("DDL", _plan_ddl),
    exp.Alter: ("DDL", _plan_ddl),
    exp.Describe: ("EXPLAIN", _plan_explain),
}
