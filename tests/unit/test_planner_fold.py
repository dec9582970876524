"""Constant folding and always-false predicates for routing (issue 13, item 17)."""

from __future__ import annotations

import pytest
from sqlglot import exp

from shardgate.planner.fold import always_false, fold_integer
from shardgate.planner.target import Target, parse_target
from shardgate.sql.parse import parse


def _where(sql: str) -> exp.Expr:
    stmt = parse(f"select 1 from t where {sql}")
    return stmt.args["where"].this


@pytest.mark.parametrize("text,value", [
    ("5+5", 10), ("2*3-1", 5), ("-(4)", -4), ("(1+2)*3", 9),
    ("9223372036854775807+0", 9223372036854775807),
])
def test_integer_arithmetic_folds(text: str, value: int) -> None:
    assert fold_integer(parse(f"select {text}").expressions[0]) == value


@pytest.mark.parametrize("text", [
    "7/2", "1.5+1", "'1'+1", "9223372036854775807+1", "a+1", "2 DIV 1",
])
def test_what_engines_compute_differently_is_not_folded(text: str) -> None:
    assert fold_integer(parse(f"select {text} from t").expressions[0]) is None


@pytest.mark.parametrize("pred", [
    "col = NULL", "NULL = col", "col < NULL", "col IN (NULL)", "col IN (NULL, NULL)",
    "NULL IN (1, 2)", "1 IN ('aa', 'bb')", "1 = 2", "FALSE", "col NOT IN (NULL, 1)",
    "(col = NULL OR 1 = 2)", "a = 1 AND b = NULL",
])
def test_always_false(pred: str) -> None:
    assert always_false(_where(pred))


@pytest.mark.parametrize("pred", [
    "col = 1", "col <=> NULL", "col IS NULL", "col IN (NULL, 1)", "1 IN ('1', 'x')",
    "'a' = 'A'", "col NOT IN (1, 2)", "col = NULL OR col = 1", "1 = 1",
])
def test_not_always_false(pred: str) -> None:
    # 'a' = 'A' depends on the collation and '1' = 1 converts on MySQL/SQLite but
    # fails on PostgreSQL: such comparisons are left to the shard
    assert not always_false(_where(pred))


@pytest.mark.parametrize("text,target", [
    ("user[-]", Target("user", "-", True)),
    ("user[-80]", Target("user", "-80", True)),
    ("user[40-c0]", Target("user", "40-c0", True)),
    ("user:-80", Target("user", "-80", False)),
    ("user:80-", Target("user", "80-", False)),
    ("user", None),
    ("", None),
])
def test_shard_targets(text: str, target: Target | None) -> None:
    assert parse_target(text) == target
