"""SQL value semantics of a shard's database, for what the gate computes itself.

After merging shards the gate filters (HAVING, gate-side join terms), sorts,
groups, combines partial aggregates and evaluates select-list expressions. A
:class:`Semantics` (one per dialect and collation) does it as the shard's
database would:

* **truth**: three-valued (``None`` is unknown). MySQL/MariaDB and SQLite take
  a number, or a string's numeric prefix, as TRUE when non-zero; PostgreSQL
  takes booleans only (anything else is refused, as PostgreSQL refuses it).
* **comparison**: numbers numerically, whatever their Python type (a double
  against an integer or decimal as doubles on MySQL and PostgreSQL, exactly
  on SQLite); strings by
  the collation; a number against a string as doubles on MySQL, by storage
  class on SQLite (numbers < text < blobs). What the database would not
  compare is refused with a coded error, never a Python ``TypeError``.
* **arithmetic**: integers exactly (out of BIGINT range: an error on MySQL and
  PostgreSQL, a double on SQLite), decimals exactly, doubles when a double is
  involved; strings take their numeric prefix on MySQL (a double) and SQLite.
* **division**: MySQL gives a decimal with the dividend's scale plus
  ``div_precision_increment`` (4), rounded half up when shown or compared,
  but kept to whole 9-digit words (truncated) in further arithmetic, as
  MariaDB's ``decimal_div`` does: ``AVG(n) * 2`` is ``4.2857`` for
  ``AVG(n) = 15/7`` (``2.142857142 * 2``), not ``2.1429 * 2``
  (:class:`Quotient`); the gate's ``/`` reaches
  SQLite and PostgreSQL as a division of doubles (sqlglot's rendering of
  MySQL's ``/``); ``x / 0`` is NULL everywhere. AVG on PostgreSQL is a
  numeric division at ``select_div_scale``'s scale.

Collations (``Collation``): ``binary`` (code point order, trailing spaces
significant: SQLite's BINARY, PostgreSQL's ``C``), MariaDB's ``utf8mb4_bin``
(code points, PAD SPACE) and ``utf8mb4_general_ci`` (MariaDB's weights, read
from the server by ``scripts/gen_general_ci.py``, PAD SPACE).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Context, Decimal
from typing import Any

from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.general_ci import WEIGHTS as GENERAL_CI_WEIGHTS
from shardgate.evalengine.rules import ValueRules, rules_of
from shardgate.sql.dialects import Dialect

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: exact decimal arithmetic (MySQL decimals have at most 65 digits)
EXACT = Context(prec=120)
#: MariaDB's default ``div_precision_increment``
DIV_PRECISION_INCREMENT = 4
_MYSQL_MAX_SCALE = 30
#: MariaDB's decimals are stored in words of 9 digits
_DIGITS_PER_WORD = 9


class Quotient(Decimal):
    """A MySQL/MariaDB decimal that holds more digits than it shows.

    A division's quotient (and AVG's) keeps whole 9-digit words of fraction
    (truncated) for the arithmetic that uses it, but is shown, compared and
    grouped at its declared scale ``shown`` (rounded half up). Arithmetic
    with one keeps it a ``Quotient``, the declared scale following MySQL's
    types: the sum of the scales for ``*``, the larger for ``+`` and ``-``.
    """

    shown: int

    def __new__(cls, value: Decimal, shown: int) -> Quotient:
        self = Decimal.__new__(cls, value)
        self.shown = shown
        return self

    def value(self) -> Decimal:
        """The decimal the database shows (and compares)."""
        return Decimal(self).quantize(Decimal(1).scaleb(-self.shown), rounding=ROUND_HALF_UP,
                                      context=EXACT)


def shown(v: Any) -> Any:
    """``v`` as the database returns it: a :class:`Quotient` at its declared scale."""
    return v.value() if isinstance(v, Quotient) else v


def _declared_scale(v: Any) -> int:
    if isinstance(v, Quotient):
        return v.shown
    return _scale(v) if isinstance(v, Decimal) else 0


@dataclass(frozen=True)
class Collation:
    """How a database compares and groups strings.

    ``weights`` maps code points to sort weights (absent: the code point
    itself); code points above U+FFFF weigh ``supplementary`` when given.
    ``pad_space``: trailing spaces are ignored (the shorter string is compared
    as if padded with spaces).
    """

    name: str
    pad_space: bool = False
    weights: Mapping[int, int] | None = None
    supplementary: int | None = None
    #: a collation the gate does not know: comparing or grouping strings is refused
    unknown: bool = False

    def _refuse(self) -> None:
        raise Unsupported(
            f"the shards' collation {self.name!r} is not supported by the gate, so it cannot "
            f"merge, group or sort their strings the way the database does; supported: "
            f"{_SUPPORTED}; set the keyspace's 'collation' if the columns use one of them"
        )

    @functools.cached_property
    def _table(self) -> dict[int, str]:
        """``str.translate``'s table: each code point with a weight of its own, to it."""
        return {cp: chr(w) for cp, w in (self.weights or {}).items()}

    def _weigh(self, s: str) -> str:
        """The string of ``s``'s weights, one character each: weights compare as the
        strings' characters do (translated in C; a 120-character sort key weighed a
        character at a time in Python made a merged ORDER BY of 100 rows cost 10 ms)."""
        w = s.translate(self._table)
        if self.supplementary is not None and not w.isascii() and max(w) > "\uffff":
            sup = chr(self.supplementary)
            w = "".join(sup if c > "\uffff" else c for c in w)
        return w

    def weigh(self, s: str) -> str:
        """``s`` with each character replaced by its weight (same length): equal
        characters under the collation become equal, without PAD SPACE."""
        if self.unknown:
            self._refuse()
        if self.weights is None and self.supplementary is None:
            return s
        return self._weigh(s)

    def key(self, s: str) -> Hashable:
        """Equal keys exactly for the strings the collation holds equal."""
        if self.unknown:
            self._refuse()
        if self.pad_space:
            s = s.rstrip(" ")
        if self.weights is None and self.supplementary is None:
            return s
        return self._weigh(s)

    def compare(self, a: str, b: str) -> int:
        """-1, 0 or 1."""
        if self.unknown:
            self._refuse()
        if not self.pad_space and self.weights is None:
            return (a > b) - (a < b)
        wa = self._weigh(a.rstrip(" ") if self.pad_space else a)
        wb = self._weigh(b.rstrip(" ") if self.pad_space else b)
        if self.pad_space:  # PAD SPACE: the shorter compared as if padded with spaces
            n = max(len(wa), len(wb))
            wa, wb = wa.ljust(n), wb.ljust(n)
        return (wa > wb) - (wa < wb)


BINARY = Collation("binary")
COLLATIONS: dict[str, Collation] = {
    "binary": BINARY,
    "utf8mb4_bin": Collation("utf8mb4_bin", pad_space=True),
    "utf8mb4_general_ci": Collation("utf8mb4_general_ci", pad_space=True,
                                    weights=GENERAL_CI_WEIGHTS, supplementary=0xFFFD),
}
#: other names of the binary collation (PostgreSQL's)
_BINARY_NAMES = ("c", "c.utf-8", "c.utf8", "posix", "ucs_basic")
_SUPPORTED = [*sorted(COLLATIONS), "C", "POSIX", "ucs_basic"]


def collation(name: str) -> Collation:
    """The supported collation called ``name``; refuses the others."""
    found = _known(name)
    if found is None:
        raise InvalidArgument(
            f"collation {name!r} is not supported by the gate (it could not merge shards' "
            f"strings the way the database compares them); supported: {_SUPPORTED}"
        )
    return found


def _known(name: str) -> Collation | None:
    key = name.lower()
    return BINARY if key in _BINARY_NAMES else COLLATIONS.get(key)


_NUMERIC_PREFIX = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_INT_TEXT = re.compile(r"[+-]?\d+")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | Decimal) and not isinstance(v, bool)


def _cmp(a: Any, b: Any) -> int:
    return -1 if a < b else (1 if a > b else 0)


def _scale(d: Decimal) -> int:
    exponent = d.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def pg_div_scale(num: Decimal, den: Decimal) -> int:
    """``select_div_scale`` of PostgreSQL's numeric.c for ``num / den``."""
    w1, f1 = _pg_weight(num)
    w2, f2 = _pg_weight(den)
    qweight = w1 - w2
    if f1 <= f2:
        qweight -= 1
    return min(max(16 - qweight * 4, _scale(num), _scale(den), 0), 1000)


def _pg_weight(d: Decimal) -> tuple[int, int]:
    """PostgreSQL's numeric weight and first base-10000 digit of ``d``."""
    d = abs(d)
    if d == 0:
        return 0, 0
    weight = 0
    while d >= 10000:
        d /= 10000
        weight += 1
    while d < 1:
        d *= 10000
        weight -= 1
    return weight, int(d)


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul,
}
_EXACT_ARITH: dict[str, Callable[[Decimal, Decimal], Decimal]] = {
    "+": EXACT.add, "-": EXACT.subtract, "*": EXACT.multiply,
}


@dataclass(frozen=True)
class Semantics:
    """Values as one dialect and collation treat them (see the module doc)."""

    dialect: Dialect
    collation: Collation = BINARY
    #: the database's collation / locale name as read from it, lower case
    #: (PostgreSQL's ``c.utf-8``: what LOWER and UPPER follow)
    locale: str = ""

    @functools.cached_property
    def rules(self) -> ValueRules:
        """The dialect's value rules (:mod:`~shardgate.evalengine.rules`)."""
        return rules_of(self.dialect)

    # -------------------------------------------------------------- numbers --

    def number(self, v: Any) -> Any:
        """``v`` as a number for arithmetic and SUM (not NULL)."""
        if isinstance(v, bool):
            return int(v)
        if _is_number(v):
            return v
        rules = self.rules
        if isinstance(v, str | bytes) and rules.text_is_number:
            text = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            m = _NUMERIC_PREFIX.match(text)
            if m is None:
                return rules.non_numeric_text
            digits = m.group(1)
            if rules.integer_text_is_integer and _INT_TEXT.fullmatch(digits):
                n = int(digits)
                return n if INT64_MIN <= n <= INT64_MAX else float(n)
            return float(digits)
        raise Unsupported(
            f"the gate cannot use {type(v).__name__} value {v!r} as a number the way "
            f"{self.dialect} would"
        )

    def arith(self, op: str, a: Any, b: Any, declared: str | None = None) -> Any:
        """``a op b`` for ``op`` in ``+ - *``; NULL if either is NULL.

        ``declared``: the integer type both operands have in the statement (see
        :func:`~shardgate.evalengine.evaluate.integer_type`); where the dialect keeps
        it (:attr:`~shardgate.evalengine.rules.ValueRules.narrow_integers`), an integer
        result past its range fails as the database fails.
        """
        if a is None or b is None:
            return None
        a, b = self.number(a), self.number(b)
        if isinstance(a, float) or isinstance(b, float):
            return _ARITH[op](float(a), float(b))
        if isinstance(a, int) and isinstance(b, int):
            r = _ARITH[op](a, b)
            bits = self.rules.narrow_integers.get(declared) if declared else None
            if bits is None:
                pass
            elif bits == 0:  # exact (PostgreSQL's numeric): no range
                return r
            elif not -(1 << (bits - 1)) <= r < 1 << (bits - 1):
                raise InvalidArgument(f"{declared} out of range in '{a} {op} {b}'")
            if INT64_MIN <= r <= INT64_MAX:
                return r
            if self.rules.overflow_to_double:
                return _ARITH[op](float(a), float(b))
            raise InvalidArgument(f"BIGINT value is out of range in '{a} {op} {b}'")
        exact = _EXACT_ARITH[op](Decimal(a), Decimal(b))
        if isinstance(a, Quotient) or isinstance(b, Quotient):
            sa, sb = _declared_scale(a), _declared_scale(b)
            return Quotient(exact, min(sa + sb if op == "*" else max(sa, sb), _MYSQL_MAX_SCALE))
        return exact

    def divide(self, a: Any, b: Any) -> Any:
        """``a / b`` as the gate's SQL divides on the dialect; NULL for ``x / 0``.

        The gate speaks MySQL: its ``/`` reaches SQLite as ``CAST(a AS REAL) / b``
        and PostgreSQL as ``CAST(a AS DOUBLE PRECISION) / NULLIF(b, 0)``, a double
        there; on MySQL/MariaDB it is a decimal division.
        """
        if a is None or b is None:
            return None
        a, b = self.number(a), self.number(b)
        if b == 0:
            return None
        if isinstance(a, float) or isinstance(b, float) or not self.rules.decimal_division:
            return float(a) / float(b)
        return self.decimal_divide(a if isinstance(a, Decimal) else Decimal(a),
                                   b if isinstance(b, Decimal) else Decimal(b))

    def decimal_divide(self, num: Decimal, den: Decimal) -> Decimal:
        """Exact decimal division at the database's result scale, rounded half up.

        MySQL/MariaDB: a :class:`Quotient` shown at the dividend's declared scale
        plus ``div_precision_increment``, holding the whole 9-digit words of
        ``decimal_div`` (the operands' scales plus the increment), truncated;
        PostgreSQL: ``select_div_scale`` (numeric division, e.g. AVG).
        """
        if self.rules.pg_division_scale:
            scale = pg_div_scale(num, den)
            return EXACT.divide(num, den).quantize(
                Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=EXACT)
        declared = min(_declared_scale(num) + DIV_PRECISION_INCREMENT, _MYSQL_MAX_SCALE)
        words = -(-(_scale(num) + _scale(den) + DIV_PRECISION_INCREMENT) // _DIGITS_PER_WORD)
        held = EXACT.divide(num, den).quantize(
            Decimal(1).scaleb(-words * _DIGITS_PER_WORD), rounding=ROUND_DOWN, context=EXACT)
        return Quotient(held, declared)

    # ---------------------------------------------------------------- truth --

    def truth(self, v: Any) -> bool | None:
        """SQL truth of ``v``: True, False or None (unknown)."""
        if v is None or isinstance(v, bool):
            return v
        if self.rules.boolean_conditions:
            raise Unsupported(
                f"a condition must be boolean on PostgreSQL, got {type(v).__name__} {v!r}"
            )
        return bool(self.number(shown(v)) != 0)

    def boolean(self, v: bool | None) -> Any:
        """A condition's value as the database returns it: 1/0, or a PostgreSQL boolean."""
        if v is None or self.rules.boolean_conditions:
            return v
        return int(v)

    # ----------------------------------------------------------- comparison --

    def compare(self, a: Any, b: Any) -> int:
        """-1, 0 or 1 for two non-NULL values."""
        if isinstance(a, bool):
            a = int(a)
        if isinstance(b, bool):
            b = int(b)
        na, nb = _is_number(a), _is_number(b)
        if na and nb:
            a, b = shown(a), shown(b)
            if not self.rules.exact_mixed_numbers and \
                    isinstance(a, float) is not isinstance(b, float):
                # a double against an integer or a decimal (0.1 as written) compares as
                # doubles on MariaDB and PostgreSQL: f = 0.1 holds for the double 0.1
                return _cmp(float(a), float(b))
            return _cmp(a, b)
        if isinstance(a, str) and isinstance(b, str):
            return self.collation.compare(a, b)
        if isinstance(a, bytes) and isinstance(b, bytes):
            return _cmp(a, b)
        rules = self.rules
        if rules.storage_class_order:
            ra, rb = _storage_class(a), _storage_class(b)
            if ra != rb and ra and rb:
                return _cmp(ra, rb)
        elif rules.text_compares_as_number and (na or nb) and _stringlike(a, b):
            return _cmp(float(self.number(a)), float(self.number(b)))
        elif rules.text_compares_as_number and _stringlike(a, b):
            return _cmp(_as_bytes(a), _as_bytes(b))
        if type(a) is type(b):
            try:
                return _cmp(a, b)
            except TypeError:
                pass
        raise Unsupported(
            f"the gate cannot compare {type(a).__name__} {a!r} with {type(b).__name__} "
            f"{b!r} the way {self.dialect} would"
        )

    def equal(self, a: Any, b: Any) -> bool | None:
        """``a = b`` in three-valued logic."""
        if a is None or b is None:
            return None
        return self.compare(a, b) == 0

    def key(self, v: Any) -> Hashable:
        """Equal keys for the values GROUP BY / DISTINCT put together."""
        if isinstance(v, str):
            return self.collation.key(v)
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, Quotient):
            return v.value()
        return v  # type: ignore[no-any-return]


def _storage_class(v: Any) -> int:
    """SQLite's order of storage classes: numbers, text, blobs (0: other)."""
    if _is_number(v):
        return 1
    if isinstance(v, str):
        return 2
    if isinstance(v, bytes):
        return 3
    return 0


def _stringlike(a: Any, b: Any) -> bool:
    return all(_is_number(x) or isinstance(x, str | bytes) for x in (a, b))


def _as_bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


@functools.lru_cache(maxsize=64)
def semantics(dialect: str, collation_name: str | None = None) -> Semantics:
    """The semantics of ``dialect`` with ``collation_name`` (default: the dialect's).

    An unsupported collation (a database's own, read from it) gives semantics
    that refuse string comparisons, and only those.
    """
    rules = rules_of(dialect)
    name = collation_name or rules.default_collation
    return Semantics(rules.dialect, _known(name) or Collation(name, unknown=True), name.lower())
