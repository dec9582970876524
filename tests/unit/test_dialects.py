"""Dialect names and objects, ShardId, TableType (pure: no database)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlglot

from shardgate.errors import InvalidArgument
from shardgate.keys import ShardId
from shardgate.queues import signals
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.dialects.render import render
from shardgate.vschema import TableType, VSchema


def test_dialect_values_are_the_stored_strings() -> None:
    assert [d.value for d in Dialect] == ["sqlite", "postgres", "mysql"]
    assert Dialect("postgres") is Dialect.POSTGRES and Dialect.MYSQL == "mysql"
    assert Dialect.of("postgresql") is Dialect.POSTGRES  # a backend URL kind
    with pytest.raises(InvalidArgument, match="unknown SQL dialect 'oracle'"):
        Dialect.of("oracle")


@pytest.mark.parametrize("dialect", list(Dialect))
def test_each_dialect_has_one_object_speaking_it(dialect: Dialect) -> None:
    obj = sql_dialect(dialect)
    assert obj.name is dialect and obj.sqlglot == dialect.value
    assert sql_dialect(dialect) is obj
    assert obj.placeholder == ("?" if dialect is Dialect.SQLITE else "%s")


def test_naming_a_dialect_does_not_load_sqlglot() -> None:
    code = ("import sys, shardgate.sql.dialects, shardgate.backends.sqlite; "
            "print('sqlglot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def _render(sql: str, dialect: Dialect) -> str:
    tree = sqlglot.parse_one(sql, dialect="mysql")
    return render(tree, dialect, sql_dialect(dialect).placeholder).sql


def test_render_fixes_belong_to_their_dialect() -> None:
    locked = "SELECT id FROM t WHERE id = :id FOR UPDATE"
    assert _render(locked, Dialect.SQLITE) == "SELECT id FROM t WHERE id = ?"
    assert _render(locked, Dialect.POSTGRES).endswith("FOR UPDATE")
    shared = "SELECT id FROM t FOR SHARE"
    assert _render(shared, Dialect.MYSQL).endswith(" LOCK IN SHARE MODE")
    assert _render("INSERT IGNORE INTO t (a) VALUES (1)", Dialect.POSTGRES) == \
        "INSERT INTO t (a) VALUES (1) ON CONFLICT DO NOTHING"
    assert _render("DELETE FROM t WHERE a = 1 ORDER BY b LIMIT 2", Dialect.POSTGRES) == (
        "DELETE FROM t WHERE ctid IN (SELECT ctid FROM t WHERE a = 1 ORDER BY b NULLS FIRST "
        "LIMIT 2)")
    assert "BYTEA" in _render("CREATE TABLE t (b VARBINARY(16))", Dialect.POSTGRES)
    assert "(16)" not in _render("CREATE TABLE t (b VARBINARY(16))", Dialect.POSTGRES)
    assert _render("SELECT 'a%' FROM t", Dialect.MYSQL) == "SELECT 'a%%' FROM t"


def test_insert_ignore_and_upsert_forms() -> None:
    assert sql_dialect(Dialect.SQLITE).insert_ignore() == ("INSERT OR IGNORE INTO", "")
    assert sql_dialect(Dialect.MYSQL).insert_ignore() == ("INSERT IGNORE INTO", "")
    assert sql_dialect(Dialect.POSTGRES).insert_ignore() == \
        ("INSERT INTO", " ON CONFLICT DO NOTHING")
    pg = signals.signal_sql(Dialect.POSTGRES, "jobs", 5)
    assert "ON CONFLICT (queue) DO UPDATE SET seq = _sg_queue_signals.seq + 1" in pg
    assert "LEAST(_sg_queue_signals.since_ns, EXCLUDED.since_ns)" in pg
    my = signals.signal_sql(Dialect.MYSQL, "jobs", 5)
    assert "ON DUPLICATE KEY UPDATE seq = seq + 1, since_ns = LEAST(since_ns, " \
           "VALUES(since_ns))" in my
    lite = signals.signal_sql(Dialect.SQLITE, "jobs", 5)
    assert "since_ns = min(since_ns, excluded.since_ns)" in lite


def test_table_comments_go_where_each_dialect_keeps_them() -> None:
    lite = sql_dialect(Dialect.SQLITE).table_comment("t", "m")
    assert (lite.inner, lite.suffix, lite.after) == ("/* m */", "", ())
    my = sql_dialect(Dialect.MYSQL).table_comment("t", "m")
    assert (my.inner, my.suffix, my.after) == ("", " COMMENT = 'm'", ())
    pg = sql_dialect(Dialect.POSTGRES).table_comment("t", "m")
    assert pg.after == ("COMMENT ON TABLE t IS 'm'",)
    text = "CREATE TABLE t (\n  /* shardgate_queue,ack_wait=5 */\n  id BIGINT)"
    assert sql_dialect(Dialect.SQLITE).comment_from(text, "shardgate_queue") == \
        "shardgate_queue,ack_wait=5"
    assert sql_dialect(Dialect.SQLITE).comment_from("CREATE TABLE t (id INT)", "x") == ""
    assert sql_dialect(Dialect.SQLITE).comment_on_table("t", "m") is None


def test_shard_id_round_trips_through_its_text() -> None:
    sid = ShardId.parse("commerce/-80")
    assert sid == ShardId("commerce", "-80") and str(sid) == "commerce/-80"
    assert ShardId.parse("ks/a/b") == ShardId("ks", "a/b")  # the first slash splits
    assert {sid: 1}[ShardId("commerce", "-80")] == 1
    assert sorted([ShardId("ks", "80-"), ShardId("ks", "-80")])[0].shard == "-80"
    for bad in ("commerce", "/-80", "commerce/", ""):
        with pytest.raises(InvalidArgument, match="keyspace/shard"):
            ShardId.parse(bad)


def test_table_types_parse_from_the_vschema_document() -> None:
    vs = VSchema.from_json({
        "lookup": {"sharded": False, "tables": {"seq": {"type": "sequence"}, "plain": {}}},
        "user": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                 "tables": {"countries": {"type": "reference"},
                            "jobs": {"type": "queue",
                                     "column_vindexes": [{"column": "id", "name": "hash"}]}}},
    })
    tables = {**vs.keyspace("lookup").tables, **vs.keyspace("user").tables}
    assert tables["seq"].type is TableType.SEQUENCE
    assert tables["plain"].type is TableType.NORMAL and tables["plain"].type == ""
    assert tables["countries"].type is TableType.REFERENCE
    assert tables["jobs"].type is TableType.QUEUE
    with pytest.raises(Exception, match=r"unknown table type 'nope'; use one of "
                                        r"\['sequence', 'reference', 'queue'\]"):
        VSchema.from_json({"k": {"sharded": False, "tables": {"t": {"type": "nope"}}}})
