"""Statements to plans. Pure: no I/O, same input -> same plan.

:func:`build_plan` dispatches on the statement's kind (the ``_BUILDERS`` table) to
the planner of that kind: :mod:`~shardgate.planner.query` (SELECT, UNION),
:mod:`~shardgate.planner.insert`, :mod:`~shardgate.planner.dml` (UPDATE, DELETE),
:mod:`~shardgate.planner.ddl`; a statement targeting a shard or keyspace
(``USE ks:-80``, ``ks[ksid]``) is one route there (:mod:`~shardgate.planner.target`).
Routing rules apply first; a read the rules send elsewhere (MoveTables' read switch)
is planned both ways.

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
from typing import Any

from sqlglot import exp

from shardgate.engine.explain import Explain
from shardgate.engine.plan import Plan
from shardgate.engine.primitive import Primitive
from shardgate.engine.readswitch import ReadSwitch
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.planner.ddl import plan_ddl
from shardgate.planner.dml import plan_update_delete
from shardgate.planner.insert import plan_insert
from shardgate.planner.query import plan_parenthesized, plan_select
from shardgate.planner.rules import apply_routing_rules
from shardgate.planner.target import parse_target, statement_target, targeted_route
from shardgate.sql.rewrite import transform
from shardgate.sql.statements import StatementType
from shardgate.vschema import VSchema


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
    routed = (stmt if kind is StatementType.DDL
              else apply_routing_rules(stmt, vschema, default_keyspace))
    prim = fn(routed, vschema, default_keyspace)
    if kind is StatementType.SELECT and vschema.read_routing_rules:
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


def _plan_insert(stmt: exp.Insert, vschema: VSchema, default_ks: str | None) -> Primitive:
    return plan_insert(stmt, vschema, default_ks, _plan_query)


def _plan_query(stmt: exp.Expr, vschema: VSchema, default_ks: str | None) -> Primitive:
    """A query planned as a statement of its own (an INSERT's VALUES subqueries)."""
    return build_plan(stmt, "", vschema, default_ks).instructions


_Builder = Callable[[Any, VSchema, str | None], Primitive]
_BUILDERS: dict[type[exp.Expr], tuple[StatementType, _Builder]] = {
    exp.Select: (StatementType.SELECT, plan_select),
    exp.Union: (StatementType.SELECT, plan_select),
    exp.Subquery: (StatementType.SELECT, plan_parenthesized),
    exp.Insert: (StatementType.INSERT, _plan_insert),
    exp.Update: (StatementType.UPDATE, plan_update_delete),
    exp.Delete: (StatementType.DELETE, plan_update_delete),
    exp.Create: (StatementType.DDL, plan_ddl),
    exp.Drop: (StatementType.DDL, plan_ddl),
    exp.TruncateTable: (StatementType.DDL, plan_ddl),
    exp.Alter: (StatementType.DDL, plan_ddl),
    exp.Describe: (StatementType.EXPLAIN, _plan_explain),
}
