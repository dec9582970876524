"""Writes that must not lose or misplace data (issue 13, items 1-6), on the recording fake."""

from __future__ import annotations

import decimal

import pytest

from shardgate.errors import Code, ShardgateError
from shardgate.evalengine.coerce import NO_MATCH, SCATTER, Kind, kind_of_type, stored_value
from shardgate.planner import build_plan
from shardgate.result import Result
from shardgate.sql.parse import parse
from shardgate.testing import RecordingCursor
from shardgate.vschema import VSchema

from .recording import FOUR, ONE, VSCHEMA, cursor, ksid, run, shard_of


def refused(sql: str, keyspace: str = "user") -> ShardgateError:
    with pytest.raises(ShardgateError) as err:
        build_plan(parse(sql), sql, VSCHEMA, keyspace)
    return err.value


# -- item 2: a column named twice ------------------------------------------------


@pytest.mark.parametrize("sql", [
    "insert into user_extra (user_id, user_id) values (77001, 77002)",
    "insert into user_extra (user_id, v, USER_ID) values (1, 2, 3)",
    "insert into main.unsharded (a, a) values (1, 2)",
])
def test_insert_naming_a_column_twice_is_refused(sql: str) -> None:
    err = refused(sql)
    assert err.code is Code.INVALID_ARGUMENT
    assert "twice" in err.message


# -- item 3: INSERT IGNORE and owned lookups -------------------------------------


def lookup_rows(vc: RecordingCursor) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    return (vc.lookup.query("select name, keyspace_id from name_user_map order by 1"),
            vc.lookup.query("select email, keyspace_id from email_user_map order by 1"))


async def test_insert_ignore_skipped_by_the_shard_leaves_no_lookup_rows() -> None:
    vc = cursor()
    vc.results = {s: Result(rows_affected=0) for s in FOUR.names}  # a duplicate id
    r = await run(vc, "insert ignore into user (id, name, email) values (1, 'a', 'a@x')")
    assert r.rows_affected == 0
    assert lookup_rows(vc) == ([], [])
    assert [line for line in vc.log if "INSERT IGNORE INTO user" in line]


async def test_insert_ignore_skips_a_row_whose_unique_lookup_value_is_taken() -> None:
    vc = cursor()
    vc.lookup.script(f"insert into email_user_map values ('b@x', x'{ksid(2).hex()}')")
    vc.results = {s: Result(rows_affected=1) for s in FOUR.names}
    r = await run(vc, "insert ignore into user (id, name, email) values (1, 'n', 'b@x'), "
                      "(3, 'c', 'c@x'), (4, 'd', 'c@x')")
    assert r.rows_affected == 1
    assert lookup_rows(vc) == ([("c", ksid(3))], [("b@x", ksid(2)), ("c@x", ksid(3))])
    inserts = [line for line in vc.log if "INSERT IGNORE INTO user" in line]
    assert len(inserts) == 1 and inserts[0].endswith("[3, 'c', 'c@x']")


async def test_insert_ignore_keeps_lookup_rows_it_did_not_create() -> None:
    vc = cursor()
    vc.lookup.script(f"insert into email_user_map values ('a@x', x'{ksid(1).hex()}');"
                     f"insert into name_user_map values ('a', x'{ksid(1).hex()}')")
    vc.results = {s: Result(rows_affected=0) for s in FOUR.names}
    await run(vc, "insert ignore into user (id, name, email) values (1, 'a', 'a@x')")
    assert lookup_rows(vc) == ([("a", ksid(1))], [("a@x", ksid(1))])


async def test_insert_ignore_skips_a_unique_value_taken_by_a_row_of_the_same_keyspace_id(
) -> None:
    # Another owner row with this keyspace id holds b@x (a table whose primary
    # vindex is not its primary key): one database's unique key skips the row,
    # while the shard, without that key, would take it (rows_affected 1).
    vc = cursor()
    vc.lookup.script(f"insert into email_user_map values ('b@x', x'{ksid(1).hex()}')")
    vc.results = {s: Result(rows_affected=1) for s in FOUR.names}
    r = await run(vc, "insert ignore into user (id, name, email) values (1, 'n', 'b@x')")
    assert r.rows_affected == 0
    assert not [line for line in vc.log if "INSERT IGNORE INTO user" in line]
    assert lookup_rows(vc) == ([], [("b@x", ksid(1))])


def test_insert_ignore_with_lookups_outside_the_transaction_is_refused() -> None:
    vs = VSchema.from_json({"s": {
        "sharded": True,
        "vindexes": {"hash": {"type": "hash"},
                     "auto": {"type": "lookup_unique", "owner": "t",
                              "params": {"table": "m", "from": "e", "to": "k",
                                         "autocommit": "true"}}},
        "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"},
                                             {"column": "e", "name": "auto"}]}},
    }})
    sql = "insert ignore into t (id, e) values (1, 'a')"
    with pytest.raises(ShardgateError) as err:
        build_plan(parse(sql), sql, vs, "s")
    assert err.value.code is Code.UNIMPLEMENTED and "'auto'" in err.value.message


async def test_insert_ignore_without_owned_lookups_still_runs() -> None:
    vc = cursor()
    await run(vc, "insert ignore into user_extra (user_id, v) values (1, 2)")
    assert len(vc.log) == 1 and "INSERT IGNORE INTO user_extra" in vc.log[0]


def test_upsert_moving_a_row_and_replace_into_sharded_tables_are_refused() -> None:
    # ON DUPLICATE KEY UPDATE into an owner of lookups runs (engine/upsert.py, issue 32);
    # one that assigns the primary vindex column would move the row
    assert refused("insert into user (id, name, email) values (1, 'a', 'a@x') "
                   "on duplicate key update id = 7").code is Code.UNIMPLEMENTED
    with pytest.raises(ShardgateError):
        build_plan(parse("replace into user (id, name) values (1, 'a')"),
                   "replace into user (id, name) values (1, 'a')", VSCHEMA, "user")


# -- item 4: IS NULL on a lookup vindex column -----------------------------------


async def test_is_null_on_a_lookup_column_scatters() -> None:
    vc = cursor()
    plan = build_plan(parse("select id from user where name is null"), "", VSCHEMA, "user")
    assert plan.describe()["Instructions"]["Variant"] == "Scatter"
    await plan.instructions.execute(vc, {})
    assert len(vc.log) == 4 and all("WHERE name IS NULL" in line for line in vc.log)


async def test_delete_where_lookup_column_is_null_reaches_every_shard() -> None:
    vc = cursor()
    vc.results = {s: Result(["id", "name", "email"], [(3, None, None)]) for s in ("-40",)}
    await run(vc, "delete from user where name is null")
    selects = [line for line in vc.log if "FOR UPDATE" in line]
    deletes = [line for line in vc.log if line.split(": ", 1)[1].startswith("DELETE")]
    assert len(selects) == 4 and len(deletes) == 4
    assert vc.lookup.query("select * from name_user_map") == []


def test_is_null_on_the_primary_vindex_still_routes_nowhere() -> None:
    plan = build_plan(parse("select id from user where id is null and name is null"), "",
                      VSCHEMA, "user")
    assert plan.describe()["Instructions"]["Variant"] == "None"


# -- item 6: subqueries in VALUES ------------------------------------------------


async def test_subquery_in_values_of_a_sharded_insert_is_computed_over_all_shards() -> None:
    vc = cursor()
    vc.results = {s: Result(["count(*)"], [(n,)]) for s, n in zip(FOUR.names, (1, 2, 3, 4),
                                                                   strict=True)}
    await run(vc, "insert into user_extra (user_id, v) values (5, (select count(*) from "
                  "user_extra))")
    counts = [line for line in vc.log if "COUNT(*)" in line]
    assert len(counts) == 4  # every shard counted
    assert vc.log[-1].endswith("INSERT INTO user_extra (user_id, v) VALUES (%s, %s) [5, 10]")


async def test_subquery_giving_the_vindex_value_routes_the_row_by_its_result() -> None:
    vc = cursor()
    vc.results = {"0": Result(["max(id)"], [(7,)])}
    await run(vc, "insert into user_extra (user_id, v) values ((select max(id) from "
                  "main.unsharded), 'a')")
    assert vc.log[0] == "ExecuteShard main/0: SELECT MAX(id) FROM unsharded []"
    assert vc.log[1] == (f"ExecuteShard user/{shard_of(7)}: INSERT INTO user_extra "
                         "(user_id, v) VALUES (%s, %s) [7, 'a']")


async def test_subquery_in_values_returning_several_rows_is_refused() -> None:
    vc = cursor()
    vc.results = {"0": Result(["a"], [(1,), (2,)])}
    with pytest.raises(ShardgateError) as err:
        await run(vc, "insert into user_extra (user_id, v) values (5, (select a from "
                      "main.unsharded))")
    assert err.value.code is Code.INVALID_ARGUMENT and "2 rows" in err.value.message
    assert not any("INSERT" in line for line in vc.log)


@pytest.mark.parametrize("value", [
    "(select count(*) from user_extra) + 1",
    "exists (select 1 from user_extra)",
    "5 in (select v from user_extra)",
])
def test_subquery_inside_an_expression_in_sharded_values_is_refused(value: str) -> None:
    err = refused(f"insert into user_extra (user_id, v) values (5, {value})")
    assert err.code is Code.UNIMPLEMENTED and "subquery" in err.message


async def test_unsharded_insert_reading_another_keyspace_computes_it_first() -> None:
    vc = cursor()
    vc.results = {s: Result(["count(*)"], [(2,)]) for s in FOUR.names}
    await run(vc, "insert into unsharded (a, b) values (1, (select count(*) from user_extra) "
                  "+ 1)", keyspace="main")
    assert vc.log[-1] == ("ExecuteShard main/0: INSERT INTO unsharded (a, b) VALUES "
                          "(1, %s + 1) [8]")


async def test_subquery_in_values_within_one_unsharded_keyspace_runs_there() -> None:
    vc = cursor()
    await run(vc, "insert into unsharded (a, b) values (1, (select count(*) from unsharded_b))",
              keyspace="main")
    assert vc.log == ["ExecuteShard main/0: INSERT INTO unsharded (a, b) VALUES "
                      "(1, (SELECT COUNT(*) FROM unsharded_b)) []"]


# -- item 1: vindex values from the value the column stores ----------------------

INT, TEXT = Kind.INTEGER, Kind.TEXT


@pytest.mark.parametrize(("value", "kind", "dialect", "write", "expected"), [
    (5.0, INT, "mysql", True, 5),
    (True, INT, "sqlite", True, 1),
    ("03", INT, "postgres", True, 3),
    ("-7", INT, "mysql", False, -7),
    ("5e0", INT, "mysql", True, 5),
    ("5.0", INT, "sqlite", False, 5),
    (decimal.Decimal("12345678901234567890"), INT, "mysql", True, 12345678901234567890),
    (5.5, INT, "mysql", False, NO_MATCH),
    ("5.5", INT, "sqlite", False, NO_MATCH),
    ("abc", INT, "sqlite", False, NO_MATCH),
    # SQLite reads a number from text skipping its whitespace: k = ' 4' matches 4
    (" 4", INT, "sqlite", False, 4),
    ("\t+4.0\n", INT, "sqlite", False, 4),
    ("\x1c4", INT, "sqlite", False, NO_MATCH),  # not a space to sqlite3Isspace
    (7, TEXT, "postgres", True, "7"),
    (7, TEXT, "sqlite", False, "7"),
    (7, TEXT, "mysql", False, SCATTER),
    (7.0, TEXT, "sqlite", False, SCATTER),
    ("07", TEXT, "mysql", True, "07"),
    (None, INT, "mysql", True, None),
    (b"03", INT, "mysql", True, b"03"),
    (5.0, Kind.OTHER, "mysql", True, 5.0),
    (5.0, None, "mysql", True, 5.0),
    ("ab  ", Kind.CHAR, "mysql", True, "ab"),
    ("ab ", Kind.CHAR, "mysql", False, "ab"),
    (7, Kind.CHAR, "mysql", True, "7"),
])
def test_stored_value(value: object, kind: Kind | None, dialect: str, write: bool,
                      expected: object) -> None:
    got = stored_value(value, kind, dialect, write=write, column="c")
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("value", "kind", "dialect", "write"), [
    (5.5, INT, "mysql", True),          # rounded by MySQL/PostgreSQL, kept REAL by SQLite
    ("abc", INT, "mysql", False),       # MySQL compares it as 0
    ("abc", INT, "sqlite", True),
    (" 7", INT, "sqlite", True),
    ("5.0", INT, "postgres", True),     # invalid input syntax for type bigint
    (True, INT, "postgres", False),     # bigint = boolean does not exist
    (float(1 << 60), INT, "mysql", True),
    (float("nan"), INT, "mysql", False),
    (7.0, TEXT, "mysql", True),         # '7.0' or '7' depending on the backend
    (True, TEXT, "postgres", True),     # 'true' on PostgreSQL, '1' elsewhere
])
def test_stored_value_refuses_what_backends_would_do_differently(
    value: object, kind: Kind, dialect: str, write: bool
) -> None:
    with pytest.raises(ShardgateError) as err:
        stored_value(value, kind, dialect, write=write, column="c")
    assert err.value.code is Code.INVALID_ARGUMENT


@pytest.mark.parametrize(("declared", "dialect", "kind"), [
    ("BIGINT", "sqlite", INT), ("unsigned big int", "sqlite", INT),
    ("VARCHAR(16)", "sqlite", TEXT), ("CLOB", "sqlite", TEXT), ("", "sqlite", Kind.OTHER),
    ("bigint", "mysql", INT), ("varchar", "mysql", TEXT), ("decimal", "mysql", Kind.OTHER),
    ("integer", "postgres", INT), ("character varying", "postgres", TEXT),
    ("numeric", "postgres", Kind.OTHER), ("char", "mysql", Kind.CHAR),
    ("character", "postgres", Kind.OTHER), ("CHAR(4)", "sqlite", TEXT),
])
def test_kind_of_type(declared: str, dialect: str, kind: Kind) -> None:
    assert kind_of_type(declared, dialect) is kind


async def test_where_on_an_integer_vindex_column_maps_the_compared_integer() -> None:
    vc = cursor()
    vc.column_types = {"user_extra": {"user_id": INT}}
    await run(vc, "select v from user_extra where user_id = 5.0")
    assert vc.log == [f"ExecuteShard user/{shard_of(5)}: SELECT v FROM user_extra "
                      "WHERE user_id = 5.0 []"]
    vc.log.clear()
    await run(vc, "select v from user_extra where user_id in (5.0, 6, 7.5)")
    expected: dict[str, list[object]] = {}
    for original, n in ((5.0, 5), (6, 6)):  # 7.5: no integer equals it
        expected.setdefault(shard_of(n), []).append(original)
    assert sorted(vc.log) == sorted(
        f"ExecuteShard user/{shard}: SELECT v FROM user_extra WHERE user_id IN "
        f"({', '.join(['%s'] * len(vals))}) {vals}" for shard, vals in expected.items())


async def test_insert_hashes_and_sends_the_stored_integer() -> None:
    vc = cursor()
    vc.column_types = {"user_extra": {"user_id": INT, "v": TEXT}}
    await run(vc, "insert into user_extra (user_id, v) values (:id, 'a')", {"id": "03"})
    assert vc.log == [f"ExecuteShard user/{shard_of(3)}: INSERT INTO user_extra "
                      "(user_id, v) VALUES (%s, %s) [3, 'a']"]
    with pytest.raises(ShardgateError) as err:
        await run(vc, "insert into user_extra (user_id, v) values (5.5, 'a')")
    assert err.value.code is Code.INVALID_ARGUMENT


async def test_lookup_rows_and_updates_record_the_stored_value() -> None:
    vc = cursor()
    vc.column_types = {"user": {"id": INT, "name": INT, "email": TEXT}}
    await run(vc, "insert into user (id, name, email) values (1, '042', 'a@x')")
    assert vc.lookup.query("select name from name_user_map") == [("42",)]
    vc.results = {shard_of(1): Result(["id", "name"], [(1, 42)])}
    await run(vc, "update user set name = '043' where id = 1")
    assert vc.lookup.query("select name from name_user_map") == [("43",)]


async def test_mysql_text_column_compared_with_numbers_reads_every_shard() -> None:
    vc = cursor()
    vc.column_types = {"num_tbl": {"id": INT, "x": TEXT}}
    await run(vc, "select id from num_tbl where x in (7, 8)")
    assert len(vc.log) == 4 and all(line.endswith("[7, 8]") for line in vc.log)
    with pytest.raises(ShardgateError) as err:
        await run(vc, "update num_tbl set y = 1 where x = 7")
    assert err.value.code is Code.INVALID_ARGUMENT


# -- lookup rows the lookup table's collation matches ----------------------------


async def test_lookup_rows_matched_by_the_lookup_tables_collation_are_routed_to() -> None:
    vc = RecordingCursor({"user": FOUR, "lookup": ONE})
    vc.lookup.script(
        "create table name_user_map (name text collate nocase, keyspace_id blob);"
        "create table email_user_map (email text collate nocase primary key, keyspace_id blob);"
        f"insert into name_user_map values ('red', x'{ksid(3).hex()}'), "
        f"('BLUE', x'{ksid(11).hex()}');"
        f"insert into email_user_map values ('A@x', x'{ksid(3).hex()}'), "
        f"('b@X', x'{ksid(4).hex()}');"
    )
    await run(vc, "select id from user where name in ('RED', 'blue')")
    reached = {line.split(":")[0].split("/")[1] for line in vc.log}
    assert reached == {shard_of(3), shard_of(11)} == {"40-80", "80-c0"}
    vc.log.clear()
    await run(vc, "select id from user where email = 'a@X'")
    assert [line.split(":")[0] for line in vc.log] == [f"ExecuteShard user/{shard_of(3)}"]
    vc.log.clear()
    await run(vc, "select id from user where email in ('a@x', 'B@x')")  # no INTERNAL error
    assert {line.split(":")[0].split("/")[1] for line in vc.log} == {shard_of(3), shard_of(4)}
