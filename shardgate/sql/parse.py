"""Parsing gate SQL.

Gate SQL is MySQL-flavoured (as Vitess's), with ``:name`` bind variables.
Parse errors become :class:`shardgate.errors.SyntaxError_` naming the line,
the column and the offending token in the user's words (never sqlglot's
class names): ``syntax error at line 1, column 29 near '*': incomplete
expression``. The position is the first token that could not be parsed: a
statement starting with a word that starts no statement (``SELCT * FROM t``)
is wrong at that word, not where sqlglot gave up. The error also carries the
line and the statement's text from that token (``line``, ``near``), which the
MySQL listener quotes as MySQL does (error 1064).

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

from sqlglot import Dialect, TokenType, exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from shardgate.errors import InvalidArgument, SyntaxError_
from shardgate.sql.long_lists import parse_statements

GATE_DIALECT = "mysql"

# sqlglot's messages, rewritten for people (patterns over the error text, not SQL).
_TOKEN = re.compile(r"<Token token_type: [^,]+, text: (.*?), line: \d+.*?>")
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_MISSING = re.compile(r"^Required keyword: '\w+' missing for <class '(?:[\w.]+\.)?(\w+)'>")
_UNCLOSED = re.compile(r"Missing (.) from (\d+):(\d+)")
#: what a user calls the part sqlglot found incomplete (by expression class)
_PARTS = {
    "Where": "WHERE clause", "Having": "HAVING clause", "Group": "GROUP BY clause",
    "Order": "ORDER BY clause", "Limit": "LIMIT clause", "Values": "VALUES list",
    "Join": "join", "Table": "table name", "Select": "SELECT", "Insert": "INSERT",
    "Update": "UPDATE", "Delete": "DELETE", "In": "IN list", "Between": "BETWEEN",
    "Case": "CASE expression", "Anonymous": "function call",
}
#: the recursion limit while parsing (CPython 3.11+ keeps Python-to-Python
#: calls off the C stack, so this costs no C stack on the parser's path)
PARSE_RECURSION_LIMIT = 6_000
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
    if "::" in sql:
        sql = list_args(sql)
    try:
        with _deep_recursion():
            statements = parse_statements(sql, GATE_DIALECT)
    except RecursionError:
        raise too_deep() from None
    except SqlglotError as exc:
        raise syntax_error(sql, exc) from exc
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
    if isinstance(stmt, exp.Condition) and not isinstance(stmt, exp.Query):
        # an expression, not a statement (`SELCT` parses as a column name)
        raise _unknown_first_word(sql) or SyntaxError_(
            f"syntax error: not a statement: {sql.strip()[:80]!r}", line=1, near=sql.strip())
    if isinstance(stmt, exp.Command):
        # sqlglot falls back to Command for statements it does not model.
        raise SyntaxError_(f"unsupported or malformed statement: {sql.strip()[:80]!r}")
    return stmt


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def list_args(sql: str) -> str:
    """Vitess's list bind variables, ``IN ::name``, as ``IN (:name)``.

    ``::name`` right after ``IN`` (Vitess's ``ListArg``) stands for the list bound
    to ``name``; the gate's own form is ``IN (:name)``, which takes a list value.
    ``::`` anywhere else (in strings, comments, or PostgreSQL casts, which the
    gate's MySQL dialect does not have) is left alone.
    """
    try:
        tokens = Dialect.get_or_raise(GATE_DIALECT).tokenize(sql)
    except SqlglotError:
        return sql  # the parse reports it
    out: list[str] = []
    done = 0
    for i in range(1, len(tokens) - 1):
        tok, name = tokens[i], tokens[i + 1]
        if tok.token_type is TokenType.DCOLON and tokens[i - 1].token_type is TokenType.IN \
                and name.start == tok.end + 1 and _NAME.match(name.text) \
                and sql[name.start:name.end + 1] == name.text:
            out.append(sql[done:tok.start])
            out.append(f"(:{name.text})")
            done = name.end + 1
    if not out:
        return sql
    out.append(sql[done:])
    return "".join(out)


def describe_error(exc: SqlglotError) -> str:
    """What is wrong, in the user's words, without the position."""
    if isinstance(exc, ParseError) and exc.errors:
        return _detail(exc.errors[0].get("description") or "")
    if isinstance(exc, TokenError):
        m = _UNCLOSED.search(_token_message(exc))
        if m:
            return _unclosed(m.group(1))
        return "the statement could not be read (an unterminated comment or string?)"
    return _detail(str(exc).splitlines()[0] if str(exc) else "")


def syntax_error(sql: str, exc: SqlglotError) -> SyntaxError_:
    """sqlglot's error for ``sql`` as the user's: ``syntax error at line L, column C near
    'token': detail``, at the first token that could not be parsed."""
    unknown = _unknown_first_word(sql)
    if unknown is not None:
        return unknown
    detail = describe_error(exc)
    if isinstance(exc, ParseError) and exc.errors and exc.errors[0].get("line"):
        first = exc.errors[0]
        near = str(first.get("highlight") or "")
        line, end_col = int(first["line"]), int(first.get("col") or 1)
        col = max(1, end_col - len(near) + 1) if "\n" not in near else end_col
        near_text = f" near {near!r}" if near else ""
        return SyntaxError_(f"syntax error at line {line}, column {col}{near_text}: {detail}",
                            line=line, near=_rest(sql, line, col))
    if isinstance(exc, TokenError):
        m = _UNCLOSED.search(_token_message(exc))
        if m:
            offset = int(m.group(3))
            line, col = line_col(sql, offset)
            return SyntaxError_(
                f"syntax error at line {line}, column {col} near {m.group(1)!r}: {detail}",
                line=line, near=sql[offset:])
    return SyntaxError_(f"syntax error: {detail}")


def _unknown_first_word(sql: str) -> SyntaxError_ | None:
    """The error of a statement whose first token is a plain word that starts no statement
    (``SELCT``), or None."""
    try:
        tokens = Dialect.get_or_raise(GATE_DIALECT).tokenize(sql)
    except SqlglotError:
        return None
    if not tokens or tokens[0].token_type is not TokenType.VAR:
        return None
    first = tokens[0]
    line, col = line_col(sql, first.start)
    return SyntaxError_(f"syntax error at line {line}, column {col} near {first.text!r}: "
                        f"no statement starts with {first.text!r}",
                        line=line, near=sql[first.start:])


def _rest(sql: str, line: int, col: int) -> str:
    """The text of ``sql`` from 1-based ``line`` and ``col`` on."""
    lines = sql.split("\n")
    if line > len(lines):
        return ""
    offset = sum(len(x) + 1 for x in lines[:line - 1]) + col - 1
    return sql[offset:]


def line_col(sql: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of character ``offset`` of ``sql``."""
    line = sql.count("\n", 0, offset) + 1
    return line, offset - (sql.rfind("\n", 0, offset) + 1) + 1


def _token_message(exc: TokenError) -> str:
    """The tokenizer's own message (sqlglot wraps it in "Error tokenizing ...")."""
    cause = exc.__cause__ or exc.__context__
    return f"{exc} {cause}" if isinstance(cause, TokenError) else str(exc)


def _unclosed(quote: str) -> str:
    if quote == "`":
        return "unterminated quoted identifier"
    return "unterminated string" if quote in "'\"" else f"missing {quote!r}"


def _detail(description: str) -> str:
    m = _MISSING.match(description)
    if m:
        return f"incomplete {_PARTS.get(m.group(1), 'expression')}"
    if description.startswith("Invalid expression / Unexpected token"):
        return "unexpected token"
    if description.startswith("Expecting "):
        return f"expected {description[len('Expecting '):]!r}"
    text = _TOKEN.sub(
        lambda t: "the end of the statement" if t.group(1) == "SENTINEL" else repr(t.group(1)),
        description,
    )
    text = _CLASS.sub(lambda c: _PARTS.get(c.group(1), c.group(1).lower()), text)
    return (text[:1].lower() + text[1:]) or "the statement could not be parsed"
