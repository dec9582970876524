"""SQL functions the gate evaluates after merging shards, as each database computes them.

Every function takes the :class:`~shardgate.evalengine.sqlsem.Semantics` of the
shards' database and non-NULL-checked values; each returns NULL (``None``) for a
NULL argument where the database does, and raises :class:`Unsupported` (coded
UNIMPLEMENTED) for what the gate cannot compute exactly, never a guess.

The gate's SQL is MySQL's on every backend (``CONCAT`` reaches SQLite and
PostgreSQL as ``||``, ``%`` PostgreSQL as ``% NULLIF(b, 0)``), so each function
follows the database's evaluation of the statement as the gate renders it:

* **text of a value** (:func:`to_text`, what ``CONCAT`` and ``LOWER`` make of a
  number): integers as decimal digits, decimals (MySQL/MariaDB, PostgreSQL) in
  fixed point at their scale; doubles, booleans and bytes are refused (each
  database formats them its own way);
* **LOWER / UPPER** (:func:`change_case`): per code point, with the database's
  own tables (:mod:`~shardgate.evalengine.casemap`, read from the servers):
  MariaDB's ``utf8mb4_general_ci`` case map; PostgreSQL's under ``LC_CTYPE``
  ``C.UTF-8`` (glibc); ASCII letters only under PostgreSQL's ``C``/``POSIX`` and
  on SQLite (without ICU). Non-ASCII text under another locale is refused;
* **CONCAT** (:func:`concat`): NULL if any argument is NULL (MySQL's CONCAT;
  ``||`` on SQLite and PostgreSQL);
* **LIKE** (:func:`like`): ``%`` any run, ``_`` one character; MariaDB compares
  characters by the collation's weights (``'Ábc' LIKE 'a%'`` under
  ``utf8mb4_general_ci``; trailing spaces count), SQLite folds ASCII letters
  only, PostgreSQL compares code points; the escape character is ``\\`` on
  MariaDB and PostgreSQL unless ``ESCAPE`` names one, none on SQLite;
* **%** (:func:`modulo`): the remainder has the dividend's sign everywhere;
  ``x % 0`` is NULL; integers and decimals only (a double is refused);
* **result types of CASE / COALESCE / IF / NULLIF** (:func:`unify`): on
  MySQL/MariaDB one type for every branch: a branch of text makes the result
  text (a number chosen becomes its text); SQLite keeps each value's own
  type; PostgreSQL rejects mixed branches itself (the gate refuses a mix it
  meets).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from shardgate.errors import Unsupported
from shardgate.evalengine.rules import LikeFold
from shardgate.evalengine.sqlsem import EXACT, Quotient, Semantics, shown


class Kind(enum.Enum):
    """What the database types an expression as, before any row is read."""

    TEXT = "text"
    NUMBER = "number"
    NULL = "null"
    #: a column or an aggregate of one: the gate does not know the column's type
    UNKNOWN = "unknown"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | Decimal) and not isinstance(v, bool)


def to_text(sem: Semantics, v: Any, where: str) -> str:
    """``v`` (not NULL) as the text the database makes of it in ``where``."""
    if isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, Decimal) and sem.rules.decimal_text:
        if isinstance(v, Quotient):
            v = shown(v)
        return format(v, "f")
    raise Unsupported(
        f"the gate cannot compute {where} of {type(v).__name__} value {v!r} after merging "
        f"shards the way {sem.rules.title} formats it: compute it in a query one shard answers"
    )


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_ASCII_UPPER = {c + 32: c for c in range(ord("A"), ord("Z") + 1)}


def change_case(sem: Semantics, v: Any, upper: bool) -> Any:
    """``UPPER(v)`` or ``LOWER(v)``; NULL for NULL."""
    if v is None:
        return None
    name = "UPPER" if upper else "LOWER"
    rules = sem.rules
    if rules.strict_operands and not isinstance(v, str):
        raise Unsupported(f"{name} of a {type(v).__name__} is refused by {sem.rules.title}")
    text = to_text(sem, v, name)
    tables = rules.case_tables.get(sem.locale)
    if tables is not None:
        return text.translate(tables[1] if upper else tables[0])
    ascii_only = "*" in rules.ascii_case or sem.locale in rules.ascii_case
    if not ascii_only and not text.isascii():
        raise Unsupported(
            f"the gate cannot compute {name} of non-ASCII text under the shards' "
            f"{sem.locale or sem.collation.name!r} locale: compute it in a query one shard answers"
        )
    return text.translate(_ASCII_UPPER if upper else _ASCII_LOWER)


def concat(sem: Semantics, values: Sequence[Any]) -> Any:
    """``CONCAT(values...)`` (``||`` on SQLite and PostgreSQL): NULL if any is NULL."""
    if any(v is None for v in values):
        return None
    return "".join(to_text(sem, v, "CONCAT") for v in values)


def like(sem: Semantics, value: Any, pattern: Any, escape: Any = None) -> bool | None:
    """``value LIKE pattern [ESCAPE escape]`` in three-valued logic."""
    if value is None or pattern is None:
        return None
    rules = sem.rules
    if rules.strict_operands and not (isinstance(value, str) and isinstance(pattern, str)):
        raise Unsupported(f"LIKE over a value that is not text is refused by {sem.rules.title}")
    text, pat = to_text(sem, value, "LIKE"), to_text(sem, pattern, "LIKE")
    esc = rules.like_escape if escape is None else to_text(sem, escape, "ESCAPE")
    if esc is not None and len(esc) != 1:
        raise Unsupported("LIKE ... ESCAPE needs a single character")
    fold = _like_fold(sem)
    parts: list[str] = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if esc is not None and c == esc:
            if i + 1 == len(pat):
                raise Unsupported("a LIKE pattern ending with its escape character is refused")
            parts.append(re.escape(fold(pat[i + 1])))
            i += 2
            continue
        parts.append(".*" if c == "%" else "." if c == "_" else re.escape(fold(c)))
        i += 1
    return re.fullmatch("".join(parts), fold(text), re.DOTALL) is not None


def _like_fold(sem: Semantics) -> Any:
    """A function mapping text to what LIKE compares (per character, same length)."""
    fold = sem.rules.like_fold
    if fold is LikeFold.ASCII:
        return lambda s: s.translate(_ASCII_LOWER)
    if fold is LikeFold.EXACT:
        return lambda s: s
    collation = sem.collation
    if collation.name == "utf8mb4_bin":
        return lambda s: s
    if collation.name != "utf8mb4_general_ci":
        raise Unsupported(
            f"the gate cannot compute LIKE under the shards' collation {collation.name!r}")
    return collation.weigh


def modulo(sem: Semantics, a: Any, b: Any) -> Any:
    """``a % b``: the dividend's sign; NULL for ``x % 0`` (and NULL operands)."""
    if a is None or b is None:
        return None
    if sem.rules.strict_operands and not (_is_number(a) and _is_number(b)):
        raise Unsupported(f"% over a value that is not a number is refused by {sem.rules.title}")
    x, y = sem.number(a), sem.number(b)
    if isinstance(x, float) or isinstance(y, float) or isinstance(x, Quotient) or \
            isinstance(y, Quotient):
        raise Unsupported("the gate cannot compute % of a double or a quotient after merging "
                          "shards: compute it in a query one shard answers")
    if y == 0:
        return None
    if isinstance(x, int) and isinstance(y, int):
        r = abs(x) % abs(y)
        return -r if x < 0 else r
    return EXACT.remainder(Decimal(x), Decimal(y))


def unify(sem: Semantics, value: Any, kinds: Sequence[Kind], others: Sequence[Any],
          form: str) -> Any:
    """The value CASE / COALESCE / IF / NULLIF (``form``) returns when it picks ``value``.

    ``kinds`` are the static kinds of every branch it could return; ``others``
    the values in this row of the branches of UNKNOWN kind it did not pick.
    """
    if value is None or not sem.rules.unified_result_type or not _is_number(value):
        return value
    if Kind.TEXT in kinds or any(isinstance(o, str | bytes) for o in others):
        return to_text(sem, value, form)
    if Kind.UNKNOWN in kinds and any(o is None for o in others):
        raise Unsupported(
            f"{form} mixes a number with a column or aggregate whose type the gate does not "
            "know (MariaDB returns text if that column is text): compute it in a query one "
            "shard answers, or CAST the branches to one type"
        )
    return value
