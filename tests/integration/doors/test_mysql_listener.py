"""The MySQL listener with real MySQL clients, over SQLite, PostgreSQL and MariaDB shards.

The listener runs in the test's event loop; the blocking clients (PyMySQL,
mysqlclient, mysql-connector, SQLAlchemy, pandas) run in a worker thread
(``asyncio.to_thread``) so the loop keeps serving them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import ipaddress
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import mysql.connector
import MySQLdb
import pandas as pd
import pymysql
import pytest
import sqlalchemy as sa
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from shardgate.api.mysql import MysqlListener, TlsConfig, serve_mysql
from shardgate.auth.users import StaticUsers
from shardgate.errors import FailedPrecondition
from tests.acceptance.test_cli_mysql import SCRIPT, mariadb
from tests.integration.conftest import Cluster

T = TypeVar("T")


async def run(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread (a blocking client), the loop serving meanwhile."""
    return await asyncio.wait_for(asyncio.to_thread(fn), timeout=120)


@pytest.fixture
async def mysql_port(cluster: Cluster) -> AsyncIterator[int]:
    listener, port = await serve_mysql(cluster.gate, "127.0.0.1", 0)
    try:
        yield port
    finally:
        await _stop(listener)


async def _stop(listener: MysqlListener) -> None:
    await listener.stop()


def connect(port: int, database: str | None = "commerce", **kwargs: Any) -> Any:
    return pymysql.connect(host="127.0.0.1", port=port, user="app", database=database,
                           autocommit=True, **kwargs)


def _errno(exc: pytest.ExceptionInfo[Exception]) -> int:
    return int(exc.value.args[0])


def _sqlstate(exc: pytest.ExceptionInfo[Exception]) -> str:
    return str(getattr(exc.value, "sqlstate", ""))


# -- PyMySQL: statements, targeting, transactions ------------------------------------------


async def test_pymysql_reads_writes_and_counts(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        conn = connect(mysql_port)
        cur = conn.cursor()
        assert cur.execute("INSERT INTO customer (email, name) VALUES (%s, %s), (%s, %s)",
                           ("a@x.io", "Ada", "b@x.io", "Bob")) == 2
        first = cur.lastrowid
        assert first and first > 0
        cur.execute("SELECT customer_id, email FROM customer ORDER BY customer_id")
        rows = cur.fetchall()
        assert [r[1] for r in rows] == ["a@x.io", "b@x.io"] and rows[0][0] == first
        cur.execute("SELECT name FROM customer WHERE email = %s", ("b@x.io",))
        assert cur.fetchall() == (("Bob",),)
        assert cur.execute("UPDATE customer SET name = 'Robert' WHERE email = 'b@x.io'") == 1
        assert cur.execute("DELETE FROM customer WHERE name = 'nobody'") == 0
        cur.execute("SELECT @@version, DATABASE(), @@autocommit")
        version, db, autocommit = cur.fetchone()
        assert version.startswith("8.0") and db == "commerce" and autocommit == 1
        cur.execute("SELECT LAST_INSERT_ID()")
        assert cur.fetchone() == (first,)
        conn.close()

    await run(client)


async def test_use_targets_a_shard_or_a_keyspace_id(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        conn = connect(mysql_port)
        cur = conn.cursor()
        for i in range(20):
            cur.execute("INSERT INTO customer (email, name) VALUES (%s, 'n')", (f"{i}@x.io",))
        cur.execute("SELECT COUNT(*) FROM customer")
        assert cur.fetchone() == (20,)
        per_shard = 0
        for shard in ("-40", "40-80", "80-c0", "c0-"):
            cur.execute(f"USE `commerce:{shard}`")
            cur.execute("SELECT COUNT(*) FROM customer")
            per_shard += cur.fetchone()[0]
        assert per_shard == 20
        cur.execute("USE `commerce[80]`")  # the shard owning keyspace id 0x80
        cur.execute("SELECT DATABASE()")
        assert cur.fetchone() == ("commerce:80-c0",)
        conn.select_db("lookup")  # COM_INIT_DB
        cur.execute("SELECT COUNT(*) FROM customer_email_idx")
        assert cur.fetchone() == (20,)
        with pytest.raises(pymysql.err.MySQLError) as err:
            cur.execute("USE nowhere")
        assert _errno(err) == 1049
        conn.close()
        with pytest.raises(pymysql.err.MySQLError) as err:
            connect(mysql_port, database="nowhere")
        assert _errno(err) == 1049

    await run(client)


async def test_transactions_autocommit_and_savepoints(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        conn = connect(mysql_port)
        other = connect(mysql_port)
        cur, seen = conn.cursor(), other.cursor()

        def count() -> int:
            seen.execute("SELECT COUNT(*) FROM customer")
            return int(seen.fetchone()[0])

        conn.begin()
        cur.execute("INSERT INTO customer (email, name) VALUES ('t1@x.io', 'T')")
        assert conn.get_server_info().startswith("8.0")
        assert count() == 0
        conn.rollback()
        assert count() == 0

        conn.autocommit(False)  # SET AUTOCOMMIT = 0: every statement opens a transaction
        cur.execute("INSERT INTO customer (email, name) VALUES ('t2@x.io', 'T')")
        cur.execute("SAVEPOINT s1")
        cur.execute("INSERT INTO customer (email, name) VALUES ('t3@x.io', 'T')")
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        assert count() == 0
        conn.commit()
        assert count() == 1
        cur.execute("INSERT INTO customer (email, name) VALUES ('t4@x.io', 'T')")
        conn.autocommit(True)  # commits the open transaction, as MySQL does
        assert count() == 2

        cur.execute("SET transaction_mode = 'twopc'")
        cur.execute("SELECT @@transaction_mode")
        assert cur.fetchone() == ("twopc",)
        cur.execute("BEGIN")
        two = "INSERT INTO customer (email, name) VALUES ('t5@x.io', 'T'), ('t6@x.io', 'T')"
        cur.execute(two)
        if cluster.kind == "sqlite":  # SQLite cannot prepare: COMMIT refused, rolled back
            with pytest.raises(pymysql.err.MySQLError):
                cur.execute("COMMIT")
            assert count() == 2
        else:
            cur.execute("COMMIT")
            assert count() == 4
        conn.close()
        other.close()

    await run(client)


async def test_errors_carry_mysql_numbers(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        conn = connect(mysql_port)
        cur = conn.cursor()
        cur.execute("INSERT INTO customer (email, name) VALUES ('dup@x.io', 'D')")
        cases = {
            "SELECT * FROM customer WHERE (": (1064, "42000"),
            "SELECT * FROM no_such_table": (1146, "42S02"),
            "SELECT no_such_column FROM customer": (1054, "42S22"),
            "INSERT INTO customer (email, name) VALUES ('dup@x.io', 'again')": (1062, "23000"),
        }
        for sql, (errno, sqlstate) in cases.items():
            with pytest.raises(pymysql.err.MySQLError) as err:
                cur.execute(sql)
            assert (_errno(err), _sqlstate(err)) == (errno, sqlstate), (sql, err.value)
        cur.execute("SELECT 1")  # the connection is still good
        assert cur.fetchone() == (1,)
        conn.close()

    await run(client)


async def test_streams_a_large_scatter_result(cluster: Cluster, mysql_port: int) -> None:
    n = 3000

    def client() -> None:
        conn = connect(mysql_port)
        cur = conn.cursor()
        values = ", ".join(f"('{i}@x.io', 'name {i}')" for i in range(n))
        cur.execute(f"INSERT INTO customer (email, name) VALUES {values}")
        stream = conn.cursor(pymysql.cursors.SSCursor)  # unbuffered: rows as they come
        stream.execute("SELECT customer_id, email, name FROM customer")
        got = sum(1 for _ in stream)
        assert got == n
        stream.close()
        # a client that goes away after the first rows of a big result
        quitter = connect(mysql_port)
        qs = quitter.cursor(pymysql.cursors.SSCursor)
        qs.execute("SELECT customer_id, email, name FROM customer")
        assert qs.fetchone() is not None
        quitter._sock.close()  # no COM_QUIT: the socket just closes
        cur.execute("SELECT COUNT(*) FROM customer")
        assert cur.fetchone() == (n,)
        conn.close()

    await run(client)


# -- what clients ask first: SHOW, DESCRIBE, information_schema ----------------------------


async def test_catalog_answers(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        conn = connect(mysql_port)
        cur = conn.cursor()
        cur.execute("SHOW DATABASES")
        assert [r[0] for r in cur.fetchall()] == ["information_schema", "commerce", "lookup"]
        cur.execute("SHOW TABLES")
        assert [r[0] for r in cur.fetchall()] == ["corder", "customer"]
        cur.execute("SHOW FULL TABLES FROM lookup")
        assert ("customer_email_idx", "BASE TABLE") in cur.fetchall()
        cur.execute("DESCRIBE customer")
        rows = {r[0]: r for r in cur.fetchall()}
        assert rows["customer_id"][1].startswith("bigint")  # MariaDB says bigint(20)
        assert rows["customer_id"][2:4] == ("NO", "PRI")
        assert rows["email"][1] == "varchar(128)"
        cur.execute("SHOW COLUMNS FROM customer_email_idx FROM lookup")
        assert [r[0] for r in cur.fetchall()] == ["email", "keyspace_id"]
        cur.execute("SHOW CREATE TABLE customer")
        name, ddl = cur.fetchone()
        assert name == "customer" and "`email` varchar(128)" in ddl
        assert "PRIMARY KEY (`customer_id`)" in ddl
        cur.execute("SHOW INDEX FROM corder")
        assert ("corder", 0, "PRIMARY") in [r[:3] for r in cur.fetchall()]
        cur.execute("SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = 'commerce' ORDER BY table_name")
        assert cur.fetchall() == (("corder",), ("customer",))
        cur.execute("SELECT column_name, data_type, column_key FROM information_schema.columns "
                    "WHERE table_schema = 'commerce' AND table_name = 'customer' "
                    "ORDER BY ordinal_position")
        assert cur.fetchall() == (("customer_id", "bigint", "PRI"), ("email", "varchar", ""),
                                  ("name", "varchar", ""))
        cur.execute("SELECT index_name, column_name FROM information_schema.statistics "
                    "WHERE table_schema = 'lookup' AND table_name = 'customer_email_idx'")
        assert cur.fetchall() == (("PRIMARY", "email"),)
        cur.execute("SELECT constraint_name, column_name FROM "
                    "information_schema.key_column_usage WHERE table_schema = 'commerce' "
                    "AND table_name = 'corder'")
        assert cur.fetchall() == (("PRIMARY", "order_id"),)
        with pytest.raises(pymysql.err.MySQLError) as err:
            cur.execute("DESCRIBE no_such_table")
        assert _errno(err) == 1146
        cur.execute("SHOW VITESS_SHARDS")
        assert len(cur.fetchall()) == 5
        cur.execute("SHOW VITESS_TABLETS")
        assert {r[3] for r in cur.fetchall()} == {"PRIMARY"}
        cur.execute("SHOW VSCHEMA TABLES")
        assert cur.fetchall() == (("corder",), ("customer",))
        cur.execute("SHOW VSCHEMA VINDEXES")
        assert {r[1] for r in cur.fetchall()} == {"hash", "customer_email_idx"}
        cur.execute("SHOW VSCHEMA VINDEXES ON customer")
        assert [r[:3] for r in cur.fetchall()] == [
            ("customer_id", "hash", "hash"), ("email", "customer_email_idx", "lookup_unique")]
        cur.execute("SHOW VARIABLES LIKE 'sql_mode'")
        assert cur.fetchone()[0] == "sql_mode"
        conn.close()

    await run(client)


# -- other clients ---------------------------------------------------------------------------


async def test_mysqlclient_and_mysql_connector(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        conn = MySQLdb.connect(host="127.0.0.1", port=mysql_port, user="app", db="commerce")
        cur = conn.cursor()
        cur.execute("INSERT INTO customer (email, name) VALUES (%s, %s)", ("m@x.io", "M"))
        conn.commit()
        cur.execute("SELECT email, name FROM customer WHERE email = %s", ("m@x.io",))
        assert cur.fetchall() == (("m@x.io", "M"),)
        conn.close()
        # mysql-connector's prepared cursor: COM_STMT_PREPARE / COM_STMT_EXECUTE
        conn2 = mysql.connector.connect(host="127.0.0.1", port=mysql_port, user="app",
                                        database="commerce", autocommit=True,
                                        auth_plugin="mysql_native_password")
        pc = conn2.cursor(prepared=True)
        pc.execute("INSERT INTO customer (email, name) VALUES (%s, %s)", ("p@x.io", "P"))
        assert pc.rowcount == 1
        pc.execute("SELECT email, name FROM customer WHERE email = %s", ("p@x.io",))
        assert [tuple(r) for r in pc.fetchall()] == [("p@x.io", "P")]
        conn2.close()

    await run(client)


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "customer"
    customer_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    email: Mapped[str] = mapped_column(sa.String(128))
    name: Mapped[str] = mapped_column(sa.String(128))
    orders: Mapped[list[Order]] = relationship(back_populates="customer")


class Order(Base):
    __tablename__ = "corder"
    order_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    customer_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("customer.customer_id"))
    sku: Mapped[str] = mapped_column(sa.String(64))
    price: Mapped[int] = mapped_column(sa.BigInteger)
    customer: Mapped[Customer] = relationship(back_populates="orders")


async def test_sqlalchemy_core_orm_and_reflection(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        engine = sa.create_engine(f"mysql+pymysql://app@127.0.0.1:{mysql_port}/commerce")
        with engine.begin() as c:  # Core
            c.execute(sa.text("INSERT INTO customer (email, name) VALUES (:e, :n)"),
                      [{"e": "core@x.io", "n": "Core"}])
            assert c.execute(sa.text("SELECT name FROM customer WHERE email = 'core@x.io'")
                             ).scalar_one() == "Core"
        with Session(engine) as s:  # ORM
            ada = Customer(email="ada@x.io", name="Ada")
            s.add(ada)
            s.commit()
            assert ada.customer_id > 0
            s.add_all([Order(customer_id=ada.customer_id, sku="s1", price=3),
                       Order(customer_id=ada.customer_id, sku="s2", price=4)])
            s.commit()
        with Session(engine) as s:
            found = s.scalars(sa.select(Customer).where(Customer.email == "ada@x.io")).one()
            assert sorted(o.sku for o in found.orders) == ["s1", "s2"]
            # a co-located join: both tables sharded by customer_id
            rows = s.execute(
                sa.select(Customer.name, Order.sku).join(Order.customer)
                .where(Customer.customer_id == found.customer_id).order_by(Order.sku)).all()
            assert [tuple(r) for r in rows] == [("Ada", "s1"), ("Ada", "s2")]
            found.name = "Ada L."
            s.commit()
        insp = sa.inspect(engine)  # reflection
        assert insp.get_table_names() == ["corder", "customer"]
        cols = {c["name"]: c for c in insp.get_columns("customer")}
        assert isinstance(cols["email"]["type"], sa.String) and cols["email"]["type"].length == 128
        assert insp.get_pk_constraint("corder")["constrained_columns"] == ["order_id"]
        assert insp.has_table("customer") and not insp.has_table("nope")
        assert "lookup" in insp.get_schema_names()
        meta = sa.MetaData()
        t = sa.Table("customer", meta, autoload_with=engine)
        assert [c.name for c in t.columns] == ["customer_id", "email", "name"]
        engine.dispose()

    await run(client)


async def test_pandas_read_sql_and_to_sql(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        engine = sa.create_engine(f"mysql+pymysql://app@127.0.0.1:{mysql_port}/commerce")
        frame = pd.DataFrame({"email": [f"{i}@pd.io" for i in range(50)],
                              "name": [f"n{i}" for i in range(50)]})
        assert frame.to_sql("customer", engine, if_exists="append", index=False) == 50
        back = pd.read_sql("SELECT email, name FROM customer ORDER BY email", engine)
        assert len(back) == 50 and list(back.columns) == ["email", "name"]
        assert back["email"].iloc[0] == "0@pd.io"
        engine.dispose()

    await run(client)


# -- authentication and TLS --------------------------------------------------------------------


async def test_users_file_auth(cluster: Cluster, tmp_path: Path) -> None:
    users_file = tmp_path / "users.json"
    users_file.write_text(json.dumps({
        "alice": [{"Password": "s3cret", "UserData": "team-a"}],
        # MySQL's PASSWORD('hashed-pw'): the file need not hold the password
        "bob": [{"MysqlNativePassword": "*" + _native_hash("hashed-pw")}],
    }))
    users = StaticUsers.load(users_file)
    listener, port = await serve_mysql(cluster.gate, "127.0.0.1", 0, users=users)

    def client() -> None:
        ok = pymysql.connect(host="127.0.0.1", port=port, user="alice", password="s3cret",
                             database="commerce")
        ok.cursor().execute("SELECT 1")
        ok.close()
        bob = pymysql.connect(host="127.0.0.1", port=port, user="bob", password="hashed-pw")
        bob.close()
        for user, password in (("alice", "wrong"), ("mallory", "s3cret"), ("alice", "")):
            with pytest.raises(pymysql.err.OperationalError) as err:
                pymysql.connect(host="127.0.0.1", port=port, user=user, password=password)
            assert _errno(err) == 1045, (user, err.value)

    try:
        await run(client)
        with pytest.raises(FailedPrecondition):
            await serve_mysql(cluster.gate, "0.0.0.0", 0)  # no users: loopback only
    finally:
        await _stop(listener)


def _native_hash(password: str) -> str:
    return hashlib.sha1(hashlib.sha1(password.encode()).digest()).hexdigest().upper()


async def test_a_failed_login_cannot_run_queries(cluster: Cluster, tmp_path: Path) -> None:
    """After a wrong password the connection is closed, whatever the client sends next."""
    users = StaticUsers.from_mapping({"alice": [{"Password": "s3cret"}]})
    listener, port = await serve_mysql(cluster.gate, "127.0.0.1", 0, users=users)

    def client() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            _read_packet(sock)  # handshake
            # HandshakeResponse41 with a wrong 20-byte scramble, then a query anyway
            caps = 0x0200 | 0x8000 | 0x00080000 | 0x0008
            body = struct.pack("<IIB23x", caps, 1 << 24, 45) + b"alice\x00" + b"\x14" + \
                b"x" * 20 + b"commerce\x00" + b"mysql_native_password\x00"
            _send_packet(sock, 1, body)
            err = _read_packet(sock)
            assert err[0] == 0xFF and struct.unpack("<H", err[1:3])[0] == 1045
            try:
                _send_packet(sock, 0, b"\x03SELECT 1")
                assert _read_packet(sock) == b""  # closed, no answer
            except (ConnectionError, OSError):
                pass

    try:
        await run(client)
    finally:
        await _stop(listener)


async def test_tls_and_require_tls(cluster: Cluster, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    listener, port = await serve_mysql(cluster.gate, "127.0.0.1", 0,
                                       tls=TlsConfig(str(cert), str(key), required=True))

    def client() -> None:
        with pytest.raises(pymysql.err.OperationalError) as err:
            pymysql.connect(host="127.0.0.1", port=port, user="app", ssl_disabled=True)
        assert _errno(err) == 3159
        conn = pymysql.connect(host="127.0.0.1", port=port, user="app", database="commerce",
                               ssl={"ca": str(cert), "check_hostname": False})
        cur = conn.cursor()
        cur.execute("SHOW STATUS LIKE 'Ssl_cipher'")
        cur.execute("SELECT COUNT(*) FROM customer")
        assert cur.fetchone() == (0,)
        conn.close()

    try:
        await run(client)
    finally:
        await _stop(listener)


def _tls_with_early_hello(port: int, cert: Path) -> bytes:
    """A client that sends its TLS ClientHello in the same write as the SSLRequest
    (clients do not wait between them; the listener then finds the ClientHello already
    read), then logs in over TLS; the listener's answer to the login (an OK packet)."""
    import ssl

    caps = 0x200 | 0x800 | 0x8000 | 0x80000  # PROTOCOL_41, SSL, SECURE_CONNECTION, PLUGIN_AUTH
    body = struct.pack("<IIB23x", caps, 1 << 24, 45)
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:

        def pumped(step: Callable[[], T]) -> T:
            """``step()`` on the TLS object, the socket feeding it until it has enough."""
            while True:
                try:
                    return step()
                except ssl.SSLWantReadError:
                    sock.sendall(outgoing.read())
                    data = sock.recv(65536)
                    assert data, "the listener closed the connection"
                    incoming.write(data)

        greeting = sock.recv(4096)
        assert greeting[4] == 10  # protocol 10 handshake
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.do_handshake()  # the ClientHello, into `outgoing`
        sock.sendall(struct.pack("<I", len(body))[:3] + b"\x01" + body + outgoing.read())
        pumped(tls.do_handshake)
        login = body + b"app\x00\x00" + b"mysql_native_password\x00"
        tls.write(struct.pack("<I", len(login))[:3] + b"\x02" + login)
        sock.sendall(outgoing.read())
        return pumped(lambda: tls.read(65536))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tls_upgrade_keeps_a_client_hello_sent_with_the_ssl_request(
    tmp_path: Path, loop: str
) -> None:
    """The ClientHello that arrives in the same read as the SSLRequest reaches the TLS
    protocol, on asyncio's loop and on uvloop (``--event-loop auto`` picks it when
    installed, the ``fast`` extra); on uvloop every such handshake failed before."""
    import uvloop

    from shardgate.gate import Gate
    from shardgate.topo.embedded import embedded_topology

    cert, key = _self_signed(tmp_path)

    async def scenario() -> list[bytes]:
        gate = Gate.open(embedded_topology(tmp_path / "data"))
        listener, port = await serve_mysql(gate, "127.0.0.1", 0,
                                           tls=TlsConfig(str(cert), str(key), required=True))
        try:
            return [await asyncio.wait_for(asyncio.to_thread(_tls_with_early_hello, port, cert),
                                           30) for _ in range(3)]
        finally:
            await _stop(listener)
            await gate.close()

    answers = uvloop.run(scenario()) if loop == "uvloop" else asyncio.run(scenario())
    assert [a[4] for a in answers] == [0x00] * 3  # OK packets: logged in over TLS


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


# -- bad input on the wire ----------------------------------------------------------------------


def _send_packet(sock: socket.socket, seq: int, body: bytes) -> None:
    sock.sendall(struct.pack("<I", len(body))[:3] + bytes([seq]) + body)


def _read_packet(sock: socket.socket) -> bytes:
    head = _recv(sock, 4)
    if len(head) < 4:
        return b""
    return _recv(sock, int.from_bytes(head[:3], "little"))


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


async def test_bad_input_on_the_wire(cluster: Cluster, mysql_port: int) -> None:
    def client() -> None:
        good = connect(mysql_port)
        cur = good.cursor()
        bad = connect(mysql_port)
        sock = bad._sock
        # an unknown command: an error packet, and the connection still works
        _send_packet(sock, 0, b"\x99")
        err = _read_packet(sock)
        assert err[0] == 0xFF and struct.unpack("<H", err[1:3])[0] == 1047
        bad.ping()
        # a malformed packet (COM_STMT_EXECUTE of a statement that does not exist, cut short)
        _send_packet(sock, 0, b"\x17\x01")
        reply = _read_packet(sock)
        assert reply == b"" or reply[0] == 0xFF
        # garbage instead of a handshake response: an error, closed
        with socket.create_connection(("127.0.0.1", mysql_port), timeout=10) as raw:
            _read_packet(raw)
            raw.sendall(b"\x05\x00\x00\x01" + b"\x07" * 5)
            reply = _read_packet(raw)
            assert reply == b"" or reply[0] == 0xFF
            assert _read_packet(raw) == b""
        cur.execute("SELECT COUNT(*) FROM customer")  # others keep being served
        assert cur.fetchone() == (0,)
        good.close()

    await run(client)


@pytest.mark.parametrize("backend_kind", ["sqlite"], indirect=True)
async def test_a_stalled_handshake_is_closed(cluster: Cluster) -> None:
    listener, port = await serve_mysql(cluster.gate, "127.0.0.1", 0, connect_timeout_s=0.5)

    def client() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
            _read_packet(raw)
            raw.sendall(b"\xff\xff\xff\x01" + b"\x00" * 64)  # announces 16 MB, sends 64 B
            assert _read_packet(raw) == b""  # closed after the connect timeout

    try:
        await run(client)
    finally:
        await _stop(listener)


@pytest.mark.parametrize("backend_kind", ["sqlite"], indirect=True)
async def test_a_thousand_connections_at_once(cluster: Cluster, mysql_port: int) -> None:
    n = 1000

    def client() -> None:
        socks = []
        try:
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", mysql_port), timeout=30)
                socks.append(s)
            greeted = sum(1 for s in socks if _read_packet(s)[:1] == b"\x0a")
            assert greeted == n
            conn = connect(mysql_port)  # still served with a thousand idle connections open
            cur = conn.cursor()
            cur.execute("SELECT COUNT(*) FROM customer")
            assert cur.fetchone() == (0,)
            conn.close()
        finally:
            for s in socks:
                s.close()
        conn = connect(mysql_port)
        conn.ping()
        conn.close()

    await run(client)


async def test_mariadb_command_line_client(cluster: Cluster, mysql_port: int) -> None:
    done = await run(lambda: mariadb(mysql_port, "commerce", stdin=SCRIPT))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[:2] == ["name", "Ada"]
    assert "bob@example.com\tRobert" in out and "commerce/c0-" in out
    dup = await run(lambda: mariadb(
        mysql_port, "commerce", "-e",
        "INSERT INTO customer (email, name) VALUES ('ada@example.com', 'again')"))
    assert "ERROR 1062 (23000)" in dup.stderr


@pytest.mark.parametrize("backend_kind", ["sqlite", "postgres"], indirect=True)
async def test_spark_jdbc_reads_a_sharded_table(
    cluster: Cluster, mysql_port: int, spark: Any
) -> None:
    def client() -> None:
        conn = connect(mysql_port)
        cur = conn.cursor()
        values = ", ".join(f"('{i}@spark.io', 'n{i}')" for i in range(200))
        cur.execute(f"INSERT INTO customer (email, name) VALUES {values}")
        conn.close()
        frame = (spark.read.format("jdbc")
                 .option("url", f"jdbc:mysql://127.0.0.1:{mysql_port}/commerce")
                 .option("driver", "org.mariadb.jdbc.Driver")
                 .option("user", "spark").option("dbtable", "customer").load())
        assert frame.columns == ["customer_id", "email", "name"]
        rows = frame.where("name LIKE 'n1%'").collect()
        assert len(rows) == 1 + 10 + 100
        assert frame.count() == 200

    await run(client)


async def test_mysql_semantics_clients_rely_on(cluster: Cluster, mysql_port: int) -> None:
    """Autocommit as the handshake says, DDL's implicit commit, DECIMAL columns,
    constant selects evaluated by a shard, RETURNING refused (MySQL 8)."""
    def client() -> None:
        conn = pymysql.connect(host="127.0.0.1", port=mysql_port, user="app",
                               database="lookup")  # PyMySQL's default: autocommit off
        assert conn.get_autocommit() is False  # it sent SET autocommit=0: the status said on
        cur = conn.cursor()
        cur.execute("CREATE TABLE sem_t (id INT PRIMARY KEY, d DECIMAL(10,2))")
        cur.execute("INSERT INTO sem_t VALUES (1, 12.50)")
        cur.execute("SAVEPOINT sp")
        cur.execute("INSERT INTO sem_t VALUES (2, 1.25)")
        cur.execute("ROLLBACK TO SAVEPOINT sp")
        other = connect(mysql_port, database="lookup")
        ocur = other.cursor()
        ocur.execute("SELECT COUNT(*) FROM sem_t")
        assert ocur.fetchone() == (0,)  # not committed yet
        cur.execute("CREATE TABLE sem_u (id INT PRIMARY KEY)")  # commits first, as MySQL
        ocur.execute("SELECT id, d FROM sem_t")
        assert ocur.fetchall() == ((1, Decimal("12.50")),)
        ocur.execute("SELECT CAST('2.5' AS DECIMAL(10,2)) AS x, FLOOR(7 / 2) AS y")
        assert ocur.fetchone() == (Decimal("2.50"), 3)
        with pytest.raises(pymysql.err.MySQLError) as err:
            ocur.execute("INSERT INTO sem_t VALUES (3, 1) RETURNING id")
        assert _errno(err) == 1064
        for t in ("sem_t", "sem_u"):
            ocur.execute(f"DROP TABLE {t}")
        other.close()
        conn.close()

    await run(client)
