"""Each dialect's value rules, as one table per :class:`~shardgate.sql.dialects.Dialect`.

Everything in ``evalengine`` that a database does its own way reads it from
the dialect's :class:`ValueRules` (:func:`rules_of`) instead of branching on
the dialect's name: how text becomes a number, what overflows, how ``/``
divides, what a condition may be, how mixed types compare, what a constant
becomes next to a column, how values print as text, LIKE and LOWER/UPPER,
the result type of CASE/COALESCE, and how a column's declared type converts
what it is given (:mod:`~shardgate.evalengine.coerce`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardgate.evalengine.casemap import C_UTF8_LOWER, C_UTF8_UPPER, MARIADB_LOWER, MARIADB_UPPER
from shardgate.sql.dialects import Dialect

#: (LOWER, UPPER) code point tables
CaseTables = tuple[Mapping[int, int], Mapping[int, int]]


class ConstantAffinity(enum.Enum):
    """What a constant compared with a column's value becomes."""

    #: the constant as written (MySQL/MariaDB)
    NONE = "none"
    #: a quoted constant takes the column's type (PostgreSQL's unknown literals)
    TYPED = "typed"
    #: SQLite's affinity: numeric text becomes a number next to a number, a number
    #: text next to text
    SQLITE = "sqlite"


class LikeFold(enum.Enum):
    """What LIKE compares characters by."""

    #: the collation's weights (MariaDB)
    COLLATION = "collation"
    #: ASCII letters folded to lower case (SQLite without ICU)
    ASCII = "ascii"
    #: code points (PostgreSQL's deterministic collations)
    EXACT = "exact"


@dataclass(frozen=True)
class ValueRules:
    """How one dialect's database treats values (see the module doc)."""

    dialect: Dialect
    #: the collation when neither the topology nor the database names one
    default_collation: str
    #: the database's name in messages
    title: str
    # ---------------------------------------------------------------- numbers --
    #: a string's numeric prefix is its number in arithmetic and truth (else refused)
    text_is_number: bool
    #: what text without a numeric prefix is as a number
    non_numeric_text: int | float
    #: text holding an integer is that integer (not a double)
    integer_text_is_integer: bool
    #: integer arithmetic past BIGINT gives a double (else an error)
    overflow_to_double: bool
    #: ``/`` of exact numbers is a decimal division (else the gate's ``/`` reaches the
    #: database as a division of doubles)
    decimal_division: bool
    #: numeric division at PostgreSQL's ``select_div_scale`` (else MySQL's
    #: ``div_precision_increment`` and 9-digit words)
    pg_division_scale: bool
    # ---------------------------------------------------------------- truth --
    #: conditions must be booleans, and are returned as booleans (else 1/0)
    boolean_conditions: bool
    # ----------------------------------------------------------- comparison --
    #: a double against an integer or decimal compares exactly (else as doubles)
    exact_mixed_numbers: bool
    #: values of different storage classes order numbers < text < blobs
    storage_class_order: bool
    #: text against a number compares as doubles; text against bytes as bytes
    text_compares_as_number: bool
    #: what a constant compared with a column becomes
    constant_affinity: ConstantAffinity
    #: a literal with a point (``1.5``) is a double (else an exact decimal)
    fractional_literal_is_double: bool
    #: a literal with an exponent (``1e2``) is a double
    exponent_literal_is_double: bool
    # ------------------------------------------------------------- functions --
    #: functions over text or numbers refuse other types (LOWER(int), int LIKE ...)
    strict_operands: bool
    #: decimals have a text of their own (fixed point at their scale)
    decimal_text: bool
    #: LIKE's escape character when no ESCAPE is written
    like_escape: str | None
    like_fold: LikeFold
    #: LOWER/UPPER tables by lower-case collation or locale name
    case_tables: Mapping[str, CaseTables] = field(default_factory=dict)
    #: collations / locales under which only ASCII letters change case ("*": all)
    ascii_case: frozenset[str] = frozenset()
    #: CASE / COALESCE / IF have one result type for all branches (text wins)
    unified_result_type: bool = False
    # ------------------------------------------------- column kinds (coerce) --
    #: the query listing a table's (column, declared type); ``{ph}``: the table
    column_types_sql: str = ""
    #: declared types read by SQLite's affinity rules (else exact type names)
    affinity_types: bool = False
    integer_types: frozenset[str] = frozenset()
    text_types: frozenset[str] = frozenset()
    #: CHAR columns drop trailing spaces (MySQL)
    char_drops_spaces: bool = False
    #: booleans convert to integers in integer columns (else refused)
    bool_to_integer: bool = True
    #: decimal or exponent text (``'5.0'``) reads into an integer column
    number_text_to_integer: bool = True
    #: a read compares text with an integer column after skipping spaces, and text
    #: that is no number matches no row (SQLite's numeric affinity)
    affinity_reads: bool = False
    #: a read of a number against a text column compares as numbers: every shard
    number_reads_text_as_number: bool = False
    #: integer types narrower than BIGINT that arithmetic keeps (PostgreSQL's
    #: ``int4 * int4`` is int4, "integer out of range" past it), by declared type: bits
    #: (0: exact, PostgreSQL's ``numeric`` from SUM of ``bigint``)
    narrow_integers: Mapping[str, int] = field(default_factory=dict)


_MYSQL_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})
_MYSQL_TEXTS = frozenset({"varchar", "tinytext", "text", "mediumtext", "longtext"})

RULES: dict[Dialect, ValueRules] = {
    Dialect.MYSQL: ValueRules(
        Dialect.MYSQL, "utf8mb4_general_ci", "MariaDB",
        text_is_number=True, non_numeric_text=0.0, integer_text_is_integer=False,
        overflow_to_double=False, decimal_division=True, pg_division_scale=False,
        boolean_conditions=False, exact_mixed_numbers=False, storage_class_order=False,
        text_compares_as_number=True, constant_affinity=ConstantAffinity.NONE,
        fractional_literal_is_double=False, exponent_literal_is_double=True,
        strict_operands=False, decimal_text=True, like_escape="\\",
        like_fold=LikeFold.COLLATION,
        case_tables={"utf8mb4_general_ci": (MARIADB_LOWER, MARIADB_UPPER)},
        unified_result_type=True,
        column_types_sql="SELECT column_name, data_type FROM information_schema.columns "
                         "WHERE table_schema = DATABASE() AND table_name = {ph}",
        integer_types=_MYSQL_INTEGERS, text_types=_MYSQL_TEXTS, char_drops_spaces=True,
        number_reads_text_as_number=True,
    ),
    Dialect.POSTGRES: ValueRules(
        Dialect.POSTGRES, "binary", "PostgreSQL",
        text_is_number=False, non_numeric_text=0, integer_text_is_integer=False,
        overflow_to_double=False, decimal_division=False, pg_division_scale=True,
        boolean_conditions=True, exact_mixed_numbers=False, storage_class_order=False,
        text_compares_as_number=False, constant_affinity=ConstantAffinity.TYPED,
        fractional_literal_is_double=False, exponent_literal_is_double=False,
        strict_operands=True, decimal_text=True, like_escape="\\", like_fold=LikeFold.EXACT,
        case_tables={"c.utf-8": (C_UTF8_LOWER, C_UTF8_UPPER),
                     "c.utf8": (C_UTF8_LOWER, C_UTF8_UPPER)},
        ascii_case=frozenset({"c", "posix"}),
        column_types_sql="SELECT column_name, data_type FROM information_schema.columns "
                         "WHERE table_schema = current_schema() AND table_name = {ph}",
        integer_types=frozenset({"smallint", "integer", "bigint"}),
        text_types=frozenset({"character varying", "text"}),
        bool_to_integer=False, number_text_to_integer=False,
        narrow_integers={"smallint": 16, "integer": 32, "numeric": 0},
    ),
    Dialect.SQLITE: ValueRules(
        Dialect.SQLITE, "binary", "SQLite",
        text_is_number=True, non_numeric_text=0, integer_text_is_integer=True,
        overflow_to_double=True, decimal_division=False, pg_division_scale=False,
        boolean_conditions=False, exact_mixed_numbers=True, storage_class_order=True,
        text_compares_as_number=False, constant_affinity=ConstantAffinity.SQLITE,
        fractional_literal_is_double=True, exponent_literal_is_double=True,
        strict_operands=False, decimal_text=False, like_escape=None, like_fold=LikeFold.ASCII,
        ascii_case=frozenset({"*"}),
        column_types_sql="SELECT name, type FROM pragma_table_info({ph})",
        affinity_types=True, affinity_reads=True,
    ),
}


def rules_of(dialect: str) -> ValueRules:
    """The rules of ``dialect`` (a :class:`Dialect` or its name, ``postgresql`` too)."""
    found = RULES.get(dialect)  # type: ignore[call-overload]
    return found if found is not None else RULES[Dialect.of(dialect)]
