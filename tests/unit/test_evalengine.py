"""The gate's evaluation engine: functions computed after merging shards, per dialect.

Expected values are what each database answers (checked on MariaDB 10.11,
PostgreSQL 15 under C.UTF-8 and SQLite 3.40; the differential tester
compares them end to end).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from shardgate.errors import Code, ShardgateError, Unsupported
from shardgate.evalengine import functions as fn
from shardgate.evalengine.evaluate import Unresolved, compile_expr, kind_of
from shardgate.evalengine.functions import Kind
from shardgate.evalengine.rules import RULES, rules_of
from shardgate.evalengine.sqlsem import Quotient, Semantics, semantics
from shardgate.sql.dialects import Dialect
from shardgate.sql.parse import parse

MARIADB = semantics("mysql")  # utf8mb4_general_ci
PG = semantics("postgres", "C.UTF-8")
PG_C = semantics("postgres", "C")
SQLITE = semantics("sqlite")


def value(sql: str, row: tuple[Any, ...], sem: Semantics, slots: dict[str, int] | None = None
          ) -> Any:
    """The value of the first select item of ``sql`` over ``row`` (slots a, b, c...)."""
    node = parse(sql).expressions[0]
    names = slots if slots is not None else {chr(ord("a") + i): i for i in range(len(row))}
    return compile_expr(node, names)(row, sem)


def test_every_dialect_has_value_rules() -> None:
    assert set(RULES) == set(Dialect)
    assert rules_of("postgresql") is RULES[Dialect.POSTGRES]
    assert semantics("postgres").dialect is Dialect.POSTGRES


@pytest.mark.parametrize(("sem", "text", "lower", "upper"), [
    (MARIADB, "ÁbC ß İ", "ábc ß i", "ÁBC ß İ"),
    (PG, "ÁbC ß İ", "ábc ß i", "ÁBC ß İ"),
    (PG_C, "AbC z", "abc z", "ABC Z"),
    (SQLITE, "ÁbC ß", "Ábc ß", "ÁBC ß"),
])
def test_lower_and_upper_follow_the_databases_case_maps(
    sem: Semantics, text: str, lower: str, upper: str
) -> None:
    assert fn.change_case(sem, text, upper=False) == lower
    assert fn.change_case(sem, text, upper=True) == upper
    assert fn.change_case(sem, None, upper=True) is None


def test_case_maps_refuse_what_the_gate_does_not_know() -> None:
    with pytest.raises(Unsupported, match="non-ASCII"):
        fn.change_case(semantics("postgres", "en_US.UTF-8"), "Á", upper=False)
    assert fn.change_case(semantics("postgres", "en_US.UTF-8"), "Ab", upper=False) == "ab"
    with pytest.raises(Unsupported, match="refused by PostgreSQL"):
        fn.change_case(PG, 3, upper=False)
    assert fn.change_case(MARIADB, 3, upper=False) == "3"


def test_concat_is_null_with_any_null_and_prints_exact_numbers() -> None:
    assert fn.concat(MARIADB, ["a", None]) is None
    assert fn.concat(SQLITE, ["a", 3, "-", -7]) == "a3--7"
    assert fn.concat(MARIADB, [Decimal("2.50"), "|", Quotient(Decimal("2.142857142"), 4)]) == \
        "2.50|2.1429"
    with pytest.raises(Unsupported, match=r"float value 0\.1 .* PostgreSQL formats"):
        fn.concat(PG, ["a", 0.1])
    with pytest.raises(Unsupported):
        fn.concat(SQLITE, [Decimal("1.5")])


@pytest.mark.parametrize(("sem", "text", "pattern", "hit"), [
    (MARIADB, "Ábc", "a%", True),  # accents and case by the collation's weights
    (MARIADB, "ß", "s", True),
    (MARIADB, "abc ", "%c", False),  # trailing spaces count in LIKE
    (MARIADB, "a%c", "a\\%c", True),  # the default escape
    (MARIADB, "abc", "a\\%c", False),
    (SQLITE, "ABC", "a_c", True),  # ASCII letters fold
    (SQLITE, "Ábc", "á%", False),  # others do not
    (SQLITE, "a\\bc", "a\\%", True),  # no default escape
    (PG, "Abc", "a%", False),  # code points
    (PG, "a_c", "a\\_c", True),
    (PG, "line\nbreak", "line%", True),
])
def test_like_follows_each_dialects_rules(sem: Semantics, text: str, pattern: str,
                                          hit: bool) -> None:
    assert fn.like(sem, text, pattern) is hit


def test_like_escape_null_and_refusals() -> None:
    assert fn.like(SQLITE, "a%", "a!%", "!") is True
    assert fn.like(MARIADB, None, "a") is None and fn.like(MARIADB, "a", None) is None
    assert value("SELECT a NOT LIKE 'R%'", ("red",), MARIADB) == 0
    assert value("SELECT a NOT LIKE 'R%'", ("red",), PG) is True
    assert value("SELECT a LIKE 'r!%' ESCAPE '!'", ("r%",), SQLITE) == 1
    assert value("SELECT a NOT LIKE 'x'", (None,), SQLITE) is None
    with pytest.raises(Unsupported, match="escape"):
        fn.like(PG, "a", "a\\")
    with pytest.raises(Unsupported, match="not text"):
        fn.like(PG, 3, "3")
    assert fn.like(MARIADB, 31, "3%") is True


@pytest.mark.parametrize(("a", "b", "want"), [
    (7, 3, 1), (-7, 3, -1), (7, -3, 1), (-7, -3, -1), (7, 0, None), (None, 3, None),
    (Decimal("-7.5"), 2, Decimal("-1.5")),
])
def test_modulo_takes_the_dividends_sign(a: Any, b: Any, want: Any) -> None:
    for sem in (MARIADB, PG, SQLITE):
        assert fn.modulo(sem, a, b) == want


def test_modulo_refuses_doubles() -> None:
    with pytest.raises(Unsupported):
        fn.modulo(MARIADB, 7.5, 2)


def test_coalesce_case_if_and_nullif() -> None:
    assert value("SELECT COALESCE(a, b, 3)", (None, None), SQLITE) == 3
    assert value("SELECT IFNULL(a, 'x')", (None,), PG) == "x"
    assert value("SELECT NULLIF(a, 'RED')", ("red",), MARIADB) is None  # the collation
    assert value("SELECT NULLIF(a, 'RED')", ("red",), PG) == "red"
    assert value("SELECT CASE WHEN a > 1 THEN 'big' WHEN a IS NULL THEN 'none' END",
                 (None,), SQLITE) == "none"
    assert value("SELECT CASE WHEN a > 1 THEN 'big' END", (0,), SQLITE) is None
    assert value("SELECT CASE a WHEN 1 THEN 'one' WHEN 'red' THEN 'r' ELSE 'x' END",
                 ("red",), SQLITE) == "r"
    # SQLite: a column of TEXT affinity makes the constant 1 the text '1'
    assert value("SELECT CASE a WHEN 1 THEN 'one' ELSE 'x' END", ("1",), SQLITE) == "one"
    assert value("SELECT IF(a, 'y', 'n')", (0,), MARIADB) == "n"


def test_mariadb_gives_case_and_coalesce_one_result_type() -> None:
    # a text branch makes the result text, whichever branch is taken
    assert value("SELECT CASE WHEN a > 1 THEN a ELSE 'small' END", (5,), MARIADB) == "5"
    assert value("SELECT CASE WHEN a > 1 THEN a ELSE 'small' END", (5,), SQLITE) == 5
    assert value("SELECT COALESCE(a, b)", (3, "x"), MARIADB) == "3"
    assert value("SELECT COALESCE(a, b)", (3, 4), MARIADB) == 3
    # the other branch's type is unknown when it is NULL: refused, not guessed
    for sql, row in (("SELECT COALESCE(a, 0)", (None,)), ("SELECT COALESCE(a, b)", (None, 4))):
        with pytest.raises(Unsupported, match="does not know"):
            value(sql, row, MARIADB)
    assert value("SELECT COALESCE(a, 0)", (None,), SQLITE) == 0
    assert value("SELECT COALESCE(COUNT(*), 0)", (None,), MARIADB, {"count(*)": 0}) == 0


def test_kinds_are_read_from_the_expression() -> None:
    def k(sql: str) -> Kind:
        return kind_of(parse(sql).expressions[0])

    assert k("SELECT CONCAT(a, 1)") is Kind.TEXT
    assert k("SELECT COUNT(*) + 1") is Kind.NUMBER
    assert k("SELECT MIN(a)") is Kind.UNKNOWN
    assert k("SELECT CASE WHEN a THEN 1 ELSE 'x' END") is Kind.TEXT
    assert k("SELECT COALESCE(NULL, 2)") is Kind.NUMBER
    assert k("SELECT a LIKE 'x'") is Kind.NUMBER


def test_what_the_gate_does_not_evaluate_is_refused_with_a_code() -> None:
    with pytest.raises(ShardgateError) as err:
        compile_expr(parse("SELECT LENGTH(a)").expressions[0], {"a": 0})
    assert err.value.code is Code.UNIMPLEMENTED and "LENGTH" in err.value.message
    with pytest.raises(Unresolved):
        compile_expr(parse("SELECT LOWER(b)").expressions[0], {"a": 0})


def _typed(sql: str, types: dict[str, str]) -> Any:
    """The first select item of ``sql`` with its columns' declared types set."""
    from sqlglot import exp

    from shardgate.evalengine.evaluate import DECLARED_TYPE

    node = parse(sql).expressions[0]
    for col in node.find_all(exp.Column):
        if col.name in types:
            col.meta[DECLARED_TYPE] = types[col.name]
    return node


def test_postgres_keeps_int4_and_int2_through_arithmetic() -> None:
    # PostgreSQL 15: SELECT MIN(n) * 2 (n int4 = 2147483647) -> 'integer out of range';
    # MIN(n) * 3000000000 (an int8 literal) -> 6442450941000000000; smallint * smallint
    # -> 'smallint out of range'; MariaDB and SQLite compute in BIGINT
    from shardgate.evalengine.evaluate import integer_type

    big = (2147483647,)
    node = _typed("SELECT MIN(n) * 2", {"n": "integer"})
    assert integer_type(node) == "integer"
    with pytest.raises(ShardgateError, match="integer out of range") as caught:
        compile_expr(node, {"min(n)": 0})(big, PG)
    assert caught.value.code is Code.INVALID_ARGUMENT
    assert compile_expr(node, {"min(n)": 0})(big, MARIADB) == 4294967294
    assert compile_expr(node, {"min(n)": 0})(big, SQLITE) == 4294967294
    wide = _typed("SELECT MIN(n) * 3000000000", {"n": "integer"})
    assert integer_type(wide) == "bigint"
    assert compile_expr(wide, {"min(n)": 0})(big, PG) == 6442450941000000000
    neg = _typed("SELECT -MAX(n)", {"n": "integer"})
    with pytest.raises(ShardgateError, match="integer out of range"):
        compile_expr(neg, {"max(n)": 0})((-2147483648,), PG)
    small = _typed("SELECT a * b", {"a": "smallint", "b": "smallint"})
    with pytest.raises(ShardgateError, match="smallint out of range"):
        compile_expr(small, {"a": 0, "b": 1})((200, 200), PG)
    mixed = _typed("SELECT a * b", {"a": "smallint", "b": "integer"})
    assert compile_expr(mixed, {"a": 0, "b": 1})((200, 200), PG) == 40000
    # SUM of int8 is numeric there: exact, past BIGINT
    total = _typed("SELECT SUM(DISTINCT k) * 4", {"k": "bigint"})
    assert integer_type(total) == "numeric"
    assert compile_expr(total, {"sum(distinct k)": 0})((1 << 62,), PG) == 1 << 64
    # no declared type (a COUNT, an untracked column): BIGINT's range, as before
    assert integer_type(parse("SELECT COUNT(*) * 2").expressions[0]) is None
    assert value("SELECT a * 2", big, PG) == 4294967294
