"""Evaluating small SQL expressions at the gate (HAVING, ORDER BY after merging).

Only what post-processing needs: literals, references to result slots (by
canonical SQL text or alias), arithmetic, comparisons, AND/OR/NOT, IS [NOT]
NULL, IN lists, with SQL's three-valued logic (``None`` is unknown).
:func:`compile_expr` checks at plan time that everything is supported and
resolvable, so execution never meets an unknown node.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from sqlglot import exp

from shardgate.engine.values import Literal, from_expression
from shardgate.errors import Unsupported
from shardgate.sql.rewrite import flatten

Row = Sequence[Any]
Evaluator = Callable[[Row], Any]


def canonical(node: exp.Expr) -> str:
    """The text used to match an expression to a result slot."""
    return node.sql(dialect="mysql").lower()


_ARITH: dict[type[exp.Expr], Callable[[Any, Any], Any]] = {
    exp.Add: operator.add,
    exp.Sub: operator.sub,
    exp.Mul: operator.mul,
}
_COMPARE: dict[type[exp.Expr], Callable[[Any, Any], bool]] = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
}


def _num(v: Any) -> Any:
    return Decimal(str(v)) if isinstance(v, float) else v


def _div(a: Any, b: Any) -> Any:
    if b == 0:
        return None  # MySQL: division by zero is NULL
    if isinstance(a, int) and isinstance(b, int):
        return Decimal(a) / Decimal(b)
    if isinstance(a, float) or isinstance(b, float):
        return float(a) / float(b)
    return Decimal(a) / Decimal(b)


def compile_expr(node: exp.Expr, slots: Mapping[str, int]) -> Evaluator:
    """Compile ``node`` into a function of a result row.

    ``slots`` maps canonical texts (and lower-case aliases) to row indexes.
    """
    key = canonical(node)
    if key in slots:
        i = slots[key]
        return lambda row: row[i]
    if isinstance(node, exp.Column) and node.name.lower() in slots:
        i = slots[node.name.lower()]
        return lambda row: row[i]
    if isinstance(node, exp.Paren):
        return compile_expr(node.this, slots)
    if isinstance(node, exp.Literal | exp.Null | exp.Boolean) or (
        isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal)
    ):
        value = from_expression(node)
        assert isinstance(value, Literal)
        constant = value.value
        return lambda row: constant
    if isinstance(node, exp.Binary) and (type(node) in _ARITH or isinstance(node, exp.Div)):
        fn = _div if isinstance(node, exp.Div) else _ARITH[type(node)]
        left, right = compile_expr(node.left, slots), compile_expr(node.right, slots)

        def arith(row: Row) -> Any:
            a, b = left(row), right(row)
            if a is None or b is None:
                return None
            if isinstance(a, Decimal) or isinstance(b, Decimal):
                a, b = _num(a), _num(b)
            return fn(a, b)

        return arith
    if isinstance(node, exp.Binary) and type(node) in _COMPARE:
        cmp = _COMPARE[type(node)]
        left, right = compile_expr(node.left, slots), compile_expr(node.right, slots)

        def compare(row: Row) -> Any:
            a, b = left(row), right(row)
            if a is None or b is None:
                return None
            if isinstance(a, Decimal) or isinstance(b, Decimal):
                a, b = _num(a), _num(b)
            return cmp(a, b)

        return compare
    if isinstance(node, exp.And | exp.Or):
        # A chain of one connector is compiled flat (AND and OR are associative in
        # SQL's three-valued logic): 1,000 OR terms are neither 1,000 nested calls
        # nor 1,000 re-renderings of ever shorter chains.
        terms = [compile_expr(t, slots) for t in flatten(node, type(node))]
        combine = _and if isinstance(node, exp.And) else _or

        def chain(row: Row) -> Any:
            acc = terms[0](row)
            for term in terms[1:]:
                acc = combine(acc, term(row))
            return acc

        return chain
    if isinstance(node, exp.Not):
        inner = compile_expr(node.this, slots)

        def negate(row: Row) -> Any:
            v = inner(row)
            return None if v is None else not v

        return negate
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        inner = compile_expr(node.this, slots)
        return lambda row: inner(row) is None
    if isinstance(node, exp.Between):
        inner = compile_expr(node.this, slots)
        low = compile_expr(node.args["low"], slots)
        high = compile_expr(node.args["high"], slots)

        def between(row: Row) -> Any:
            v, lo, hi = inner(row), low(row), high(row)
            if v is None or lo is None or hi is None:
                return None
            return bool(lo <= v <= hi)

        return between
    if isinstance(node, exp.In) and not node.args.get("query"):
        inner = compile_expr(node.this, slots)
        items = [compile_expr(e, slots) for e in node.expressions]

        def member(row: Row) -> Any:
            v = inner(row)
            if v is None:
                return None
            values = [f(row) for f in items]
            if v in values:
                return True
            return None if None in values else False

        return member
    raise Unsupported(
        f"the gate cannot evaluate {node.sql(dialect='mysql')!r} after merging shards: "
        "use plain columns, aggregates of the select list, arithmetic and comparisons"
    )


def _and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return bool(a) and bool(b)


def _or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return bool(a) or bool(b)
