"""Rendering a gate AST as SQL for one shard's dialect with positional parameters.

A bind variable ``:name`` becomes the backend's placeholder (``?`` or ``%s``)
and ``ShardSQL.params`` records which bind variable feeds each position, so
execution only builds a list. With ``%s`` drivers every literal ``%`` is
doubled first. Keyspace qualifiers are dropped: each shard's database holds
its tables unqualified.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from shardgate.errors import InvalidArgument
from shardgate.sql.rewrite import transform

_MARK = "\x00sgp{}\x00"
#: meta flag of a SUM that is AVG's partial sum
AVG_SUM = "sg_avg_sum"
_MARK_RE = re.compile("\x00sgp(\\d+)\x00")


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


_BINARY_TYPES = {
    exp.DataType.Type.VARBINARY,
    exp.DataType.Type.BINARY,
    exp.DataType.Type.BLOB,
    exp.DataType.Type.LONGBLOB,
    exp.DataType.Type.MEDIUMBLOB,
    exp.DataType.Type.TINYBLOB,
}


def _fix_for_dialect(node: exp.Expr, dialect: str) -> exp.Expr:
    """Patch what sqlglot's generator gets wrong for a target dialect."""
    if (
        dialect == "postgres"
        and isinstance(node, exp.DataType)
        and node.this in _BINARY_TYPES
        and node.expressions
    ):
        # BYTEA takes no length: VARBINARY(16) -> BYTEA, not BYTEA(16).
        return exp.DataType.build("bytea", dialect="postgres")
    if dialect == "postgres" and isinstance(node, exp.Insert) and node.args.get("ignore"):
        node = node.copy()
        node.set("ignore", None)
        node.set("conflict", exp.OnConflict(action=exp.var("DO NOTHING")))
        return node
    if dialect == "postgres" and isinstance(node, exp.Delete | exp.Update) and (
        node.args.get("limit") is not None or node.args.get("order") is not None
    ):
        return _pg_limited_dml(node)
    if dialect == "sqlite" and isinstance(node, exp.Sum) and node.meta.get(AVG_SUM):
        return _sqlite_avg_sum(node.this)
    if dialect == "sqlite" and isinstance(node, exp.Select) and node.args.get("locks"):
        # SQLite has no row locks: a transaction already holds the database lock.
        node = node.copy()
        node.set("locks", None)
        return node
    return node


_AVG_SUM_SQLITE = sqlglot.parse_one(
    "CASE WHEN COUNT(__sg_x) = SUM(typeof(__sg_x) = 'integer') "
    "THEN CAST(SUM(__sg_x >> 32) AS TEXT) || ':' || CAST(SUM(__sg_x & 4294967295) AS TEXT) "
    "|| ':' || CAST(TOTAL(ABS(CAST(__sg_x AS REAL))) AS TEXT) "
    "ELSE TOTAL(__sg_x) END",
    dialect="sqlite",
)


def _sqlite_avg_sum(x: exp.Expression) -> exp.Expression:
    """AVG's partial sum on SQLite, which SUM would overflow on large integers.

    Integers: the exact sum as text ``'hi:lo:magnitude'`` (the sums of their
    high and low 32 bits, which cannot overflow, and the sum of their absolute
    values as a double; :func:`avg_partial` and :func:`avg_magnitude` read
    it); otherwise ``TOTAL(x)``, a double, as SQLite's AVG sums.
    """
    return _AVG_SUM_SQLITE.transform(
        lambda n: exp.Paren(this=x.copy())
        if isinstance(n, exp.Column) and n.name == "__sg_x" else n
    )


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


def _pg_limited_dml(node: exp.Delete | exp.Update) -> exp.Expression:
    """PostgreSQL has no ``DELETE/UPDATE ... ORDER BY ... LIMIT``: pick the rows by ctid.

    ``DELETE FROM t WHERE w ORDER BY o LIMIT n`` becomes
    ``DELETE FROM t WHERE ctid IN (SELECT ctid FROM t WHERE w ORDER BY o LIMIT n)``.
    """
    node = node.copy()
    pick = exp.Select(expressions=[exp.column("ctid")]).from_(node.this.copy())
    for arg in ("where", "order", "limit"):
        pick.set(arg, node.args.get(arg))
        node.set(arg, None)
    node.set("where", exp.Where(this=exp.In(this=exp.column("ctid"), query=pick.subquery())))
    return node


def render(tree: exp.Expr, dialect: str, placeholder: str) -> ShardSQL:
    """Generate ``tree`` for ``dialect`` with positional placeholders."""
    names: list[str] = []
    lists: set[str] = set()

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

    fixed = transform(tree, lambda n: _fix_for_dialect(n, dialect))
    marked = transform(fixed, mark, copy=False)
    sql = marked.sql(dialect=dialect, copy=False)  # ``marked`` is our own copy
    if dialect == "mysql" and sql.endswith(" FOR SHARE"):
        sql = sql[: -len(" FOR SHARE")] + " LOCK IN SHARE MODE"  # MariaDB's spelling
    if placeholder == "%s":
        sql = sql.replace("%", "%%")
    # Markers are read in the order they appear in the text, which need not be
    # the order the tree was walked in (sqlglot visits LIMIT before WHERE).
    pieces = _MARK_RE.split(sql)
    parts = tuple(pieces[0::2])
    params = tuple(names[int(i)] for i in pieces[1::2])
    return ShardSQL(sql=placeholder.join(parts), params=params, parts=parts,
                    placeholder=placeholder, list_params=frozenset(lists))
