"""Writes that must not lose or misplace rows (issue 13 items 1 and 4), on real backends.

A small keyspace of 4 shards: ``t1`` (BIGINT ``id`` under ``hash``, BIGINT ``tag``
under an owned lookup with ``ignore_nulls``), ``t2`` (BIGINT ``k`` under
``xxhash``: the keyspace id depends on the value's text), ``t3`` (VARCHAR
``s`` under ``xxhash``) and ``t4`` (an owned ``lookup_unique`` on ``email``).
Placement is checked by reading every shard directly.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology

from ..conftest import gate_for

VSCHEMA: dict[str, Any] = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "xxhash": {"type": "xxhash"},
        "email_idx": {"type": "lookup_unique", "owner": "t4",
                      "params": {"table": "lk.email_idx", "from": "email", "to": "keyspace_id"}},
        "tag_idx": {"type": "lookup", "owner": "t1",
                    "params": {"table": "lk.tag_idx", "from": "tag", "to": "keyspace_id",
                               "ignore_nulls": "true"}},
    },
    "tables": {
        "t1": {"column_vindexes": [{"column": "id", "name": "hash"},
                                   {"column": "tag", "name": "tag_idx"}]},
        "t2": {"column_vindexes": [{"column": "k", "name": "xxhash"}]},
        "t3": {"column_vindexes": [{"column": "s", "name": "xxhash"}]},
        "t4": {"column_vindexes": [{"column": "id", "name": "hash"},
                                   {"column": "email", "name": "email_idx"}]},
        "t5": {"column_vindexes": [{"column": "c", "name": "xxhash"}]},
    },
}
DDL = [
    "CREATE TABLE t1 (id BIGINT PRIMARY KEY, tag BIGINT, n BIGINT)",
    "CREATE TABLE t2 (k BIGINT PRIMARY KEY, v VARCHAR(16))",
    "CREATE TABLE t3 (s VARCHAR(16) PRIMARY KEY, v VARCHAR(16))",
    "CREATE TABLE t4 (id BIGINT PRIMARY KEY, email VARCHAR(32))",
    "CREATE TABLE t5 (c CHAR(4) PRIMARY KEY, v VARCHAR(16))",
]


def topology(kind: str) -> Callable[[Callable[..., str]], Topology]:
    def make(make_database: Callable[..., str]) -> Topology:
        shards = {kr.name: make_database(kind, f"w{i}")
                  for i, kr in enumerate(KeyRange(b"", b"").split(4))}
        return Topology.from_dict({
            "default_keyspace": "ks",
            "keyspaces": {
                "ks": {"shards": shards, "vschema": VSCHEMA},
                "lk": {"shards": {"0": make_database(kind, "wl")},
                       "vschema": {"sharded": False,
                                   "tables": {"tag_idx": {}, "email_idx": {}}}},
            },
        })
    return make


@pytest.fixture
async def gate(backend_kind: str, tablets: str, make_database: Callable[..., str],
               request: pytest.FixtureRequest) -> AsyncIterator[Gate]:
    async with gate_for(backend_kind, tablets, topology(backend_kind), make_database,
                        request, shape="writes") as g:
        s = g.session(identity=TRUSTED)
        for ddl in DDL:
            await g.execute(s, ddl)
        # no unique key on the lookup tables: the gate alone must keep them exact
        for ddl in ("CREATE TABLE tag_idx (tag BIGINT, keyspace_id VARBINARY(16))",
                    "CREATE TABLE email_idx (email VARCHAR(32), keyspace_id VARBINARY(16))"):
            await g.execute(g.session("lk", identity=TRUSTED), ddl)
        yield g


async def rows(gate: Gate, sql: str, bv: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    return sorted((await gate.execute(gate.session(identity=TRUSTED), sql, bv)).rows)


async def placed(gate: Gate, table: str, column: str) -> dict[str, list[Any]]:
    """Each shard's values of ``column``, read on the shard itself."""
    out: dict[str, list[Any]] = {}
    for shard in gate.topology.keyspace("ks").shards:
        res = await gate.tablets[("ks", shard.name)].execute(f"SELECT {column} FROM {table}", [])
        if res.rows:
            out[shard.name] = sorted(r[0] for r in res.rows)
    return out


def shard_of(gate: Gate, vindex: str, value: Any) -> str:
    ks = gate.topology.keyspace("ks")
    v = gate.vschema.keyspace("ks").vindexes[vindex]
    ksid = v.map([value])[0][0]  # type: ignore[attr-defined]
    return ks.shard_map.find(ksid)


async def refused(gate: Gate, sql: str) -> ShardgateError:
    with pytest.raises(ShardgateError) as err:
        await gate.execute(gate.session(identity=TRUSTED), sql)
    return err.value


async def test_reads_find_rows_by_the_value_an_integer_column_compares(
    gate: Gate, backend_kind: str
) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t1 (id, tag, n) VALUES (5, NULL, 0), (6, NULL, 0), "
                          "(1, NULL, 0)")
    for where in ("id = 5.0", "id = 5e0", "id = '05'", "id = :v"):
        assert await rows(gate, f"SELECT id FROM t1 WHERE {where}", {"v": 5.0}) == [(5,)], where
    assert await rows(gate, "SELECT id FROM t1 WHERE id IN (5.0, 6)") == [(5,), (6,)]
    assert await rows(gate, "SELECT id FROM t1 WHERE id = 5.5") == []
    res = await gate.execute(s, "UPDATE t1 SET n = 7 WHERE id = 5.0")
    assert res.rows_affected == 1
    assert await rows(gate, "SELECT n FROM t1 WHERE id = 5") == [(7,)]
    if backend_kind == "postgres":  # bigint = boolean is an error on PostgreSQL
        assert (await refused(gate, "SELECT id FROM t1 WHERE id = TRUE")).code \
            is Code.INVALID_ARGUMENT
    else:
        assert await rows(gate, "SELECT id FROM t1 WHERE id = TRUE") == [(1,)]


async def test_a_derived_table_routes_by_the_value_its_column_compares(gate: Gate) -> None:
    # an IN over a derived table's vindex column routes by the stored values
    # (3, not the text '03', whose xxhash keyspace id differs), as a plain select does
    await gate.execute(gate.session(identity=TRUSTED),
                       "INSERT INTO t2 (k, v) VALUES (3, 'a'), (5, 'b')")
    assert await rows(gate, "SELECT k FROM t2 WHERE k IN ('03', 5)") == [(3,), (5,)]
    assert await rows(
        gate, "SELECT k FROM (SELECT k FROM t2 WHERE k IN ('03', 5)) AS d"
    ) == [(3,), (5,)]


async def test_inserts_place_rows_by_the_stored_integer(gate: Gate, backend_kind: str) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t2 (k, v) VALUES ('03', 'a'), (5.0, 'b'), (6e0, 'c')")
    assert await placed(gate, "t2", "k") == _by_shard(gate, "xxhash", [3, 5, 6])
    assert await rows(gate, "SELECT k, v FROM t2 WHERE k = 3") == [(3, "a")]
    assert await rows(gate, "SELECT k FROM t2 WHERE k IN (5, 6)") == [(5,), (6,)]
    for bad in ("5.5", "'abc'", "' 7'", "'7.5'"):
        err = await refused(gate, f"INSERT INTO t2 (k, v) VALUES ({bad}, 'x')")
        assert err.code is Code.INVALID_ARGUMENT, bad
    if backend_kind == "postgres":
        assert (await refused(gate, "INSERT INTO t2 (k, v) VALUES (TRUE, 'x')")).code \
            is Code.INVALID_ARGUMENT
    else:
        await gate.execute(s, "INSERT INTO t2 (k, v) VALUES (TRUE, 'x')")
        assert await rows(gate, "SELECT v FROM t2 WHERE k = 1") == [("x",)]
    assert sum(len(v) for v in (await placed(gate, "t2", "k")).values()) == \
        3 + (backend_kind != "postgres")


async def test_numbers_into_a_varchar_column(gate: Gate, backend_kind: str) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t3 (s, v) VALUES (7, 'int'), ('07', 'text')")
    assert await placed(gate, "t3", "s") == _by_shard(gate, "xxhash", ["07", "7"])
    assert await rows(gate, "SELECT v FROM t3 WHERE s = '7'") == [("int",)]
    for bad in ("7.0", "TRUE"):
        err = await refused(gate, f"INSERT INTO t3 (s, v) VALUES ({bad}, 'x')")
        assert err.code is Code.INVALID_ARGUMENT, bad
    if backend_kind == "mysql":  # MySQL compares text with a number as numbers
        assert await rows(gate, "SELECT v FROM t3 WHERE s = 7") == [("int",), ("text",)]
        err = await refused(gate, "UPDATE t3 SET v = 'y' WHERE s = 7")
        assert err.code is Code.INVALID_ARGUMENT
    elif backend_kind == "sqlite":  # the number takes the column's TEXT affinity
        assert await rows(gate, "SELECT v FROM t3 WHERE s = 7") == [("int",)]


async def test_lookup_values_are_the_stored_ones(gate: Gate) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t1 (id, tag, n) VALUES (9, '03', 0)")
    lookup = gate.tablets[("lk", "0")]
    assert [r[0] for r in (await lookup.execute("SELECT tag FROM tag_idx", [])).rows] == [3]
    assert await rows(gate, "SELECT id FROM t1 WHERE tag = 3") == [(9,)]
    assert await rows(gate, "SELECT id FROM t1 WHERE tag = 3.0") == [(9,)]
    await gate.execute(s, "UPDATE t1 SET tag = '04' WHERE id = 9")
    assert [r[0] for r in (await lookup.execute("SELECT tag FROM tag_idx", [])).rows] == [4]
    assert await rows(gate, "SELECT id FROM t1 WHERE tag = 4") == [(9,)]


async def test_is_null_on_a_lookup_column_finds_and_deletes_rows(gate: Gate) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t1 (id, tag, n) VALUES (1, NULL, 0), (2, 5, 0), "
                          "(3, NULL, 0), (4, NULL, 0)")
    assert await rows(gate, "SELECT id FROM t1 WHERE tag IS NULL") == [(1,), (3,), (4,)]
    assert await rows(gate, "SELECT COUNT(*) FROM t1 WHERE tag IS NULL") == [(3,)]
    res = await gate.execute(s, "DELETE FROM t1 WHERE tag IS NULL")
    assert res.rows_affected == 3
    assert await rows(gate, "SELECT id FROM t1") == [(2,)]
    assert await rows(gate, "SELECT id FROM t1 WHERE tag = 5") == [(2,)]


async def test_insert_ignore_keeps_lookups_exact(gate: Gate) -> None:
    s = gate.session(identity=TRUSTED)
    lookup = gate.tablets[("lk", "0")]

    async def emails() -> list[tuple[Any, ...]]:
        res = await lookup.execute("SELECT email, keyspace_id FROM email_idx", [])
        return sorted((r[0], shard_of_ksid(gate, bytes(r[1]))) for r in res.rows)

    await gate.execute(s, "INSERT INTO t4 (id, email) VALUES (1, 'a')")
    # the id exists: the row is skipped, and so is its lookup row
    r = await gate.execute(s, "INSERT IGNORE INTO t4 (id, email) VALUES (1, 'z')")
    assert r.rows_affected == 0
    # the unique value is taken: skipped, no second row for 'a'
    r = await gate.execute(s, "INSERT IGNORE INTO t4 (id, email) VALUES (2, 'a')")
    assert r.rows_affected == 0
    r = await gate.execute(s, "INSERT IGNORE INTO t4 (id, email) VALUES (3, 'c'), (4, 'c'), "
                              "(1, 'q'), (5, 'e')")
    assert r.rows_affected == 2
    assert await rows(gate, "SELECT id, email FROM t4") == [(1, "a"), (3, "c"), (5, "e")]
    assert await emails() == sorted([("a", shard_of(gate, "hash", 1)),
                                     ("c", shard_of(gate, "hash", 3)),
                                     ("e", shard_of(gate, "hash", 5))])
    assert await rows(gate, "SELECT id FROM t4 WHERE email = 'c'") == [(3,)]
    # a non-unique lookup: the skipped re-insert leaves exactly one lookup row
    await gate.execute(s, "INSERT IGNORE INTO t1 (id, tag, n) VALUES (9, 7, 0)")
    r = await gate.execute(s, "INSERT IGNORE INTO t1 (id, tag, n) VALUES (9, 8, 0), (9, 7, 0)")
    assert r.rows_affected == 0
    res = await lookup.execute("SELECT tag FROM tag_idx", [])
    assert [row[0] for row in res.rows] == [7]


async def test_mysql_char_columns_route_without_the_trailing_spaces_mysql_drops(
    gate: Gate, backend_kind: str
) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t5 (c, v) VALUES ('ab  ', 'x'), ('cd', 'y')")
    assert await rows(gate, "SELECT v FROM t5 WHERE c = 'ab  '") == [("x",)]
    if backend_kind == "mysql":  # stored and compared without trailing spaces
        assert await rows(gate, "SELECT v FROM t5 WHERE c = 'ab'") == [("x",)]
        assert await rows(gate, "SELECT v FROM t5 WHERE c = 'cd '") == [("y",)]
        assert await placed(gate, "t5", "c") == _by_shard(gate, "xxhash", ["ab", "cd"])


async def test_subquery_in_values_is_computed_over_all_shards(gate: Gate) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t1 (id, tag, n) VALUES (1, NULL, 0), (2, NULL, 0), "
                          "(3, NULL, 0), (4, NULL, 0), (5, NULL, 0)")
    assert len(await placed(gate, "t1", "id")) > 1  # the rows span shards
    await gate.execute(s, "INSERT INTO t1 (id, tag, n) VALUES (100, NULL, "
                          "(SELECT COUNT(*) FROM t1))")
    assert await rows(gate, "SELECT n FROM t1 WHERE id = 100") == [(5,)]
    await gate.execute(s, "INSERT INTO t2 (k, v) VALUES ((SELECT MAX(id) FROM t1), 'max')")
    assert await placed(gate, "t2", "k") == _by_shard(gate, "xxhash", [100])
    assert (await refused(gate, "INSERT INTO t2 (k, v) VALUES (7, (SELECT id FROM t1))")).code \
        is Code.INVALID_ARGUMENT
    assert await rows(gate, "SELECT k FROM t2") == [(100,)]


async def test_lookup_rows_the_lookup_table_collation_matches_are_followed(
    gate: Gate, backend_kind: str
) -> None:
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t4 (id, email) VALUES (1, 'red'), (2, 'blue ')")
    ci = backend_kind == "mysql"  # MariaDB's default collation: case and trailing spaces ignored
    assert await rows(gate, "SELECT id FROM t4 WHERE email = 'RED'") == ([(1,)] if ci else [])
    assert await rows(gate, "SELECT id FROM t4 WHERE email IN ('Red', 'blue')") == (
        [(1,), (2,)] if ci else [])
    res = await gate.execute(s, "DELETE FROM t4 WHERE email = 'BLUE'")
    assert res.rows_affected == (1 if ci else 0)
    left = await gate.tablets[("lk", "0")].execute("SELECT email FROM email_idx", [])
    assert sorted(r[0] for r in left.rows) == (["red"] if ci else ["blue ", "red"])


def shard_of_ksid(gate: Gate, ksid: bytes) -> str:
    return gate.topology.keyspace("ks").shard_map.find(ksid)


def _by_shard(gate: Gate, vindex: str, values: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for v in values:
        out.setdefault(shard_of(gate, vindex, v), []).append(v)
    return {k: sorted(v) for k, v in out.items()}


def _count_begins(gate: Gate) -> list[str]:
    """Record every shard transaction the gate begins (the tablets still begin them)."""
    begun: list[str] = []
    for (ks, shard), tablet in gate.tablets.items():
        real = tablet.begin

        async def begin(real: Any = real, name: str = f"{ks}/{shard}") -> int:
            begun.append(name)
            return int(await real())

        tablet.begin = begin  # type: ignore[method-assign]
    return begun


async def test_a_multi_row_insert_into_one_shard_is_one_autocommit_statement(
        gate: Gate) -> None:
    """No BEGIN/COMMIT around a one-shard INSERT; rows of several shards stay atomic."""
    values = range(1, 200)
    by_shard: dict[str, list[int]] = {}
    for v in values:
        by_shard.setdefault(shard_of(gate, "xxhash", v), []).append(v)
    first, second = sorted(by_shard, key=lambda s: -len(by_shard[s]))[:2]
    same = by_shard[first][:3]
    begun = _count_begins(gate)
    await gate.execute(gate.session(identity=TRUSTED),
                       "INSERT INTO t2 (k, v) VALUES (:a, 'x'), (:b, 'y'), "
                       "(:c, 'z')", {"a": same[0], "b": same[1], "c": same[2]})
    assert begun == []
    assert (await placed(gate, "t2", "k")) == {first: sorted(same)}
    # Rows for two shards, one of them a duplicate: nothing of the statement stays.
    other = by_shard[second][0]
    with pytest.raises(ShardgateError):
        await gate.execute(gate.session(identity=TRUSTED),
                           "INSERT INTO t2 (k, v) VALUES (:a, 'x'), (:b, 'y')",
                           {"a": other, "b": same[0]})
    assert sorted(begun) == sorted([f"ks/{first}", f"ks/{second}"])
    assert (await placed(gate, "t2", "k")) == {first: sorted(same)}


async def test_insert_select_routes_each_selected_row(gate: Gate) -> None:
    """INSERT ... SELECT into a sharded table: the gate selects, then routes each row."""
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t2 (k, v) VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    res = await gate.execute(s, "INSERT INTO t1 (id, tag, n) SELECT k, k + 10, 0 FROM t2 "
                                "WHERE k > 1")
    assert res.rows_affected == 3
    assert await placed(gate, "t1", "id") == _by_shard(gate, "hash", [2, 3, 4])
    assert await rows(gate, "SELECT id FROM t1 WHERE tag = 13") == [(3,)]  # its lookup row
    empty = await gate.execute(s, "INSERT INTO t1 (id, tag, n) SELECT k, k, 0 FROM t2 "
                                  "WHERE k > 99")
    assert empty.rows_affected == 0
    # A duplicate among the selected rows: 1062, and nothing of the statement stays.
    err = await refused(gate, "INSERT INTO t1 (id, tag, n) SELECT k + 3, NULL, 0 FROM t2")
    assert err.code is Code.ALREADY_EXISTS
    assert await placed(gate, "t1", "id") == _by_shard(gate, "hash", [2, 3, 4])
    ignored = await gate.execute(s, "INSERT IGNORE INTO t1 (id, tag, n) "
                                    "SELECT k + 3, NULL, 0 FROM t2")
    assert ignored.rows_affected == 3  # 4 skipped, 5 6 7 inserted
    assert sorted(v for vs in (await placed(gate, "t1", "id")).values() for v in vs) == \
        [2, 3, 4, 5, 6, 7]
    err = await refused(gate, "INSERT INTO t1 SELECT k, k, 0 FROM t2")
    # no column list: the tracked columns (id, tag, n) are used, and ids 2-4 are taken,
    # as one database holding t1 would say
    assert err.code is Code.ALREADY_EXISTS, err


async def test_a_pulled_out_scalar_subquery_keeps_its_type(gate: Gate, backend_kind: str) -> None:
    """``SELECT k, (SELECT ...)``: the column is the subquery's own value (a DATETIME
    stays a datetime), not the shard's echo of a bound parameter (text on MariaDB)."""
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t2 (k, v) VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    when = "CAST('2006-05-12 12:00:00' AS DATETIME)" if backend_kind == "mysql" else \
        "CAST(1.5 AS DECIMAL(4, 2))"
    alone = (await gate.execute(s, f"SELECT {when} FROM t2 WHERE k = 1")).rows[0][0]
    if backend_kind == "mysql":
        assert isinstance(alone, datetime.datetime)
    got = await rows(gate, f"SELECT k, (SELECT {when} FROM t2 WHERE k = 1) AS d, v FROM t2")
    assert got == [(1, alone, "a"), (2, alone, "b"), (3, alone, "c")]
    assert {type(r[1]) for r in got} == {type(alone)}


async def test_a_cast_to_char_routes_by_its_text(gate: Gate) -> None:
    """``CAST(7 AS CHAR(4))`` as a vindex value is MySQL's text of it, '7' (not padded)."""
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t3 (s, v) VALUES (CAST(7 AS CHAR(4)), 'c'), "
                          "(CAST('ab' AS CHAR), 'd')")
    assert await placed(gate, "t3", "s") == _by_shard(gate, "xxhash", ["7", "ab"])
    assert await rows(gate, "SELECT v FROM t3 WHERE s = CAST(7 AS CHAR)") == [("c",)]
    err = await refused(gate, "INSERT INTO t3 (s, v) VALUES (CAST('abc' AS CHAR(2)), 'e')")
    assert err.code is Code.INVALID_ARGUMENT  # truncated by MySQL: not computed here
