"""Routing of pinned tables, routing rules, require_explicit_routing and authoritative
column lists, executed against the recording fake (which shard gets which SQL).

Pinned tables route as in Vitess's planner (``pin_test`` of
go/vt/vtgate/planbuilder/testdata/vschemas/schema.json in vitessio/vitess): EqualUnique
through the ``binary`` vindex, the value being the pinned keyspace id; the shard is the
one whose key range holds it (here ``80`` -> ``80-c0`` of four shards).
"""

from __future__ import annotations

from typing import Any

import pytest

from shardgate.errors import Code, ShardgateError
from shardgate.keys import KeyRange, ShardMap
from shardgate.planner import build_plan
from shardgate.result import Result
from shardgate.sql.parse import parse
from shardgate.sql.schema import ColumnsUnknown
from shardgate.testing import RecordingCursor
from shardgate.vschema import VSchema

FOUR = ShardMap([(kr.name, kr) for kr in KeyRange().split(4)])
ONE = ShardMap([("0", KeyRange())])

VSCHEMA = VSchema.from_json(
    {
        "user": {
            "sharded": True,
            "vindexes": {"hash": {"type": "hash"}},
            "tables": {
                "pin_test": {"pinned": "80"},
                "pin_too": {"pinned": "80"},
                "pin_auth": {"pinned": "3f", "columns": [{"name": "k"}, {"name": "uid"}],
                             "column_list_authoritative": True},
                "low_pin": {"pinned": "3f"},
                "user": {"columnVindexes": [{"column": "id", "name": "hash"}],
                         "columns": [{"name": "id"}, {"name": "name"}],
                         "columnListAuthoritative": True},
                "legacy": {"column_vindexes": [{"column": "id", "name": "hash"}]},
            },
        },
        "main": {"sharded": False, "tables": {"unsharded": {}}},
        "secret": {"sharded": False, "require_explicit_routing": True,
                   "tables": {"hidden": {}}},
    },
    {"rules": [{"from_table": "legacy", "to_tables": ["main.unsharded"]},
               {"from_table": "user.retired", "to_tables": []}]},
)


async def run(sql: str, keyspace: str | None = "user", **bv: Any) -> RecordingCursor:
    vc = RecordingCursor({"user": FOUR, "main": ONE, "secret": ONE})
    plan = build_plan(parse(sql), sql, VSCHEMA, keyspace)
    await plan.instructions.execute(vc, bv)
    return vc


async def test_pinned_select_goes_to_the_shard_of_the_pin() -> None:
    vc = await run("select * from pin_test where x = 1")
    assert vc.log == ["ExecuteShard user/80-c0: SELECT * FROM pin_test WHERE x = 1 []"]
    vc = await run("select count(*) from low_pin")
    assert vc.log == ["ExecuteShard user/-40: SELECT COUNT(*) FROM low_pin []"]
    plan = build_plan(parse("select * from pin_test"), "", VSCHEMA, "user")
    described = plan.instructions.describe()
    assert (described["Variant"], described["Vindex"]) == ("EqualUnique", "binary")


async def test_pinned_writes_go_to_the_shard_of_the_pin() -> None:
    vc = await run("insert into pin_test (a, b) values (1, 2), (3, 4)")
    assert vc.log == [
        "ExecuteShard user/80-c0: INSERT INTO pin_test (a, b) VALUES (1, 2), (3, 4) []"
    ]
    vc = await run("update pin_test set a = 5 where b = 2")
    assert vc.log == ["ExecuteShard user/80-c0: UPDATE pin_test SET a = 5 WHERE b = 2 []"]
    vc = await run("delete from low_pin where a = 1")
    assert vc.log == ["ExecuteShard user/-40: DELETE FROM low_pin WHERE a = 1 []"]
    vc = await run("insert into pin_test (a) values (1) on duplicate key update a = 2")
    assert vc.log == ["ExecuteShard user/80-c0: INSERT INTO pin_test (a) VALUES (1) "
                      "ON DUPLICATE KEY UPDATE a = 2 []"]
    # A SELECT source would read the pinned shard only: refused.
    with pytest.raises(ShardgateError) as err:
        await run("insert into pin_test (a) select id from user")
    assert err.value.code is Code.UNIMPLEMENTED
    # A subquery in VALUES is computed over every shard first (issue 13 item 6), then bound.
    vc = await run("insert into pin_test (a) values ((select count(*) from user))")
    assert vc.log[:4] == [f"ExecuteShard user/{s}: SELECT COUNT(*) FROM user []"
                          for s in ("-40", "40-80", "80-c0", "c0-")]
    assert vc.log[4:] == ["ExecuteShard user/80-c0: INSERT INTO pin_test (a) VALUES (%s) [0]"]


async def test_pinned_table_joined_with_a_sharded_one_runs_at_the_gate() -> None:
    vc = RecordingCursor({"user": FOUR, "main": ONE, "secret": ONE})
    vc.results = {"80-c0": Result(["uid"], [(7,)])}
    sql = "select u.name from pin_test p join user u on u.id = p.uid"
    plan = build_plan(parse(sql), sql, VSCHEMA, "user")
    await plan.instructions.execute(vc, {})
    assert vc.log[0].startswith("ExecuteShard user/80-c0: SELECT")
    assert len(vc.log) == 2 and "user/" in vc.log[1]  # then the user row's one shard


async def test_tables_pinned_to_one_keyspace_id_join_on_their_shard() -> None:
    vc = await run("select a.x, b.y from pin_test a join pin_too b on a.k = b.k")
    assert vc.log == ["ExecuteShard user/80-c0: SELECT a.x, b.y FROM pin_test AS a "
                      "JOIN pin_too AS b ON a.k = b.k []"]
    vc = await run("select a.x from pin_test a join low_pin b on a.k = b.k")
    assert [line.split(":")[0] for line in vc.log] == ["ExecuteShard user/80-c0"]  # b: none


async def test_authoritative_columns_expand_star_in_a_gate_join() -> None:
    vc = RecordingCursor({"user": FOUR, "main": ONE, "secret": ONE})
    # pin_auth lives on -40 (pin 3f); user 3 (hash 4eb1...) on 40-80.
    vc.results = {"-40": Result(["k", "uid"], [("a", 3)]),
                  "40-80": Result(["id", "name"], [(3, "x")])}
    sql = "select * from pin_auth p join user u on u.id = p.uid"
    plan = build_plan(parse(sql), sql, VSCHEMA, "user")
    result = await plan.instructions.execute(vc, {})
    assert vc.log[0] == "ExecuteShard user/-40: SELECT p.k, p.uid FROM pin_auth AS p []"
    assert vc.log[1].startswith("ExecuteShard user/40-80: SELECT u.id, u.name FROM user AS u")
    assert result.fields == ["k", "uid", "id", "name"] and result.rows == [("a", 3, 3, "x")]
    sql = "select u.*, p.k from pin_auth p join user u on u.id = p.uid"
    plan = build_plan(parse(sql), sql, VSCHEMA, "user")
    assert (await plan.instructions.execute(vc, {})).rows == [(3, "x", "a")]
    # A star over a table without an authoritative list is still refused.
    with pytest.raises(ShardgateError) as err:
        await run("select * from pin_test a join user u on u.id = a.uid")
    assert err.value.code is Code.UNIMPLEMENTED


async def test_routing_rule_rewrites_the_table() -> None:
    vc = await run("select legacy.id from legacy where legacy.id = 1", keyspace=None)
    assert vc.log == [
        "ExecuteShard main/0: SELECT legacy.id FROM unsharded AS legacy WHERE legacy.id = 1 []"
    ]
    vc = await run("select l.id from user.legacy l where l.id = 1", keyspace=None)
    assert vc.log[0].startswith("ExecuteShard user/")  # no rule for user.legacy: not routed
    vc = await run("insert into legacy (id) values (1)", keyspace=None)
    assert vc.log == ["ExecuteShard main/0: INSERT INTO unsharded (id) VALUES (1) []"]
    vc = await run("update legacy set a = 1 where id = 2", keyspace=None)
    # (a single-table UPDATE/DELETE drops its alias and the qualifiers naming it)
    assert vc.log == ["ExecuteShard main/0: UPDATE unsharded SET a = 1 WHERE id = 2 []"]
    vc = await run("update legacy set a = 1 where legacy.id = 2", keyspace=None)
    assert vc.log == ["ExecuteShard main/0: UPDATE unsharded SET a = 1 WHERE id = 2 []"]
    vc = await run("delete from legacy where id = 3", keyspace=None)
    assert vc.log == ["ExecuteShard main/0: DELETE FROM unsharded WHERE id = 3 []"]
    # DDL names the table it changes: not rewritten (nor refused by a disabling rule)
    plan = build_plan(parse("create table retired (id int)"), "", VSCHEMA, "user")
    assert "retired" in plan.instructions.describe()["Query"]


async def test_disabled_table_and_explicit_routing() -> None:
    with pytest.raises(ShardgateError) as err:
        await run("select * from retired")  # user.retired through the default keyspace
    assert err.value.code is Code.FAILED_PRECONDITION
    with pytest.raises(ShardgateError) as err:
        await run("select * from user.retired", keyspace=None)
    assert err.value.code is Code.FAILED_PRECONDITION
    with pytest.raises(ShardgateError) as err:
        await run("select * from hidden", keyspace=None)
    assert err.value.code is Code.NOT_FOUND
    vc = await run("select * from secret.hidden", keyspace=None)
    assert vc.log == ["ExecuteShard secret/0: SELECT * FROM hidden []"]


async def test_authoritative_columns_fill_an_insert_without_a_column_list() -> None:
    vc = await run("insert into user values (1, 'a')")
    [line] = vc.log
    assert line.startswith("ExecuteShard user/") and "INSERT INTO user (id, name)" in line
    with pytest.raises(ShardgateError) as err:
        await run("insert into user values (1)")
    assert err.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(ColumnsUnknown):  # not authoritative: the tracked columns are asked for
        await run("insert into legacy values (1)", keyspace="user")
