"""Comparison literals of MySQL text as bind variables, so the plan cache is hit.

MySQL clients usually send values inline (PyMySQL, mysqlclient and JDBC
without server-side prepare interpolate them), so every point select is a new
text and the gate would parse and plan each one. Like Vitess's normalizer,
:func:`bind_literals` turns ``WHERE id = 42`` into ``WHERE id = :_l0`` with
``{"_l0": 42}``; the text, now the same for every id, is planned once.

It is deliberately narrow, a scan of the text (no parse): in a ``SELECT``,
``UPDATE`` or ``DELETE`` with one ``SELECT`` at most (no subqueries or
unions), only an integer or a quoted string that follows a comparison
operator (``=``, ``<=>``, ``<>``, ``!=``, ``<``, ``<=``, ``>``, ``>=``) after
the ``WHERE`` keyword (an ``UPDATE``'s: after ``SET``, so ``SET c = 'x'`` too),
or the two of ``BETWEEN x AND y`` (sysbench's range reads), and is followed by
the end of the value (whitespace,
``)``, ``,``, ``;`` or the end of the text), is replaced, outside comments,
quoted identifiers and other strings. So result column names (the select
list) never change. Decimals and floats (kept exact as text), strings with a
character set introducer, a ``COLLATE`` or another string after them, hex or
bit literals, JSON ``->`` paths, anything it does not understand, stay as
they are; ``None`` means the statement runs exactly as sent. String escapes
are MySQL's (``\\n``, ``\\'``, ``''``...). An ``INSERT``/``REPLACE ... VALUES``
whose rows hold only literals has its integers and strings bound
(:func:`_bind_values`): the plan of a row count is made once.
"""

from __future__ import annotations

import re
from typing import Any

#: Prefix of the bind variable names this module makes (not used by clients' own).
PREFIX = "_l"

_OPERATOR = re.compile(r"(<=>|<=|>=|<>|!=|=|<|>)\s*")
_NUMBER = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_AFTER = re.compile(r"\s*(?:$|[),;]|(?=\s)(?!\s*(?:collate\b|['\"])))", re.I)
_SELECT = re.compile(r"\bselect\b", re.I)
_INTEGER = re.compile(r"-?\d+")
_WHERE = re.compile(r"where\b", re.I)
_ESCAPES = {"0": "\0", "'": "'", '"': '"', "b": "\b", "n": "\n", "r": "\r", "t": "\t",
            "Z": "\x1a", "\\": "\\", "%": "\\%", "_": "\\_"}
#: Statements whose comparison literals are bound.
_STATEMENTS = re.compile(r"^\s*(select|update|delete)\b", re.I)
#: The next character the scan acts on, before and after ``WHERE`` (the others are
#: skipped in one C-level search instead of one loop turn each).
_NEXT_BEFORE_WHERE = re.compile(r"[wWsS'\"`#]|--|/\*")
_SET = re.compile(r"set\b", re.I)
#: an INSERT/REPLACE ... VALUES whose rows :func:`_bind_values` reads
_INSERT = re.compile(r"\s*(?:insert|replace)\s+(?:(?:ignore|low_priority|delayed|high_priority)"
                     r"\s+)?(?:into\s+)?[`\w.]+\s*(?:\([^()'\"]*\)\s*)?values?\s*(?=\()", re.I)
#: values of a VALUES row kept as written (not bound)
_KEPT = re.compile(r"(?:null|default|true|false)\b|-?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])",
                   re.I)
_ROW_SEPARATOR = re.compile(r"\s*([,)])\s*")
_END = re.compile(r"\s*;?\s*$")
_NEXT_AFTER_WHERE = re.compile(r"[<>=!'\"`#bB]|--|/\*")
_BETWEEN = re.compile(r"between\s+", re.I)
_AND = re.compile(r"\s+and\s+", re.I)


def bind_literals(sql: str) -> tuple[str, dict[str, Any]] | None:
    """``sql`` with its comparison literals as ``:_lN`` bind variables, and their values.

    None when there is nothing to bind, or the text has ``:`` bind variables
    of its own, or anything the scan does not understand.
    """
    if ":" in sql:
        return None
    if _INSERT.match(sql):
        return _bind_values(sql)
    first = _STATEMENTS.match(sql)
    if first is None or len(_SELECT.findall(sql)) > 1:
        return None
    out: list[str] = []
    binds: dict[str, Any] = {}
    i, n, last = 0, len(sql), 0
    where = False
    # an UPDATE's SET assignments are scanned as its WHERE is (``SET c = 'x'``)
    update_set = first.group(1).lower() == "update"
    while i < n:
        found = (_NEXT_AFTER_WHERE if where else _NEXT_BEFORE_WHERE).search(sql, i)
        if found is None:
            break
        i = found.start()
        c = sql[i]
        if c in "'\"`":
            end = _skip_quoted(sql, i)
            if end < 0:
                return None
            i = end
            continue
        if c == "#" or sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end < 0:
                return None
            i = end + 2
            continue
        if not where:
            word = c in "wWsS" and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_"))
            where = word and (_WHERE.match(sql, i) is not None
                              or (update_set and _SET.match(sql, i) is not None))
            i += 1
            continue
        if c in "bB":
            i = _bind_between(sql, i, out, binds, last)
            if i < 0:  # both bound: the text is copied up to the end of the second
                last = i = -i
            continue
        m = _OPERATOR.match(sql, i) if c in "<>=!" and sql[i - 1] != "-" else None
        if m is None:
            i += 1
            continue
        start = m.end()
        value, end = _literal(sql, start)
        if end < 0 or not _AFTER.match(sql, end):
            i = start
            continue
        name = f"{PREFIX}{len(binds)}"
        binds[name] = value
        out.append(sql[last:start])
        out.append(f":{name}")
        last = i = end
    if not binds:
        return None
    out.append(sql[last:])
    return "".join(out), binds


def literal_value(text: str) -> Any:
    """The value :func:`bind_literals` binds for the literal ``text`` (a quoted string's
    text, escapes read; an integer's int; None for what it never binds)."""
    value, end = _literal(text, 0)
    return value if end == len(text) else None


def _bind_values(sql: str) -> tuple[str, dict[str, Any]] | None:
    """An ``INSERT``/``REPLACE ... VALUES (...), (...)`` with its integer and string
    values bound (sysbench's inserts; the prepare's hold hundreds of rows). Rows hold
    literals only (``NULL``, ``DEFAULT``, booleans and decimals stay as written); any
    other value, or anything after the rows (``ON DUPLICATE KEY UPDATE``), gives None."""
    m = _INSERT.match(sql)
    assert m is not None
    out: list[str] = []
    binds: dict[str, Any] = {}
    i, last = m.end(), 0
    while True:  # at a row's "("
        if i >= len(sql) or sql[i] != "(":
            return None
        i += 1
        while True:  # at a value
            while i < len(sql) and sql[i].isspace():
                i += 1
            value, end = _literal(sql, i)
            if end >= 0:
                name = f"{PREFIX}{len(binds)}"
                binds[name] = value
                out += (sql[last:i], f":{name}")
                last = end
            else:
                kept = _KEPT.match(sql, i)
                if kept is None:
                    return None
                end = kept.end()
            sep = _ROW_SEPARATOR.match(sql, end)
            if sep is None:
                return None
            i = sep.end()
            if sep.group(1) == ")":
                break
        if _END.match(sql, i):
            break
        if sql[i] != ",":
            return None
        i += 1
        while i < len(sql) and sql[i].isspace():
            i += 1
    if not binds:
        return None
    out.append(sql[last:])
    return "".join(out), binds


def _bind_between(sql: str, i: int, out: list[str], binds: dict[str, Any], last: int) -> int:
    """At a ``b`` at ``i``: ``BETWEEN x AND y`` with two literals has them bound (the text
    up to the second appended to ``out``) and gives minus the index after it; otherwise
    the index to go on scanning from."""
    if i and (sql[i - 1].isalnum() or sql[i - 1] == "_"):
        return i + 1
    m = _BETWEEN.match(sql, i)
    if m is None:
        return i + 1
    low, low_end = _literal(sql, m.end())
    if low_end < 0:
        return m.end()
    m_and = _AND.match(sql, low_end)
    if m_and is None:
        return low_end
    high, high_end = _literal(sql, m_and.end())
    if high_end < 0 or not _AFTER.match(sql, high_end):
        return m_and.end()
    names = f"{PREFIX}{len(binds)}", f"{PREFIX}{len(binds) + 1}"
    binds[names[0]], binds[names[1]] = low, high
    out += (sql[last:m.end()], f":{names[0]}", sql[low_end:m_and.end()], f":{names[1]}")
    return -high_end


def _literal(sql: str, i: int) -> tuple[Any, int]:
    """The literal at ``i`` and where it ends; ``(None, -1)`` when there is none."""
    if i < len(sql) and sql[i] in "'\"":
        end = _skip_quoted(sql, i)
        if end < 0:
            return None, -1
        return _unescape(sql[i + 1 : end - 1], sql[i]), end
    m = _NUMBER.match(sql, i)
    if m is None or (m.end() < len(sql) and (sql[m.end()].isalnum() or sql[m.end()] in "_.")):
        return None, -1
    text = m.group(0)
    if _INTEGER.fullmatch(text):
        return int(text), m.end()
    return None, -1  # decimals and floats keep their exact text


def _skip_quoted(sql: str, i: int) -> int:
    """The index after the quoted text starting at ``i`` (-1 when it never ends)."""
    q = sql[i]
    j = i + 1
    while j < len(sql):
        c = sql[j]
        if c == "\\" and q != "`":
            j += 2
            continue
        if c == q:
            if j + 1 < len(sql) and sql[j + 1] == q:
                j += 2
                continue
            return j + 1
        j += 1
    return -1


def _unescape(body: str, quote: str) -> str:
    out: list[str] = []
    j = 0
    while j < len(body):
        c = body[j]
        if c == "\\" and j + 1 < len(body):
            nxt = body[j + 1]
            out.append(_ESCAPES.get(nxt, nxt))
            j += 2
        elif c == quote and j + 1 < len(body) and body[j + 1] == quote:
            out.append(quote)
            j += 2
        else:
            out.append(c)
            j += 1
    return "".join(out)
