"""Sending a statement with several query scopes to the shards as one query.

A *scope* is one SELECT: the outer query, a derived table, a subquery, or one
side of a UNION. Two ways let the whole statement run on the shards unchanged
(Vitess merges these into one route too):

* **one shard**: every sharded table of every scope is pinned by a unique
  vindex equality to the same value of the same vindex (``WHERE id = 5`` in
  each), so every row any scope can read lives on that one shard. Each table
  is pinned by the terms naming it (its alias, when it has one) that filter
  its rows: WHERE, inner joins' ON, and the ON of its own LEFT JOIN; in
  ``t1 LEFT JOIN t1 b ON t1.id = b.n WHERE t1.id = 3`` only ``t1`` is
  pinned, so the join is no single-shard route;
* **co-located subqueries**: every sharded table of each subquery is tied by
  an equality of primary vindex columns (same vindex function) to a table of
  the outer query or of an already tied table, e.g.
  ``EXISTS (SELECT 1 FROM user_extra e WHERE e.user_id = u.id)``: for each
  outer row, the rows the subquery can match live on the outer row's shard,
  so each shard answers for its own outer rows.

Anything else is left to the caller (pull-outs, nested loops or a refusal).
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from shardgate.engine.primitive import Opcode
from shardgate.planner.routing import RouteChoice, choose, conjuncts
from shardgate.vindexes import Lookup, Vindex
from shardgate.vschema import Table, TableType, VSchema


def scope_of(node: exp.Expr) -> exp.Select | None:
    """The SELECT a node belongs to (its nearest enclosing SELECT)."""
    return node.find_ancestor(exp.Select)


def scopes(stmt: exp.Expr) -> list[exp.Select]:
    """Every SELECT of the statement, outermost first."""
    return list(stmt.find_all(exp.Select))


def scope_tables(scope: exp.Select) -> list[exp.Table]:
    """The tables read directly by one SELECT (FROM and JOIN, not subqueries)."""
    return [t for t in scope.find_all(exp.Table) if t.name and scope_of(t) is scope]


def is_dual(node: exp.Table) -> bool:
    """``FROM dual``: MySQL's one-row table, which no shard needs."""
    return node.name.lower() == "dual" and not node.db


def _scope_terms(scope: exp.Select) -> list[exp.Expr]:
    terms = list(conjuncts(scope.args.get("where")))
    for join in scope.args.get("joins") or []:
        terms.extend(conjuncts(join.args.get("on")))
    return terms


def _alias(node: exp.Table) -> str:
    return (node.alias or node.name).lower()


def _restricting_terms(scope: exp.Select, node: exp.Table) -> list[exp.Expr]:
    """The scope's AND terms every row of ``node`` in its result satisfies.

    WHERE and the ON of inner joins filter every table's rows; the ON of a
    LEFT JOIN only those of the tables it joins (its right side): the rows
    before it are kept when it fails (NULL-extended). RIGHT and FULL joins'
    ON terms are not counted for any table.
    """
    terms = list(conjuncts(scope.args.get("where")))
    for join in scope.args.get("joins") or []:
        side = (join.side or "").upper()
        if not side or (side == "LEFT" and any(
                t is node for t in join.this.find_all(exp.Table))):
            terms.extend(conjuncts(join.args.get("on")))
    return terms


def _vindex_key(v: Vindex) -> tuple[object, ...]:
    """Vindexes with equal keys map equal values to equal keyspace ids."""
    if isinstance(v, Lookup):
        return ("lookup", id(v))
    return (type(v), tuple(sorted(v.params.items())))


def _resolve(
    stmt: exp.Expr, vschema: VSchema, default_ks: str | None
) -> Iterator[tuple[exp.Select, exp.Table, Table]]:
    for scope in scopes(stmt):
        for node in scope_tables(scope):
            if is_dual(node):
                continue
            yield scope, node, vschema.find_table(node.name, node.db or None, default_ks)


def single_shard(stmt: exp.Expr, vschema: VSchema, default_ks: str | None) -> RouteChoice | None:
    """The one EqualUnique route every sharded table of every scope agrees on."""
    found: RouteChoice | None = None
    key: tuple[object, ...] | None = None
    for scope, node, table in _resolve(stmt, vschema, default_ks):
        if table.type == TableType.REFERENCE or not vschema.keyspace(table.keyspace).sharded:
            continue
        # An aliased table's columns are named by its alias only: ``t1.id = 3`` in
        # ``t1 JOIN t1 t1b`` pins t1, never t1b.
        names = {_alias(node)}
        if len(scope_tables(scope)) == 1:
            names.add("")
        terms = _restricting_terms(scope, node)
        choice = choose(table, exp.and_(*terms) if terms else None, names)
        if choice.opcode is not Opcode.EQUAL_UNIQUE or choice.vindex is None:
            return None
        this_key = (_vindex_key(choice.vindex), tuple(
            v.describe() for v in choice.values if not isinstance(v, tuple)
        ), len(choice.values))
        if key is None:
            found, key = choice, this_key
        elif this_key != key:
            return None
    return found


def only_derived_tables(stmt: exp.Select) -> bool:
    """True when every nested SELECT lies in a derived table of ``stmt``'s FROM/JOINs."""
    sources = [j.this for j in stmt.args.get("joins") or []]
    frm = stmt.args.get("from_")
    if frm is not None:
        sources.append(frm.this)
    derived = [s for s in sources if isinstance(s, exp.Subquery)]
    for node in stmt.find_all(exp.Select):
        if node is stmt:
            continue
        parent = node.parent
        while parent is not None and parent is not stmt and not any(parent is d for d in derived):
            parent = parent.parent
        if parent is None or parent is stmt:
            return False
    return True


def same_vindex(a: Table, b: Table) -> bool:
    """True when ``a`` and ``b`` have one-column primary vindexes computing the same
    function: equal values of those columns live on the same shard."""
    pa, pb = a.primary, b.primary
    if pa is None or pb is None or len(pa.columns) != 1 or len(pb.columns) != 1:
        return False
    if pa.vindex is pb.vindex:
        return True
    return not isinstance(pa.vindex, Lookup) and _vindex_key(pa.vindex) == _vindex_key(pb.vindex)


def colocated_subqueries(
    stmt: exp.Select, vschema: VSchema, default_ks: str | None
) -> bool:
    """True when every subquery's sharded tables are tied to the outer rows' shard.

    ``stmt``'s own tables must already be co-located (checked by the caller).
    Derived tables (subqueries in FROM) are not handled here.
    """
    resolved = list(_resolve(stmt, vschema, default_ks))
    aliases = [_alias(node) for _, node, _ in resolved]
    if len(set(aliases)) != len(aliases):
        return False  # a shadowed alias: columns could name either table
    tables = {_alias(node): table for _, node, table in resolved}
    anchored = {_alias(node) for scope, node, _ in resolved if scope is stmt}
    pending: list[tuple[exp.Select, str]] = []
    for scope, node, table in resolved:
        if scope is stmt:
            continue
        if isinstance(scope.parent, exp.Subquery) and isinstance(
            scope.parent.parent, exp.From | exp.Join
        ):
            if scope.parent.parent.parent is stmt:
                anchored.add(_alias(node))  # a derived table of the outer query: a join side
                continue
            return False
        if table.type == TableType.REFERENCE:
            anchored.add(_alias(node))
        elif vschema.keyspace(table.keyspace).sharded:
            pending.append((scope, _alias(node)))
        else:
            return False
    progress = True
    while pending and progress:
        progress = False
        for scope, alias in list(pending):
            if _tied(scope, alias, anchored, tables):
                anchored.add(alias)
                pending.remove((scope, alias))
                progress = True
    return not pending


def _tied(scope: exp.Select, alias: str, anchored: set[str], tables: dict[str, Table]) -> bool:
    table = tables[alias]
    if table.primary is None:
        return False
    for term in _scope_terms(scope):
        if not (isinstance(term, exp.EQ) and isinstance(term.left, exp.Column)
                and isinstance(term.right, exp.Column)):
            continue
        single = len(scope_tables(scope)) == 1
        for mine, other in ((term.left, term.right), (term.right, term.left)):
            # an unqualified column of a one-table subquery naming that table's
            # vindex column is that table's (the innermost scope wins in SQL)
            if not (mine.table.lower() == alias or (single and not mine.table)):
                continue
            if other.table.lower() not in anchored:
                continue
            other_table = tables.get(other.table.lower())
            if other_table is None or other_table.primary is None:
                continue
            if mine.name.lower() == table.primary.columns[0] and \
                    other.name.lower() == other_table.primary.columns[0] and \
                    same_vindex(table, other_table):
                return True
    return False
