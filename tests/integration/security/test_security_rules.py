"""The statement rules of issue 30 (items 2-7 and 10) over real doors and real shards.

Each test runs on SQLite, PostgreSQL and MariaDB shards (where the item
applies), through a served gate (gRPC, ``GateClient`` with a users file and a
table ACL) and through the MySQL listener (pymysql with the same users), in
plain sessions and in shard-targeted ones (``USE `commerce:-80```).

The ACL: ``bob`` reads every table but ``corder`` (no role on it), ``alice``
writes every table but ``corder``, ``dba`` is admin of everything (``%``).
``corder`` holds marker values no other table holds, so a result carrying
one is a leak.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ServerSecurity
from shardgate.api.grpc.server import serve
from shardgate.api.mysql import serve_mysql
from shardgate.auth import StaticUsers
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED
from shardgate.errors import ShardgateError
from shardgate.gate import Gate

from ..conftest import open_cluster

USERS = {"alice": [{"Password": "alice-pw"}], "bob": [{"Password": "bob-pw"}],
         "dba": [{"Password": "dba-pw"}]}
ACL = {"table_groups": [
    {"name": "orders", "table_names_or_prefixes": ["corder"], "admins": ["dba"]},
    {"name": "the rest", "table_names_or_prefixes": ["%"], "readers": ["bob"],
     "writers": ["alice"], "admins": ["dba"]},
]}
#: what only the denied table holds
MARKER = "zz-secret-sku"
MARKER_PRICE = 987654321
TARGET = "commerce:-80"


class Refused(Exception):
    """A statement the door refused: the gate's code (or the MySQL errno) and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class Doors:
    gate: Gate
    kind: str
    grpc: str
    mysql_port: int

    async def run(self, door: str, user: str, sql: str, *, targeted: bool = False
                  ) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` run by ``user`` through ``door``; Refused if refused."""
        if door == "grpc":
            async with GateClient(self.grpc, keyspace="commerce", user=user,
                                  password=f"{user}-pw", timeout=30) as client:
                if targeted:
                    await client.execute(f"USE `{TARGET}`")
                try:
                    return [tuple(r) for r in (await client.execute(sql)).rows]
                except ShardgateError as exc:
                    raise Refused(exc.code.name, exc.message) from None
        return await asyncio.to_thread(self._mysql, user, sql, targeted)

    def _mysql(self, user: str, sql: str, targeted: bool) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(host="127.0.0.1", port=self.mysql_port, user=user,
                               password=f"{user}-pw", database="commerce", autocommit=True)
        try:
            cur = conn.cursor()
            if targeted:
                cur.execute(f"USE `{TARGET}`")
            try:
                cur.execute(sql)
            except pymysql.err.MySQLError as exc:
                errno = exc.args[0] if exc.args else 0
                code = "PERMISSION_DENIED" if errno in (1142, 1227, 1044) else str(errno)
                raise Refused(code, str(exc.args[1] if len(exc.args) > 1 else exc)) from None
            return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    async def refused(self, door: str, user: str, sql: str, *, targeted: bool = False,
                      says: str = "") -> str:
        """Assert ``sql`` is refused with PERMISSION_DENIED (naming ``says``); its message.

        The MySQL listener answers some statements itself, never sending them to a shard
        (``SET``, ``information_schema``: :data:`LISTENER_ANSWERS`); there any refusal
        (or the listener's own answer, without a denied row) will do.
        """
        answers = door == "mysql" and sql.lower().startswith(LISTENER_ANSWERS)
        try:
            rows = await self.run(door, user, sql, targeted=targeted)
        except Refused as exc:
            if answers:
                return exc.message
            if door == "mysql" and exc.code == "1064":
                return ""  # the listener's own parser refused it: it never reached the gate
            assert exc.code == "PERMISSION_DENIED", (door, user, targeted, sql, exc)
            assert says.lower() in exc.message.lower(), (door, user, targeted, sql, exc.message)
            return exc.message
        if answers and not _leaks(rows):
            return ""  # the listener's own answer: nothing was sent to a shard
        raise AssertionError(f"{door} {user} {sql!r} was not refused: {rows[:3]}")


DOORS = ["grpc", "mysql"]
#: statements the MySQL listener answers itself (never sent to a shard), by their start
LISTENER_ANSWERS = ("set ", "select * from information_schema.", "select * from mysql.",
                    "select version()", "select connection_id()", "select user()", "show ")


@pytest.fixture
async def doors(backend_kind: str, make_database: Callable[..., str]) -> AsyncIterator[Doors]:
    c = await open_cluster(backend_kind, lambda kind, hint="": make_database(kind, "r" + hint),
                           shards=2)
    gate = c.gate
    try:
        s = gate.session("commerce", identity=TRUSTED)
        for i in range(1, 7):
            await gate.execute(s, "INSERT INTO customer (customer_id, email, name) VALUES "
                                  f"({i}, 'c{i}@x', 'c-{i}')")
            await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                                  f"VALUES ({i}, {i}, '{MARKER}-{i}', {MARKER_PRICE})")
        gate.guard = Guard(TableACL.from_mapping(ACL))
        async with served_doors(gate, backend_kind) as doors_:
            yield doors_
    finally:
        await gate.close()


@contextlib.asynccontextmanager
async def served_doors(gate: Gate, backend_kind: str) -> AsyncIterator[Doors]:
    """``gate`` behind a gRPC server and a MySQL listener, both with :data:`USERS`."""
    users = StaticUsers.from_mapping(USERS)
    server, port = await serve(gate, "127.0.0.1", 0,
                               security=ServerSecurity(users=users), no_auth=False)
    listener, mysql_port = await serve_mysql(gate, "127.0.0.1", 0, users=users)
    try:
        yield Doors(gate, backend_kind, f"grpc://127.0.0.1:{port}", mysql_port)
    finally:
        await listener.stop()
        await server.stop(None)


def _leaks(rows: list[tuple[Any, ...]]) -> bool:
    return any(MARKER in str(v) or str(MARKER_PRICE) in str(v) for r in rows for v in r)


# -- item 2: CTE names resolved by scope ----------------------------------------------------

CTE_HIDING = [
    "WITH corder AS (SELECT * FROM corder) SELECT * FROM corder",
    "WITH customer AS (SELECT sku AS name FROM corder) SELECT name FROM customer",
    "WITH a AS (SELECT * FROM corder), corder AS (SELECT 1 AS x) SELECT * FROM a",
    "SELECT * FROM customer WHERE name IN (WITH x AS (SELECT sku FROM corder) "
    "SELECT sku FROM x)",
    "WITH x AS (SELECT 1 AS n) SELECT (SELECT max(sku) FROM corder) FROM x",
    "WITH corder AS (SELECT 1 AS a) SELECT * FROM (WITH y AS (SELECT * FROM corder) "
    "SELECT * FROM y) z, customer",
]


@pytest.mark.parametrize("door", DOORS)
async def test_a_cte_named_like_a_denied_table_does_not_hide_it(doors: Doors, door: str) -> None:
    for sql in CTE_HIDING:
        for targeted in (False, True):
            await doors.refused(door, "bob", sql, targeted=targeted, says="corder")
    # (the last one: PostgreSQL and SQLite read the outer CTE there, MariaDB 10.11 reads the
    # table, as the same statement run as an admin shows on MariaDB)
    rows = await doors.run(door, "dba", CTE_HIDING[-1], targeted=True)
    assert _leaks(rows) == (doors.kind == "mysql" and bool(rows)), rows
    # a CTE in scope still hides a table for reads: bob may read what it computes
    rows = await doors.run(door, "bob", "WITH corder AS (SELECT name FROM customer) "
                                        "SELECT * FROM corder", targeted=True)
    assert rows and all(str(r[0]).startswith("c-") for r in rows), rows


# -- item 3 and 10: data-changing CTEs and locking reads need the writer role -----------------

@pytest.mark.parametrize("door", DOORS)
async def test_data_changing_ctes_and_locking_reads_need_the_writer_role(
    doors: Doors, door: str
) -> None:
    changing = [
        "WITH d AS (DELETE FROM customer WHERE customer_id > 0 RETURNING customer_id) "
        "SELECT * FROM d",
        "WITH u AS (UPDATE customer SET name = 'owned' RETURNING customer_id) SELECT * FROM u",
        "WITH i AS (INSERT INTO customer (customer_id, email, name) VALUES (99, 'e', 'n') "
        "RETURNING customer_id) SELECT * FROM i",
        "SELECT * FROM customer FOR UPDATE",
        "SELECT * FROM customer WHERE customer_id = 1 FOR SHARE",
        "SELECT * FROM customer LOCK IN SHARE MODE",
    ]
    for sql in changing:
        for targeted in (True, False):
            await doors.refused(door, "bob", sql, targeted=targeted,
                                says="needs the writer role on table commerce.customer")
    s = doors.gate.session("commerce", identity=TRUSTED)
    rows = (await doors.gate.execute(s, "SELECT count(*) FROM customer WHERE name = 'owned' "
                                        "OR customer_id = 99")).rows
    assert rows == [(0,)]
    assert (await doors.gate.execute(s, "SELECT count(*) FROM customer")).rows == [(6,)]
    # a writer may take row locks in a targeted session
    if doors.kind != "sqlite":
        await doors.run(door, "alice", "SELECT customer_id FROM customer FOR UPDATE",
                        targeted=True)


# -- item 4: functions ----------------------------------------------------------------------

ALWAYS_REFUSED = {  # for everyone, admin included: SQL in a string, session state
    "postgres": ["SELECT ts_stat('SELECT to_tsvector(sku) FROM corder')",
                 "SELECT query_to_xml('SELECT * FROM corder', true, true, '')",
                 "SELECT * FROM customer WHERE name = (SELECT ts_rewrite(to_tsquery('a'), "
                 "'SELECT to_tsquery(sku), to_tsquery(sku) FROM corder'))",
                 "SELECT table_to_xml('corder', true, true, '')",
                 "SELECT set_config('default_transaction_read_only', 'on', false)",
                 "SELECT pg_catalog.set_config('statement_timeout', '1', false)",
                 "SELECT pg_advisory_lock(1)", "SELECT pg_try_advisory_lock(2)",
                 "SELECT dblink('dbname=x', 'SELECT 1')"],
    "mysql": ["SELECT GET_LOCK('x', 0)", "SELECT RELEASE_ALL_LOCKS()",
              "SELECT LAST_INSERT_ID(5)", "SELECT @v := name FROM customer"],
    "sqlite": ["SELECT eval('SELECT sku FROM corder')"],
}
BELOW_ADMIN_REFUSED = {  # for bob, not for dba
    "postgres": ["SELECT current_setting('data_directory')", "SELECT version()",
                 "SELECT pg_sleep(0)", "SELECT inet_server_addr()",
                 "SELECT nextval('x')", "SELECT pg_catalog.pg_get_userbyid(10)",
                 "SELECT has_table_privilege('corder', 'select')"],
    "mysql": ["SELECT SLEEP(0)", "SELECT BENCHMARK(1, 1)", "SELECT CONNECTION_ID()",
              "SELECT USER()", "SELECT VERSION()"],
    "sqlite": ["SELECT sqlite_version()", "SELECT sqlite_source_id()"],
}
ALLOWED_TO_READERS = {  # ordinary functions of each dialect
    "postgres": "SELECT upper(name), length(email), md5(name), "
                "jsonb_typeof(jsonb_build_object('n', name)), "
                "date_trunc('day', now()) IS NOT NULL FROM customer WHERE customer_id = 1",
    "mysql": "SELECT UPPER(name), LENGTH(email), MD5(name), JSON_OBJECT('n', name), "
             "DATE_FORMAT(NOW(), '%Y') IS NOT NULL FROM customer WHERE customer_id = 1",
    "sqlite": "SELECT upper(name), length(email), printf('%s', name), json_object('n', name), "
              "strftime('%Y', 'now') IS NOT NULL FROM customer WHERE customer_id = 1",
}


@pytest.mark.parametrize("door", DOORS)
async def test_functions_allow_list_below_admin_and_deny_list_for_everyone(
    doors: Doors, door: str
) -> None:
    kind = doors.kind
    for sql in ALWAYS_REFUSED[kind]:
        if door == "mysql" and "LAST_INSERT_ID" in sql:
            continue  # the listener answers LAST_INSERT_ID itself (its own, per connection)
        for user in ("bob", "dba"):
            await doors.refused(door, user, sql, targeted=True, says="deny-list")
    for sql in BELOW_ADMIN_REFUSED[kind]:
        await doors.refused(door, "bob", sql, targeted=True, says="needs the admin role")
    assert await doors.run(door, "dba", BELOW_ADMIN_REFUSED[kind][-1], targeted=True)
    rows = await doors.run(door, "bob", ALLOWED_TO_READERS[kind], targeted=True)
    assert len(rows) == 1 and str(rows[0][0]).upper() == "C-1"
    # a user's function, qualified by its schema, is not on any list
    await doors.refused(door, "bob", "SELECT evil.upper(name) FROM customer", targeted=True,
                        says="admin role")


# -- item 6: statements about the server are never sent ---------------------------------------

NEVER_SENT = [
    ("DROP DATABASE {other}", "DROP DATABASE"), ("CREATE DATABASE sg_evil", "CREATE DATABASE"),
    ("ALTER DATABASE {other} SET work_mem = '1MB'", "ALTER DATABASE"),
    ("CREATE SCHEMA evil", "CREATE SCHEMA"), ("DROP SCHEMA public CASCADE", "DROP SCHEMA"),
    ("CREATE USER evil IDENTIFIED BY 'x'", "CREATE USER"), ("CREATE ROLE evil", "CREATE ROLE"),
    ("ALTER USER root IDENTIFIED BY 'x'", "ALTER USER"), ("DROP USER evil", "DROP USER"),
    ("DROP ROLE evil", "DROP ROLE"), ("GRANT ALL ON customer TO bob", "GRANT"),
    ("REVOKE ALL ON customer FROM bob", "REVOKE"),
    ("CREATE TABLESPACE evil LOCATION '/tmp'", "CREATE TABLESPACE"),
    ("ALTER SYSTEM SET work_mem = '1MB'", "ALTER SYSTEM"), ("SET GLOBAL max_connections = 1",
                                                           "SET GLOBAL"),
    ("FLUSH PRIVILEGES", "FLUSH"), ("SHUTDOWN", "SHUTDOWN"), ("RESET MASTER", "RESET"),
    ("PURGE BINARY LOGS BEFORE NOW()", "PURGE"), ("CHANGE MASTER TO MASTER_HOST='x'", "CHANGE"),
    ("CREATE SERVER evil FOREIGN DATA WRAPPER x", "CREATE SERVER"),
    ("DROP SERVER evil", "DROP SERVER"), ("SHOW BINLOG EVENTS", "SHOW BINLOG"),
    ("DO $$ BEGIN EXECUTE 'DROP TABLE customer'; END $$", "DO"),
    ("PREPARE s FROM 'SELECT * FROM corder'", "PREPARE"),
    ("EXECUTE IMMEDIATE 'SELECT * FROM corder'", "EXECUTE"),
]


@pytest.mark.parametrize("door", DOORS)
async def test_server_wide_statements_are_never_sent_even_for_admins(
    doors: Doors, door: str, make_database: Callable[..., str]
) -> None:
    other_url = make_database(doors.kind, "bystander")  # a database of no keyspace
    other = other_url.rstrip("/").rsplit("/", 1)[-1].split("?")[0]
    if doors.kind == "sqlite":
        other = "main"
    for template, form in NEVER_SENT:
        sql = template.format(other=other)
        for targeted in (True, False):
            message = await doors.refused(door, "dba", sql, targeted=targeted)
            if not message or (door == "mysql" and (
                    sql.lower().startswith(LISTENER_ANSWERS) or not targeted)):
                continue
            assert form in message and "deny-list" in message, (sql, message)
    # the bystander database is still there, with its tables
    from shardgate.backends import open_backend

    backend = open_backend(other_url, pool_size=1)
    try:
        conn = await backend.acquire()
        await conn.execute("SELECT 1")
        await backend.release(conn)
    finally:
        await backend.close()


# -- item 7: catalogs --------------------------------------------------------------------------

DENIED_CATALOGS = {
    "postgres": ["SELECT query FROM pg_stat_activity", "SELECT * FROM pg_shadow",
                 "SELECT * FROM pg_catalog.pg_stats", "SELECT * FROM pg_settings",
                 "SELECT * FROM pg_authid", "SELECT rolname FROM pg_roles",
                 "SELECT * FROM information_schema.role_table_grants"],
    "mysql": ["SELECT * FROM information_schema.processlist", "SELECT * FROM mysql.user",
              "SELECT * FROM performance_schema.threads", "SELECT * FROM sys.processlist",
              "SELECT * FROM information_schema.schemata", "SHOW PROCESSLIST",
              "SHOW DATABASES", "SHOW TABLES FROM mysql"],
    "sqlite": ["SELECT * FROM pragma_database_list", "SELECT * FROM main.sqlite_stat1",
               "SELECT * FROM pragma_compile_options", "SELECT * FROM sqlite_sequence"],
}
READABLE = {
    "postgres": "SELECT table_schema, table_name FROM information_schema.tables",
    "mysql": "SELECT table_schema, table_name FROM information_schema.tables",
    "sqlite": "SELECT 'main', name FROM sqlite_master WHERE type = 'table'",
}


@pytest.mark.parametrize("door", DOORS)
async def test_catalogs_below_admin_are_an_allow_list_kept_to_the_keyspace(
    doors: Doors, door: str, make_database: Callable[..., str]
) -> None:
    make_database(doors.kind, "neighbour")  # another database on the same server
    kind = doors.kind
    for sql in DENIED_CATALOGS[kind]:
        for targeted in (True, False):
            await doors.refused(door, "bob", sql, targeted=targeted)
    if door == "mysql":
        return  # the listener answers information_schema itself (the gateway's own view)
    rows = await doors.run(door, "bob", READABLE[kind], targeted=True)
    names = {str(r[1]).lower() for r in rows}
    assert {"customer", "corder"} <= names, rows
    assert len({str(r[0]) for r in rows}) == 1, rows  # the shard's own schema only
    assert not names & {"user", "pg_class", "processlist", "tables"}, rows
    rows = await doors.run(door, "bob", "SELECT column_name FROM information_schema.columns "
                                        "WHERE table_name = 'customer'", targeted=True) \
        if kind != "sqlite" else await doors.run(
            door, "bob", "SELECT name FROM pragma_table_info('customer')", targeted=True)
    assert sorted(str(r[0]).lower() for r in rows) == ["customer_id", "email", "name"]
    # an admin reads the server's catalogs
    assert await doors.run(door, "dba", DENIED_CATALOGS[kind][0], targeted=True) is not None
