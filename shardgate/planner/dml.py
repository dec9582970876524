"""UPDATE and DELETE planning: the route, and the owned lookups a statement maintains.

A statement on an unsharded keyspace or a reference table is one route; on a
sharded table its WHERE chooses the shards (an IN list split per shard), and a
table owning lookup vindexes gets a :class:`~shardgate.engine.dml.LookupDML`
that reads the affected rows first. A multi-table statement runs only when its
rows share a shard (:func:`~shardgate.planner.dml_join.join_dml_as_exists`).
Pure: no I/O.
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.engine.cursor import ShardQuery
from shardgate.engine.dml import LookupChange, LookupDML
from shardgate.engine.primitive import Opcode, Primitive
from shardgate.engine.route import Route
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.values import SQLExpr, Value, from_expression
from shardgate.planner.dml_join import join_dml_as_exists
from shardgate.planner.merge import colocated_subqueries, single_shard
from shardgate.planner.query import Ref, refs_of, route_for, single_keyspace, split_in
from shardgate.planner.routing import choose
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.sql.statements import StatementType
from shardgate.vindexes import Lookup
from shardgate.vschema import ColumnVindex, Table, TableType, VSchema


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
) -> tuple[list[Ref], Ref]:
    refs = refs_of(stmt, vschema, default_ks)
    if not refs:
        raise InvalidArgument(f"{verb} needs a table")
    single_keyspace(refs, verb)
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


def plan_update_delete(
    stmt: exp.Expression, vschema: VSchema, default_ks: str | None
) -> Primitive:
    """Plan an UPDATE or DELETE (see the module docstring)."""
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
    if table.type == TableType.REFERENCE:
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
        split_tree, in_var = split_in(stmt, choice)
        return route_for(choice, ks.name, split_tree, table.name, write=True, in_var=in_var)
    route = route_for(choice, ks.name, tree, table.name, write=True)
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
                     tuple(lookup_changes), StatementType(verb))


def _lookup_changes(
    stmt: exp.Expression, table: Table
) -> list[tuple[ColumnVindex, tuple[Value | None, ...]]]:
    """The owned lookups a DML statement must maintain, with UPDATE's new values.

    Refuses changes the gate cannot keep consistent: the primary vindex column,
    a functional vindex column, or an owned lookup's new value that is not a
    constant. A column of a lookup the table does not own may change: that
    lookup is its owner's, and is not touched.
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
            # A lookup the table does not own is left alone (Vitess's rule: its owner
            # keeps it); a functional vindex would no longer map the row to its shard.
            if col in cv.columns and not isinstance(cv.vindex, Lookup):
                raise Unsupported(
                    f"UPDATE of column {table.name}.{col} of functional vindex {cv.name!r} "
                    "is not supported: the row would no longer map to its shard (only "
                    "lookup vindex columns may change)"
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
