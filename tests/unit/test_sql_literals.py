"""Comparison literals of MySQL text as bind variables (the MySQL listener's normalizer)."""

from __future__ import annotations

import pytest

from shardgate.sql.literals import bind_literals


@pytest.mark.parametrize(("sql", "text", "binds"), [
    ("SELECT id, v FROM t WHERE id = 42", "SELECT id, v FROM t WHERE id = :_l0", {"_l0": 42}),
    ("select * from t where name = 'o''k\\n' and x>=-5",
     "select * from t where name = :_l0 and x>=:_l1", {"_l0": "o'k\n", "_l1": -5}),
    ("update t set a = 5 where id = 7", "update t set a = :_l0 where id = :_l1",
     {"_l0": 5, "_l1": 7}),
    ("select a = 5 from t where b = 1 limit 10", "select a = 5 from t where b = :_l0 limit 10",
     {"_l0": 1}),
    ("delete from t where (a = 'x')", "delete from t where (a = :_l0)", {"_l0": "x"}),
    ("select * from t where s = \"d\\\"q\"", "select * from t where s = :_l0", {"_l0": 'd"q'}),
    ("select * from t where s = 'a%\\_'", "select * from t where s = :_l0", {"_l0": "a%\\_"}),
    # sysbench's range reads: both ends of BETWEEN, NOT BETWEEN too
    ("SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN 5 AND 104",
     "SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN :_l0 AND :_l1", {"_l0": 5, "_l1": 104}),
    ("select * from t where b = 1 and x not between 'a' And 'b' order by x",
     "select * from t where b = :_l0 and x not between :_l1 And :_l2 order by x",
     {"_l0": 1, "_l1": "a", "_l2": "b"}),
    ("select * from t where between_x = 3 and y between-1 and 2",
     "select * from t where between_x = :_l0 and y between-1 and 2", {"_l0": 3}),
    # an UPDATE's assignments (not k = k + 1)
    ("UPDATE sbtest1 SET c='1-2\\'' WHERE id=5", "UPDATE sbtest1 SET c=:_l0 WHERE id=:_l1",
     {"_l0": "1-2'", "_l1": 5}),
    ("update t set k = k + 1, v = 7 where id = 3",
     "update t set k = k + 1, v = :_l0 where id = :_l1", {"_l0": 7, "_l1": 3}),
    ("update settings set a = 1", "update settings set a = :_l0", {"_l0": 1}),
    # INSERT/REPLACE rows of literals (NULL, DEFAULT and decimals kept as written)
    ("INSERT INTO sbtest1(k, c, pad) VALUES(502, 'a-b', 'c'),(7, 'd', 'e\\'f')",
     "INSERT INTO sbtest1(k, c, pad) VALUES(:_l0, :_l1, :_l2),(:_l3, :_l4, :_l5)",
     {"_l0": 502, "_l1": "a-b", "_l2": "c", "_l3": 7, "_l4": "d", "_l5": "e'f"}),
    ("replace into `t` (a, b) values (null, 1.5), ( DEFAULT , -3 );",
     "replace into `t` (a, b) values (null, 1.5), ( DEFAULT , :_l0 );", {"_l0": -3}),
])
def test_binds_comparison_literals(sql: str, text: str, binds: dict[str, object]) -> None:
    assert bind_literals(sql) == (text, binds)


@pytest.mark.parametrize("sql", [
    "select * from t where a = 'x' collate utf8mb4_bin",  # a collation on the literal
    "select * from t where a = 1.5",  # decimals keep their exact text
    "select * from t where a in (select b from u where c = 1)",  # subqueries
    "select * from t where a = 'x' 'y'",  # adjacent strings concatenate
    "select * from t where a = :id",  # the client's own bind variables
    "select * from t where a = 0x1f",
    "select * from t where a = _utf8mb4'x'",
    "select * from t where a = 'unterminated",
    "select 1 from t /* where a = 1",
    "select * from t where j->'$.a' is null",
    "select 'where a = 1' from t",
    "select * from t where x between 1.5 and 2",  # a decimal end
    "select * from t where x between y and 2",  # a column end
    "select * from t where abetween 1 and 2",
    "select * from t where settings = 'a' and x in (select 1)",
    "insert into t (a, b) values (1, now())",  # not a literal
    "insert into t (a) values (1) on duplicate key update a = 2",
    "insert into t (a) select 1",
    "insert into t (a) values ('x' 'y')",
    "insert into t (a) values (0x1f)",
    "insert into t (a) values (1),",
    "insert into t (a) values (1.5)",  # nothing to bind
])
def test_leaves_what_it_does_not_understand(sql: str) -> None:
    assert bind_literals(sql) is None


def test_json_path_is_kept() -> None:
    assert bind_literals("select * from t where j->'$.a' = 'x'") == (
        "select * from t where j->'$.a' = :_l0", {"_l0": "x"})
