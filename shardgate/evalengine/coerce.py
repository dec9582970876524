"""The value a column will store (or compare as): what vindexes must map.

A vindex places a row by the value its column *stores*, after the shard's own
type conversion, not by the literal the statement wrote: ``5.0``, ``TRUE``,
``5e0`` and ``'05'`` all become ``5`` in a BIGINT column, and ``5`` becomes
``'5'`` in a VARCHAR column. :func:`stored_value` predicts that conversion
from the column's kind (:func:`kind_of_type`, read from the shard's schema)
and the shard's dialect, and refuses what it cannot predict.

Rules, for an INTEGER column (any backend's integer types; SQLite: INTEGER
affinity):

* ``int`` stays; ``bool`` is 1/0 (PostgreSQL refuses it: refused);
* ``float`` / ``Decimal`` with an integral value below 2**53 becomes that int;
  a fractional one is refused in a write (MySQL and PostgreSQL round, SQLite
  keeps a REAL: the backends disagree) and matches no row in a read;
* a string of digits (optional sign) is that int; a decimal or exponent form
  (``'5.0'``, ``'5e0'``) is its value on MySQL and SQLite (PostgreSQL refuses
  it: refused); anything else (``'abc'``, spaces) is refused, except that a
  SQLite read can match no row with it (MySQL would compare it as 0).

For a TEXT column (VARCHAR, TEXT; SQLite: any TEXT affinity; MySQL CHAR too,
whose trailing spaces MySQL drops: strings lose them). PostgreSQL's CHAR(n)
pads to n, which would need the length: it is left as given.

* ``str`` stays; an ``int`` is written as its decimal text; in a read, MySQL
  compares a number with text *as numbers* (``'05' = 5``), so no single value
  can be routed on: the read goes to every shard (:data:`SCATTER`);
* ``bool``, ``float`` and ``Decimal`` are refused in writes (each backend
  writes them differently) and scatter in reads.

Other kinds, unknown columns and ``bytes``/``None`` are left as they are.
"""

from __future__ import annotations

import decimal
import enum
import re
from collections.abc import Mapping
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.evalengine.rules import rules_of


class Kind(enum.Enum):
    """How a column converts what it is given."""

    INTEGER = "integer"
    TEXT = "text"
    #: MySQL CHAR: text whose trailing spaces are dropped (read back and compared
    #: without them)
    CHAR = "char"
    OTHER = "other"


class _Marker(enum.Enum):
    NO_MATCH = "no match"
    SCATTER = "scatter"


#: a read value no row of the column can equal: it maps to no shard
NO_MATCH = _Marker.NO_MATCH
#: a read value that equals stored values of several forms: every shard is asked
SCATTER = _Marker.SCATTER

_INT_RE = re.compile(r"[+-]?[0-9]+")
_NUMBER_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_EXACT_FLOAT = 1 << 53
#: the characters SQLite skips around a number it reads from text (sqlite3Isspace)
_SQLITE_SPACE = " \t\n\v\f\r"
def column_types_sql(dialect: str, placeholder: str) -> str:
    """The query listing ``(column, declared type)`` of the table bound to ``placeholder``."""
    return rules_of(dialect).column_types_sql.format(ph=placeholder)


def kind_of_type(declared: str, dialect: str) -> Kind:
    """The kind of a column from its declared type (SQLite) or ``data_type`` (others)."""
    t = declared.strip().lower()
    rules = rules_of(dialect)
    if rules.affinity_types:  # SQLite's affinity rules, in their order
        if "int" in t:
            return Kind.INTEGER
        if "char" in t or "clob" in t or "text" in t:
            return Kind.TEXT
        return Kind.OTHER
    if t in rules.integer_types:
        return Kind.INTEGER
    if t in rules.text_types:
        return Kind.TEXT
    if t == "char" and rules.char_drops_spaces:
        return Kind.CHAR
    return Kind.OTHER


def stored_value(
    value: Any, kind: Kind | None, dialect: str, *, write: bool, column: str
) -> Any:
    """What the column stores for ``value`` (a write) or compares it as (a read).

    Returns the value, :data:`NO_MATCH` or :data:`SCATTER` (reads only);
    raises :class:`InvalidArgument` where the conversion is lossy, differs
    between backends or the backend would refuse it.
    """
    if value is None or kind is None or kind is Kind.OTHER:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return value
    if kind is Kind.INTEGER:
        return _to_integer(value, dialect, write, column)
    text = _to_text(value, dialect, write, column)
    if kind is Kind.CHAR and isinstance(text, str):
        return text.rstrip(" ")  # the value without the spaces that do not count
    return text


def _refuse(value: Any, column: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"value {value!r} for vindex column {column!r} is refused: {why}; "
        "give the value in the column's own type"
    )


def _to_integer(value: Any, dialect: str, write: bool, column: str) -> Any:
    rules = rules_of(dialect)
    if isinstance(value, bool):
        if not rules.bool_to_integer:
            raise _refuse(value, column, f"{rules.title} does not convert booleans to integers")
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float | decimal.Decimal):
        return _integral(decimal.Decimal(value) if isinstance(value, float) else value,
                         value, write, column, exact=isinstance(value, decimal.Decimal))
    if isinstance(value, str):
        # SQLite compares ' 4' with an integer column as 4 (numeric affinity)
        text = value.strip(_SQLITE_SPACE) if rules.affinity_reads and not write else value
        if _INT_RE.fullmatch(text):
            return int(text)
        if _NUMBER_RE.fullmatch(text):
            if not rules.number_text_to_integer:
                raise _refuse(value, column, f"{rules.title} reads only whole "
                                             "numbers into integers")
            return _integral(decimal.Decimal(text), value, write, column, exact=True)
        if not write and rules.affinity_reads:
            return NO_MATCH  # SQLite compares it as text: no integer equals it
        raise _refuse(value, column, "it is not a number and the column holds integers")
    return value


def _integral(
    number: decimal.Decimal, value: Any, write: bool, column: str, *, exact: bool
) -> Any:
    if not number.is_finite():
        raise _refuse(value, column, "it is not a finite number")
    if number != number.to_integral_value():
        if write:
            raise _refuse(value, column, "the column holds integers and backends round "
                                         "fractions differently")
        return NO_MATCH
    n = int(number)
    if not exact and abs(n) >= _EXACT_FLOAT:
        raise _refuse(value, column, "a floating-point number this large is not exact")
    return n


def _to_text(value: Any, dialect: str, write: bool, column: str) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not write and rules_of(dialect).number_reads_text_as_number:
            return SCATTER  # MySQL compares text with a number as numbers: '05' = 5
        return str(value)
    if isinstance(value, bool | float | decimal.Decimal):
        if write:
            raise _refuse(value, column, "backends write it into text differently")
        return SCATTER
    return value


def convert_row(
    values: tuple[Any, ...],
    columns: tuple[str, ...],
    kinds: Mapping[str, Kind],
    dialect: str,
    *,
    write: bool,
) -> tuple[Any, ...]:
    """:func:`stored_value` of each value of a multi-column vindex tuple."""
    return tuple(
        stored_value(v, kinds.get(c), dialect, write=write, column=c)
        for v, c in zip(values, columns, strict=True)
    )
