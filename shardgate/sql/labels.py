"""The name a database gives an unaliased select-list expression: its text.

MySQL and SQLite name such a column by the expression as written. sqlglot
writes ``x NOT IN (...)``, ``x IS NOT NULL`` and ``x NOT BETWEEN ...`` as
``NOT x IN (...)`` and so on; a label keeps the written form, so a column
the gate rewrote (a pulled-out subquery) is still named as the user wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlglot import exp
from sqlglot.generators.mysql import MySQLGenerator

_NEGATED = {exp.In: " IN ", exp.Is: " IS ", exp.Between: " BETWEEN "}


class _LabelGenerator(MySQLGenerator):
    def not_sql(self, expression: exp.Not) -> str:
        inner = expression.this
        infix = _NEGATED.get(type(inner))
        if infix is not None:
            left = self.sql(inner, "this")
            text = self.sql(inner)
            if text.startswith(left + infix):
                rest = text[len(left) + len(infix):]
                # x IS NOT NULL, but x NOT IN (...), x NOT BETWEEN ...
                return f"{left} IS NOT {rest}" if infix == " IS " else f"{left} NOT{infix}{rest}"
        return str(super().not_sql(expression))


def label(expression: exp.Expr) -> str:
    """The column name a database gives ``expression`` when it has no alias."""
    return str(_LabelGenerator(dialect="mysql").generate(expression, copy=True))


def with_values(expression: exp.Expr, bind_vars: Mapping[str, Any]) -> exp.Expr:
    """``expression`` with each scalar bind variable replaced by its value as a
    literal: how a database given the values names the column."""

    def literal(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder) and node.name in bind_vars:
            value = bind_vars[node.name]
            if value is None or isinstance(value, bool | int | float | str):
                return exp.convert(value)
        return node

    return expression.transform(literal)
