"""Routing rules applied to a statement before it is planned (Vitess's ``RoutingRules``).

Each table reference a rule matches (see :meth:`VSchema.routing_target`) is
rewritten to the rule's ``keyspace.table``; a reference that had no alias keeps
its written name as alias, so ``legacy.id`` still resolves, as Vitess plans
``select * from route1`` as ``select * from ks.t1 as route1``. The target of an
INSERT gets no alias (SQL has none there). The statement is copied only when a
rule matches. DDL is not rewritten (it names the table it creates or drops).
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.vschema import VSchema


def apply_routing_rules(
    stmt: exp.Expr, vschema: VSchema, default_keyspace: str | None, *, reads: bool = False
) -> exp.Expr:
    """``stmt`` with its routed table references rewritten (or ``stmt`` itself);
    ``reads``: as read outside a transaction (read rules first)."""
    if not vschema.routing_rules and not (reads and vschema.read_routing_rules):
        return stmt
    if not any(_target(t, vschema, default_keyspace, reads) for t in _tables(stmt)):
        return stmt
    out = stmt.copy()
    insert_target = _insert_target(out)
    for table in list(_tables(out)):
        target = _target(table, vschema, default_keyspace, reads)
        if target is None:
            continue
        keyspace, name = target
        written = table.name
        table.set("this", exp.to_identifier(name))
        table.set("db", exp.to_identifier(keyspace))
        if table is not insert_target and not table.alias and written != name:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(written)))
    return out


def _tables(stmt: exp.Expr) -> list[exp.Table]:
    ctes = {c.alias_or_name.lower() for c in stmt.find_all(exp.CTE)}
    return [t for t in stmt.find_all(exp.Table) if t.name and t.name.lower() not in ctes]


def _target(
    table: exp.Table, vschema: VSchema, default_keyspace: str | None, reads: bool
) -> tuple[str, str] | None:
    return vschema.routing_target(table.name, table.db or None, default_keyspace, reads=reads)


def _insert_target(stmt: exp.Expr) -> exp.Table | None:
    if not isinstance(stmt, exp.Insert):
        return None
    target = stmt.this
    if isinstance(target, exp.Schema):
        target = target.this
    return target if isinstance(target, exp.Table) else None
