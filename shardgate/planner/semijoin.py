"""Correlated subqueries the shards cannot answer whole (Vitess's SemiJoin).

``EXISTS (SELECT ...)``, ``x [NOT] IN (SELECT ...)`` and scalar subqueries in
WHERE or the select list that name columns of the outer query, when neither
one shard holds every row (:func:`~shardgate.planner.merge.single_shard`) nor
the subquery is tied to the outer rows' shard by the primary vindex
(:func:`~shardgate.planner.merge.colocated_subqueries`):

1. the outer query's tables run without those terms, returning the columns the
   statement uses (Vitess's LHS);
2. each subquery's value is appended to every outer row by a
   :class:`~shardgate.engine.semijoin.CorrelatedSubquery`: *keyed* when the
   subquery is row-wise and tied to the outer query only by top-level WHERE
   equalities ``inner.col = outer.col`` (it runs once per batch of outer keys,
   ``inner.col IN (:__sg_ckN)``), else *per row* (the outer columns become bind
   variables ``:__sg_oN_i``; it runs once per distinct tuple of their values);
3. the WHERE terms holding the subqueries filter at the gate (NOT EXISTS and
   NOT IN with SQL's NULL rules: ``x NOT IN`` a set holding NULL is never
   true), then the statement is finished there (aggregates, ORDER BY, LIMIT,
   select list: :func:`~shardgate.planner.finish.finish_at_gate`).

Columns of an outer query over several tables must be qualified, and the
select list must name its columns (no ``*``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from shardgate.engine.postprocess import Filter
from shardgate.engine.primitive import Primitive
from shardgate.engine.probe import TypeChecked
from shardgate.engine.semijoin import CorrelatedSubquery, SubqueryKind
from shardgate.errors import Unsupported
from shardgate.evalengine.evaluate import canonical, compile_expr
from shardgate.planner.finish import finish_at_gate
from shardgate.planner.join import TableRef, _filters_rows, keep_labels
from shardgate.planner.routing import conjuncts
from shardgate.planner.select import ORDERING, needs_aggregation

PlanFn = Callable[[exp.Expression], Primitive]

SUBQUERY_COLUMN = "__sg_cs{}"
KEYS_VAR = "__sg_ck{}"
OUTER_VAR = "__sg_o{}_{}"


@dataclass
class _Correlated:
    """One correlated subquery of the outer query (nodes of the outer query's copy)."""

    node: exp.Expr
    kind: SubqueryKind
    inner: exp.Expression
    #: the outer columns the subquery names, distinct, in order
    outer_columns: list[exp.Column]
    #: IN's left operand
    needle: exp.Expr | None


def _defined_aliases(query: exp.Expr) -> set[str]:
    """Every table name or alias, and derived-table alias, a query defines at any depth."""
    out = {(t.alias or t.name).lower() for t in query.find_all(exp.Table)}
    out |= {s.alias.lower() for s in query.find_all(exp.Subquery) if s.alias}
    return out


def _clause(node: exp.Expr, stmt: exp.Select) -> str | None:
    """The clause of ``stmt`` (its arg name) ``node`` lies in, if no other scope is between."""
    child: exp.Expr = node
    parent = node.parent
    while parent is not None and parent is not stmt:
        if isinstance(parent, exp.Select | exp.From | exp.Join | exp.Subquery):
            return None
        child, parent = parent, parent.parent
    return child.arg_key if parent is stmt else None


def _outer_columns(inner: exp.Expr, outer: set[str]) -> list[exp.Column] | None:
    """The columns of ``outer`` aliases ``inner`` names; None when it names an alias
    neither defines (a scope further out)."""
    defined = _defined_aliases(inner)
    found: dict[str, exp.Column] = {}
    for c in inner.find_all(exp.Column):
        qual = c.table.lower()
        if not qual or qual in defined:
            continue
        if qual not in outer:
            return None
        found.setdefault(canonical(c), c)
    return list(found.values())


def _find(stmt: exp.Select, outer: set[str]) -> list[_Correlated] | None:
    """The correlated subqueries of ``stmt``'s WHERE and select list; None when one
    cannot be answered here (elsewhere in the statement, a quantified comparison,
    or naming a scope further out)."""
    found: list[_Correlated] = []
    for node in list(stmt.find_all(exp.Exists, exp.In, exp.Subquery)):
        if isinstance(node, exp.Subquery) and (
            isinstance(node.parent, exp.In | exp.Exists) or (node.arg_key in ("from_", "this")
            and isinstance(node.parent, exp.From | exp.Join))
        ):
            continue
        if isinstance(node, exp.In) and not node.args.get("query"):
            continue
        clause = _clause(node, stmt)
        if clause is None:
            continue
        query: exp.Expr
        if isinstance(node, exp.Exists):
            query, kind, needle = node.this, SubqueryKind.EXISTS, None
        elif isinstance(node, exp.In):
            query, kind, needle = node.args["query"], SubqueryKind.IN, node.this
        else:
            query, kind, needle = node, SubqueryKind.VALUE, None
        while isinstance(query, exp.Subquery) and not any(
                query.args.get(a) is not None for a in ORDERING):
            query = query.this
        if not isinstance(query, exp.Query) or not isinstance(query, exp.Expression):
            return None
        columns = _outer_columns(query, outer)
        if columns is None:
            return None
        if not columns:
            continue  # uncorrelated: pulled out before, or answered where it is
        if clause not in ("where", "expressions") or isinstance(node.parent, exp.Any | exp.All):
            return None
        found.append(_Correlated(node, kind, query, columns, needle))
    return found


def _key_terms(
    inner: exp.Select, outer: set[str]
) -> tuple[list[tuple[exp.Column, exp.Column]], list[exp.Expr]] | None:
    """``inner``'s WHERE split into correlation equalities (inner column, outer
    column) and the other terms, when only such equalities name the outer query."""
    keys: list[tuple[exp.Column, exp.Column]] = []
    rest: list[exp.Expr] = []
    defined = _defined_aliases(inner)

    def is_outer(c: exp.Expr) -> bool:
        return isinstance(c, exp.Column) and bool(c.table) and c.table.lower() in outer \
            and c.table.lower() not in defined

    for term in conjuncts(inner.args.get("where")):
        if isinstance(term, exp.EQ) and isinstance(term.left, exp.Column) and \
                isinstance(term.right, exp.Column):
            a, b = term.left, term.right
            if is_outer(a) and not is_outer(b):
                a, b = b, a
            if is_outer(b) and not is_outer(a):
                keys.append((a, b))
                continue
        if any(is_outer(c) for c in term.find_all(exp.Column)):
            return None
        rest.append(term)
    return (keys, rest) if keys else None


def _keyed_inner(found: _Correlated, outer: set[str], var: str
                 ) -> tuple[exp.Select, list[exp.Column]] | None:
    """The subquery returning its key columns (then IN's value), filtered by the
    outer keys' list ``var``; and the outer key columns, in order. None if the
    subquery cannot be answered by key (it aggregates, limits, or names the outer
    query elsewhere)."""
    inner = found.inner
    if found.kind is SubqueryKind.VALUE or not isinstance(inner, exp.Select) or \
            inner.find(exp.Window):
        return None  # a scalar subquery's value is its one row's: per row
    bare = inner.copy()
    bare.set("distinct", None)
    bare.set("order", None)
    limit = bare.args.get("limit")
    if limit is not None and found.kind is SubqueryKind.EXISTS and \
            bare.args.get("offset") is None and isinstance(limit.expression, exp.Literal) \
            and limit.expression.is_int and int(limit.expression.this) >= 1:
        bare.set("limit", None)  # EXISTS needs one row: LIMIT n >= 1 changes nothing
    if needs_aggregation(bare) or any(bare.args.get(a) is not None for a in ORDERING):
        return None
    if any(n is not bare for n in bare.find_all(exp.Select)) and \
            _outer_columns_nested(bare, outer):
        return None
    split = _key_terms(bare, outer)
    if split is None:
        return None
    keys, rest = split
    for join in bare.args.get("joins") or []:
        if any(c.table.lower() in outer and c.table.lower() not in _defined_aliases(bare)
               for c in join.find_all(exp.Column)):
            return None
    items: list[exp.Expr] = [a.copy() for a, _b in keys]
    if found.kind is SubqueryKind.IN:
        value = bare.expressions
        if len(value) != 1 or isinstance(value[0], exp.Star) or value[0].is_star:
            return None
        if any(c.table.lower() in outer and c.table.lower() not in _defined_aliases(bare)
               for c in value[0].find_all(exp.Column)):
            return None
        items.append(value[0].copy())
    bare.set("expressions", items)
    terms = [t.copy() for t in rest]
    terms.append(exp.In(this=keys[0][0].copy(), expressions=[exp.Placeholder(this=var)]))
    bare.set("where", exp.Where(this=exp.and_(*terms)))
    return bare, [b for _a, b in keys]


def _outer_columns_nested(inner: exp.Select, outer: set[str]) -> bool:
    """Whether a subquery nested in ``inner`` names the outer query."""
    for sub in inner.find_all(exp.Select):
        if sub is inner:
            continue
        defined = _defined_aliases(inner)
        if any(c.table.lower() in outer and c.table.lower() not in defined
               for c in sub.find_all(exp.Column)):
            return True
    return False


def _per_row_inner(found: _Correlated, n: int) -> tuple[exp.Expression, list[str]]:
    """The subquery with its outer columns as bind variables, and their names."""
    names = {canonical(c): OUTER_VAR.format(n, i) for i, c in enumerate(found.outer_columns)}
    defined = _defined_aliases(found.inner)

    def bind(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table and \
                node.table.lower() not in defined and canonical(node) in names:
            return exp.Placeholder(this=names[canonical(node)])
        return node

    inner = found.inner.copy().transform(bind)
    assert isinstance(inner, exp.Expression)
    if found.kind is SubqueryKind.EXISTS and isinstance(inner, exp.Select) and \
            inner.args.get("limit") is None:
        inner = inner.limit(1)
    return inner, list(names.values())


def _needed_columns(stmt: exp.Select, gate_terms: Sequence[exp.Expr],
                    extra: Sequence[exp.Expr]) -> list[exp.Column]:
    """The outer columns the gate needs after the shards answer: the select list,
    the gate's WHERE terms, GROUP BY, HAVING, ORDER BY, and ``extra``."""
    aliases = {e.alias.lower() for e in stmt.expressions if isinstance(e, exp.Alias)}
    later: list[exp.Expr] = []
    for arg in ("group", "having", "order"):
        node = stmt.args.get(arg)
        if node is not None:
            later.append(node)
    needed: dict[str, exp.Column] = {}

    def add(c: exp.Column, after_select: bool) -> None:
        if c.find_ancestor(exp.Select) is not stmt and c.find_ancestor(exp.Select) is not None:
            return  # inside a subquery of the statement
        if c.name.startswith("__sg_cs") or c.is_star:
            return
        if after_select and not c.table and c.name.lower() in aliases:
            return  # a select alias
        needed.setdefault(canonical(c), c)

    for node in [*stmt.expressions, *gate_terms]:
        for c in node.find_all(exp.Column):
            add(c, False)
    for node in later:
        for c in node.find_all(exp.Column):
            add(c, True)
    for node in extra:
        for c in ([node] if isinstance(node, exp.Column) else node.find_all(exp.Column)):
            needed.setdefault(canonical(c), c)
    return list(needed.values())


def plan_semijoins(
    stmt: exp.Select, refs: Sequence[TableRef], plan: PlanFn, keyspace: str,
    one_keyspace: bool,
) -> Primitive | None:
    """``stmt`` with its correlated subqueries answered at the gate, or None when it
    has none this can answer (the caller then refuses it)."""
    outer = {r.alias for r in refs}
    out = stmt.copy()
    found = _find(out, outer)
    if not found:
        return None
    if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
           for e in stmt.expressions):
        raise Unsupported("SELECT * with a correlated subquery the shards cannot answer "
                          "whole is not supported across shards: name the columns")
    if needs_aggregation(out) and any(_clause(f.node, out) == "expressions" for f in found):
        raise Unsupported("a correlated subquery in the select list of an aggregating query "
                          "across shards is not supported")
    keep_labels(out, [f.node for f in found])
    value_matters = [not _filters_rows(f.node) for f in found]
    needles = [f.needle.copy() for f in found if f.needle is not None]
    for j, f in enumerate(found):
        f.node.replace(exp.column(SUBQUERY_COLUMN.format(j)))
    where = out.args.get("where")
    gate_terms: list[exp.Expr] = []
    shard_terms: list[exp.Expr] = []
    for term in conjuncts(where):
        marked = any(c.name.startswith("__sg_cs") for c in term.find_all(exp.Column))
        (gate_terms if marked else shard_terms).append(term)
    correlation = [c for f in found for c in f.outer_columns]
    needed = _needed_columns(out, gate_terms, [*needles, *correlation])
    single = len(refs) == 1
    if not single and any(not c.table for c in needed):
        raise Unsupported(
            "a correlated subquery over a join across shards needs every column of the "
            "outer query qualified with its table"
        )
    slots: dict[str, int] = {}
    for i, c in enumerate(needed):
        slots.setdefault(canonical(c), i)
        if single:
            slots.setdefault(c.name.lower(), i)
            slots.setdefault(f"{refs[0].alias}.{c.name.lower()}", i)
    items: list[exp.Expr] = [c.copy() for c in needed] or [exp.Literal.number(1)]
    outer_stmt = exp.Select(expressions=items)
    outer_stmt.set("from_", out.args["from_"].copy())
    if out.args.get("joins"):
        outer_stmt.set("joins", [j.copy() for j in out.args["joins"]])
    if shard_terms:
        outer_stmt.set("where", exp.Where(this=exp.and_(*[t.copy() for t in shard_terms])))
    rows: Primitive = plan(outer_stmt)
    width = len(items)
    keyspaces = tuple(sorted({r.table.keyspace for r in refs}))
    needle_iter = iter(needles)
    for j, f in enumerate(found):
        needle = next(needle_iter) if f.needle is not None else None
        var = KEYS_VAR.format(j)
        keyed = _keyed_inner(f, outer, var)
        inner_stmt: exp.Expression
        if keyed is not None:
            inner_stmt, outer_keys = keyed
            inner_keys = tuple(range(len(outer_keys)))
            names: tuple[str, ...] = (var,)
            value_column = len(outer_keys)
        else:
            per_row, bound = _per_row_inner(f, j)
            inner_stmt, outer_keys, inner_keys = per_row, f.outer_columns, ()
            names, value_column = tuple(bound), 0
        positions = tuple(slots[canonical(c)] for c in outer_keys)
        rows = CorrelatedSubquery(
            rows, plan(inner_stmt), f.kind, positions, inner_keys, names, keyspace=keyspace,
            needle=compile_expr(needle, slots) if needle is not None else None,
            value_column=value_column, value_matters=value_matters[j], keyspaces=keyspaces,
        )
        slots[SUBQUERY_COLUMN.format(j)] = width + j
    if gate_terms:
        predicate = exp.and_(*gate_terms)
        rows = Filter(rows, compile_expr(predicate, slots), predicate.sql(dialect="mysql"),
                      keyspace=keyspace)
    out.set("where", None)
    done = finish_at_gate(out, rows, slots, keyspace)
    return TypeChecked(done, keyspace, stmt) if one_keyspace else done
