"""Rendering a gate AST as SQL for one shard's dialect with positional parameters.

A bind variable ``:name`` becomes the backend's placeholder (``?`` or ``%s``)
and ``ShardSQL.params`` records which bind variable feeds each position, so
execution only builds a list. With ``%s`` drivers every literal ``%`` is
doubled first. Keyspace qualifiers are dropped: each shard's database holds
its tables unqualified. What sqlglot's generator gets wrong for a dialect is
patched by the dialect's object (:meth:`SQLDialect.fix`, :meth:`SQLDialect.finish`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from shardgate.errors import InvalidArgument
from shardgate.sql.dialects import AVG_SUM, Dialect, sql_dialect
from shardgate.sql.rewrite import transform

_MARK = "\x00sgp{}\x00"
_MARK_RE = re.compile("\x00sgp(\\d+)\x00")

__all__ = ["AVG_SUM", "ShardSQL", "avg_magnitude", "avg_partial", "render", "strip_qualifiers"]


@dataclass(frozen=True, slots=True)
class ShardSQL:
    """SQL for one dialect and the bind variable names of its positional params.

    ``parts`` is the SQL split around its placeholders (one more part than
    params), so a bind variable holding a list (``id IN (:ids)``) expands to
    one placeholder per element without rendering the tree again.
    """

    sql: str
    params: tuple[str, ...]
    parts: tuple[str, ...] = ()
    placeholder: str = "?"
    #: the bind variables that stand in an IN list, where a list value may go
    list_params: frozenset[str] = frozenset()

    def args(self, bind_vars: Mapping[str, Any]) -> list[Any]:
        return self.bind(bind_vars)[1]

    def bind(self, bind_vars: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL and its positional arguments for these bind variables."""
        try:
            values = [bind_vars[name] for name in self.params]
        except KeyError as exc:
            raise InvalidArgument(
                f"missing bind variable :{exc.args[0]}; pass it in bind_vars"
            ) from None
        if not any(isinstance(v, list | tuple) for v in values):
            return self.sql, values
        out = [self.parts[0]]
        args: list[Any] = []
        for name, value, part in zip(self.params, values, self.parts[1:], strict=True):
            if isinstance(value, list | tuple):
                if name not in self.list_params:
                    raise InvalidArgument(
                        f"bind variable :{name} is a list, but it is not an IN list "
                        f"('col IN (:{name})'): bind one value"
                    )
                if not value:
                    raise InvalidArgument(f"bind variable :{name} is an empty list")
                out.append(", ".join([self.placeholder] * len(value)))
                args.extend(value)
            else:
                out.append(self.placeholder)
                args.append(value)
            out.append(part)
        return "".join(out), args


def strip_qualifiers(tree: exp.Expr) -> exp.Expr:
    """Drop ``keyspace.`` from table references (shards hold tables unqualified)."""

    def fix(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table | exp.Column) and node.args.get("db") is not None:
            node = node.copy()
            node.set("db", None)
            node.set("catalog", None)
        return node

    return transform(tree, fix)


def avg_partial(value: Any) -> Any:
    """The number an AVG partial sum stands for (``'hi:lo:m'`` from SQLite: an exact int)."""
    if isinstance(value, str):
        hi, lo = value.split(":")[:2]
        return (int(hi) << 32) + int(lo)
    return value


def avg_magnitude(value: Any) -> float:
    """The sum of the absolute values behind an AVG partial of integers: read
    from SQLite's ``'hi:lo:m'``, ``abs`` of one integer (a row's own value, as
    a join at the gate gives); 0.0 for any other partial."""
    if isinstance(value, str):
        parts = value.split(":")
        return float(parts[2]) if len(parts) > 2 else 0.0
    if isinstance(value, int) and not isinstance(value, bool):
        return float(abs(value))
    return 0.0


def render(tree: exp.Expr, dialect: Dialect, placeholder: str) -> ShardSQL:
    """Generate ``tree`` for ``dialect`` with positional placeholders."""
    names: list[str] = []
    lists: set[str] = set()
    target = sql_dialect(dialect)

    def mark(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder):
            name = node.name
            if not name:
                raise InvalidArgument(
                    "positional '?' bind variables are not supported: use :name bind variables"
                )
            names.append(name)
            if isinstance(node.parent, exp.In) and node.arg_key == "expressions":
                lists.add(name)
            return exp.Var(this=_MARK.format(len(names) - 1))
        return node

    fixed = transform(tree, target.fix)
    marked = transform(fixed, mark, copy=False)
    # ``marked`` is our own copy
    sql = target.finish(marked.sql(dialect=target.sqlglot, copy=False))
    if placeholder == "%s":
        sql = sql.replace("%", "%%")
    # Markers are read in the order they appear in the text, which need not be
    # the order the tree was walked in (sqlglot visits LIMIT before WHERE).
    pieces = _MARK_RE.split(sql)
    parts = tuple(pieces[0::2])
    params = tuple(names[int(i)] for i in pieces[1::2])
    return ShardSQL(sql=placeholder.join(parts), params=params, parts=parts,
                    placeholder=placeholder, list_params=frozenset(lists))
