"""The MySQL listener's normalizer learned per statement shape gives exactly what
``bind_literals`` gives, statement after statement of one shape with other values."""

from __future__ import annotations

import random

import pytest

from shardgate.api.mysql.shapes import Shapes
from shardgate.sql.literals import bind_literals

#: Statement shapes; ``{i}`` takes an integer, ``{s}`` a string's body (in the quotes
#: written around it), ``{n}`` a negative integer's digits.
SHAPES = [
    "SELECT id, v FROM t WHERE id = {i}",
    "select * from t where name = '{s}' and x>=-{n}",
    "update t set a = {i} where id = {i}",
    "select a = {i} from t where b = {i} limit {i}",
    "delete from t where (a = '{s}')",
    'select * from t where s = "{s}"',
    "SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN {i} AND {i}",
    "select * from t where b = {i} and x not between '{s}' And '{s}' order by x",
    "select * from t where between_x = {i} and y between-{n} and {i}",
    "UPDATE sbtest1 SET c='{s}' WHERE id={i}",
    "update t set k = k + {i}, v = {i} where id = {i}",
    "INSERT INTO sbtest1(k, c, pad) VALUES({i}, '{s}', '{s}'),({i}, '{s}', '{s}')",
    "replace into `t` (a, b) values (null, 1.5), ( DEFAULT , -{n} );",
    "select * from t where a = '{s}' collate utf8mb4_bin",
    "select * from t where a = 1.5 and b = {i}",
    "select * from t where a in (select b from u where c = {i})",
    "select * from t where a = '{s}' '{s}'",
    "select * from t where a = 0x1f and b = {i}",
    "select * from t where a = _utf8mb4'{s}' and b = {i}",
    "select * from t where j->'$.a' = '{s}'",
    "select 'where a = {i}' from t where b = {i}",
    "select * from t where x between 1.5 and {i}",
    "select * from t where abetween {i} and {i}",
    "insert into t (a, b) values ({i}, now())",
    "insert into t (a) values ({i}) on duplicate key update a = {i}",
    "select `{i}`, t{i}.x, {i}e3, x.{i} from t{i} where a{i} = {i} and `c` = {i}",
    "select * from t where a = {i} /* where b = '{s}' */ and c = {i}",
    "select * from t where a = {i} -- it's {i}\n and c = '{s}'",
    "select * from t where a in ({i}, {i}, '{s}') and b <=> {i}",
    "select * from t where a = :id and b = {i}",
    "select * from t where a = '{s}",
]

STRINGS = ["x", "", "o''k", "a\\'b", "d\\\"q", "10:30", "select", "SeLeCt 1", "a%\\_", "é ü",
           "where a = 1", "\\\\", "it''s -- not # a comment", "/* no */"]


def instances(shape: str, rng: random.Random, n: int) -> list[str]:
    def fill(shape: str) -> str:
        out = shape
        while "{i}" in out or "{s}" in out or "{n}" in out:
            out = out.replace("{i}", str(rng.choice([0, 1, 7, 42, 4242, 2**63 - 1,
                                                     rng.randrange(10**6)])), 1)
            out = out.replace("{n}", str(rng.randrange(1, 10**6)), 1)
            out = out.replace("{s}", rng.choice(STRINGS), 1)
        return out

    return [fill(shape) for _ in range(n)]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_statement_of_a_shape_binds_as_bind_literals(shape: str) -> None:
    rng = random.Random(shape)
    shapes = Shapes()
    for sql in instances(shape, rng, 60):
        assert shapes.bind(sql) == bind_literals(sql), sql


def test_a_known_shape_is_not_scanned_again() -> None:
    shapes = Shapes()
    for i in range(100):
        assert shapes.bind(f"SELECT id, v FROM t WHERE id = {i}") == (
            "SELECT id, v FROM t WHERE id = :_l0", {"_l0": i})
        assert shapes.bind(f"select * from t where name = 'n{i}' and x >= -{i} limit 5") == (
            "select * from t where name = :_l0 and x >= :_l1 limit 5",
            {"_l0": f"n{i}", "_l1": -i})
    assert (shapes.learned, shapes.hits) == (2, 198)


def test_the_cache_is_bounded() -> None:
    shapes = Shapes(capacity=8)
    for i in range(50):
        sql = f"SELECT c{i} FROM t WHERE id = {i}"
        assert shapes.bind(sql) == bind_literals(sql)
    assert len(shapes._recipes) <= 8


@pytest.mark.parametrize("sql", [
    "SELECT id, v FROM t WHERE id = 4242", "select @@version", "select @@SESSION.sql_mode",
    "select * from INFORMATION_SCHEMA.tables", "select * from Performance_Schema . x",
    "select Database()", "select version ()", "select * from mysql . user",
    "select * from sys.x", "select last_insert_id()", "select * from t where schema_x = 1",
    "select * from t where a = 'information_schema'", "select f(x) from t", "select t.a from t",
    "select * from mysqlx.t", "select * from t where user = 1", "select `schema` from t",
])
def test_the_direct_path_test_agrees_with_its_regex(sql: str) -> None:
    """The listener's cheap pre-test (no ``@``, ``(``, ``.``, ``schema``: no regex walk)
    decides as the regex alone did."""
    from shardgate.api.mysql.session import _NOT_DIRECT, _not_direct

    assert _not_direct(sql) == (_NOT_DIRECT.search(sql) is not None)
