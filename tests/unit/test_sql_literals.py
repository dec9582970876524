"""Comparison literals of MySQL text as bind variables (the MySQL listener's normalizer)."""

from __future__ import annotations

import pytest

from shardgate.sql.literals import bind_literals


@pytest.mark.parametrize(("sql", "text", "binds"), [
    ("SELECT id, v FROM t WHERE id = 42", "SELECT id, v FROM t WHERE id = :_l0", {"_l0": 42}),
    ("select * from t where name = 'o''k\\n' and x>=-5",
     "select * from t where name = :_l0 and x>=:_l1", {"_l0": "o'k\n", "_l1": -5}),
    ("update t set a = 5 where id = 7", "update t set a = 5 where id = :_l0", {"_l0": 7}),
    ("select a = 5 from t where b = 1 limit 10", "select a = 5 from t where b = :_l0 limit 10",
     {"_l0": 1}),
    ("delete from t where (a = 'x')", "delete from t where (a = :_l0)", {"_l0": "x"}),
    ("select * from t where s = \"d\\\"q\"", "select * from t where s = :_l0", {"_l0": 'd"q'}),
    ("select * from t where s = 'a%\\_'", "select * from t where s = :_l0", {"_l0": "a%\\_"}),
])
def test_binds_comparison_literals(sql: str, text: str, binds: dict[str, object]) -> None:
    assert bind_literals(sql) == (text, binds)


@pytest.mark.parametrize("sql", [
    "select * from t where a = 'x' collate utf8mb4_bin",  # a collation on the literal
    "select * from t where a = 1.5",  # decimals keep their exact text
    "select * from t where a in (select b from u where c = 1)",  # subqueries
    "select * from t where a = 'x' 'y'",  # adjacent strings concatenate
    "select * from t where a = :id",  # the client's own bind variables
    "insert into t (a) values (1)",
    "select * from t where a = 0x1f",
    "select * from t where a = _utf8mb4'x'",
    "select * from t where a = 'unterminated",
    "select 1 from t /* where a = 1",
    "select * from t where j->'$.a' is null",
    "select 'where a = 1' from t",
])
def test_leaves_what_it_does_not_understand(sql: str) -> None:
    assert bind_literals(sql) is None


def test_json_path_is_kept() -> None:
    assert bind_literals("select * from t where j->'$.a' = 'x'") == (
        "select * from t where j->'$.a' = :_l0", {"_l0": "x"})
