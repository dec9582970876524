"""Errors for what a shard database says is missing, in the user's words.

Each engine words "no such column" its own way; the user wrote SQL against
tables, not shard files, so the error leads with the object as written
(``unknown column 'nosuchcol'``) and names the shard database only as a detail.
"""

from __future__ import annotations

import re

from shardgate.errors import NotFound

# (pattern, kind): group 1 is the name, an optional group 2 the table it was looked up in.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # SQLite
    (re.compile(r"^no such column: (\S+)"), "column"),
    (re.compile(r"^no such table: (\S+)"), "table"),
    (re.compile(r"^no such function: (\S+)"), "function"),
    (re.compile(r"^no such index: (\S+)"), "index"),
    # PostgreSQL
    (re.compile(r'^column "(.+?)" of relation "(.+?)" does not exist'), "column"),
    (re.compile(r'^column "(.+?)" does not exist'), "column"),
    (re.compile(r'^relation "(.+?)" does not exist'), "table"),
    (re.compile(r'^table "(.+?)" does not exist'), "table"),
    (re.compile(r"^function (.+?) does not exist"), "function"),
    # MariaDB
    (re.compile(r"^Unknown column '(.+?)' in '"), "column"),
    (re.compile(r"^Table '(?:[^'.]+\.)?(.+?)' doesn't exist"), "table"),
    (re.compile(r"^Unknown table '(?:[^'.]+\.)?(.+?)'"), "table"),
    (re.compile(r"^FUNCTION (?:[^ .]+\.)?(\S+) does not exist"), "function"),
)


def missing(text: str, safe_url: str) -> NotFound:
    """``NOT_FOUND`` for a shard's "no such ..." message ``text``."""
    for pattern, kind in _PATTERNS:
        m = pattern.match(text)
        if m is not None:
            name = m.group(1)
            table = m.group(2) if (m.lastindex or 0) >= 2 else None
            where = f" in table '{table}'" if table else ""
            return NotFound(f"unknown {kind} '{name}'{where} (shard database {safe_url})")
    return NotFound(f"not found: {text} (shard database {safe_url})")
