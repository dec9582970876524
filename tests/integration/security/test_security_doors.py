"""Every door carries the caller's identity (issue 30, item 1), through real MySQL clients.

The MySQL listener served with a users file and a table ACL, reached with
PyMySQL and mysql-connector, on SQLite, PostgreSQL and MariaDB shards and on
PostgreSQL tablet processes (production mode): a reader cannot read a denied
table (also in a shard-targeted session, and not through the catalog paths
the listener answers itself: DESCRIBE, SHOW, information_schema), cannot
DELETE or DROP; a writer cannot run DDL; a user with the role gets the rows.
COM_CHANGE_USER makes the session the new user's; without a users file the
listener's caller is ANONYMOUS, as on gRPC. The embedded DB-API driver runs as
the identity it is given, and the console's queue page as its HTTP user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import mysql.connector
import pymysql
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ServerSecurity
from shardgate.api.grpc.server import serve
from shardgate.api.http import HttpServer
from shardgate.api.mysql import MysqlListener, serve_mysql
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED, Identity
from shardgate.auth.users import StaticUsers
from shardgate.client import dbapi
from shardgate.client.embedded import close_embedded, open_embedded
from shardgate.errors import PermissionDenied
from shardgate.gate import Gate
from shardgate.topo.embedded import embedded_topology
from shardgate.topo.local import open_topo
from tests.acceptance.test_cli import (
    STOP_TIMEOUT_S,
    cli_env,
    free_port,
    shardgate,
    wait_for_port,
)
from tests.acceptance.test_cli_mysql import mariadb
from tests.conftest import console_cluster
from tests.integration.conftest import Cluster
from tests.integration.doors.test_grpc import set_up_embedded

T = TypeVar("T")

USERS = {name: [{"Password": f"{name}-pw"}] for name in ("rita", "walt", "ada", "nobody")}
#: rita reads customers only; walt reads and writes both tables; ada is the admin
ACL = {"table_groups": [
    {"name": "customers", "table_names_or_prefixes": ["customer"],
     "readers": ["rita"], "writers": ["walt"], "admins": ["ada"]},
    {"name": "orders", "table_names_or_prefixes": ["corder"],
     "readers": [], "writers": ["walt"], "admins": ["ada"]},
    {"name": "the rest", "table_names_or_prefixes": ["%"],
     "readers": ["rita"], "writers": ["walt"], "admins": ["ada"]},
]}
#: ER_TABLEACCESS_DENIED_ERROR, what the listener answers PERMISSION_DENIED with
DENIED = 1142


async def run(fn: Callable[[], T]) -> T:
    """``fn()`` (a blocking client) in a worker thread, the loop serving meanwhile."""
    return await asyncio.wait_for(asyncio.to_thread(fn), timeout=120)


async def seed(gate: Gate) -> None:
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, "INSERT INTO customer (customer_id, email, name) VALUES "
                          "(1, 'a@x.io', 'Ann'), (2, 'b@x.io', 'Bob')")
    await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES "
                          "(10, 1, 'secret-sku', 99), (11, 2, 'other', 5)")


@pytest.fixture
async def listener(cluster: Cluster) -> AsyncIterator[int]:
    """The cluster's gate with the ACL above, its MySQL listener with the users above."""
    cluster.gate.guard = Guard(TableACL.from_mapping(ACL))
    await seed(cluster.gate)
    server, port = await serve_mysql(cluster.gate, "127.0.0.1", 0,
                                     users=StaticUsers.from_mapping(USERS))
    try:
        yield port
    finally:
        await server.stop()


def connect(port: int, user: str, database: str = "commerce") -> Any:
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=f"{user}-pw",
                           database=database, autocommit=True)


def refused(cur: Any, sql: str) -> str:
    """The message of the 1142 the listener answers ``sql`` with."""
    with pytest.raises(pymysql.err.MySQLError) as info:
        cur.execute(sql)
    assert info.value.args[0] == DENIED, (sql, info.value.args)
    return str(info.value.args[1])


async def test_reader_reads_only_its_tables_and_changes_nothing(listener: int) -> None:
    def client() -> None:
        rita = connect(listener, "rita").cursor()
        rita.execute("SELECT name FROM customer ORDER BY customer_id")
        assert rita.fetchall() == (("Ann",), ("Bob",))
        for sql in ("SELECT * FROM corder", "SELECT sku FROM corder WHERE order_id = 10",
                    "SELECT COUNT(*) FROM corder",
                    "SELECT c.name, o.sku FROM customer c JOIN corder o "
                    "ON o.customer_id = c.customer_id WHERE c.customer_id = 1"):
            message = refused(rita, sql)
            assert "'rita'" in message and "corder" in message
        refused(rita, "DELETE FROM customer WHERE customer_id = 2")
        refused(rita, "UPDATE customer SET name = 'x' WHERE customer_id = 1")
        refused(rita, "INSERT INTO customer (customer_id, email, name) VALUES (3, 'c', 'C')")
        refused(rita, "DROP TABLE customer")
        refused(rita, "DROP TABLE corder")
        # a session targeted at one shard is checked the same way
        rita.execute("USE `commerce:-40`")
        refused(rita, "SELECT * FROM corder")
        refused(rita, "DELETE FROM customer")
        refused(rita, "DROP TABLE customer")
        rita.execute("SELECT COUNT(*) FROM customer")  # what it may read, it reads
        # the user with the role gets the rows: nothing was deleted or dropped
        walt = connect(listener, "walt").cursor()
        walt.execute("SELECT order_id, sku FROM corder ORDER BY order_id")
        assert walt.fetchall() == ((10, "secret-sku"), (11, "other"))
        walt.execute("SELECT COUNT(*) FROM customer")
        assert walt.fetchone() == (2,)
        # a user no group names gets nothing
        refused(connect(listener, "nobody").cursor(), "SELECT * FROM customer")

    await run(client)


async def test_writer_writes_but_cannot_run_ddl(listener: int) -> None:
    def client() -> None:
        walt = connect(listener, "walt").cursor()
        assert walt.execute("INSERT INTO corder (order_id, customer_id, sku, price) "
                            "VALUES (12, 1, 'new', 1)") == 1
        assert walt.execute("DELETE FROM corder WHERE order_id = 12") == 1
        for sql in ("DROP TABLE customer", "ALTER TABLE customer ADD COLUMN x INT",
                    "TRUNCATE TABLE corder", "CREATE TABLE t2 (id BIGINT PRIMARY KEY)",
                    "CREATE INDEX corder_sku ON corder (sku)"):
            assert "admin" in refused(walt, sql), sql
        walt.execute("SELECT COUNT(*) FROM corder")
        assert walt.fetchone() == (2,)

    await run(client)


async def test_catalog_paths_show_only_readable_tables(listener: int) -> None:
    """What the listener answers itself, from the shards' catalogs, without a statement
    reaching the gate's execute path: a denied table's columns stay hidden."""
    def client() -> None:
        rita = connect(listener, "rita").cursor()
        for sql in ("DESCRIBE corder", "DESC commerce.corder", "SHOW COLUMNS FROM corder",
                    "SHOW FULL COLUMNS FROM corder", "SHOW INDEX FROM corder",
                    "SHOW KEYS FROM corder FROM commerce", "SHOW CREATE TABLE corder",
                    "SHOW VSCHEMA VINDEXES ON corder"):
            refused(rita, sql)
        rita.execute("SHOW TABLES")
        tables = {r[0] for r in rita.fetchall()}
        assert "customer" in tables and "corder" not in tables
        rita.execute("SHOW TABLE STATUS")
        assert "corder" not in {r[0] for r in rita.fetchall()}
        rita.execute("SHOW VSCHEMA TABLES")
        assert "corder" not in {r[0] for r in rita.fetchall()}
        rita.execute("SELECT column_name FROM information_schema.columns "
                     "WHERE table_name = 'corder'")
        assert rita.fetchall() == ()
        rita.execute("SELECT table_name FROM information_schema.tables "
                     "WHERE table_schema = 'commerce'")
        assert {r[0] for r in rita.fetchall()} == {"customer"}
        rita.execute("DESCRIBE customer")
        assert "email" in {r[0] for r in rita.fetchall()}
        walt = connect(listener, "walt").cursor()
        walt.execute("DESCRIBE corder")
        assert "sku" in {r[0] for r in walt.fetchall()}
        walt.execute("SELECT column_name FROM information_schema.columns "
                     "WHERE table_name = 'corder'")
        assert "sku" in {str(r[0]).lower() for r in walt.fetchall()}

    await run(client)


# -- the connection's user changes (protocol level: SQLite shards are enough) -----------------


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[Gate]:
    gate = Gate.open(embedded_topology(tmp_path / "data"))
    try:
        await set_up_embedded(gate)
        await seed(gate)
        gate.guard = Guard(TableACL.from_mapping(ACL))
        yield gate
    finally:
        await gate.close()


async def _serve(gate: Gate, users: StaticUsers | None) -> tuple[MysqlListener, int]:
    return await serve_mysql(gate, "127.0.0.1", 0, users=users)


async def test_change_user_and_reset_give_the_new_users_session(embedded: Gate) -> None:
    server, port = await _serve(embedded, StaticUsers.from_mapping(USERS))

    def connector(user: str) -> Any:
        return mysql.connector.connect(host="127.0.0.1", port=port, user=user,
                                       password=f"{user}-pw", database="commerce",
                                       autocommit=True, use_pure=True,
                                       auth_plugin="mysql_native_password")

    def count_orders(conn: Any) -> int:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM corder")
        (n,) = cur.fetchone()
        cur.close()
        return int(n)

    def client() -> None:
        conn = connector("walt")
        assert count_orders(conn) == 2
        conn.cmd_change_user(username="rita", password="rita-pw", database="commerce")
        with pytest.raises(mysql.connector.Error) as info:
            count_orders(conn)
        assert info.value.errno == DENIED and "'rita'" in str(info.value)
        conn.cmd_change_user(username="walt", password="walt-pw", database="commerce")
        assert count_orders(conn) == 2  # the new user's rights, not the first one's
        # COM_RESET_CONNECTION: the open transaction is rolled back, the user stays
        cur = conn.cursor()
        cur.execute("BEGIN")
        cur.execute("INSERT INTO corder (order_id, customer_id, sku, price) "
                    "VALUES (20, 1, 'in-tx', 1)")
        cur.close()
        conn.cmd_reset_connection()
        assert count_orders(conn) == 2
        # a failed COM_CHANGE_USER closes the connection (as MySQL does)
        with pytest.raises(mysql.connector.Error):
            conn.cmd_change_user(username="walt", password="wrong", database="commerce")
        with pytest.raises(mysql.connector.Error):
            count_orders(conn)
        with contextlib.suppress(mysql.connector.Error):
            conn.close()

    try:
        await run(client)
    finally:
        await server.stop()


async def test_stmt_reset_keeps_the_transaction(embedded: Gate) -> None:
    """COM_STMT_RESET resets one prepared statement, not the session: the connection's
    open transaction (and its user) stay."""
    server, port = await _serve(embedded, StaticUsers.from_mapping(USERS))

    def client() -> None:
        conn = mysql.connector.connect(host="127.0.0.1", port=port, user="walt",
                                       password="walt-pw", database="commerce",
                                       autocommit=False, use_pure=True,
                                       auth_plugin="mysql_native_password")
        cur = conn.cursor()
        cur.execute("INSERT INTO corder (order_id, customer_id, sku, price) "
                    "VALUES (30, 1, 'kept', 1)")
        prepared = conn.cmd_stmt_prepare(b"SELECT sku FROM corder WHERE order_id = ?")
        conn.cmd_stmt_reset(prepared["statement_id"])
        conn.commit()
        cur.execute("SELECT sku FROM corder WHERE order_id = 30")
        assert cur.fetchall() == [("kept",)]
        conn.close()

    try:
        await run(client)
    finally:
        await server.stop()


async def test_without_a_users_file_the_caller_is_anonymous(embedded: Gate) -> None:
    """``shardgate up``'s listener (no users file): ANONYMOUS, whom the ACL may deny,
    as on gRPC; never the gate's trusted path."""
    embedded.guard = Guard(TableACL.from_mapping({"table_groups": [
        {"name": "customers", "table_names_or_prefixes": ["customer"],
         "readers": ["anonymous"], "writers": [], "admins": []},
    ]}))
    server, port = await _serve(embedded, None)

    def client() -> None:
        cur = pymysql.connect(host="127.0.0.1", port=port, user="whoever",
                              database="commerce", autocommit=True).cursor()
        cur.execute("SELECT COUNT(*) FROM customer")
        assert cur.fetchone() == (2,)
        assert "'anonymous'" in refused(cur, "SELECT * FROM corder")
        refused(cur, "DELETE FROM customer")
        refused(cur, "DROP TABLE customer")
        refused(cur, "DESCRIBE corder")

    try:
        await run(client)
    finally:
        await server.stop()


def test_embedded_dbapi_runs_as_the_identity_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    gate, loop_thread = open_embedded(embedded_topology(tmp_path / "data"))
    try:
        loop_thread.run(set_up_embedded(gate))
        loop_thread.run(seed(gate))
        gate.guard = Guard(TableACL.from_mapping(ACL))
        with pytest.raises(dbapi.InterfaceError, match="identity="):
            dbapi.connect(gate, loop=loop_thread.loop)
        rita = dbapi.connect(gate, loop=loop_thread.loop, identity=Identity("rita"),
                             keyspace="commerce", autocommit=True)
        with pytest.raises(dbapi.ProgrammingError) as info:
            rita.cursor().execute("SELECT * FROM corder")
        assert info.value.code is not None and info.value.code.value == "PERMISSION_DENIED"
        own = dbapi.connect(gate, loop=loop_thread.loop, identity=TRUSTED,
                            keyspace="commerce", autocommit=True)
        cur = own.cursor()
        cur.execute("SELECT COUNT(*) FROM corder")
        assert cur.fetchone() == (2,)
        rita.close()
        own.close()
    finally:
        close_embedded(gate, loop_thread)


def _basic(user: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, f"{user}-pw")}


async def test_console_reads_a_queue_as_its_http_user(tmp_path: Path) -> None:
    gate = await Gate.from_topo(await open_topo(console_cluster(tmp_path)))
    server = HttpServer(gate, "127.0.0.1", 0, users=StaticUsers.from_mapping(USERS))
    try:
        s = gate.session("ks", identity=TRUSTED)
        await gate.execute(s, "CREATE QUEUE fjobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                              "SHARD BY user_id")
        gate.guard = Guard(TableACL.from_mapping({"table_groups": [
            {"name": "jobs", "table_names_or_prefixes": ["fjobs"],
             "readers": ["rita"], "writers": [], "admins": ["ada"]},
        ]}))
        port = await server.start()
        url = f"http://127.0.0.1:{port}/api/queues/ks/fjobs/failed"
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=_basic("walt")) as r:
                body = await r.json()
                assert r.status == 403, body
                assert body["code"] == "PERMISSION_DENIED" and "'walt'" in body["message"]
            async with http.get(url, headers=_basic("rita")) as r:
                assert r.status == 200, await r.text()
                assert await r.json() == []
    finally:
        await server.stop()
        await gate.close()


async def test_grpc_explain_needs_the_statements_rights(embedded: Gate) -> None:
    """ExplainPlan resolves shards as execution would (it reads lookup vindexes): only
    for a caller who may run the statement."""
    server, port = await serve(embedded, "127.0.0.1", 0, no_auth=False, security=ServerSecurity(
        users=StaticUsers.from_mapping(USERS)))
    try:
        async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="commerce", user="rita",
                              password="rita-pw", timeout=30) as rita:
            with pytest.raises(PermissionDenied, match="'rita'"):
                await rita.explain("SELECT * FROM corder WHERE order_id = 10")
            plan = await rita.explain("SELECT * FROM customer WHERE email = 'a@x.io'")
            assert plan["Instructions"]["Shards"]
    finally:
        await server.stop(None)


# -- the command line: `shardgate up` with --users-file and --acl-file, the mariadb client ---

UP_CLUSTER = """\
default_keyspace: app
keyspaces:
  app:
    shards: {"0": "sqlite:///app.db"}
    vschema: {sharded: false, tables: {t: {}, secret: {}}}
"""
UP_ACL = {"table_groups": [
    {"name": "open", "table_names_or_prefixes": ["t"],
     "readers": ["rita"], "writers": ["walt"], "admins": ["ada"]},
    {"name": "closed", "table_names_or_prefixes": ["secret"],
     "readers": [], "writers": ["walt"], "admins": ["ada"]},
]}


def test_shardgate_up_listener_applies_the_acl_to_the_mariadb_client(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(UP_CLUSTER)
    (tmp_path / "users.json").write_text(json.dumps(USERS))
    (tmp_path / "acl.json").write_text(json.dumps(UP_ACL))
    for sql in ("CREATE TABLE t (id BIGINT PRIMARY KEY)",
                "CREATE TABLE secret (id BIGINT PRIMARY KEY, v VARCHAR(20))",
                "INSERT INTO t (id) VALUES (1)", "INSERT INTO secret (id, v) VALUES (1, 'x')"):
        made = shardgate("sql", "--cluster", "cluster.yaml", sql, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
    port, mysql_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", "up", "--cluster", "cluster.yaml",
         "--port", str(port), "--mysql-port", str(mysql_port), "--http-port", "0",
         "--users-file", "users.json", "--acl-file", "acl.json"],
        cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_port(proc, mysql_port)

        def as_user(user: str, sql: str) -> subprocess.CompletedProcess[str]:
            return mariadb(mysql_port, f"--password={user}-pw", "app", "-e", sql, user=user)

        for user, sql in (("rita", "SELECT v FROM secret"), ("rita", "DESCRIBE secret"),
                          ("rita", "DELETE FROM t"), ("rita", "DROP TABLE t"),
                          ("walt", "DROP TABLE secret"), ("walt", "ALTER TABLE t ADD x INT")):
            done = as_user(user, sql)
            assert done.returncode != 0 and "ERROR 1142" in done.stderr, (user, sql, done)
        shown = as_user("rita", "SHOW TABLES")
        assert shown.returncode == 0 and shown.stdout.split()[1:] == ["t"], shown
        read = as_user("walt", "SELECT v FROM secret")
        assert read.returncode == 0 and read.stdout.split() == ["v", "x"], read
        assert as_user("rita", "SELECT id FROM t").stdout.split() == ["id", "1"]
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
