"""Executing plans against a recording fake: which shard gets which SQL, and merging."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from Crypto.Cipher import DES

from shardgate.engine.primitive import map_distinct
from shardgate.errors import Code, ShardgateError
from shardgate.planner import build_plan
from shardgate.result import Result
from shardgate.sql.parse import parse
from shardgate.testing import RecordingCursor
from shardgate.vindexes.base import SingleColumn
from shardgate.vschema import VSchema

from .recording import FOUR, VSCHEMA, cursor, run, shard_of

_DES = DES.new(bytes(8), DES.MODE_ECB)


async def test_equal_unique_reaches_one_shard() -> None:
    vc = cursor()
    await run(vc, "select id from user where id = :id", {"id": 11})
    assert vc.log == [f"ExecuteShard user/{shard_of(11)}: SELECT id FROM user WHERE id = %s [11]"]


async def test_in_reaches_only_the_shards_of_its_values() -> None:
    vc = cursor()
    await run(vc, "select id from user where id in (1, 2, 3, 4, 5, 6)")
    expected = sorted({shard_of(i) for i in range(1, 7)}, key=lambda n: FOUR.names.index(n))
    assert [line.split(":")[0] for line in vc.log] == [f"ExecuteShard user/{s}" for s in expected]


async def test_lookup_routes_through_the_lookup_table() -> None:
    vc = cursor()
    ksid = _DES.encrypt((42).to_bytes(8, "big"))
    vc.lookup.script("insert into email_user_map values ('a@x', x'" + ksid.hex() + "')")
    await run(vc, "select id from user where email = :e", {"e": "a@x"})
    assert vc.log == [f"ExecuteShard user/{shard_of(42)}: SELECT id FROM user WHERE email = %s "
                      "['a@x']"]
    vc.log.clear()
    await run(vc, "select id from user where email = :e", {"e": "nobody@x"})
    # no shard holds it: one shard gives the fields over no rows, its WHERE kept
    # so the database rejects what it would reject
    assert vc.log == ["ExecuteShard user/-40: SELECT id FROM user WHERE 1 <> 1 AND "
                      "(email = %s) ['nobody@x']"]


async def test_scatter_merges_order_by_and_cuts_limit_offset() -> None:
    vc = cursor()
    vc.results = {
        "-40": Result(["id", "col"], [(9, "a"), (5, "b"), (1, "c")]),
        "40-80": Result(["id", "col"], [(8, "a"), (2, "b")]),
        "80-c0": Result(["id", "col"], []),
        "c0-": Result(["id", "col"], [(7, "a"), (6, "b"), (3, "c")]),
    }
    r = await run(vc, "select id, col from user order by id desc limit :n offset 2", {"n": 3})
    assert r.rows == [(7, "a"), (6, "b"), (5, "b")]
    assert all("LIMIT %s [5]" in line for line in vc.log)  # LIMIT n+offset on every shard
    assert len(vc.log) == 4


async def test_insert_splits_rows_by_shard_and_creates_lookups_first() -> None:
    vc = cursor()
    r = await run(vc, "insert into user (name, email) values ('a', 'a@x'), ('b', 'b@x'), "
                      "('c', 'c@x')")
    assert vc.log[0] == "NextSequence lookup.user_seq: 3"
    assert r.insert_id == 1
    shard_lines = [line for line in vc.log if line.startswith("ExecuteShard")]
    per_shard: dict[str, int] = {}
    for i in (1, 2, 3):
        per_shard[shard_of(i)] = per_shard.get(shard_of(i), 0) + 1
    assert len(shard_lines) == len(per_shard)
    for line in shard_lines:
        shard = line.split(":")[0].split("/")[1]
        assert line.count("(%s, %s, %s)") == per_shard[shard]
    names = vc.lookup.query("select name, keyspace_id from name_user_map order by name")
    assert names == [(n, _DES.encrypt(i.to_bytes(8, "big"))) for n, i in (("a", 1), ("b", 2),
                                                                         ("c", 3))]
    assert len(vc.lookup.query("select * from email_user_map")) == 3


async def test_insert_refuses_unmappable_rows_before_writing() -> None:
    vc = cursor()
    with pytest.raises(ShardgateError) as err:
        await run(vc, "insert into user_extra (user_id, v) values (1, 'a'), (NULL, 'b')")
    assert err.value.code is Code.INVALID_ARGUMENT
    assert vc.log == []
    with pytest.raises(ShardgateError) as err:
        await run(vc, "insert into user_extra (user_id, v) values ('abc', 'b')")
    assert err.value.code is Code.INVALID_ARGUMENT
    assert vc.log == []


async def test_scatter_dml_sums_rows_affected() -> None:
    vc = cursor()
    vc.results = {s: Result(rows_affected=2) for s in FOUR.names}
    r = await run(vc, "update user_extra set v = 1 where v = 0")
    assert r.rows_affected == 8 and len(vc.log) == 4


async def test_in_list_is_split_per_shard() -> None:
    vc = cursor()
    await run(vc, "select id from user where id in (1, 2, 3, 4, 5, 6, 7, 8)")
    expected: dict[str, list[int]] = {}
    for i in range(1, 9):
        expected.setdefault(shard_of(i), []).append(i)
    got = {}
    for line in vc.log:
        shard = line.split(":")[0].split("/")[1]
        args = line[line.rindex("["):]
        got[shard] = args
        assert line.count("%s") == len(expected[shard])
    assert got == {s: str(v) for s, v in expected.items()}


async def test_list_bind_variable_expands() -> None:
    vc = cursor()
    await run(vc, "select id from user where id in (:ids)", {"ids": [1, 2, 3]})
    total = sum(line.count("%s") for line in vc.log)
    assert total == 3
    assert {line.split(":")[0] for line in vc.log} == {f"ExecuteShard user/{shard_of(i)}"
                                                       for i in (1, 2, 3)}


async def test_tuple_in_on_multicol_routes_by_both_columns() -> None:
    vc = cursor()
    plan = build_plan(parse("select * from events where (region, id) in ((1, 2), (3, 4))"),
                      "", VSCHEMA, "user")
    assert plan.describe()["Instructions"]["Variant"] == "IN"
    await plan.instructions.execute(vc, {})
    assert 1 <= len(vc.log) <= 2


SECONDARY = VSchema.from_json({"s": {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}, "num": {"type": "numeric"}},
    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"},
                                         {"column": "shadow", "name": "num"}]}},
}})


async def test_secondary_vindex_is_verified_or_generated() -> None:
    vc = RecordingCursor({"s": FOUR})

    async def run_s(sql: str) -> None:
        await build_plan(parse(sql), sql, SECONDARY, "s").instructions.execute(vc, {})

    ksid = _DES.encrypt((5).to_bytes(8, "big"))
    shadow = int.from_bytes(ksid, "big")  # numeric: the value is its own keyspace id
    await run_s(f"insert into t (id, shadow) values (5, {shadow})")
    assert len(vc.log) == 1
    with pytest.raises(ShardgateError) as err:
        await run_s("insert into t (id, shadow) values (5, 123)")
    assert err.value.code is Code.INVALID_ARGUMENT and "does not map" in err.value.message
    vc.log.clear()
    await run_s("insert into t (id) values (5)")  # generated from the keyspace id
    assert vc.log[0].endswith(f"[5, {shadow}]"), vc.log


async def test_a_subquery_used_as_a_value_has_one_column_even_over_no_rows() -> None:
    # MySQL, PostgreSQL and SQLite all refuse a two-column subquery as a value,
    # whether or not it returns rows
    vc = cursor()
    vc.results = {name: Result(["col", "b"], []) for name in FOUR.names}
    with pytest.raises(ShardgateError) as err:
        await run(vc, "select id from user where id = (select col, b from user)")
    assert err.value.code is Code.INVALID_ARGUMENT
    assert "exactly one column" in err.value.message


async def test_a_subquery_used_as_a_value_returns_at_most_one_row() -> None:
    vc = cursor()
    vc.results = {name: Result(["col"], [(1,)]) for name in FOUR.names[:2]}
    with pytest.raises(ShardgateError) as err:
        await run(vc, "select id from user where id = (select col from user)")
    assert err.value.code is Code.INVALID_ARGUMENT
    assert "more than 1 row" in err.value.message


async def test_insert_rows_sharing_a_bind_variable_route_as_each_row_alone() -> None:
    """Rows of one INSERT that share a sharding value are hashed once, and every row
    still goes where it would go on its own (literals and other variables mixed in)."""
    vc = cursor()
    await run(vc, "insert into user_extra (user_id, v) values (:u, 'a'), (:u, 'b'), (:w, 'c'), "
                  "(7, 'd'), (:u, 'e')", {"u": 11, "w": 12})
    rows_by_shard: dict[str, int] = {}
    for u in (11, 11, 12, 7, 11):
        rows_by_shard[shard_of(u)] = rows_by_shard.get(shard_of(u), 0) + 1
    got = {line.split(":")[0].split("/")[1]: line.count("(%s, %s)")
           for line in vc.log if line.startswith("ExecuteShard")}
    assert got == rows_by_shard
    assert sum(got.values()) == 5


class _Counting(SingleColumn):
    """Maps a value to a keyspace id naming its type and value; counts what it maps."""

    def __init__(self) -> None:
        super().__init__("counting", {})
        self.mapped: list[Any] = []

    @property
    def cost(self) -> int:
        return 1

    @property
    def unique(self) -> bool:
        return True

    def map(self, values: Sequence[Any]) -> list[list[bytes]]:
        self.mapped.extend(values)
        return [[f"{type(v).__name__}:{v!r}".encode()] for v in values]


async def test_distinct_sharding_values_are_mapped_once_and_never_conflated() -> None:
    vindex = _Counting()
    values: list[Any] = [5, 5, True, 1, 1.0, "5", 5, (1, "a"), (True, "a"), (1, "a")]
    got = await map_distinct(cursor(), vindex, values)
    assert got == [[f"{type(v).__name__}:{v!r}".encode()] for v in values]
    assert len(vindex.mapped) == 7  # 5, True, 1, 1.0, '5', (1, 'a'), (True, 'a')
    unhashable: list[Any] = [[1], [1]]  # mapped as given
    assert len(await map_distinct(cursor(), _Counting(), unhashable)) == 2
