"""Multi-table DELETE/UPDATE as a single-table statement with EXISTS.

``DELETE t FROM tbl AS t JOIN other AS o ON t.a = o.a WHERE w`` deletes the
rows of ``tbl`` that have a matching ``other`` row; so does
``DELETE FROM tbl WHERE <t-only terms of w> AND EXISTS (SELECT 1 FROM other AS
o WHERE tbl.a = o.a AND <other terms of w>)``, which every engine accepts
(SQLite has no multi-table DELETE, PostgreSQL spells it USING). UPDATE is
rewritten the same way when its SET reads only the target table's columns.
The caller sends the result to the shards only when the subquery is
co-located with the target rows (joined on the primary vindex) or pinned to
the same shard.
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.errors import Unsupported
from shardgate.planner.routing import conjuncts


def _names(table: exp.Table) -> set[str]:
    return {table.name.lower()} | ({table.alias.lower()} if table.alias else set())


def _qualifiers(node: exp.Expr) -> set[str]:
    return {c.table.lower() for c in node.find_all(exp.Column)}


def join_dml_as_exists(stmt: exp.Expression) -> exp.Expression | None:
    """The EXISTS form of a multi-table DELETE/UPDATE, or None if it is not one."""
    target = stmt.this
    if not isinstance(stmt, exp.Delete | exp.Update) or not isinstance(target, exp.Table):
        return None
    joins = list(target.args.get("joins") or [])
    if not joins:
        return None
    mine = _names(target)
    if isinstance(stmt, exp.Delete):
        targets = stmt.args.get("tables") or []
        if len(targets) != 1 or targets[0].name.lower() not in mine:
            raise Unsupported("a multi-table DELETE across shards must delete from one table")
    others: list[exp.Table] = []
    for j in joins:
        if j.side or j.kind or not isinstance(j.this, exp.Table) or j.args.get("using"):
            raise Unsupported(
                "a multi-table DELETE/UPDATE across shards takes inner joins of tables with ON"
            )
        if _names(j.this) & mine:
            raise Unsupported("a multi-table DELETE/UPDATE joining its target to itself "
                              "is not supported across shards")
        others.append(j.this)
    if isinstance(stmt, exp.Update):
        for a in stmt.expressions:
            if not (isinstance(a, exp.EQ) and isinstance(a.this, exp.Column)
                    and a.this.table.lower() in mine | {""}
                    and _qualifiers(a.expression) <= mine):
                raise Unsupported(
                    "a multi-table UPDATE across shards may set only its target's columns "
                    "from its target's (qualified) columns"
                )
    inner_terms: list[exp.Expr] = []
    outer_terms: list[exp.Expr] = []
    for j in joins:
        inner_terms.extend(conjuncts(j.args.get("on")))
    for term in conjuncts(stmt.args.get("where")):
        quals = _qualifiers(term)
        (outer_terms if quals and quals <= mine else inner_terms).append(term)
    probe = exp.Select(expressions=[exp.Literal.number(1)]).from_(others[0].copy())
    for j in joins[1:]:
        probe = probe.join(j.copy())
    if inner_terms:
        probe.set("where", exp.Where(this=exp.and_(*[t.copy() for t in inner_terms])))
    exists = exp.Exists(this=probe)
    out = stmt.copy()
    bare = target.copy()
    bare.set("joins", None)
    out.set("this", bare)
    out.set("tables", None)
    out.set("where", exp.Where(this=exp.and_(*[t.copy() for t in outer_terms], exists)))
    if isinstance(out, exp.Update):  # SET columns unqualified: SQLite accepts no other
        out.set("expressions", [exp.EQ(this=exp.column(a.this.name), expression=a.expression)
                                for a in out.expressions])
    alias = target.alias.lower() if target.alias else None
    if alias is None:
        return out
    name = target.name

    def rename(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table.lower() == alias:
            return exp.column(node.name, table=name)
        return node

    bare.set("alias", None)
    renamed = out.transform(rename)
    assert isinstance(renamed, exp.Expression)
    return renamed
