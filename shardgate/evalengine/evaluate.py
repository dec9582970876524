"""Evaluating SQL expressions at the gate (select lists, HAVING, ORDER BY, join
filters after merging shards; Vitess's evalengine).

Literals, references to result slots (by canonical SQL text or alias),
arithmetic (``+ - * / %``), comparisons, AND/OR/NOT, IS [NOT] NULL, IN lists,
BETWEEN, ``COALESCE``/``IFNULL``, ``NULLIF``, ``CASE``, ``IF``, ``CONCAT``,
``LOWER``/``UPPER`` and ``[NOT] LIKE [ESCAPE]`` (:mod:`~shardgate.evalengine.functions`),
with SQL's three-valued logic (``None`` is unknown). Anything else is refused
at plan time with a coded UNIMPLEMENTED error naming the form. Values
follow the shard database's rules (:class:`~shardgate.evalengine.sqlsem.Semantics`,
passed at execution): truth of numbers and strings, mixed-type comparisons,
collations, integer and decimal arithmetic and division; on SQLite and
PostgreSQL, what a column makes of the constant it is compared with
(``int_col < '3'`` compares numbers there; SQLite's ``text_col = 3`` texts).
:func:`compile_expr` checks at plan time that everything is supported and
resolvable, so execution never meets an unknown node.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from sqlglot import exp

from shardgate.errors import Unsupported
from shardgate.evalengine import functions as fn
from shardgate.evalengine.functions import Kind
from shardgate.evalengine.rules import ConstantAffinity
from shardgate.evalengine.sqlsem import Semantics
from shardgate.evalengine.values import Literal, from_expression
from shardgate.sql.rewrite import flatten

Row = Sequence[Any]
#: a compiled expression: its value for a result row, under the shard database's semantics
Evaluator = Callable[[Row, Semantics], Any]


def canonical(node: exp.Expr) -> str:
    """The text used to match an expression to a result slot."""
    return node.sql(dialect="mysql").lower()


_ARITH: dict[type[exp.Expr], str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}
_COMPARE: dict[type[exp.Expr], Callable[[int], bool]] = {
    exp.EQ: lambda c: c == 0,
    exp.NEQ: lambda c: c != 0,
    exp.GT: lambda c: c > 0,
    exp.GTE: lambda c: c >= 0,
    exp.LT: lambda c: c < 0,
    exp.LTE: lambda c: c <= 0,
}


_PREDICATES = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not,
               exp.Is, exp.Between, exp.In, exp.Like, exp.Escape)


class Unresolved(Unsupported):
    """A column that is not among the slots the gate has (not grouped, not selected)."""


def compile_expr(node: exp.Expr, slots: Mapping[str, int]) -> Evaluator:
    """Compile ``node`` into a function of a result row and the shards' semantics.

    ``slots`` maps canonical texts (and lower-case aliases) to row indexes. A
    condition's value is the database's: 1/0 on MySQL and SQLite, a boolean on
    PostgreSQL, NULL when unknown.
    """
    f = _compile(node, slots)
    if isinstance(node, _PREDICATES) and canonical(node) not in slots:
        return lambda row, sem: sem.boolean(f(row, sem))
    return f


def _compile(node: exp.Expr, slots: Mapping[str, int]) -> Evaluator:
    key = canonical(node)
    if key in slots:
        i = slots[key]
        return lambda row, sem: row[i]
    if isinstance(node, exp.Column) and node.name.lower() in slots:
        i = slots[node.name.lower()]
        return lambda row, sem: row[i]
    if isinstance(node, exp.Column):
        raise Unresolved(
            f"{node.sql(dialect='mysql')!r} is neither grouped nor aggregated, so it cannot be "
            "computed across shards: add it to GROUP BY"
        )
    function = _function(node, slots)
    if function is not None:
        return function
    if isinstance(node, exp.Paren):
        return compile_expr(node.this, slots)
    if isinstance(node, exp.Literal) and node.is_number and not node.is_int:
        return _fractional(node.this)
    if isinstance(node, exp.Literal | exp.Null | exp.Boolean) or (
        isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and node.this.is_int
    ):
        value = from_expression(node)
        assert isinstance(value, Literal)
        constant = value.value
        return lambda row, sem: constant
    if isinstance(node, exp.Neg):
        inner, declared = compile_expr(node.this, slots), integer_type(node.this)
        return lambda row, sem: sem.arith("-", 0, inner(row, sem), declared)
    if isinstance(node, exp.Div):
        left, right = compile_expr(node.left, slots), compile_expr(node.right, slots)
        return lambda row, sem: sem.divide(left(row, sem), right(row, sem))
    if isinstance(node, exp.Binary) and type(node) in _ARITH:
        op, declared = _ARITH[type(node)], integer_type(node)
        left, right = compile_expr(node.left, slots), compile_expr(node.right, slots)
        return lambda row, sem: sem.arith(op, left(row, sem), right(row, sem), declared)
    if isinstance(node, exp.Binary) and type(node) in _COMPARE:
        test = _COMPARE[type(node)]
        left, right = compile_expr(node.left, slots), compile_expr(node.right, slots)
        if _is_constant(node.right) and _is_column(node.left):
            right = _with_affinity(right, left)
        elif _is_constant(node.left) and _is_column(node.right):
            left = _with_affinity(left, right)

        def compare(row: Row, sem: Semantics) -> Any:
            a, b = left(row, sem), right(row, sem)
            if a is None or b is None:
                return None
            return test(sem.compare(a, b))

        return compare
    if isinstance(node, exp.And | exp.Or):
        # A chain of one connector is compiled flat (AND and OR are associative in
        # SQL's three-valued logic): 1,000 OR terms are neither 1,000 nested calls
        # nor 1,000 re-renderings of ever shorter chains.
        terms = [compile_expr(t, slots) for t in flatten(node, type(node))]
        combine = _and if isinstance(node, exp.And) else _or

        def chain(row: Row, sem: Semantics) -> Any:
            acc = sem.truth(terms[0](row, sem))
            for term in terms[1:]:
                acc = combine(acc, sem.truth(term(row, sem)))
            return acc

        return chain
    if isinstance(node, exp.Not):
        inner = compile_expr(node.this, slots)

        def negate(row: Row, sem: Semantics) -> Any:
            v = sem.truth(inner(row, sem))
            return None if v is None else not v

        return negate
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        inner = compile_expr(node.this, slots)
        return lambda row, sem: inner(row, sem) is None
    if isinstance(node, exp.Between):
        inner = compile_expr(node.this, slots)
        low = compile_expr(node.args["low"], slots)
        high = compile_expr(node.args["high"], slots)
        if _is_column(node.this):
            low = _with_affinity(low, inner) if _is_constant(node.args["low"]) else low
            high = _with_affinity(high, inner) if _is_constant(node.args["high"]) else high

        def between(row: Row, sem: Semantics) -> Any:
            v, lo, hi = inner(row, sem), low(row, sem), high(row, sem)
            above = None if v is None or lo is None else sem.compare(lo, v) <= 0
            below = None if v is None or hi is None else sem.compare(v, hi) <= 0
            return _and(above, below)

        return between
    if isinstance(node, exp.In) and not node.args.get("query"):
        inner = compile_expr(node.this, slots)
        items = [compile_expr(e, slots) for e in node.expressions]
        if _is_column(node.this):
            items = [_with_affinity(f, inner) if _is_constant(e) else f
                     for f, e in zip(items, node.expressions, strict=True)]

        def member(row: Row, sem: Semantics) -> Any:
            v = inner(row, sem)
            if v is None:
                return None
            found: bool | None = False
            for f in items:
                eq = sem.equal(v, f(row, sem))
                if eq:
                    return True
                if eq is None:
                    found = None
            return found

        return member
    raise Unsupported(
        f"the gate cannot evaluate {type(node).__name__.upper()} in "
        f"{node.sql(dialect='mysql')!r} after merging shards: it evaluates arithmetic, "
        "comparisons, COALESCE, NULLIF, CASE, IF, CONCAT, LOWER, UPPER and LIKE"
    )


#: ``Column.meta`` key: the column's declared type as the tracked schema has it
#: (:class:`~shardgate.sql.schema.ColumnInfo`), set by the planner where arithmetic
#: at the gate needs it (:func:`integer_type`)
DECLARED_TYPE = "declared_type"
_INTEGERS = ("smallint", "integer", "bigint", "numeric")  # PostgreSQL's, narrowest first
#: PostgreSQL's SUM of an integer type: int2/int4 sum to int8, int8 to numeric
_SUM_TYPE = {"smallint": "bigint", "integer": "bigint", "bigint": "numeric"}


def integer_type(node: exp.Expr) -> str | None:
    """The integer type the database gives ``node`` in arithmetic, statically, or None.

    PostgreSQL keeps ``smallint`` and ``integer`` through ``+ - *`` (``int4 * int4``
    is int4: "integer out of range" past it): a column of such a type (its
    :data:`DECLARED_TYPE`), MIN / MAX / ANY_VALUE of one, an integer literal (int4
    when it fits, as PostgreSQL types it) and arithmetic of those, the widest
    operand's type; SUM of ``bigint`` is ``numeric`` (exact: no BIGINT overflow).
    Names the dialect does not keep are harmless:
    :meth:`~shardgate.evalengine.sqlsem.Semantics.arith` checks only the dialect's
    :attr:`~shardgate.evalengine.rules.ValueRules.narrow_integers`.
    """
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Min | exp.Max | exp.AnyValue) and isinstance(node.this, exp.Column):
        node = node.this
    if isinstance(node, exp.Sum):
        arg = node.this
        if isinstance(arg, exp.Distinct) and len(arg.expressions) == 1:
            arg = arg.expressions[0]
        return _SUM_TYPE.get(str(arg.meta.get(DECLARED_TYPE))) if isinstance(
            arg, exp.Column) else None
    if isinstance(node, exp.Column):
        declared = node.meta.get(DECLARED_TYPE)
        return declared if declared in _INTEGERS else None
    if isinstance(node, exp.Literal) and node.is_int:
        n = int(node.this)
        return "integer" if n < 1 << 31 else "bigint" if n < 1 << 63 else None
    if isinstance(node, exp.Neg):
        return integer_type(node.this)
    if isinstance(node, exp.Binary) and type(node) in _ARITH:
        left, right = integer_type(node.left), integer_type(node.right)
        if left is None or right is None:
            return None
        return max(left, right, key=_INTEGERS.index)
    return None


def kind_of(node: exp.Expr) -> Kind:
    """The static kind of ``node`` (:class:`~shardgate.evalengine.functions.Kind`)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Null):
        return Kind.NULL
    if isinstance(node, exp.Literal):
        return Kind.TEXT if node.is_string else Kind.NUMBER
    if isinstance(node, exp.Concat | exp.Lower | exp.Upper):
        return Kind.TEXT
    if isinstance(node, (exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Count,
                         exp.Sum, exp.Avg, exp.Boolean, *_PREDICATES)):
        return Kind.NUMBER
    if isinstance(node, exp.Coalesce | exp.Case | exp.If):
        kinds = {kind_of(b) for b in _branches(node)} - {Kind.NULL}
        if not kinds:
            return Kind.NULL
        if Kind.TEXT in kinds:
            return Kind.TEXT
        return kinds.pop() if len(kinds) == 1 else Kind.UNKNOWN
    if isinstance(node, exp.Nullif):
        return kind_of(node.this)
    return Kind.UNKNOWN


def _branches(node: exp.Expr) -> list[exp.Expr]:
    """The expressions whose value CASE / COALESCE / IF may return."""
    if isinstance(node, exp.Coalesce):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Case):
        out = [i.args["true"] for i in node.args.get("ifs") or []]
        default = node.args.get("default")
        return out + ([default] if default is not None else [exp.Null()])
    if isinstance(node, exp.If):
        false = node.args.get("false")
        return [node.args["true"], false if false is not None else exp.Null()]
    return [node]


def _function(node: exp.Expr, slots: Mapping[str, int]) -> Evaluator | None:
    """The evaluator of a function ``node`` (see the module doc), None if not one."""
    if isinstance(node, exp.Lower | exp.Upper):
        inner = compile_expr(node.this, slots)
        upper = isinstance(node, exp.Upper)
        return lambda row, sem: fn.change_case(sem, inner(row, sem), upper)
    if isinstance(node, exp.Concat):
        parts = [compile_expr(e, slots) for e in node.expressions]
        return lambda row, sem: fn.concat(sem, [p(row, sem) for p in parts])
    if isinstance(node, exp.Mod):
        left, right = compile_expr(node.left, slots), compile_expr(node.right, slots)
        return lambda row, sem: fn.modulo(sem, left(row, sem), right(row, sem))
    if isinstance(node, exp.Like | exp.Escape):
        escape_f: Evaluator | None = None
        if isinstance(node, exp.Escape):
            escape_f = compile_expr(node.expression, slots)
            node = node.this
            if not isinstance(node, exp.Like):
                return None
        value, pattern = compile_expr(node.this, slots), compile_expr(node.expression, slots)
        esc = escape_f
        negate = bool(node.args.get("negate"))  # NOT LIKE

        def matches(row: Row, sem: Semantics) -> Any:
            e = esc(row, sem) if esc is not None else None
            if esc is not None and e is None:
                return None
            hit = fn.like(sem, value(row, sem), pattern(row, sem), e)
            return hit if hit is None or not negate else not hit

        return matches
    if isinstance(node, exp.Nullif):
        first, second = compile_expr(node.this, slots), compile_expr(node.expression, slots)
        if _is_column(node.this) and _is_constant(node.expression):
            second = _with_affinity(second, first)

        def nullif(row: Row, sem: Semantics) -> Any:
            a = first(row, sem)
            return None if sem.equal(a, second(row, sem)) else a

        return nullif
    if isinstance(node, exp.Coalesce | exp.Case | exp.If):
        return _choice(node, slots)
    return None


def _choice(node: exp.Coalesce | exp.Case | exp.If, slots: Mapping[str, int]) -> Evaluator:
    """COALESCE / CASE / IF: the value of the branch chosen, typed as the database types
    the whole expression (:func:`~shardgate.evalengine.functions.unify`)."""
    branches = _branches(node)
    values = [compile_expr(b, slots) for b in branches]
    kinds = [kind_of(b) for b in branches]
    unknown = [i for i, k in enumerate(kinds) if k is Kind.UNKNOWN]
    form = type(node).__name__.upper()

    def typed(row: Row, sem: Semantics, picked: int, value: Any) -> Any:
        if value is None or not sem.rules.unified_result_type:
            return value
        others = [values[i](row, sem) for i in unknown if i != picked]
        return fn.unify(sem, value, kinds, others, form)

    if isinstance(node, exp.Coalesce):
        def coalesce(row: Row, sem: Semantics) -> Any:
            for i, f in enumerate(values):
                v = f(row, sem)
                if v is not None:
                    return typed(row, sem, i, v)
            return None

        return coalesce
    if isinstance(node, exp.If):
        cond = compile_expr(node.this, slots)

        def if_(row: Row, sem: Semantics) -> Any:
            i = 0 if sem.truth(cond(row, sem)) is True else 1
            return typed(row, sem, i, values[i](row, sem))

        return if_
    operand_node = node.this
    operand = compile_expr(operand_node, slots) if operand_node is not None else None
    whens: list[Evaluator] = []
    for i in node.args.get("ifs") or []:
        when = compile_expr(i.this, slots)
        if operand is not None and _is_column(operand_node) and _is_constant(i.this):
            when = _with_affinity(when, operand)
        whens.append(when)

    def case(row: Row, sem: Semantics) -> Any:
        subject = operand(row, sem) if operand is not None else None
        for i, when in enumerate(whens):
            if operand is not None:
                hit = sem.equal(subject, when(row, sem))
            else:
                hit = sem.truth(when(row, sem))
            if hit is True:
                return typed(row, sem, i, values[i](row, sem))
        return typed(row, sem, len(whens), values[-1](row, sem))

    return case


def _is_column(node: exp.Expr) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Column)


def _is_constant(node: exp.Expr) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Neg):
        node = node.this
    return isinstance(node, exp.Literal)


_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_REAL_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


def _with_affinity(constant: Evaluator, column: Evaluator) -> Evaluator:
    """``constant`` as the database compares it with a column's value.

    SQLite: a column of numeric affinity (it holds a number) makes a text that
    is a well-formed number that number, a column of TEXT affinity (it holds
    text) makes a number its text. PostgreSQL: a quoted constant takes the
    column's type (``int_col < '3'`` is ``< 3``; text that is no such number
    stays text, which the gate refuses to compare, as PostgreSQL rejects it).
    Elsewhere, and for values that do not convert, the constant as it is.
    """

    def value(row: Row, sem: Semantics) -> Any:
        c = constant(row, sem)
        affinity = sem.rules.constant_affinity
        if c is None or affinity is ConstantAffinity.NONE:
            return c
        v = column(row, sem)
        if affinity is ConstantAffinity.TYPED:
            return _pg_typed(c, v)
        if isinstance(v, int | float) and not isinstance(v, bool) and isinstance(c, str):
            if _INTEGER_TEXT.fullmatch(c):
                n = int(c)
                return n if -(2**63) <= n < 2**63 else float(n)
            if _REAL_TEXT.fullmatch(c):
                return float(c)
        elif isinstance(v, str) and isinstance(c, int | float | Decimal) and \
                not isinstance(c, bool):
            return str(c)
        return c

    return value


def _pg_typed(c: Any, v: Any) -> Any:
    """A quoted constant ``c`` read as the type of the column value ``v`` (PostgreSQL)."""
    if not isinstance(c, str) or isinstance(v, bool):
        return c
    if isinstance(v, int) and _INTEGER_TEXT.fullmatch(c):
        return int(c)
    if isinstance(v, float | Decimal) and _REAL_TEXT.fullmatch(c):
        return float(c) if isinstance(v, float) else Decimal(c.strip())
    return c


def _fractional(text: str) -> Evaluator:
    """A number literal with a point or exponent: a double on SQLite (and MySQL for
    ``1e2``), an exact decimal otherwise."""
    exact = Decimal(text)
    approximate = float(text)
    is_exponent = "e" in text.lower()

    def value(row: Row, sem: Semantics) -> Any:
        rules = sem.rules
        if rules.fractional_literal_is_double or (
                is_exponent and rules.exponent_literal_is_double):
            return approximate
        return exact

    return value


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False
