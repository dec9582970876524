"""MySQL forms translated for SQLite and PostgreSQL shards (shardgate.sql.dialects.mysql_forms),
and Vitess's ``IN ::list`` bind lists (shardgate.sql.parse.list_args)."""

from __future__ import annotations

import pytest

from shardgate.errors import Unsupported
from shardgate.sql.dialects import Dialect
from shardgate.sql.dialects.render import render
from shardgate.sql.parse import list_args, parse


def _sql(query: str, dialect: str) -> str:
    return render(parse(query), Dialect(dialect), "?").sql


@pytest.mark.parametrize("query,sqlite,postgres,mysql", [
    ("select last_insert_id()", "SELECT LAST_INSERT_ROWID()", "SELECT LASTVAL()",
     "SELECT LAST_INSERT_ID()"),
    ("select straight_join a.x from t a straight_join u b on a.id = b.id",
     "SELECT a.x FROM t AS a JOIN u AS b ON a.id = b.id",
     "SELECT a.x FROM t AS a JOIN u AS b ON a.id = b.id",
     "SELECT STRAIGHT_JOIN a.x FROM t AS a STRAIGHT_JOIN u AS b ON a.id = b.id"),
    ("(select a from t) union (select b from u)", "SELECT a FROM t UNION SELECT b FROM u",
     "(SELECT a FROM t) UNION (SELECT b FROM u)", "(SELECT a FROM t) UNION (SELECT b FROM u)"),
    ("select x from t where id in (select 1 from dual)", "SELECT x FROM t WHERE id IN (SELECT 1)",
     "SELECT x FROM t WHERE id IN (SELECT 1)", "SELECT x FROM t WHERE id IN (SELECT 1)"),
    ("delete from t where name = _binary 'abc' or name = _utf8mb4'x'",
     "DELETE FROM t WHERE name = 'abc' OR name = 'x'",
     "DELETE FROM t WHERE name = 'abc' OR name = 'x'",
     "DELETE FROM t WHERE name = _binary 'abc' OR name = _utf8mb4 'x'"),
    ("select _binary X'ff'", "SELECT x'ff'", "SELECT CAST('\\xff' AS BYTEA)",
     "SELECT _binary x'ff'"),
    ("delete u from t u join v b on u.id = b.id where b.x = 1",
     "DELETE FROM t WHERE rowid IN (SELECT u.rowid FROM t AS u JOIN v AS b ON u.id = b.id "
     "WHERE b.x = 1)",
     "DELETE FROM t WHERE ctid IN (SELECT u.ctid FROM t AS u JOIN v AS b ON u.id = b.id "
     "WHERE b.x = 1)",
     "DELETE u FROM t AS u JOIN v AS b ON u.id = b.id WHERE b.x = 1"),
    ("delete from u using t u, v b where u.id = b.id",
     "DELETE FROM t WHERE rowid IN (SELECT u.rowid FROM t AS u, v AS b WHERE u.id = b.id)",
     "DELETE FROM t WHERE ctid IN (SELECT u.ctid FROM t AS u, v AS b WHERE u.id = b.id)",
     "DELETE FROM u USING t AS u, v AS b WHERE u.id = b.id"),
    ("update t u join v b on u.id = b.id set u.x = b.y where b.z = 1",
     "UPDATE t AS u SET x = b.y FROM v AS b WHERE u.id = b.id AND b.z = 1",
     "UPDATE t AS u SET x = b.y FROM v AS b WHERE u.id = b.id AND b.z = 1",
     "UPDATE t AS u JOIN v AS b ON u.id = b.id SET u.x = b.y WHERE b.z = 1"),
])
def test_translated(query: str, sqlite: str, postgres: str, mysql: str) -> None:
    assert _sql(query, "sqlite") == sqlite
    assert _sql(query, "postgres") == postgres
    assert _sql(query, "mysql") == mysql


def test_union_arm_with_limit_is_a_derived_table_on_sqlite() -> None:
    got = _sql("(select a from t order by a limit 1) union all (select b from u)", "sqlite")
    assert got.startswith("SELECT * FROM (SELECT a FROM t ORDER BY a LIMIT 1) AS __sg_u")
    assert got.endswith("UNION ALL SELECT b FROM u")


def test_upsert_on_sqlite_refused_on_postgres() -> None:
    q = "insert into t (a, b) values (1, 2) on duplicate key update b = values(b) + 1"
    assert _sql(q, "sqlite").endswith("ON CONFLICT DO UPDATE SET b = excluded.b + 1")
    with pytest.raises(Unsupported, match="ON DUPLICATE KEY UPDATE cannot run on a postgres"):
        _sql(q, "postgres")


@pytest.mark.parametrize("query,names", [
    ("select @@session.autocommit", "@@session.autocommit"),
    ("select @@sql_mode", "@@sql_mode"),
    ("select last_insert_id(5)", "LAST_INSERT_ID\\(expr\\)"),
    ("delete a, b from t a join u b on a.id = b.id", "DELETE from several tables"),
    ("update t a left join u b on a.id = b.id set a.x = 1", "LEFT JOIN"),
    ("update t a join u b on a.id = b.id set b.x = 1", "b.x"),
])
def test_refused_naming_the_form(query: str, names: str) -> None:
    for dialect in ("sqlite", "postgres"):
        with pytest.raises(Unsupported, match=names):
            _sql(query, dialect)
    _sql(query, "mysql")  # MariaDB takes them as written


def test_list_args() -> None:
    assert list_args("select * from t where id in ::ids and s = 'a::b' and x not in ::xs") \
        == "select * from t where id in (:ids) and s = 'a::b' and x not in (:xs)"
    assert list_args("select a::int from t") == "select a::int from t"
    assert parse("delete from user where id in ::list").sql(dialect="mysql") == \
        "DELETE FROM user WHERE id IN (:list)"
