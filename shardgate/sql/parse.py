"""Parsing gate SQL.

Gate SQL is MySQL-flavoured (as Vitess's), with ``:name`` bind variables.
Parse errors become :class:`shardgate.errors.SyntaxError_` with the position.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from shardgate.errors import InvalidArgument, SyntaxError_

GATE_DIALECT = "mysql"
_TOKEN = re.compile(r"<Token token_type: [^,]+, text: (.*?), line: \d+.*?>")


def parse(sql: str) -> exp.Expression:
    """Parse exactly one statement of gate SQL."""
    try:
        statements = sqlglot.parse(sql, read=GATE_DIALECT)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = ""
        if first.get("line"):
            where = f" at line {first['line']}, column {first.get('col')}"
        near = first.get("highlight") or ""
        detail = first.get("description") or str(exc).splitlines()[0]
        detail = _TOKEN.sub(lambda m: repr(m.group(1)), detail)
        raise SyntaxError_(
            f"syntax error{where}{f' near {near!r}' if near else ''}: {detail}"
        ) from exc
    except TokenError as exc:
        raise SyntaxError_(f"syntax error: {exc}") from exc
    statements = [s for s in statements if s is not None]
    if not statements:
        raise InvalidArgument("empty statement: send one SQL statement")
    if len(statements) > 1:
        raise InvalidArgument(
            f"got {len(statements)} statements: send one statement per call "
            "(use execute_batch for several)"
        )
    stmt = statements[0]
    assert isinstance(stmt, exp.Expression)
    if isinstance(stmt, exp.Command):
        # sqlglot falls back to Command for statements it does not model.
        raise SyntaxError_(f"unsupported or malformed statement: {sql.strip()[:80]!r}")
    return stmt
