"""Rendering a gate AST as SQL for one shard's dialect with positional parameters.

A bind variable ``:name`` becomes the backend's placeholder (``?`` or ``%s``)
and ``ShardSQL.params`` records which bind variable feeds each position, so
execution only builds a list. With ``%s`` drivers every literal ``%`` is
doubled first. Keyspace qualifiers are dropped: each shard's database holds
its tables unqualified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from shardgate.errors import InvalidArgument

_MARK = "\x00sgp{}\x00"


@dataclass(frozen=True, slots=True)
class ShardSQL:
    """SQL for one dialect and the bind variable names of its positional params."""

    sql: str
    params: tuple[str, ...]

    def args(self, bind_vars: Mapping[str, Any]) -> list[Any]:
        try:
            return [bind_vars[name] for name in self.params]
        except KeyError as exc:
            raise InvalidArgument(
                f"missing bind variable :{exc.args[0]}; pass it in bind_vars"
            ) from None


def strip_qualifiers(tree: exp.Expression) -> exp.Expression:
    """Drop ``keyspace.`` from table references (shards hold tables unqualified)."""

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.args.get("db") is not None:
            node = node.copy()
            node.set("db", None)
            node.set("catalog", None)
        elif isinstance(node, exp.Column) and node.args.get("db") is not None:
            node = node.copy()
            node.set("db", None)
            node.set("catalog", None)
        return node

    return tree.transform(fix)


def render(tree: exp.Expression, dialect: str, placeholder: str) -> ShardSQL:
    """Generate ``tree`` for ``dialect`` with positional placeholders."""
    names: list[str] = []

    def mark(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder):
            name = node.name
            if not name:
                raise InvalidArgument(
                    "positional '?' bind variables are not supported: use :name bind variables"
                )
            names.append(name)
            return exp.Var(this=_MARK.format(len(names) - 1))
        return node

    marked = tree.transform(mark)
    sql = marked.sql(dialect=dialect)
    if placeholder == "%s":
        sql = sql.replace("%", "%%")
    for i in range(len(names)):
        sql = sql.replace(_MARK.format(i), placeholder, 1)
    return ShardSQL(sql=sql, params=tuple(names))
