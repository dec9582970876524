"""The DB-API 2.0 driver over gRPC and over an in-process gate, on SQLite shards.

The gate (and, for ``grpc``, its server) runs on a private loop thread, as in
an application: the tests themselves are synchronous DB-API code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.client import dbapi
from shardgate.client.embedded import close_embedded, open_embedded
from shardgate.errors import AlreadyExists, Code
from shardgate.topo.embedded import embedded_topology

from .test_grpc import set_up_embedded

Connect = Callable[..., dbapi.Connection]


@pytest.fixture(params=["grpc", "inprocess"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Connect]:
    """``connect(**kwargs)`` -> a connection to a fresh embedded cluster; all closed at the end."""
    gate, loop_thread = open_embedded(embedded_topology(tmp_path))
    opened: list[dbapi.Connection] = []
    server: Any = None
    try:
        loop_thread.run(set_up_embedded(gate))
        if request.param == "grpc":
            server, port = loop_thread.run(serve(gate, "127.0.0.1", 0))
            target = f"grpc://127.0.0.1:{port}"

            def make(**kwargs: Any) -> dbapi.Connection:
                conn = dbapi.connect(target, timeout=30, **kwargs)
                opened.append(conn)
                return conn

        else:

            def make(**kwargs: Any) -> dbapi.Connection:
                conn = dbapi.connect(gate, loop=loop_thread.loop, identity=TRUSTED, **kwargs)
                opened.append(conn)
                return conn

        yield make
    finally:
        for conn in opened:
            conn.close()
        if server is not None:
            loop_thread.run(server.stop(None))
        close_embedded(gate, loop_thread)


def count(conn: dbapi.Connection, where: str = "1 = 1") -> int:
    cur = conn.cursor()
    cur.execute(f"SELECT customer_id FROM customer WHERE {where}")
    return len(cur.fetchall())


def test_module_globals() -> None:
    assert dbapi.apilevel == "2.0"
    assert dbapi.threadsafety == 1
    assert dbapi.paramstyle == "named"
    assert issubclass(dbapi.IntegrityError, dbapi.DatabaseError)
    assert issubclass(dbapi.DatabaseError, dbapi.Error)
    assert issubclass(dbapi.InterfaceError, dbapi.Error)


def test_description_rowcount_lastrowid(connect: Connect) -> None:
    conn = connect(autocommit=True)
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1
    cur.execute(
        "INSERT INTO customer (email, name) VALUES (:email, :name)", {"email": "a@x", "name": "A"}
    )
    assert cur.description is None
    assert cur.rowcount == 1
    assert cur.lastrowid == 1  # from customer_seq
    cur.execute("INSERT INTO customer (email, name) VALUES ('b@x', 'B'), ('c@x', NULL)")
    assert (cur.rowcount, cur.lastrowid) == (2, 2)

    cur.execute("SELECT customer_id, email, name FROM customer WHERE customer_id = :id", {"id": 3})
    assert cur.description is not None
    assert [d[0] for d in cur.description] == ["customer_id", "email", "name"]
    assert all(len(d) == 7 for d in cur.description)
    assert cur.rowcount == 1
    assert cur.lastrowid is None
    assert cur.fetchone() == (3, "c@x", None)
    assert cur.fetchone() is None


def test_fetch_styles_and_iteration(connect: Connect) -> None:
    conn = connect(autocommit=True)
    cur = conn.cursor()
    cur.executemany(
        "INSERT INTO customer (email, name) VALUES (:e, :n)",
        [{"e": f"u{i}@x", "n": f"n{i}"} for i in range(5)],
    )
    assert cur.rowcount == 5
    assert cur.lastrowid == 5
    cur.execute("SELECT customer_id FROM customer ORDER BY customer_id")
    assert cur.rowcount == 5
    assert cur.fetchone() == (1,)
    cur.arraysize = 2
    assert cur.fetchmany() == [(2,), (3,)]
    assert cur.fetchmany(5) == [(4,), (5,)]
    assert cur.fetchall() == []
    cur.execute("SELECT customer_id FROM customer ORDER BY customer_id DESC")
    assert [row[0] for row in cur] == [5, 4, 3, 2, 1]
    cur.execute("INSERT INTO customer (email, name) VALUES ('z@x', 'z')")
    with pytest.raises(dbapi.ProgrammingError, match="no result set"):
        cur.fetchall()


def test_integrity_error_on_unique_lookup_duplicate(connect: Connect) -> None:
    conn = connect(autocommit=True)
    cur = conn.cursor()
    cur.execute("INSERT INTO customer (email, name) VALUES ('dup@x', 'first')")
    with pytest.raises(dbapi.IntegrityError) as err:
        cur.execute("INSERT INTO customer (email, name) VALUES ('dup@x', 'second')")
    assert err.value.code is Code.ALREADY_EXISTS
    assert isinstance(err.value.__cause__, AlreadyExists)
    assert count(conn) == 1


def test_error_classes_by_code(connect: Connect) -> None:
    cur = connect(autocommit=True).cursor()
    with pytest.raises(dbapi.ProgrammingError) as bad_sql:
        cur.execute("SELECT * FROM customer WHERE")
    assert bad_sql.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(dbapi.ProgrammingError) as unknown:
        cur.execute("SELECT * FROM no_such_table")
    assert unknown.value.code is Code.NOT_FOUND
    with pytest.raises(dbapi.ProgrammingError, match="paramstyle is 'named'"):
        cur.execute("SELECT * FROM customer WHERE customer_id = :id", (1,))  # type: ignore[arg-type]


def test_rollback_and_commit_with_autocommit_off(connect: Connect) -> None:
    conn = connect()
    assert conn.autocommit is False
    observer = connect(autocommit=True)
    cur = conn.cursor()
    cur.execute("INSERT INTO customer (email, name) VALUES ('r@x', 'R')")
    assert conn.in_transaction
    assert count(conn, "email = 'r@x'") == 1  # visible inside the transaction
    conn.rollback()
    assert not conn.in_transaction
    assert count(observer, "email = 'r@x'") == 0

    cur.execute("INSERT INTO customer (email, name) VALUES ('c@x', 'C')")
    cur.execute("INSERT INTO customer (email, name) VALUES ('c2@x', 'C2')")
    conn.commit()
    assert count(observer, "email IN ('c@x', 'c2@x')") == 2


def test_failed_statement_ends_the_transaction(connect: Connect) -> None:
    conn = connect()
    observer = connect(autocommit=True)
    cur = conn.cursor()
    cur.execute("INSERT INTO customer (email, name) VALUES ('f@x', 'F')")
    with pytest.raises(dbapi.ProgrammingError):
        cur.execute("SELECT * FROM customer WHERE")
    assert not conn.in_transaction
    conn.commit()  # nothing left to commit
    assert count(observer, "email = 'f@x'") == 0
    cur.execute("INSERT INTO customer (email, name) VALUES ('g@x', 'G')")  # a new transaction
    conn.commit()
    assert count(observer, "email = 'g@x'") == 1


def test_close_rolls_back_and_context_manager_commits(connect: Connect) -> None:
    observer = connect(autocommit=True)
    conn = connect()
    conn.cursor().execute("INSERT INTO customer (email, name) VALUES ('x@x', 'X')")
    conn.close()
    assert count(observer, "email = 'x@x'") == 0
    with pytest.raises(dbapi.InterfaceError):
        conn.cursor()

    with connect() as conn2:
        conn2.cursor().execute("INSERT INTO customer (email, name) VALUES ('y@x', 'Y')")
    assert conn2.closed
    assert count(observer, "email = 'y@x'") == 1


def test_switching_autocommit_on_commits(connect: Connect) -> None:
    observer = connect(autocommit=True)
    conn = connect()
    conn.cursor().execute("INSERT INTO customer (email, name) VALUES ('s@x', 'S')")
    conn.autocommit = True
    assert count(observer, "email = 's@x'") == 1


def test_closed_cursor(connect: Connect) -> None:
    cur = connect(autocommit=True).cursor()
    cur.close()
    with pytest.raises(dbapi.InterfaceError):
        cur.execute("SELECT 1")


def test_in_process_gate_needs_its_loop(tmp_path: Path) -> None:
    gate, loop_thread = open_embedded(embedded_topology(tmp_path))
    try:
        with pytest.raises(dbapi.InterfaceError, match="loop="):
            dbapi.connect(gate)
        with pytest.raises(dbapi.InterfaceError, match="identity="):
            dbapi.connect(gate, loop=loop_thread.loop)  # whom it runs for: no default
    finally:
        close_embedded(gate, loop_thread)


def test_unreachable_server_is_operational_error(unused_tcp_port: int) -> None:
    conn = dbapi.connect(f"grpc://127.0.0.1:{unused_tcp_port}", autocommit=True, timeout=10)
    try:
        with pytest.raises(dbapi.OperationalError) as err:
            conn.cursor().execute("SELECT 1")
        assert err.value.code is Code.UNAVAILABLE
    finally:
        conn.close()
