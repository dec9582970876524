"""Parsing gate SQL.

Gate SQL is MySQL-flavoured (as Vitess's), with ``:name`` bind variables.
Parse errors become :class:`shardgate.errors.SyntaxError_` with the position.

sqlglot's parser is recursive descent and spends about 25 Python frames per
level of parentheses, so the default recursion limit (1,000) failed at 40
levels. Parsing runs with a higher limit (:data:`PARSE_RECURSION_LIMIT`,
about 200 levels); deeper statements are refused with :func:`too_deep`.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from shardgate.errors import InvalidArgument, SyntaxError_
from shardgate.sql.long_lists import parse_statements

GATE_DIALECT = "mysql"
#: the recursion limit while parsing (CPython 3.11+ keeps Python-to-Python
#: calls off the C stack, so this costs no C stack on the parser's path)
PARSE_RECURSION_LIMIT = 6_000
_TOKEN = re.compile(r"<Token token_type: [^,]+, text: (.*?), line: \d+.*?>")
_LIMIT_LOCK = threading.Lock()


def too_deep() -> InvalidArgument:
    """The error for a statement nested deeper than the gate can plan."""
    return InvalidArgument(
        "the statement is nested too deeply (parentheses, subqueries or expressions): "
        "flatten it (for example IN lists instead of long OR chains)"
    )


@contextmanager
def _deep_recursion() -> Iterator[None]:
    """Raise the recursion limit for the block (one parse at a time: it is process-wide)."""
    with _LIMIT_LOCK:
        old = sys.getrecursionlimit()
        if old < PARSE_RECURSION_LIMIT:
            sys.setrecursionlimit(PARSE_RECURSION_LIMIT)
        try:
            yield
        finally:
            if old < PARSE_RECURSION_LIMIT:
                sys.setrecursionlimit(old)


def parse(sql: str) -> exp.Expression:
    """Parse exactly one statement of gate SQL."""
    try:
        with _deep_recursion():
            statements = parse_statements(sql, GATE_DIALECT)
    except RecursionError:
        raise too_deep() from None
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
    except Exception as exc:  # sqlglot failing otherwise: still the statement's text at fault
        raise SyntaxError_(
            f"the statement could not be parsed ({type(exc).__name__}: {exc})"
        ) from exc
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
