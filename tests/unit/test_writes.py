"""Writes that must not lose or misplace data (issue 13, items 1-6), on the recording fake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardgate.errors import Code, ShardgateError
from shardgate.keys import KeyRange, ShardMap
from shardgate.planner import build_plan
from shardgate.result import Result
from shardgate.sql import parse
from shardgate.testing import RecordingCursor
from shardgate.vschema import VSchema

VSCHEMA = VSchema.from_json(
    json.loads((Path(__file__).parent / "golden" / "vschema.json").read_text())
)
FOUR = ShardMap([(kr.name, kr) for kr in KeyRange().split(4)])
ONE = ShardMap([("0", KeyRange())])


def cursor() -> RecordingCursor:
    vc = RecordingCursor({"user": FOUR, "lookup": ONE, "main": ONE})
    vc.lookup.script(
        "create table name_user_map (name text, keyspace_id blob);"
        "create table email_user_map (email text primary key, keyspace_id blob);"
        "create table music_user_map (music_id integer primary key, user_id blob);"
    )
    return vc


async def run(vc: RecordingCursor, sql: str, bv: dict[str, object] | None = None,
              keyspace: str = "user") -> Result:
    plan = build_plan(parse(sql), sql, VSCHEMA, keyspace)
    return await plan.instructions.execute(vc, bv or {})


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


def test_insert_ignore_into_an_owner_of_lookups_is_refused() -> None:
    err = refused("insert ignore into user (id, name, email) values (1, 'a', 'a@x')")
    assert err.code is Code.UNIMPLEMENTED
    assert "name_user_map" in err.message and "email_user_map" in err.message


async def test_insert_ignore_without_owned_lookups_still_runs() -> None:
    vc = cursor()
    await run(vc, "insert ignore into user_extra (user_id, v) values (1, 2)")
    assert len(vc.log) == 1 and "INSERT IGNORE INTO user_extra" in vc.log[0]


def test_on_duplicate_key_update_and_replace_into_sharded_tables_are_refused() -> None:
    assert refused("insert into user (id, name, email) values (1, 'a', 'a@x') "
                   "on duplicate key update name = 'b'").code is Code.UNIMPLEMENTED
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


@pytest.mark.parametrize("sql", [
    "insert into user_extra (user_id, v) values (5, (select count(*) from user_extra))",
    "insert into user_extra (user_id, v) values (5, (select max(id) from main.unsharded))",
    "insert into user (id, name) values ((select 5), 'a')",
    "insert into countries (id, n) values (1, (select count(*) from user_extra))",
])
def test_subquery_in_values_of_a_sharded_insert_is_refused(sql: str) -> None:
    err = refused(sql)
    assert err.code is Code.UNIMPLEMENTED, err
    assert "subquery" in err.message


def test_subquery_in_values_of_an_unsharded_insert_reading_another_keyspace_is_refused() -> None:
    err = refused("insert into unsharded (a, b) values (1, (select count(*) from user_extra))",
                  keyspace="main")
    assert err.code is Code.UNIMPLEMENTED and "user.user_extra" in err.message
    err = refused("insert into unsharded (a, b) values (1, (select count(*) from "
                  "lookup.user_seq))", keyspace="main")
    assert err.code is Code.UNIMPLEMENTED


async def test_subquery_in_values_within_one_unsharded_keyspace_runs_there() -> None:
    vc = cursor()
    await run(vc, "insert into unsharded (a, b) values (1, (select count(*) from unsharded_b))",
              keyspace="main")
    assert vc.log == ["ExecuteShard main/0: INSERT INTO unsharded (a, b) VALUES "
                      "(1, (SELECT COUNT(*) FROM unsharded_b)) []"]
