"""Choosing a route: which vindex a WHERE clause lets us use, and with what values.

The rules (V3 design): split the WHERE into its top-level AND terms; a term
``col = const``, ``col IN (consts)`` or an OR of equalities on one column
constrains ``col``; ``col IS NULL`` only on the primary vindex (whose column
no row can have NULL: the route goes nowhere). Each column vindex of the table whose columns
are all constrained gives a candidate route; the best opcode wins
(None < EqualUnique < Equal < IN < Scatter), then the lowest vindex cost.
``write_only`` lookups are never used for routing. A value that is NULL in an
equality can match no row: the route goes nowhere (opcode None), as does a
statement with an always-false AND term (``col = NULL``, ``1 IN ('aa')``).
Integer arithmetic of literals is folded (``id = 5+5`` routes by 10). A
column of a single-column vindex inside a tuple IN (``(name, col) IN
(('a', 1), ('b', 2))``) routes by that column's values (opcode MultiEqual).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from shardgate.engine.primitive import Opcode
from shardgate.errors import InvalidArgument
from shardgate.evalengine.values import Literal, SQLExpr, Value, from_expression
from shardgate.keys import KeyRange, parse_key_range
from shardgate.planner.fold import always_false, folded_literal
from shardgate.sql.rewrite import flatten
from shardgate.vindexes import Lookup, MultiColumn, Vindex
from shardgate.vindexes.binary import Binary
from shardgate.vschema import Table


@dataclass(frozen=True)
class RouteChoice:
    opcode: Opcode
    vindex: Vindex | None = None
    values: tuple[Value | tuple[Value, ...], ...] = ()
    #: for IN routes on one column: the WHERE term (IN list or OR of
    #: equalities) the planner may rewrite to send each shard only its values
    term: exp.Expr | None = None
    #: the vindex's columns, which ``values`` are compared with
    columns: tuple[str, ...] = ()


#: column -> (values, the IN/OR term, or None when it cannot be rewritten per shard)
InLists = dict[str, tuple[tuple[Value | tuple[Value, ...], ...], exp.Expr | None]]


def conjuncts(where: exp.Expr | None) -> Iterator[exp.Expr]:
    """The top-level AND terms of ``where``, left to right (without recursion)."""
    if where is None:
        return
    yield from flatten(where.this if isinstance(where, exp.Where) else where, exp.And)


def _column_of(node: exp.Expr, names: set[str]) -> str | None:
    """The lowercase column name if ``node`` is a column of this table."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Column):
        return None
    qual = node.table.lower()
    if qual and qual not in names:
        return None
    if not qual and "" not in names:
        return None
    return node.name.lower()


def constant_value(node: exp.Expr) -> Value | None:
    """The routing value of a constant (folding integer arithmetic), or None."""
    try:
        value = from_expression(node)  # (converted once: IN lists may be long)
    except InvalidArgument:
        return folded_literal(node)
    return folded_literal(node) if isinstance(value, SQLExpr) else value


def _equality(node: exp.Expr, names: set[str]) -> tuple[str, Value] | None:
    if not isinstance(node, exp.EQ):
        return None
    for col_side, val_side in ((node.left, node.right), (node.right, node.left)):
        col = _column_of(col_side, names)
        if col is None:
            continue
        value = constant_value(val_side)
        if value is not None:
            return col, value
    return None


def constraints(
    where: exp.Expr | None, names: set[str]
) -> tuple[dict[str, Value], InLists]:
    """Equalities and IN lists on columns of the table named by ``names``.

    ``names`` holds the table's name and alias, and ``""`` when unqualified
    columns belong to it (single-table statements).
    """
    eqs: dict[str, Value] = {}
    ins: InLists = {}
    for term in conjuncts(where):
        eq = _equality(term, names)
        if eq is not None:
            eqs.setdefault(eq[0], eq[1])
            continue
        if isinstance(term, exp.Is):
            continue  # IS NULL is not "= NULL": see null_columns
        if isinstance(term, exp.In) and not term.args.get("query") and not term.args.get("not"):
            col = _column_of(term.this, names)
            values = [constant_value(i) for i in term.expressions]
            if col is not None and values and all(v is not None for v in values):
                ins.setdefault(col, (tuple(v for v in values if v is not None), term))
            elif isinstance(term.this, exp.Tuple):
                _tuple_in(term, names, ins)
            continue
        if isinstance(term, exp.Or):
            found = _or_of_equalities(term, names)
            if found is not None:
                ins.setdefault(found[0], (found[1], term))
    return eqs, ins


def null_columns(where: exp.Expr | None, names: set[str]) -> set[str]:
    """Columns of the table named by ``names`` that a top-level ``col IS NULL`` constrains."""
    out: set[str] = set()
    for term in conjuncts(where):
        if isinstance(term, exp.Is) and isinstance(term.expression, exp.Null):
            col = _column_of(term.this, names)
            if col is not None:
                out.add(col)
    return out


def _tuple_in(term: exp.In, names: set[str], ins: InLists) -> None:
    """``(a, b) IN ((1, 2), (3, 4))``: recorded under the key ``"a,b"``.

    Each column of the tuple is also recorded on its own (``a`` with ``1, 3``)
    with no rewritable term: a single-column vindex on it routes MultiEqual.
    Nested tuples (``((a, b), c) IN (((1, 2), 3))``) pair up position by
    position; a row whose shape differs makes the term unusable for routing.
    """
    rows: list[list[tuple[exp.Expr, exp.Expr]]] = []
    for item in term.expressions:
        pairs: list[tuple[exp.Expr, exp.Expr]] = []
        if not _pair_up(term.this, item, pairs):
            return
        rows.append(pairs)
    if not rows:
        return
    leaves = [left for left, _ in rows[0]]
    cols = [_column_of(c, names) for c in leaves]
    values = [[constant_value(right) for _, right in row] for row in rows]
    flat = all(not isinstance(e, exp.Tuple) for e in term.this.expressions)
    if flat and all(c is not None for c in cols) and all(
        v is not None for row in values for v in row
    ):
        key = ",".join(c for c in cols if c is not None)
        ins.setdefault(key, (tuple(tuple(v for v in row if v is not None) for row in values),
                             term))
    if len(cols) < 2:
        return
    for i, col in enumerate(cols):
        column_values = [row[i] for row in values]
        if col is not None and all(v is not None for v in column_values):
            ins.setdefault(col, (tuple(v for v in column_values if v is not None), None))


def _pair_up(
    left: exp.Expr, right: exp.Expr, out: list[tuple[exp.Expr, exp.Expr]]
) -> bool:
    """Pair each leaf of the tuple ``left`` with the value at its place in ``right``."""
    if isinstance(left, exp.Tuple):
        if not isinstance(right, exp.Tuple) or len(right.expressions) != len(left.expressions):
            return False
        return all(_pair_up(a, b, out) for a, b in zip(left.expressions, right.expressions,
                                                       strict=True))
    if isinstance(right, exp.Tuple):
        return False
    out.append((left, right))
    return True


def _or_of_equalities(
    node: exp.Expr, names: set[str]
) -> tuple[str, tuple[Value, ...]] | None:
    terms = list(flatten(node, exp.Or))
    col: str | None = None
    values: list[Value] = []
    for t in terms:
        eq = _equality(t, names)
        if eq is None or (col is not None and eq[0] != col):
            return None
        col = eq[0]
        values.append(eq[1])
    return (col, tuple(values)) if col is not None else None


#: the identity vindex pinned tables route by (Vitess does the same: ``binary``)
PINNED_VINDEX = Binary("binary", {})


def pinned_choice(table: Table) -> RouteChoice | None:
    """A pinned table's route: EqualUnique on its pinned keyspace id, or None if not pinned."""
    if table.pinned is None:
        return None
    return RouteChoice(Opcode.EQUAL_UNIQUE, PINNED_VINDEX, (Literal(table.pinned),))


def choose(table: Table, where: exp.Expr | None, names: set[str]) -> RouteChoice:
    """The best route for a statement on ``table`` given its WHERE clause."""
    pinned = pinned_choice(table)
    if pinned is not None:
        return pinned
    if any(always_false(t) for t in conjuncts(where)):
        return RouteChoice(Opcode.NONE)
    eqs, ins = constraints(where, names)
    primary = table.primary
    if primary is not None and null_columns(where, names) & set(primary.columns):
        # Inserts refuse a NULL primary vindex value and updates cannot change
        # it: no row has one. Other vindex columns may well hold NULL (a lookup
        # with ignore_nulls has no row for it), so there IS NULL routes nothing.
        return RouteChoice(Opcode.NONE, primary.vindex)
    best: RouteChoice = RouteChoice(Opcode.SCATTER)
    best_key = (Opcode.SCATTER.rank, 1 << 30)
    for cv in table.column_vindexes:
        v = cv.vindex
        if isinstance(v, Lookup) and v.write_only:
            continue
        choice: RouteChoice | None = None
        if len(cv.columns) > 1 or isinstance(v, MultiColumn):
            joined = ",".join(cv.columns)
            if joined in ins and not all(c in eqs for c in cv.columns):
                choice = RouteChoice(Opcode.IN, v, ins[joined][0])
            elif all(c in eqs for c in cv.columns):
                vals = tuple(eqs[c] for c in cv.columns)
                if any(isinstance(x, Literal) and x.value is None for x in vals):
                    choice = RouteChoice(Opcode.NONE, v)
                else:
                    choice = RouteChoice(Opcode.EQUAL_UNIQUE if v.unique else Opcode.EQUAL,
                                         v, (vals,))
        else:
            col = cv.columns[0]
            if col in eqs:
                val = eqs[col]
                if isinstance(val, Literal) and val.value is None:
                    choice = RouteChoice(Opcode.NONE, v)
                else:
                    choice = RouteChoice(
                        Opcode.EQUAL_UNIQUE if v.unique else Opcode.EQUAL, v, (val,)
                    )
            elif col in ins:
                values, term = ins[col]
                opcode = Opcode.IN if term is not None else Opcode.MULTI_EQUAL
                choice = RouteChoice(opcode, v, values, term=term)
        if choice is None and len(cv.columns) == 1 and not isinstance(v, MultiColumn):
            choice = _or_choice(v, cv.columns[0], where, names)
        if choice is None:
            continue
        choice = dataclasses.replace(choice, columns=cv.columns)
        key = (choice.opcode.rank, v.cost)
        if key < best_key:
            best, best_key = choice, key
    return best


def _branch_values(branch: exp.Expr, col: str, names: set[str]) -> list[Value] | None:
    """The values ``col`` may take in rows matching ``branch`` ([] for none), or None."""
    if any(always_false(t) for t in conjuncts(branch)):
        return []
    eqs, ins = constraints(branch, names)
    if col in eqs:
        value = eqs[col]
        return [] if isinstance(value, Literal) and value.value is None else [value]
    if col in ins:
        return [v for v in ins[col][0] if not isinstance(v, tuple)]
    ors = [t for t in conjuncts(branch) if isinstance(t, exp.Or)]
    for term in ors:
        found = _or_values(term, col, names)
        if found is not None:
            return found
    return None


def _or_values(term: exp.Or, col: str, names: set[str]) -> list[Value] | None:
    out: dict[str, Value] = {}
    for branch in flatten(term, exp.Or):  # (iterative: 1,000 terms are 1,000 levels)
        values = _branch_values(branch, col, names)
        if values is None:
            return None
        for v in values:
            out.setdefault(v.describe(), v)
    return list(out.values())


def _or_choice(
    v: Vindex, col: str, where: exp.Expr | None, names: set[str]
) -> RouteChoice | None:
    """OR/AND mixes: ``id = 1 OR (name = 'a' AND id IN (1, 2))`` routes by ``id`` 1, 2.

    A top-level OR term constrains a column when every branch does (by an
    equality, an IN list, or a nested OR); the route takes all their values.
    """
    for term in conjuncts(where):
        if not isinstance(term, exp.Or):
            continue
        values = _or_values(term, col, names)
        if values is None:
            continue
        if not values:
            return RouteChoice(Opcode.NONE, v)
        return RouteChoice(Opcode.IN, v, tuple(values))
    return None


def extract_keyrange(stmt: exp.Select) -> tuple[exp.Select, KeyRange | None]:
    """Remove a top-level ``keyrange(...)`` term from the WHERE clause.

    ``keyrange('-80')`` takes a shard name or key range; ``keyrange('40', '80')``
    takes hex bounds (empty = unbounded), as in Vitess's V3 query splitting.
    """
    where = stmt.args.get("where")
    terms = list(conjuncts(where))
    found: KeyRange | None = None
    rest = []
    for t in terms:
        if isinstance(t, exp.Anonymous) and str(t.this).lower() == "keyrange":
            if found is not None:
                raise InvalidArgument("use keyrange(...) at most once per query")
            args = t.expressions
            if not all(isinstance(a, exp.Literal) and a.is_string for a in args) or \
                    len(args) not in (1, 2):
                raise InvalidArgument(
                    "keyrange takes a shard name ('-80') or two hex bounds ('40', '80')"
                )
            if len(args) == 1:
                found = parse_key_range(args[0].this)
            else:
                found = parse_key_range(f"{args[0].this}-{args[1].this}")
        else:
            rest.append(t)
    if found is None:
        return stmt, None
    out = stmt.copy()
    out.set("where", exp.Where(this=exp.and_(*[t.copy() for t in rest])) if rest else None)
    return out, found
