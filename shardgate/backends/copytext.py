"""Rows in PostgreSQL's ``COPY`` text format, moved between databases unparsed.

A reshard copies rows from a PostgreSQL source to PostgreSQL targets; parsing
every value into a Python object and formatting it back costs most of the
copy's time. A :class:`TextRows` batch keeps each row as the line
``COPY ... TO STDOUT`` sent (fields separated by tabs, without the newline) and
parses only the fields asked for: the vindex column of every row, the primary
key of the last row, and (on the rare fallback to an upsert) whole rows.

Invariants:

* a field is split on raw tab bytes and a row on raw newline bytes: the text
  format escapes both inside values (``\\t``, ``\\n``), so neither occurs
  unescaped in a value;
* :meth:`TextRows.row` gives the tuple a typed ``SELECT`` of the same row gives
  (the same psycopg loaders, by the columns' type OIDs, after unescaping);
* the text of a row means the same row on every server only for the column
  types in :data:`PORTABLE_OIDS`, read with the settings of :data:`SOURCE_SETTINGS`
  and written with the same client encoding: the backend refuses the text
  path otherwise (the copy then reads typed rows).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

#: types whose COPY text output (under :data:`SOURCE_SETTINGS`) any PostgreSQL
#: server reads back as the same value, whatever its own settings: bool, bytea,
#: char, int8, int2, int4, text, oid, json, float4, float8, bpchar, varchar, date,
#: time, timestamp, timestamptz, interval, numeric, uuid, jsonb
PORTABLE_OIDS = frozenset({16, 17, 18, 20, 21, 23, 25, 26, 114, 700, 701, 1042, 1043, 1082,
                           1083, 1114, 1184, 1186, 1700, 2950, 3802})
#: integer types (their text is a plain decimal: ``int()`` reads it exactly)
INT_OIDS = frozenset({20, 21, 23})
#: types whose text never holds a backslash, tab, newline or carriage return: bool,
#: int8, int2, int4, oid, float4, float8, date, time, timestamp, timestamptz,
#: interval (``postgres`` style), numeric, uuid
PLAIN_OIDS = frozenset({16, 20, 21, 23, 26, 700, 701, 1082, 1083, 1114, 1184, 1186, 1700,
                        2950})
#: what the source session sets (``SET LOCAL``) before a text ``COPY TO``: output
#: that no input setting on the target reads differently (ISO dates, unambiguous
#: intervals, exact floats, hex bytea)
SOURCE_SETTINGS = (("DateStyle", "ISO, YMD"), ("IntervalStyle", "postgres"),
                   ("extra_float_digits", "3"), ("bytea_output", "hex"),
                   # and batches read in key order by the primary key's index: a
                   # freshly loaded table has no statistics, and the planner would
                   # sort the whole rest of the table for each batch
                   ("enable_seqscan", "off"), ("enable_bitmapscan", "off"),
                   ("enable_sort", "off"))

_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)
_SIMPLE = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}
NULL = b"\\N"


def _escaped(expr: str) -> str:
    """SQL escaping the text ``expr`` as ``COPY`` text output escapes it (the backslash
    first; then the characters that end a field or a line)."""
    for char, code in (("\\\\", "\\\\\\\\"), ("\\t", "\\\\t"), ("\\n", "\\\\n"),
                       ("\\r", "\\\\r")):
        expr = f"replace({expr}, E'{char}', E'{code}')"
    return expr


def batch_sql(select: str, columns: Sequence[str], oids: Sequence[int],
              order: Sequence[str]) -> str:
    """One row, one value: the rows of ``select`` (columns ``columns``, quoted, of
    types ``oids``) as COPY text lines in ``order`` (quoted column names), joined by
    newlines (NULL when there are none).

    The server builds the lines (the same output functions as ``COPY TO``, the
    same escapes), so a batch arrives as one value rather than a message per row.
    """
    fields = []
    for name, oid in zip(columns, oids, strict=True):
        # concat() gives the type's output function's text, as COPY writes it (a
        # cast to text may differ: booleans as true/false, char(n) without padding)
        text = f"concat(q.{name})"
        fields.append(f"CASE WHEN q.{name} IS NULL THEN E'\\\\N' ELSE "
                      f"{text if oid in PLAIN_OIDS else _escaped(text)} END")
    line = " || E'\\t' || ".join(fields)
    keys = ", ".join(f"q.{k}" for k in order)
    return f"SELECT string_agg({line}, E'\\n' ORDER BY {keys}) FROM ({select}) AS q"


def _unescape_one(m: re.Match[bytes]) -> bytes:
    if m.group(1) is not None:
        return bytes([int(m.group(1), 8) & 0xFF])
    if m.group(2) is not None:
        return bytes([int(m.group(2), 16)])
    c = m.group(3)
    return _SIMPLE.get(c, c)


def unescape(field: bytes) -> bytes | None:
    """A field's value bytes (None: SQL NULL), as the server would read it."""
    if field == NULL:
        return None
    if b"\\" not in field:
        return field
    return _ESCAPE.sub(_unescape_one, field)


#: loads a row's values (unescaped field bytes, None for NULL) into Python values
Load = Callable[[Sequence[bytes | None]], tuple[Any, ...]]


class TextRows:
    """A batch of rows as COPY text lines (see the module docstring)."""

    __slots__ = ("_load", "lines", "oids")

    def __init__(self, lines: list[bytes], oids: Sequence[int], load: Load) -> None:
        #: one row per line, without its newline
        self.lines = lines
        #: the columns' type OIDs
        self.oids = tuple(oids)
        self._load = load

    def __len__(self) -> int:
        return len(self.lines)

    def column(self, i: int) -> list[Any]:
        """The values of column ``i`` of every row (typed as :meth:`row` types them)."""
        n = i + 1
        if self.oids[i] in INT_OIDS:
            fields = [line.split(b"\t", n)[i] for line in self.lines]
            if NULL not in fields:
                return list(map(int, fields))
        return [self.row(k)[i] for k in range(len(self.lines))]

    def row(self, k: int) -> tuple[Any, ...]:
        """Row ``k`` as a typed ``SELECT`` returns it."""
        return self._load([unescape(f) for f in self.lines[k].split(b"\t")])

    def rows(self, which: Sequence[int] | None = None) -> list[tuple[Any, ...]]:
        """Rows ``which`` (default all) typed, as :meth:`row`."""
        return [self.row(k) for k in (range(len(self.lines)) if which is None else which)]


def data(lines: Sequence[bytes]) -> bytes:
    """``lines`` as the body of a ``COPY ... FROM STDIN`` in text format."""
    return b"\n".join(lines) + b"\n" if lines else b""
