"""Security over real gRPC servers and real shards (issue 16, items 1-4 and 8).

Authentication (users file, client certificates) on the gate and tablet
services, TLS (wrong CA, certificate reload), table ACLs (readers cannot
write, writers cannot run DDL, the gate's own tables, dry run), the
deny-list on SQLite, PostgreSQL and MariaDB shards (also after
``USE `ks:shard```), sessions bound to their caller, and listen-address rules.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ClientSecurity, ServerSecurity, TLSFiles
from shardgate.api.grpc.server import serve
from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.api.grpc.tablet_service import serve_tablet
from shardgate.auth import StaticUsers
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import DENIALS, Guard
from shardgate.auth.identity import TRUSTED
from shardgate.errors import (
    Code,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ShardgateError,
    Unauthenticated,
    Unavailable,
)
from shardgate.gate import Gate
from shardgate.tablet import Tablet
from shardgate.topo.embedded import embedded_topology

from ..conftest import open_cluster
from ..doors.test_grpc import set_up_embedded

REPO = Path(__file__).resolve().parents[3]
USERS = {
    "alice": [{"Password": "alice-pw", "UserData": "writers"}],
    "bob": [{"Password": "bob-pw"}],
    "dba": [{"Password": "dba-pw"}],
    "gate": [{"Password": "gate-secret"}],
}
ACL = {"table_groups": [
    {"name": "commerce", "table_names_or_prefixes": ["customer", "corder"],
     "readers": ["bob"], "writers": ["alice"], "admins": ["dba"]},
    {"name": "the rest", "table_names_or_prefixes": ["%"],
     "readers": ["%"], "writers": ["alice"], "admins": ["dba"]},
]}


def make_ca(directory: Path, *clients: str) -> Path:
    subprocess.run([str(REPO / "scripts" / "make-test-ca.sh"), str(directory), *clients],
                   check=True, capture_output=True, timeout=60)
    return directory


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ca(tmp_path_factory.mktemp("ca"), "alice", "gate")


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ca(tmp_path_factory.mktemp("other-ca"), "alice")


@dataclass
class Served:
    gate: Gate
    target: str
    port: int


@pytest.fixture
async def embedded_gate(tmp_path: Path) -> AsyncIterator[Gate]:
    gate = Gate.open(embedded_topology(tmp_path / "data"))
    try:
        await set_up_embedded(gate)
        yield gate
    finally:
        await gate.close()


@pytest.fixture
async def secured(embedded_gate: Gate) -> AsyncIterator[Served]:
    """The embedded cluster behind a gate with a users file and the ACL above."""
    embedded_gate.guard = Guard(TableACL.from_mapping(ACL))
    security = ServerSecurity(users=StaticUsers.from_mapping(USERS))
    server, port = await serve(embedded_gate, "127.0.0.1", 0, security=security, no_auth=False)
    try:
        yield Served(embedded_gate, f"grpc://127.0.0.1:{port}", port)
    finally:
        await server.stop(None)


def client(served: Served, user: str | None, password: str | None = None, **kw: Any) -> GateClient:
    return GateClient(served.target, keyspace="commerce", timeout=30, user=user,
                      password=password if password is not None else f"{user}-pw", **kw)


# -- authentication -------------------------------------------------------------------------


async def test_gate_refuses_unauthenticated_calls(secured: Served) -> None:
    async with GateClient(secured.target, timeout=30) as anonymous:
        with pytest.raises(Unauthenticated) as info:
            await anonymous.execute("SELECT 1 FROM customer")
        assert info.value.code is Code.UNAUTHENTICATED
        with pytest.raises(Unauthenticated):
            await anonymous.vschema()
    for _ in range(40):  # a fresh session stream each time: its first write races the refusal
        async with client(secured, "alice", "wrong") as wrong:
            with pytest.raises(Unauthenticated):
                await wrong.execute("SELECT 1 FROM customer")
    async with client(secured, "mallory", "x") as unknown:
        with pytest.raises(Unauthenticated) as info:
            await unknown.execute("SELECT 1 FROM customer")
        assert "x" not in info.value.message.split("'mallory'")[1]
    async with client(secured, "alice") as alice:
        assert (await alice.execute("SELECT count(*) FROM customer")).rows == [(0,)]


async def test_users_file_rotation_and_reload(embedded_gate: Gate, tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"alice": [{"Password": "old"}]}))
    users = StaticUsers.load(path, poll_s=0.0)
    server, port = await serve(embedded_gate, "127.0.0.1", 0,
                               security=ServerSecurity(users=users), no_auth=False)
    target = f"grpc://127.0.0.1:{port}"
    try:
        path.write_text(json.dumps({"alice": [{"Password": "old"}, {"Password": "new"}]}))
        users.reload()
        for pw in ("old", "new"):
            async with GateClient(target, user="alice", password=pw, timeout=30) as c:
                await c.execute("SELECT 1 FROM customer")
        path.write_text(json.dumps({"alice": [{"Password": "new"}]}))
        users.reload()
        async with GateClient(target, user="alice", password="old", timeout=30) as c:
            with pytest.raises(Unauthenticated):
                await c.execute("SELECT 1 FROM customer")
    finally:
        await server.stop(None)


async def test_tablet_accepts_only_gates(tmp_path: Path) -> None:
    tablet = Tablet.open("app", "0", f"sqlite:///{tmp_path / 'app.db'}")
    security = ServerSecurity(users=StaticUsers.from_mapping(USERS),
                              allowed_users=frozenset({"gate"}))
    server, port = await serve_tablet(tablet, "127.0.0.1", 0, security=security, no_auth=False)
    target = f"grpc://127.0.0.1:{port}"
    try:
        with pytest.raises(Unauthenticated):
            await GrpcTabletClient.connect(target)
        # a real user of the file, but not a gate
        with pytest.raises(Unauthenticated) as info:
            await GrpcTabletClient.connect(
                target, security=ClientSecurity(user="alice", password="alice-pw"))
        assert "may not call" in info.value.message
        gate_client = await GrpcTabletClient.connect(
            target, security=ClientSecurity(user="gate", password="gate-secret"))
        try:
            assert (await gate_client.execute("SELECT 1", [])).rows == [(1,)]
        finally:
            await gate_client.close()
        # a raw Execute without credentials reaches nothing
        probe = GrpcTabletClient(target, "app", "0", "sqlite", "?")
        try:
            with pytest.raises(Unauthenticated):
                await probe.execute("SELECT 1", [])
        finally:
            await probe.close()
    finally:
        await server.stop(None)
        await tablet.close()


# -- TLS ------------------------------------------------------------------------------------


async def test_tls_and_mtls(embedded_gate: Gate, ca: Path, other_ca: Path) -> None:
    embedded_gate.guard = Guard(TableACL.from_mapping(ACL))
    security = ServerSecurity(
        users=StaticUsers.from_mapping(USERS),
        tls=TLSFiles(ca / "server.pem", ca / "server.key", ca / "ca.pem"))
    server, port = await serve(embedded_gate, "127.0.0.1", 0, security=security, no_auth=False)
    target = f"grpcs://127.0.0.1:{port}"
    mine = ClientSecurity(tls_ca=ca / "ca.pem", tls_cert=ca / "alice.pem",
                          tls_key=ca / "alice.key")
    try:
        # mTLS: the certificate's common name is the caller; alice may write
        async with GateClient(target, keyspace="commerce", security=mine, timeout=30) as c:
            await c.execute("INSERT INTO corder (customer_id, sku, price) "
                            "VALUES (1, 's1', 1)")
        # a password overrides the certificate's name: bob may only read
        async with GateClient(target, keyspace="commerce", security=mine, user="bob",
                              password="bob-pw", timeout=30) as c:
            assert (await c.execute("SELECT sku FROM corder")).rows == [("s1",)]
            with pytest.raises(PermissionDenied):
                await c.execute("DELETE FROM corder")
        # the client trusts another CA: the handshake fails
        wrong_ca = ClientSecurity(tls_ca=other_ca / "ca.pem", tls_cert=ca / "alice.pem",
                                  tls_key=ca / "alice.key")
        async with GateClient(target, security=wrong_ca, user="alice", password="alice-pw",
                              timeout=10) as c:
            with pytest.raises(Unavailable) as info:
                await c.execute("SELECT 1 FROM corder")
            assert "TLS handshake" in info.value.message
        # no client certificate, or one from another CA: refused even with a password
        for sec in (ClientSecurity(tls_ca=ca / "ca.pem"),
                    ClientSecurity(tls_ca=ca / "ca.pem", tls_cert=other_ca / "alice.pem",
                                   tls_key=other_ca / "alice.key")):
            async with GateClient(target, security=sec, user="alice", password="alice-pw",
                                  timeout=10) as c:
                with pytest.raises(Unavailable):
                    await c.execute("SELECT 1 FROM corder")
        # plaintext to a TLS port
        async with GateClient(f"grpc://127.0.0.1:{port}", user="alice", password="alice-pw",
                              timeout=10) as c:
            with pytest.raises(Unavailable):
                await c.execute("SELECT 1 FROM corder")
    finally:
        await server.stop(None)


async def test_certificate_reload_without_restart(
    embedded_gate: Gate, tmp_path: Path, ca: Path, other_ca: Path
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    for name in ("server.pem", "server.key"):
        shutil.copy(ca / name, live / name)
    security = ServerSecurity(users=StaticUsers.from_mapping(USERS),
                              tls=TLSFiles(live / "server.pem", live / "server.key"))
    server, port = await serve(embedded_gate, "127.0.0.1", 0, security=security, no_auth=False)
    target = f"grpcs://127.0.0.1:{port}"

    async def works(ca_dir: Path) -> bool:
        sec = ClientSecurity(tls_ca=ca_dir / "ca.pem")
        async with GateClient(target, security=sec, user="alice", password="alice-pw",
                              timeout=10) as c:
            try:
                await c.execute("SELECT 1 FROM corder")
                return True
            except Unavailable:
                return False

    try:
        assert await works(ca)
        assert not await works(other_ca)
        # rotate: the files change under the running server
        shutil.copy(other_ca / "server.key", live / "server.key")
        shutil.copy(other_ca / "server.pem", live / "server.pem")
        deadline = time.monotonic() + 20
        while not await works(other_ca):
            assert time.monotonic() < deadline, "the new certificate was never served"
            await asyncio.sleep(0.2)
        assert not await works(ca)
    finally:
        await server.stop(None)


# -- ACLs -----------------------------------------------------------------------------------


async def test_reader_cannot_write_and_writer_cannot_ddl(secured: Served) -> None:
    async with client(secured, "bob") as bob, client(secured, "alice") as alice, \
            client(secured, "dba") as dba:
        await alice.execute("INSERT INTO corder (customer_id, sku, price) VALUES (1, 'a', 1)")
        assert (await bob.execute("SELECT sku FROM corder")).rows == [("a",)]
        for sql in ("INSERT INTO corder (customer_id, sku, price) VALUES (1, 'b', 1)",
                    "UPDATE corder SET price = 2 WHERE sku = 'a'",
                    "DELETE FROM corder WHERE sku = 'a'"):
            with pytest.raises(PermissionDenied) as info:
                await bob.execute(sql)
            assert info.value.code is Code.PERMISSION_DENIED
            assert "'bob' needs the writer role on table commerce.corder" in info.value.message
            assert "table group 'commerce'" in info.value.message
        for sql in ("CREATE TABLE extra (id BIGINT PRIMARY KEY)", "DROP TABLE corder",
                    "ALTER TABLE corder ADD COLUMN x INT", "TRUNCATE TABLE corder",
                    "CREATE QUEUE jobs (user_id BIGINT NOT NULL) SHARD BY user_id"):
            with pytest.raises(PermissionDenied) as info:
                await alice.execute(sql)
            assert "needs the admin role" in info.value.message
        # reading a table in a subquery needs only reader; the written one writer
        with pytest.raises(PermissionDenied):
            await bob.execute("DELETE FROM corder WHERE sku IN (SELECT sku FROM corder)")
        await dba.execute("CREATE TABLE extra (id BIGINT PRIMARY KEY)")
        assert (await bob.execute("SELECT sku FROM corder")).rows == [("a",)]
        # a session targeted at one shard is checked the same way
        await bob.execute("USE `commerce:-40`")
        await bob.execute("SELECT sku FROM corder")
        with pytest.raises(PermissionDenied):
            await bob.execute("DELETE FROM corder")
        await alice.execute("USE `commerce:-40`")
        with pytest.raises(PermissionDenied):
            await alice.execute("DROP TABLE corder")


async def test_gate_tables_are_written_by_the_gate_only(secured: Served) -> None:
    async with client(secured, "alice") as alice, client(secured, "dba") as dba:
        # writing a customer writes its lookup row and draws a sequence value: allowed
        await alice.execute("INSERT INTO customer (email, name) VALUES ('a@x', 'A')")
        for sql in ("UPDATE lookup.customer_seq SET next_id = 1",
                    "DELETE FROM lookup.customer_email_idx",
                    "INSERT INTO lookup.customer_email_idx (email, keyspace_id) "
                    "VALUES ('z@x', 'x')"):
            with pytest.raises(PermissionDenied) as info:
                await alice.execute(sql)
            assert "the gate maintains this table itself" in info.value.message
        # reading them is the "rest" group's business: everyone reads
        assert (await alice.execute("SELECT count(*) FROM lookup.customer_email_idx")
                ).rows == [(1,)]
        assert (await dba.execute("UPDATE lookup.customer_seq SET cache = 1000 WHERE id = 0")
                ).rows_affected == 1


async def test_acl_dry_run_counts_instead_of_denying(secured: Served) -> None:
    secured.gate.guard = Guard(TableACL.from_mapping(ACL), dry_run=True)
    before = DENIALS.labels("writer", "true")._value.get()
    async with client(secured, "bob") as bob:
        await bob.execute("INSERT INTO corder (customer_id, sku, price) VALUES (1, 'b', 1)")
    assert DENIALS.labels("writer", "true")._value.get() == before + 1


async def test_acl_file_reload(secured: Served, tmp_path: Path) -> None:
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(ACL))
    acl = TableACL.load(path, poll_s=0.0)
    secured.gate.guard = Guard(acl)
    async with client(secured, "bob") as bob:
        with pytest.raises(PermissionDenied):
            await bob.execute("DELETE FROM corder")
        doc = json.loads(json.dumps(ACL))
        doc["table_groups"][0]["writers"].append("bob")
        path.write_text(json.dumps(doc))
        acl.reload()
        await bob.execute("DELETE FROM corder")
        path.write_text("{not json")  # a broken edit keeps the last good ACL
        acl.reload()
        await bob.execute("DELETE FROM corder")


async def test_session_ids_are_bound_to_their_caller(secured: Served) -> None:
    async with client(secured, "alice") as alice, client(secured, "bob") as bob:
        await alice.execute("BEGIN")
        await alice.execute("INSERT INTO corder (customer_id, sku, price) VALUES (1, 'x', 1)")
        bob.session_id = alice.session_id
        with pytest.raises(NotFound):
            await bob.execute("SELECT sku FROM corder")
        with pytest.raises(NotFound):
            await bob.execute("COMMIT")
        await alice.execute("ROLLBACK")


# -- the deny-list on every database kind ------------------------------------------------------

DENIED = [
    "SELECT pg_read_file('/etc/hostname')",
    "SELECT pg_read_binary_file('/etc/hostname')",
    "SELECT * FROM pg_ls_dir('.')",
    "SELECT pg_stat_file('postgresql.conf')",
    "SELECT lo_import('/etc/hostname')",
    "SELECT lo_export(1, '{tmp}/lo.out')",
    "SELECT dblink_connect('dbname=postgres')",
    "SELECT * FROM dblink('dbname=postgres', 'select 1') AS t(a int)",
    "COPY customer TO PROGRAM 'touch {tmp}/program.out'",
    "COPY customer FROM '/etc/hostname'",
    "COPY customer TO '{tmp}/copy.out'",
    "SELECT LOAD_FILE('/etc/hostname')",
    "SELECT * FROM customer INTO OUTFILE '{tmp}/outfile.out'",
    "SELECT name FROM customer INTO DUMPFILE '{tmp}/dumpfile.out'",
    "LOAD DATA INFILE '/etc/hostname' INTO TABLE customer",
    "LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE customer",
    "ATTACH DATABASE '{tmp}/attached.db' AS other",
    "VACUUM INTO '{tmp}/vacuum.db'",
    "SELECT load_extension('{tmp}/nothing')",
    "SELECT readfile('/etc/hostname')",
    "CREATE EXTENSION IF NOT EXISTS dblink",
    "PRAGMA writable_schema = 1",
    "SELECT * FROM customer WHERE name = (SELECT pg_read_file('/etc/hostname'))",
    "INSERT INTO customer (customer_id, email, name) SELECT 1, 'x', LOAD_FILE('/etc/hostname')",
]


@pytest.fixture
async def any_backend_cluster(
    backend_kind: str, make_database: Callable[..., str]
) -> AsyncIterator[Gate]:
    c = await open_cluster(backend_kind, lambda kind, hint="": make_database(kind, "sec_" + hint),
                           shards=2)
    try:
        yield c.gate
    finally:
        await c.gate.close()


async def test_deny_list_on_every_backend(
    any_backend_cluster: Gate, tmp_path: Path, ca: Path
) -> None:
    gate = any_backend_cluster
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the database servers' users could write here, if asked
    server, port = await serve(gate, "127.0.0.1", 0, security=ServerSecurity(
        users=StaticUsers.from_mapping(USERS)), no_auth=False)
    try:
        async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="commerce", user="dba",
                              password="dba-pw", timeout=30) as plain, \
                GateClient(f"grpc://127.0.0.1:{port}", keyspace="commerce", user="dba",
                           password="dba-pw", timeout=30) as targeted:
            await targeted.execute("USE `commerce:-80`")
            for template in DENIED:
                sql = template.format(tmp=out)
                for session in (plain, targeted):
                    with pytest.raises(ShardgateError) as info:
                        await session.execute(sql)
                    assert info.value.code is Code.PERMISSION_DENIED, (sql, info.value)
                    assert "deny-list" in info.value.message, (sql, info.value)
            # the sessions still work, and nothing reached the file system
            assert (await targeted.execute("SELECT count(*) FROM customer")).rows == [(0,)]
            assert (await plain.execute("SELECT count(*) FROM customer")).rows == [(0,)]
        assert sorted(p.name for p in out.iterdir()) == []
    finally:
        await server.stop(None)


async def test_unparseable_targeted_statement_is_refused(any_backend_cluster: Gate) -> None:
    gate = any_backend_cluster
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, "USE `commerce:80-`")
    for sql in ("SET GLOBAL general_log = 1", "KILL 1", "ANALYZE customer",
                "GRANT ALL ON customer TO bob", "LOCK TABLES customer WRITE"):
        with pytest.raises(ShardgateError) as info:
            await gate.execute(s, sql)
        assert info.value.code in (Code.PERMISSION_DENIED, Code.INVALID_ARGUMENT), sql


# -- where a server may listen --------------------------------------------------------------


async def test_non_loopback_bind_needs_tls_and_auth(embedded_gate: Gate, ca: Path) -> None:
    users = StaticUsers.from_mapping(USERS)
    for security, no_auth in ((None, True), (ServerSecurity(users=users), False),
                              (ServerSecurity(tls=TLSFiles(ca / "server.pem",
                                                           ca / "server.key")), True)):
        with pytest.raises(FailedPrecondition) as info:
            await serve(embedded_gate, "0.0.0.0", 0, security=security, no_auth=no_auth)
        assert "refusing to listen on 0.0.0.0" in info.value.message
    # no authentication on loopback needs to be asked for
    with pytest.raises(FailedPrecondition):
        await serve(embedded_gate, "127.0.0.1", 0, no_auth=False)
    tablet = Tablet.open("app", "0", "sqlite:///:memory:")
    try:
        with pytest.raises(FailedPrecondition):
            await serve_tablet(tablet, "0.0.0.0", 0)
    finally:
        await tablet.close()
    # TLS and a users file: fine anywhere
    server, _ = await serve(embedded_gate, "0.0.0.0", 0, security=ServerSecurity(
        users=users, tls=TLSFiles(ca / "server.pem", ca / "server.key")), no_auth=False)
    await server.stop(None)


@pytest.fixture
def users_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "users.json"
    path.write_text(json.dumps(USERS))
    yield path


async def test_streams_and_queues_need_roles_on_their_tables(secured: Served) -> None:
    doc = json.loads(json.dumps(ACL))
    doc["table_groups"][1]["readers"] = ["dba"]  # the lookup keyspace: only dba reads it
    secured.gate.guard = Guard(TableACL.from_mapping(doc))
    async with client(secured, "bob") as bob:
        with pytest.raises(PermissionDenied) as info:
            async for _ in bob.update_stream("lookup", heartbeat_s=0.2):
                break
        assert "needs the reader role on table lookup." in info.value.message
        with pytest.raises(PermissionDenied):
            await bob.queue_stats("jobs", keyspace="lookup")
        with pytest.raises(PermissionDenied) as info:
            async for _ in bob.receive("corder", keyspace="commerce"):
                break
        assert "writer role on table commerce.corder" in info.value.message
    async with client(secured, "dba") as dba:
        async for event in dba.update_stream("lookup", heartbeat_s=0.2):
            assert event is not None
            break
