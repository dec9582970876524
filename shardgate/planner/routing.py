"""Choosing a route: which vindex a WHERE clause lets us use, and with what values.

The rules (V3 design): split the WHERE into its top-level AND terms; a term
``col = const``, ``col IN (consts)``, ``col IS NULL`` or an OR of equalities on
one column constrains ``col``. Each column vindex of the table whose columns
are all constrained gives a candidate route; the best opcode wins
(None < EqualUnique < Equal < IN < Scatter), then the lowest vindex cost.
``write_only`` lookups are never used for routing. A value that is NULL in an
equality can match no row: the route goes nowhere (opcode None).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from shardgate.engine.primitives import Opcode
from shardgate.engine.values import Literal, SQLExpr, Value, from_expression, is_constant
from shardgate.errors import InvalidArgument
from shardgate.keys import KeyRange, parse_key_range
from shardgate.sql.rewrite import flatten
from shardgate.vindexes import Lookup, MultiColumn, Vindex
from shardgate.vschema import Table


@dataclass(frozen=True)
class RouteChoice:
    opcode: Opcode
    vindex: Vindex | None = None
    values: tuple[Value | tuple[Value, ...], ...] = ()
    #: for IN routes on one column: the WHERE term (IN list or OR of
    #: equalities) the planner may rewrite to send each shard only its values
    term: exp.Expr | None = None


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


def _equality(node: exp.Expr, names: set[str]) -> tuple[str, Value] | None:
    if not isinstance(node, exp.EQ):
        return None
    for col_side, val_side in ((node.left, node.right), (node.right, node.left)):
        col = _column_of(col_side, names)
        if col is not None and is_constant(val_side):
            return col, from_expression(val_side)
    return None


def constraints(
    where: exp.Expr | None, names: set[str]
) -> tuple[dict[str, Value], dict[str, tuple[tuple[Value, ...], exp.Expr]]]:
    """Equalities and IN lists on columns of the table named by ``names``.

    ``names`` holds the table's name and alias, and ``""`` when unqualified
    columns belong to it (single-table statements).
    """
    eqs: dict[str, Value] = {}
    ins: dict[str, tuple[tuple[Value, ...], exp.Expr]] = {}
    for term in conjuncts(where):
        eq = _equality(term, names)
        if eq is not None:
            eqs.setdefault(eq[0], eq[1])
            continue
        if isinstance(term, exp.Is) and isinstance(term.expression, exp.Null):
            col = _column_of(term.this, names)
            if col is not None:
                eqs.setdefault(col, Literal(None))
            continue
        if isinstance(term, exp.In) and not term.args.get("query") and not term.args.get("not"):
            col = _column_of(term.this, names)
            values = _constants(term.expressions) if col is not None else None
            if col is not None and values:
                ins.setdefault(col, (values, term))
            elif isinstance(term.this, exp.Tuple):
                _tuple_in(term, names, ins)
            continue
        if isinstance(term, exp.Or):
            found = _or_of_equalities(term, names)
            if found is not None:
                ins.setdefault(found[0], (found[1], term))
    return eqs, ins


def _constants(items: list[exp.Expr]) -> tuple[Value, ...] | None:
    """The values of ``items`` if every one is a constant (each converted once)."""
    out = []
    for item in items:
        try:
            v = from_expression(item)
        except InvalidArgument:
            return None
        if isinstance(v, SQLExpr):
            return None
        out.append(v)
    return tuple(out)


def _tuple_in(
    term: exp.In, names: set[str], ins: dict[str, tuple[tuple[Value, ...], exp.Expr]]
) -> None:
    """``(a, b) IN ((1, 2), (3, 4))``: recorded under the key ``"a,b"``."""
    cols = [_column_of(c, names) for c in term.this.expressions]
    if any(c is None for c in cols):
        return
    rows: list[tuple[Value, ...]] = []
    for item in term.expressions:
        if not isinstance(item, exp.Tuple) or len(item.expressions) != len(cols):
            return
        if not all(is_constant(x) for x in item.expressions):
            return
        rows.append(tuple(from_expression(x) for x in item.expressions))
    ins.setdefault(",".join(c for c in cols if c is not None), (tuple(rows), term))  # type: ignore[arg-type]


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


def choose(table: Table, where: exp.Expr | None, names: set[str]) -> RouteChoice:
    """The best route for a statement on ``table`` given its WHERE clause."""
    eqs, ins = constraints(where, names)
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
                choice = RouteChoice(Opcode.IN, v, ins[col][0], term=ins[col][1])
        if choice is None:
            continue
        key = (choice.opcode.rank, v.cost)
        if key < best_key:
            best, best_key = choice, key
    return best


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
