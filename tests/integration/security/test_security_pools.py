"""Pooled connections and transaction slots under hostile use (issue 30, items 5 and 9).

Item 5: a connection handed back to a shard's pool comes back clean. A session
that changed its connection's state (``SET``, ``set_config``, a transaction
that set something, a targeted session's statement) never leaves it to the
next borrower: on PostgreSQL and MariaDB, at the pool and through the gate.

Item 9: a tablet's transaction slots are a flag (``--transaction-cap``, 20 by
default), and one user's open transactions can be capped
(``--transaction-cap-per-user``): one user's idle transactions no longer
starve another's, over gRPC (in-process tablets and a tablet reached over
gRPC) and the MySQL listener.

Everything runs against the real servers: PostgreSQL 15, MariaDB 10.11, real
gRPC servers and real MySQL clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ServerSecurity
from shardgate.api.grpc.server import serve
from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.api.grpc.tablet_service import serve_tablet
from shardgate.api.mysql import serve_mysql
from shardgate.auth import StaticUsers
from shardgate.auth.identity import TRUSTED, Identity
from shardgate.backends import open_backend
from shardgate.backends.base import Backend
from shardgate.cli.app import build_parser
from shardgate.cli.serve import gate_limits
from shardgate.errors import Code, InvalidArgument, ResourceExhausted, ShardgateError
from shardgate.gate import Gate
from shardgate.gate.limits import GateLimits
from shardgate.tablet import Tablet
from shardgate.topo import Topology

USERS = {
    "alice": [{"Password": "alice-pw"}],
    "bob": [{"Password": "bob-pw"}],
}

SERVERS = [pytest.param("postgres", marks=pytest.mark.postgres),
           pytest.param("mysql", marks=pytest.mark.mysql)]


def _unsharded(url: str) -> Topology:
    return Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": {"0": url}, "vschema": {"sharded": False, "tables": {"t": {}}}}}})


@dataclass
class Served:
    gate: Gate
    target: str
    kind: str

    def client(self, user: str, **kw: Any) -> GateClient:
        return GateClient(self.target, keyspace="app", timeout=30, user=user,
                          password=f"{user}-pw", **kw)


@contextlib.asynccontextmanager
async def _served(kind: str, make_database: Callable[..., str],
                  limits: GateLimits) -> AsyncIterator[Served]:
    url = make_database(kind, "pools")
    gate = Gate.open(_unsharded(url), limits=limits)
    try:
        await gate.execute(gate.session(identity=TRUSTED),
                           "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        security = ServerSecurity(users=StaticUsers.from_mapping(USERS))
        server, port = await serve(gate, "127.0.0.1", 0, security=security, no_auth=False)
        try:
            yield Served(gate, f"grpc://127.0.0.1:{port}", kind)
        finally:
            await server.stop(None)
    finally:
        await gate.close()


async def _hold(client: GateClient, i: int) -> None:
    """Open a transaction on the shard and leave it idle."""
    await client.execute("BEGIN")
    await client.execute("INSERT INTO t (id, v) VALUES (:i, 'held')", {"i": i})


# -- item 9: transaction slots --------------------------------------------------------------


@pytest.mark.parametrize("kind", SERVERS)
async def test_idle_transactions_of_one_user_do_not_block_another(
    kind: str, make_database: Callable[..., str]
) -> None:
    # Default caps; a short pool timeout so a starved transaction fails fast.
    async with _served(kind, make_database, GateLimits(pool_timeout_s=1.0)) as served:
        tablet = served.gate.tablets[("app", "0")].tablet  # type: ignore[attr-defined]
        assert tablet.max_transactions == 20 and tablet.user_cap is None
        held = [served.client("alice") for _ in range(3)]
        try:
            for i, c in enumerate(held):
                await _hold(c, i)
            async with served.client("bob") as bob:
                began = time.monotonic()
                await bob.execute("BEGIN")
                await bob.execute("INSERT INTO t (id, v) VALUES (100, 'bob')")
                await bob.execute("COMMIT")
                assert time.monotonic() - began < 1.0
                assert (await bob.execute("SELECT v FROM t WHERE id = 100")).rows == [("bob",)]
        finally:
            for c in held:
                await c.close()


@pytest.mark.parametrize("kind", SERVERS)
async def test_per_user_cap_refuses_the_next_transaction_of_that_user_only(
    kind: str, make_database: Callable[..., str]
) -> None:
    limits = GateLimits(pool_timeout_s=5.0, transaction_cap=4, transaction_cap_per_user=0.5)
    async with _served(kind, make_database, limits) as served:
        tablet = served.gate.tablets[("app", "0")].tablet  # type: ignore[attr-defined]
        assert (tablet.max_transactions, tablet.user_cap) == (4, 2)
        held = [served.client("alice") for _ in range(3)]
        try:
            await _hold(held[0], 1)
            await _hold(held[1], 2)
            began = time.monotonic()
            with pytest.raises(ResourceExhausted) as info:
                await _hold(held[2], 3)
            assert time.monotonic() - began < 2.0  # refused at once, not after a wait
            message = info.value.message
            assert "'alice'" in message and "--transaction-cap-per-user" in message, message
            assert info.value.code is Code.RESOURCE_EXHAUSTED
            async with served.client("bob") as bob:  # bob still gets through
                await bob.execute("BEGIN")
                await bob.execute("INSERT INTO t (id, v) VALUES (100, 'bob')")
                await bob.execute("COMMIT")
            await held[0].execute("COMMIT")  # a slot of alice's comes back
            await held[2].execute("ROLLBACK")
            await _hold(held[2], 3)
            await held[2].execute("COMMIT")
            await held[1].execute("ROLLBACK")
            assert tablet._user_open == {}  # every count given back
        finally:
            for c in held:
                await c.close()


@pytest.mark.postgres
async def test_a_tablet_reached_over_grpc_caps_the_caller_the_gate_names(
    make_database: Callable[..., str]
) -> None:
    url = make_database("postgres", "remote_cap")
    tablet = Tablet.open("app", "0", url, transaction_cap=3, transaction_cap_per_user=1)
    server, port = await serve_tablet(tablet)
    client = await GrpcTabletClient.connect(f"127.0.0.1:{port}")
    try:
        first = await client.begin("alice")
        with pytest.raises(ResourceExhausted) as info:
            await client.begin("alice")
        assert "--transaction-cap-per-user 1" in info.value.message
        other = await client.begin("bob")
        own = await client.begin()  # the gate's own work counts against no user
        for tid in (first, other, own):
            await client.rollback(tid)
        await client.rollback(await client.begin("alice"))
        assert tablet._user_open == {}
    finally:
        await client.close()
        await server.stop(None)
        await tablet.close()


@pytest.mark.postgres
async def test_transaction_cap_flags(make_database: Callable[..., str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["tablet", "--topo", "x", "--keyspace", "app", "--shard", "0"])
    assert (args.transaction_cap, args.transaction_cap_per_user) == (20, 0.0)
    args = parser.parse_args(["up", "--transaction-cap", "7", "--transaction-cap-per-user", "3"])
    limits = gate_limits(args)
    assert (limits.transaction_cap, limits.transaction_cap_per_user) == (7, 3)
    url = make_database("postgres", "flags")
    gate = Gate.open(_unsharded(url), limits=limits)
    try:
        tablet = gate.tablets[("app", "0")].tablet  # type: ignore[attr-defined]
        assert (tablet.max_transactions, tablet.user_cap) == (7, 3)
        assert tablet.backend.pool_size > 7  # connections stay for autocommit statements
    finally:
        await gate.close()


@pytest.mark.parametrize("cap, share", [(0, 0.0), (4, 1.5), (4, -1.0)])
def test_bad_transaction_caps_are_refused(cap: int, share: float) -> None:
    with pytest.raises(InvalidArgument, match="--transaction-cap"):
        GateLimits(transaction_cap=cap, transaction_cap_per_user=share)


def _mysql(port: int, user: str, *, autocommit: bool) -> Any:
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=f"{user}-pw",
                           database="app", autocommit=autocommit, connect_timeout=10,
                           read_timeout=30)


@pytest.mark.parametrize("kind", SERVERS)
async def test_mysql_clients_holding_transactions_do_not_starve_other_users(
    kind: str, make_database: Callable[..., str]
) -> None:
    # 12 clients with autocommit off each hold a transaction (a SELECT opens it); with
    # a pool of 4 (3 transaction slots) the others' selects waited out the pool timeout.
    async with _served(kind, make_database, GateLimits(pool_timeout_s=1.0)) as served:
        listener, port = await serve_mysql(served.gate, "127.0.0.1", 0,
                                           users=StaticUsers.from_mapping(USERS))
        idle: list[Any] = []
        try:
            def hold() -> None:
                for _ in range(12):
                    c = _mysql(port, "alice", autocommit=False)
                    idle.append(c)
                    with c.cursor() as cur:
                        cur.execute("SELECT count(*) FROM t")
                        assert cur.fetchone() == (0,)

            await asyncio.to_thread(hold)

            def others() -> int:
                done = 0
                for i in range(20):
                    c = _mysql(port, "bob", autocommit=i % 2 == 0)
                    try:
                        with c.cursor() as cur:
                            cur.execute("SELECT count(*) FROM t")
                            assert cur.fetchone() == (0,)
                            c.commit()
                            done += 1
                    finally:
                        c.close()
                return done

            began = time.monotonic()
            assert await asyncio.to_thread(others) == 20
            assert time.monotonic() - began < 10.0
        finally:
            for c in idle:
                with contextlib.suppress(Exception):
                    c.close()
            await listener.stop()


@pytest.mark.parametrize("kind", SERVERS)
async def test_mysql_clients_of_one_user_are_capped(
    kind: str, make_database: Callable[..., str]
) -> None:
    limits = GateLimits(pool_timeout_s=5.0, transaction_cap=6, transaction_cap_per_user=2)
    async with _served(kind, make_database, limits) as served:
        listener, port = await serve_mysql(served.gate, "127.0.0.1", 0,
                                           users=StaticUsers.from_mapping(USERS))
        idle: list[Any] = []
        try:
            def run() -> tuple[int, list[str]]:
                refused: list[str] = []
                for _ in range(4):
                    c = _mysql(port, "alice", autocommit=False)
                    idle.append(c)
                    try:
                        with c.cursor() as cur:
                            cur.execute("SELECT count(*) FROM t")
                    except pymysql.err.MySQLError as exc:
                        refused.append(str(exc))
                done = 0
                for _ in range(2):  # bob's own cap is 2 as well
                    c = _mysql(port, "bob", autocommit=False)
                    idle.append(c)
                    with c.cursor() as cur:
                        cur.execute("SELECT count(*) FROM t")
                        done += 1
                return done, refused

            done, refused = await asyncio.to_thread(run)
            assert done == 2
            assert len(refused) == 2, refused
            assert all("--transaction-cap-per-user" in r for r in refused), refused
        finally:
            for c in idle:
                with contextlib.suppress(Exception):
                    c.close()
            await listener.stop()


# -- item 5: pooled connections come back clean ---------------------------------------------

POISON = {
    "postgres": [
        "SET default_transaction_read_only = on",
        "SELECT set_config('default_transaction_read_only', 'on', false)",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    ],
    "mysql": [
        "SET SESSION tx_read_only = 1",
        "SET @@session.sql_mode = 'NO_ENGINE_SUBSTITUTION,STRICT_ALL_TABLES,ANSI_QUOTES'",
        "SET SESSION TRANSACTION READ ONLY",
    ],
}


async def _borrow(backend: Backend, n: int) -> list[Any]:
    conns = [await backend.acquire() for _ in range(n)]
    return conns


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_poisoned_pooled_connection_comes_back_clean(
    kind: str, make_database: Callable[..., str]
) -> None:
    url = make_database(kind, "poison")
    backend = open_backend(url, pool_size=2)
    try:
        conn = await backend.acquire()
        await conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        await backend.release(conn)
        for i, poison in enumerate(POISON[kind]):
            conn = await backend.acquire()
            await conn.execute(poison)
            await backend.release(conn)
            # the next borrower gets the same connection (last in, first out), clean
            again = await backend.acquire()
            assert again is conn
            await again.execute("INSERT INTO t (id, v) VALUES (%s, 'x')", [i])
            await backend.release(again)
        # inside a transaction too: a session setting changed within it outlives it
        conn = await backend.acquire()
        await conn.begin()
        await conn.execute(POISON[kind][0])
        await conn.commit()
        await backend.release(conn)
        again = await backend.acquire()
        await again.execute("INSERT INTO t (id, v) VALUES (%s, 'x')", [100])
        await backend.release(again)
        # autocommit statements (MariaDB: the query pool) too
        for i, poison in enumerate(POISON[kind]):
            await backend.execute(poison)
            await backend.execute("INSERT INTO t (id, v) VALUES (%s, 'x')", [200 + i])
        count = await backend.execute("SELECT count(*) FROM t")
        assert count.rows == [(len(POISON[kind]) * 2 + 1,)]
    finally:
        await backend.close()


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_plain_statement_keeps_its_connection_without_a_reset(
    kind: str, make_database: Callable[..., str]
) -> None:
    """The reset is paid only after what may have changed the session."""
    url = make_database(kind, "plain")
    backend = open_backend(url, pool_size=1)
    try:
        conn = await backend.acquire()
        await conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        await backend.release(conn)
        conn = await backend.acquire()
        session = await conn.execute(_SESSION_ID[kind])
        await conn.execute("INSERT INTO t (id, v) VALUES (%s, %s)", [1, "a"])
        await conn.execute("SELECT v FROM t WHERE id = %s", [1])
        await backend.release(conn)
        conn = await backend.acquire()
        assert (await conn.execute(_SESSION_ID[kind])).rows == session.rows
        await conn.execute("SET @x = 1" if kind == "mysql" else "SET work_mem = '8MB'")
        await backend.release(conn)
        conn = await backend.acquire()
        probe = "SELECT @x" if kind == "mysql" else "SHOW work_mem"
        assert (await conn.execute(probe)).rows != [(1,)] and \
            (await conn.execute(probe)).rows != [("8MB",)]
        await backend.release(conn)
    finally:
        await backend.close()


_SESSION_ID = {"postgres": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


#: what the statement rules still let an admin's targeted session send that changes
#: its connection: a temporary table named like a real one hides it in that
#: connection, and this one refuses every row
SHADOW = ("CREATE TEMPORARY TABLE t (id BIGINT PRIMARY KEY, "
          "v VARCHAR(8) CHECK (v = 'nobody'))")


@pytest.mark.parametrize("kind", SERVERS)
async def test_one_users_session_state_never_reaches_another_users_inserts(
    kind: str, make_database: Callable[..., str]
) -> None:
    """The issue's attack, through the gate: an admin's targeted session changes its
    pooled connection (whatever the statement rules let through: a temporary table
    shadowing ``t``; settings, in and out of a transaction, if they pass); another
    user's 30 INSERTs through the same shard all succeed and land in ``t``."""
    async with _served(kind, make_database, GateLimits()) as served:
        gate = served.gate
        poisoner = gate.session("app", identity=Identity("admin"))
        await gate.execute(poisoner, "USE `app:0`")
        writer = served.client("bob")
        try:
            for i in range(30):
                await gate.execute(poisoner, SHADOW)  # passes the rules: a targeted DDL
                for poison in POISON[kind]:
                    with contextlib.suppress(ShardgateError):  # refused by the rules today
                        await gate.execute(poisoner, poison)
                with contextlib.suppress(ShardgateError):
                    await gate.execute(poisoner, "BEGIN")
                    await gate.execute(poisoner, POISON[kind][0])
                    await gate.execute(poisoner, "COMMIT")
                with contextlib.suppress(ShardgateError):
                    await gate.execute(poisoner, "ROLLBACK")
                await writer.execute("INSERT INTO t (id, v) VALUES (:i, 'bob')", {"i": i})
        finally:
            await writer.close()
        # every row is in the real table (read on a connection of its own)
        backend = open_backend(gate.topology.keyspace("app").shards[0].url, pool_size=1)
        try:
            assert (await backend.execute("SELECT count(*) FROM t")).rows == [(30,)]
        finally:
            await backend.close()
