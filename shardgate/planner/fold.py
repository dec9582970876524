"""Constant folding for routing: values the planner may compute itself.

Only what every supported database computes the same way is folded:
``+``, ``-`` and ``*`` of integer literals (``id = 5+5`` routes by ``10``)
within the signed 64-bit range. Division, decimals and floats are left to the
shard (their rounding differs between engines), so such a value scatters.

A WHERE term that can match no row is *always false*: a comparison with a
NULL literal (``col = NULL``, ``col IN (NULL)``, ``NULL < x``), or a
comparison of constants that is false (``1 IN ('aa', 'bb')``, ``1 = 2``).
A statement with such a top-level AND term routes to no shard (Vitess's
``None`` route). Constants are compared only when MySQL, PostgreSQL and
SQLite agree: numbers with numbers, and a number with a string that does not
start like a number (never equal on MySQL and SQLite; PostgreSQL raises an
error for it on the shard, which the None route cannot reproduce, so that
case is left to the shard when it is not a number on either side).
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.evalengine.sqlsem import INT64_MAX, INT64_MIN
from shardgate.evalengine.values import Literal
from shardgate.sql.rewrite import flatten

_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)


def fold_integer(node: exp.Expr) -> int | None:
    """The value of an integer-only arithmetic expression, or None."""
    node = node.unnest()
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return int(node.this)
        except ValueError:
            return None
    if isinstance(node, exp.Neg):
        inner = fold_integer(node.this)
        return _in_range(-inner) if inner is not None else None
    if isinstance(node, exp.Add | exp.Sub | exp.Mul):
        left, right = fold_integer(node.left), fold_integer(node.right)
        if left is None or right is None:
            return None
        if isinstance(node, exp.Add):
            return _in_range(left + right)
        if isinstance(node, exp.Sub):
            return _in_range(left - right)
        return _in_range(left * right)
    return None


def _in_range(value: int) -> int | None:
    return value if INT64_MIN <= value <= INT64_MAX else None


def folded_literal(node: exp.Expr) -> Literal | None:
    """A Literal for a foldable arithmetic expression that is not a plain literal."""
    if isinstance(node.unnest(), exp.Literal):
        return None
    value = fold_integer(node)
    return Literal(value) if value is not None else None


def _is_null(node: exp.Expr) -> bool:
    return isinstance(node.unnest(), exp.Null)


def _number(node: exp.Expr) -> int | float | None:
    value = fold_integer(node)
    if value is not None:
        return value
    node = node.unnest()
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this)
        except ValueError:
            return None
    return None


def _never_numeric(node: exp.Expr) -> bool:
    """A string literal that no engine reads as a number (no numeric prefix)."""
    node = node.unnest()
    if not (isinstance(node, exp.Literal) and node.is_string):
        return False
    text = node.this.lstrip(" \t\n\r")
    return not text or text[0] not in "+-.0123456789"


def _constant_equal(left: exp.Expr, right: exp.Expr) -> bool | None:
    """Whether two constants are equal, when every engine agrees; else None."""
    a, b = _number(left), _number(right)
    if a is not None and b is not None:
        return a == b
    if (a is not None and _never_numeric(right)) or (b is not None and _never_numeric(left)):
        return False
    return None


def always_false(term: exp.Expr) -> bool:
    """True if this WHERE term can match no row, whatever the table holds."""
    term = term.unnest()
    if isinstance(term, exp.Boolean):
        return not term.this
    if isinstance(term, _COMPARISONS):
        if _is_null(term.left) or _is_null(term.right):
            return True
        if isinstance(term, exp.EQ):
            return _constant_equal(term.left, term.right) is False
        return False
    if isinstance(term, exp.In) and not term.args.get("query") and not term.args.get("not"):
        items = term.expressions
        if not items or _is_null(term.this):
            return bool(items)
        if all(_is_null(i) for i in items):
            return True
        if isinstance(term.this, exp.Column):  # a column may equal any constant
            return False
        outcomes = [_constant_equal(term.this, i) for i in items if not _is_null(i)]
        return all(o is False for o in outcomes)
    if isinstance(term, exp.Not):
        inner = term.this.unnest()
        # x NOT IN (..., NULL, ...) is false or NULL: never true
        if isinstance(inner, exp.In) and not inner.args.get("query"):
            return any(_is_null(i) for i in inner.expressions)
        return False
    if isinstance(term, exp.And):  # (flat: a chain of 1,000 terms is 1,000 levels deep)
        return any(always_false(t) for t in flatten(term, exp.And))
    if isinstance(term, exp.Or):
        return all(always_false(t) for t in flatten(term, exp.Or))
    return False
