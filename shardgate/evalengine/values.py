"""Values inside plans: literals, bind variables, and inline SQL expressions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from shardgate.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant written in the statement."""

    value: Any

    def describe(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, slots=True)
class BindVar:
    """``:name`` — filled from the caller's bind variables at execution."""

    name: str

    def describe(self) -> str:
        return f":{self.name}"


@dataclass(frozen=True)
class SQLExpr:
    """An expression sent to the shard as SQL (``now()``...), never routed on."""

    expr: exp.Expr
    _rendered: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def render(self, dialect: str) -> str:
        sql = self._rendered.get(dialect)
        if sql is None:
            sql = self._rendered[dialect] = self.expr.sql(dialect=dialect)
        return sql

    def describe(self) -> str:
        return self.expr.sql(dialect="mysql")


Value = Literal | BindVar | SQLExpr


def resolve(value: Value, bind_vars: Mapping[str, Any]) -> Any:
    """The Python value of a Literal or BindVar."""
    if isinstance(value, Literal):
        return value.value
    if isinstance(value, BindVar):
        try:
            return bind_vars[value.name]
        except KeyError:
            raise InvalidArgument(
                f"missing bind variable :{value.name}; pass it in bind_vars"
            ) from None
    raise InvalidArgument(
        f"{value.describe()} is not a constant: vindex columns need literals or bind variables"
    )


def from_expression(node: exp.Expr) -> Value:
    """Turn a sqlglot value expression into a plan Value."""
    if isinstance(node, exp.Placeholder) and node.name:
        return BindVar(node.name)
    if isinstance(node, exp.Paren):
        return from_expression(node.this)
    if isinstance(node, exp.Null):
        return Literal(None)
    if isinstance(node, exp.Boolean):
        return Literal(bool(node.this))
    if isinstance(node, exp.Literal):
        if node.is_string:
            return Literal(node.this)
        text = node.this
        try:
            return Literal(int(text))
        except ValueError:
            return Literal(float(text))
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        inner = from_expression(node.this)
        assert isinstance(inner, Literal)
        return Literal(-inner.value)
    if isinstance(node, exp.HexString):
        return Literal(bytes.fromhex(node.this))
    if isinstance(node, exp.Introducer) and isinstance(node.expression,
                                                       exp.HexString | exp.Literal) and \
            (isinstance(node.expression, exp.HexString) or node.expression.is_string):
        # ``_binary 'abc'``, ``_utf8mb4'x'``: the literal's text (a hex literal's bytes)
        return from_expression(node.expression)
    text_cast = _char_cast(node)
    if text_cast is not None:
        return Literal(text_cast)
    if node.find(exp.Column) is not None:
        raise InvalidArgument(
            f"value {node.sql(dialect='mysql')!r} refers to a column; use constants here"
        )
    return SQLExpr(node)


def is_constant(node: exp.Expr) -> bool:
    try:
        v = from_expression(node)
    except InvalidArgument:
        return False
    return not isinstance(v, SQLExpr)


def _char_cast(node: exp.Expr) -> str | None:
    """``CAST(1 AS CHAR)``, ``CAST('a' AS CHAR(50))``: MySQL's text of an integer or
    string literal (CHAR(n) as MySQL casts it: not padded). None for anything else,
    or when the text is longer than ``n`` (MySQL would truncate it with a warning)."""
    if not isinstance(node, exp.Cast) or not isinstance(node.to, exp.DataType):
        return None
    if node.to.this not in (exp.DataType.Type.CHAR, exp.DataType.Type.VARCHAR):
        return None
    inner = node.this.unnest()
    if not isinstance(inner, exp.Literal):
        return None
    if inner.is_string:
        text = str(inner.this)
    else:
        try:
            text = str(int(inner.this))
        except ValueError:
            return None  # a decimal's text depends on the engine's formatting
    size = node.to.expressions
    if size:
        length = size[0].this if isinstance(size[0], exp.DataTypeParam) else size[0]
        try:
            if len(text) > int(length.name if isinstance(length, exp.Expr) else length):
                return None
        except ValueError:
            return None
    return text
