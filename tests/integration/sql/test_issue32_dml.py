"""Issue 32's DML forms and unsharded pass-through, against one database holding all rows.

A 2-shard keyspace ``ks``: ``u`` (``id`` under ``hash``; ``name`` under the owned
non-unique lookup ``name_idx``, ``email`` under the owned ``lookup_unique``
``email_idx``, both ``ignore_nulls``) and ``m`` (``id`` under ``hash``; ``name``
under ``name_idx`` too, which ``m`` does not own); ``lk`` (unsharded) holds the
lookup tables; ``main`` (unsharded) the tables ``a`` and ``b``. Every statement
runs through the gate and, in the reference database's own dialect where that
differs, on one plain database of the same engine holding all rows; the rows
affected and every table must agree, and the lookup tables must be exactly
what the owner rows imply (keyspace ids computed independently).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import Backend, open_backend
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology

from ..conftest import gate_for
from ..difftest.schema import hash_ksid

VSCHEMA: dict[str, Any] = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "name_idx": {"type": "lookup", "owner": "u",
                     "params": {"table": "lk.name_idx", "from": "name", "to": "ksid",
                                "ignore_nulls": "true"}},
        "email_idx": {"type": "lookup_unique", "owner": "u",
                      "params": {"table": "lk.email_idx", "from": "email", "to": "ksid",
                                 "ignore_nulls": "true"}},
    },
    "tables": {
        "u": {"column_vindexes": [{"column": "id", "name": "hash"},
                                  {"column": "name", "name": "name_idx"},
                                  {"column": "email", "name": "email_idx"}]},
        "m": {"column_vindexes": [{"column": "id", "name": "hash"},
                                  {"column": "name", "name": "name_idx"}]},
    },
}
SHARDED_DDL = [
    "CREATE TABLE u (id BIGINT PRIMARY KEY, name VARCHAR(32), email VARCHAR(32), n INT, "
    "UNIQUE (email))",
    "CREATE TABLE m (id BIGINT PRIMARY KEY, name VARCHAR(32))",
]
U_ROWS = [(1, "ann", "ann@x", 10), (2, "bob", "bob@x", 20), (3, "ann", None, 30),
          (4, None, "dee@x", 40), (5, "eve", "eve@x", 50)]
M_ROWS = [(1, "ann"), (2, "bob"), (3, "ann")]  # (a non-owner's insert is verified)


def _main_ddl(kind: str) -> list[str]:
    auto = {"sqlite": "INTEGER PRIMARY KEY", "postgres": "SERIAL PRIMARY KEY",
            "mysql": "INT AUTO_INCREMENT PRIMARY KEY"}[kind]
    return [f"CREATE TABLE a (id {auto}, x INT, s VARCHAR(16))",
            "CREATE TABLE b (id INT PRIMARY KEY, y INT)"]


class World:
    """The gate over ``ks``/``lk``/``main`` and the reference database."""

    def __init__(self, kind: str, gate: Gate, plain: Backend) -> None:
        self.kind = kind
        self.gate = gate
        self.plain = plain
        self.session = gate.session("ks", identity=TRUSTED)

    def mark(self, sql: str) -> str:
        return sql if self.kind == "sqlite" else sql.replace("%", "%%")

    async def both(self, gate_sql: str, plain_sql: str | None = None,
                   bind_vars: dict[str, Any] | None = None) -> int:
        """Run a write on both sides: the rows affected must agree; returns them."""
        got = await self.gate.execute(self.session, gate_sql, bind_vars)
        want = await self.plain.execute(self.mark(plain_sql or gate_sql))
        assert got.rows_affected == want.rows_affected, (gate_sql, got.rows_affected,
                                                         want.rows_affected)
        await self.check()
        return got.rows_affected

    async def read(self, gate_sql: str, plain_sql: str | None = None,
                   bind_vars: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        got = sorted(map(tuple, (await self.gate.execute(self.session, gate_sql,
                                                         bind_vars)).rows))
        want = sorted(map(tuple, (await self.plain.execute(plain_sql or gate_sql)).rows))
        assert got == want, gate_sql
        return got

    async def check(self) -> None:
        """Every table as the reference's; lookups exactly what ``u`` implies."""
        for t, cols in (("u", "id, name, email, n"), ("m", "id, name"),
                        ("main.a", "id, x, s"), ("main.b", "id, y")):
            plain = f"SELECT {cols} FROM {t.split('.')[-1]}"
            await self.read(f"SELECT {cols} FROM {t}", plain)
        owners = (await self.plain.execute("SELECT id, name, email FROM u")).rows
        for col, table, pos in (("name", "name_idx", 1), ("email", "email_idx", 2)):
            res = await self.gate.execute(self.session, f"SELECT {col}, ksid FROM lk.{table}")
            have = Counter((r[0], bytes(r[1])) for r in res.rows)
            want = Counter((r[pos], hash_ksid(r[0])) for r in owners if r[pos] is not None)
            assert have == want, f"{table}: extra {have - want}, missing {want - have}"


def topology(kind: str) -> Callable[[Callable[..., str]], Topology]:
    def make(make_database: Callable[..., str]) -> Topology:
        shards = {kr.name: make_database(kind, f"i32s{i}")
                  for i, kr in enumerate(KeyRange(b"", b"").split(2))}
        return Topology.from_dict({
            "default_keyspace": "ks",
            "keyspaces": {
                "ks": {"shards": shards, "vschema": VSCHEMA},
                "lk": {"shards": {"0": make_database(kind, "i32lk")},
                       "vschema": {"sharded": False,
                                   "tables": {"name_idx": {}, "email_idx": {}}}},
                "main": {"shards": {"0": make_database(kind, "i32main")},
                         "vschema": {"sharded": False, "tables": {"a": {}, "b": {}}}},
            },
        })
    return make


@pytest.fixture
async def world(backend_kind: str, tablets: str, make_database: Callable[..., str],
                request: pytest.FixtureRequest) -> AsyncIterator[World]:
    async with gate_for(backend_kind, tablets, topology(backend_kind), make_database,
                        request, shape="issue32") as gate:
        async for w in _world(backend_kind, gate, make_database):
            yield w


async def _world(backend_kind: str, gate: Gate,
                 make_database: Callable[..., str]) -> AsyncIterator[World]:
    plain = open_backend(make_database(backend_kind, "i32one"), pool_size=1)
    w = World(backend_kind, gate, plain)
    binary = "BYTEA" if backend_kind == "postgres" else "VARBINARY(8)"
    try:
        for ddl in SHARDED_DDL:
            await gate.execute(w.session, ddl)
            await plain.execute(ddl)
        main = gate.session("main", identity=TRUSTED)
        for ddl in _main_ddl(backend_kind):
            await gate.execute(main, ddl)
            await plain.execute(ddl)
        lk = gate.session("lk", identity=TRUSTED)
        await gate.execute(lk, f"CREATE TABLE name_idx (name VARCHAR(32), ksid {binary})")
        await gate.execute(lk, f"CREATE TABLE email_idx (email VARCHAR(32), ksid {binary})")
        for row in U_ROWS:
            await w.both(f"INSERT INTO u (id, name, email, n) VALUES ({_values(row)})")
        for pair in M_ROWS:
            await w.both(f"INSERT INTO m (id, name) VALUES ({_values(pair)})")
        for a in ((1, 1, "p"), (2, 2, "q"), (3, 3, "r")):
            await w.both(f"INSERT INTO main.a (id, x, s) VALUES ({_values(a)})",
                         f"INSERT INTO a (id, x, s) VALUES ({_values(a)})")
        for b in ((1, 1), (3, 30)):
            await w.both(f"INSERT INTO main.b (id, y) VALUES ({_values(b)})",
                         f"INSERT INTO b (id, y) VALUES ({_values(b)})")
        yield w
    finally:
        await plain.close()


def _values(row: tuple[Any, ...]) -> str:
    return ", ".join("NULL" if v is None else repr(v) for v in row)


def _upsert(kind: str, body: str, sets: list[tuple[str, str, str]]) -> tuple[str, str]:
    """``body ON DUPLICATE KEY UPDATE`` for the gate and the reference's form of it:
    ``sets`` are ``(column, MySQL expression, the reference's expression)`` where the
    latter names the proposed row ``excluded`` and the existing one ``u``."""
    gate = body + " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = {e}" for c, e, _ in sets)
    if kind == "mysql":
        return gate, gate
    target = "(id) " if kind == "postgres" else ""
    plain = body + f" ON CONFLICT {target}DO UPDATE SET " + ", ".join(
        f"{c} = {p}" for c, _, p in sets)
    return gate, plain


async def test_upsert_into_an_owner_keeps_its_lookups(world: World) -> None:
    """INSERT ... ON DUPLICATE KEY UPDATE into a table owning lookup vindexes: a new row
    creates its lookup rows, an updated row's changed lookup columns move them, an
    unchanged row leaves them; rows affected as the database reports them."""
    k = world.kind
    body = "INSERT INTO u (id, name, email, n) VALUES "
    changed = 2 if k == "mysql" else 1
    # no duplicate: inserted
    assert await world.both(*_upsert(k, body + "(6, 'fay', 'fay@x', 60)",
                                     [("name", "VALUES(name)", "excluded.name")])) == 1
    # duplicate id: the lookup column changes, its row moves
    assert await world.both(*_upsert(k, body + "(1, 'amy', 'amy@x', 0)",
                                     [("name", "VALUES(name)", "excluded.name"),
                                      ("email", "VALUES(email)", "excluded.email")])) \
        == changed
    # a computed new value of the lookup column, and of another column
    assert await world.both(*_upsert(k, body + "(2, 'x', NULL, 0)",
                                     [("name", "CONCAT(name, '2')", "u.name || '2'"),
                                      ("n", "n + 1", "u.n + 1")])) == changed
    # nothing changes: no lookup work, the row counted once
    assert await world.both(*_upsert(k, body + "(5, 'eve', 'eve@x', 50)",
                                     [("name", "VALUES(name)", "excluded.name")])) == 1
    # to NULL (ignore_nulls: the lookup row goes), and the primary vindex to itself
    assert await world.both(*_upsert(k, body + "(3, NULL, 'cy@x', 0)",
                                     [("id", "VALUES(id)", "excluded.id"),
                                      ("name", "VALUES(name)", "excluded.name"),
                                      ("email", "VALUES(email)", "excluded.email")])) \
        == changed
    # several rows, one new and one duplicate
    assert await world.both(*_upsert(k, body + "(7, 'gus', 'gus@x', 70), "
                                     "(4, 'dee', 'dee@y', 0)",
                                     [("name", "VALUES(name)", "excluded.name"),
                                      ("email", "VALUES(email)", "excluded.email")])) \
        == 1 + changed
    # routed by the moved lookup rows
    await world.read("SELECT id FROM u WHERE name = 'dee'")
    await world.read("SELECT id FROM u WHERE email = 'amy@x'")
    # rolled back: lookups as before
    gate_sql, _ = _upsert(k, body + "(5, 'ivy', 'ivy@x', 0)",
                          [("name", "VALUES(name)", "excluded.name")])
    await world.gate.execute(world.session, "BEGIN")
    await world.gate.execute(world.session, gate_sql)
    await world.gate.execute(world.session, "ROLLBACK")
    await world.check()


async def test_insert_without_a_column_list_takes_the_tracked_columns(world: World) -> None:
    """``INSERT INTO u VALUES (...)``: the columns the gate tracked from the shards, in
    the table's order (routed by ``id``, lookup rows for ``name`` and ``email``), with
    ON DUPLICATE KEY UPDATE too; a row of the wrong width is refused as the database
    refuses it."""
    k = world.kind
    assert await world.both("INSERT INTO u VALUES (8, 'hal', 'hal@x', 80), "
                            "(9, NULL, 'ida@x', 90)") == 2
    await world.both("INSERT INTO m VALUES (8, 'hal')")
    changed = 2 if k == "mysql" else 1
    assert await world.both(*_upsert(k, "INSERT INTO u VALUES (8, 'hub', 'hub@x', 0)",
                                     [("name", "VALUES(name)", "excluded.name")])) == changed
    await world.read("SELECT id, n FROM u WHERE name = 'hub'")
    with pytest.raises(ShardgateError) as err:
        await world.gate.execute(world.session, "INSERT INTO u VALUES (10, 'joe')")
    assert err.value.code is Code.INVALID_ARGUMENT and "2 values for 4 columns" in str(err.value)
    await world.check()


async def test_upsert_that_would_move_a_row_is_refused(world: World) -> None:
    with pytest.raises(ShardgateError) as err:
        await world.gate.execute(world.session, "INSERT INTO u (id, name) VALUES (1, 'a') "
                                 "ON DUPLICATE KEY UPDATE id = 100")
    assert err.value.code is Code.UNIMPLEMENTED
    await world.check()


async def test_update_of_a_lookup_column_the_table_does_not_own(world: World) -> None:
    """``m.name`` is a column of ``name_idx``, which ``u`` owns: the update changes ``m``
    and leaves the lookup (``u``'s) alone, as Vitess does."""
    assert await world.both("UPDATE m SET name = 'bob' WHERE id = 1") == 1
    await world.both("UPDATE m SET name = NULL WHERE id IN (2, 3)")
    await world.read("SELECT id FROM m WHERE name = 'bob'")


async def test_introducers_and_list_binds_route_by_value(world: World) -> None:
    """``_binary 'abc'`` and ``_utf8mb4'x'`` are values routed as their text (by the
    lookup); ``IN ::ids`` takes a list bind variable (Vitess's list argument)."""
    k = world.kind

    def plain(sql: str) -> str:
        return sql if k == "mysql" else sql.replace("_binary ", "").replace("_utf8mb4", "")

    q = "SELECT id, n FROM u WHERE name = _utf8mb4'ann'"
    await world.read(q, plain(q))
    explained = await world.gate.execute(world.session, "EXPLAIN " + q)
    assert '"Vindex": "name_idx"' in str(explained.rows[0][0])
    q = "DELETE FROM u WHERE name = _binary 'bob'"
    assert await world.both(q, plain(q)) == 1
    got = await world.read("SELECT id FROM u WHERE id IN ::ids", "SELECT id FROM u WHERE id "
                           "IN (1, 3, 5)", {"ids": [1, 3, 5]})
    assert got == [(1,), (3,), (5,)]
    assert await world.both("DELETE FROM u WHERE id NOT IN ::ids AND n < :n",
                            "DELETE FROM u WHERE id NOT IN (1, 5) AND n < 35",
                            {"ids": [1, 5], "n": 35}) == 1


async def test_unsharded_statements_pass_through(world: World) -> None:
    """Statements to an unsharded keyspace pass through; MySQL forms a SQLite or
    PostgreSQL shard cannot parse are translated, or refused naming the form."""
    k = world.kind
    world.session = world.gate.session("main", identity=TRUSTED)
    # multi-table UPDATE/DELETE with aliases
    upd = "UPDATE a AS t JOIN b AS o ON t.id = o.id SET t.x = o.y WHERE o.y > 5"
    assert await world.both(upd, upd if k == "mysql" else
                            "UPDATE a AS t SET x = o.y FROM b AS o WHERE t.id = o.id AND "
                            "o.y > 5") == 1
    dele = "DELETE t FROM a t JOIN b o ON t.id = o.id WHERE o.y = 1"
    assert await world.both(dele, dele if k == "mysql" else
                            "DELETE FROM a WHERE id IN (SELECT t.id FROM a t JOIN b o "
                            "ON t.id = o.id WHERE o.y = 1)") == 1
    using = "DELETE FROM t USING a AS t, b AS o WHERE t.id = o.id AND o.y = 30"
    assert await world.both(using, using if k == "mysql" else
                            "DELETE FROM a WHERE id IN (SELECT t.id FROM a t, b o "
                            "WHERE t.id = o.id AND o.y = 30)") == 1
    # straight_join, dual, parenthesized union arms
    await world.read("SELECT STRAIGHT_JOIN t.x FROM a t STRAIGHT_JOIN b o ON t.id = o.id",
                     "SELECT t.x FROM a t JOIN b o ON t.id = o.id")
    await world.read("SELECT x FROM a WHERE id IN (SELECT 3 FROM dual)",
                     "SELECT x FROM a WHERE id IN (SELECT 3)")
    union = "(SELECT x FROM a ORDER BY x LIMIT 1) UNION (SELECT y FROM b)"
    await world.read(union, union if k != "sqlite" else
                     "SELECT * FROM (SELECT x FROM a ORDER BY x LIMIT 1) UNION SELECT y FROM b")
    # last_insert_id() in the transaction of the insert
    await world.gate.execute(world.session, "BEGIN")
    await world.gate.execute(world.session, "INSERT INTO a (x, s) VALUES (9, 'z')")
    res = await world.gate.execute(world.session, "SELECT last_insert_id()")
    await world.gate.execute(world.session, "COMMIT")
    new_id = (await world.gate.execute(world.session, "SELECT id FROM a WHERE x = 9")).rows
    assert res.rows[0][0] == new_id[0][0]
    await world.plain.execute(f"INSERT INTO a (id, x, s) VALUES ({new_id[0][0]}, 9, 'z')")
    await world.check()
    if k == "mysql":
        assert (await world.gate.execute(world.session, "SELECT @@session.autocommit")).rows
        return
    for form, sql, code in (
        ("@@session.autocommit", "SELECT @@session.autocommit", Code.UNIMPLEMENTED),
        ("DELETE from several tables", "DELETE t, o FROM a t JOIN b o ON t.id = o.id",
         Code.UNIMPLEMENTED),
        ("LAST_INSERT_ID(expr)", "SELECT last_insert_id(5)", Code.PERMISSION_DENIED),
    ):
        with pytest.raises(ShardgateError) as err:
            await world.gate.execute(world.session, sql)
        assert err.value.code is code and form in err.value.message
    await world.check()
