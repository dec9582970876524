"""The real ``shardgate`` command, run as a subprocess on an embedded cluster in tmp_path."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port as free_port  # re-exported: other tests import it here

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 60
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 20


def cli_env() -> dict[str, str]:
    """The environment for the command: this checkout first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def shardgate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardgate.cli", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def wait_for_port(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"shardgate up exited with {proc.returncode}:\n{out}\n{err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"shardgate up did not listen on port {port} within {START_TIMEOUT_S}s")


@contextlib.contextmanager
def serving(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``shardgate up`` in the background on a free port; killed if still running at the end."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardgate.cli",
            "up",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            str(port),
            "--mysql-port",
            "0",
            "--http-port",
            "0",
        ],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(proc, port)
        yield proc, f"grpc://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=STOP_TIMEOUT_S)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A ``shardgate up`` of this test's own (it may stop it)."""
    with serving(tmp_path) as served:
        yield served


@pytest.fixture(scope="module")
def shared_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """One ``shardgate up`` for the module's tests that neither stop it nor need its first
    ids (a process start is 2-3 CPU-s)."""
    with serving(tmp_path_factory.mktemp("shared")) as served:
        yield served


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A directory where ``shardgate up --check --data-dir data`` ran once, and its output."""
    cwd = tmp_path_factory.mktemp("checked")
    done = shardgate("up", "--check", "--data-dir", "data", cwd=cwd)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return cwd, done.stdout


def test_up_check_is_idempotent(checked: tuple[Path, str]) -> None:
    cwd, first = checked  # the first run, on a fresh directory; then again on it
    again = shardgate("up", "--check", "--data-dir", "data", cwd=cwd)
    assert again.returncode == 0, f"run 2: {again.stdout}\n{again.stderr}"
    for out in (first, again.stdout):
        assert "check passed" in out
        assert "1 row\n" in out
        assert "customer_id" in out
    assert (cwd / "data" / "cluster.yaml").exists()
    # The check cleans up after itself (issue 18): no customer, no lookup row, in any of
    # the shards' SQLite files (read directly: a `sql --data-dir` process each cost 2 CPU-s)
    for pattern, table in (("commerce*.db", "customer"), ("lookup.db", "customer_email_idx")):
        files = sorted((cwd / "data").glob(pattern))
        assert files, pattern
        for db in files:
            with contextlib.closing(sqlite3.connect(db)) as conn:
                assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), db


def test_up_serves_sql_until_sigterm(
    server: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    proc, target = server
    inserted = shardgate(
        "sql",
        "--target",
        target,
        "INSERT INTO customer (email, name) VALUES ('cli@example.com', 'From the CLI')",
        cwd=tmp_path,
    )
    assert inserted.returncode == 0, inserted.stderr
    assert inserted.stdout.strip() == "OK, 1 row affected, insert id 1"

    selected = shardgate(
        "sql", "--target", target, "SELECT customer_id, email, name FROM customer", cwd=tmp_path
    )
    assert selected.returncode == 0, selected.stderr
    lines = selected.stdout.strip().splitlines()
    assert lines[0].split(" | ") == ["customer_id", "email          ", "name"]
    assert lines[2].split(" | ") == ["1          ", "cli@example.com", "From the CLI"]
    assert lines[-1] == "1 row"

    plan = shardgate(
        "sql",
        "--target",
        target,
        "--explain",
        "SELECT * FROM customer WHERE customer_id = 1",
        cwd=tmp_path,
    )
    assert plan.returncode == 0, plan.stderr
    assert '"Variant": "EqualUnique"' in plan.stdout

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=STOP_TIMEOUT_S)
    assert proc.returncode == 0, err
    assert f"listening on {target}" in out
    assert "stopped" in out


def test_sql_errors_exit_1_with_the_code(
    shared_server: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    _, target = shared_server
    bad = shardgate("sql", "--target", target, "SELECT * FROM customer WHERE", cwd=tmp_path)
    assert bad.returncode == 1
    assert bad.stderr.startswith("error INVALID_ARGUMENT: ")
    missing = shardgate("sql", "--target", target, "SELECT * FROM nope", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error NOT_FOUND: ")


def test_sql_against_nothing_is_unavailable(tmp_path: Path) -> None:
    done = shardgate("sql", "--target", f"grpc://127.0.0.1:{free_port()}", "SELECT 1", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("error UNAVAILABLE: ")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert shardgate("sql", cwd=tmp_path).returncode == 2
    assert shardgate("frobnicate", cwd=tmp_path).returncode == 2


def test_schema_apply_and_vschema_show(checked: tuple[Path, str]) -> None:
    tmp_path, _ = checked  # a directory `up --check` made
    ddl = tmp_path / "extra.sql"
    ddl.write_text(
        "-- two statements; the ';' inside the string and comment must not split\n"
        "CREATE TABLE IF NOT EXISTS note (id BIGINT PRIMARY KEY, body VARCHAR(64) "
        "DEFAULT 'a;b');  -- trailing; comment\n"
        "CREATE TABLE IF NOT EXISTS tag (id BIGINT PRIMARY KEY);\n"
    )
    applied = shardgate(
        "schema",
        "apply",
        "--keyspace",
        "commerce",
        "--file",
        str(ddl),
        "--data-dir",
        "data",
        cwd=tmp_path,
    )
    assert applied.returncode == 0, applied.stderr
    assert "applied 2 statement(s) to keyspace commerce" in applied.stdout
    one = shardgate(
        "schema",
        "apply",
        "--keyspace",
        "lookup",
        "--sql",
        "CREATE TABLE IF NOT EXISTS audit (id BIGINT PRIMARY KEY)",
        "--data-dir",
        "data",
        cwd=tmp_path,
    )
    assert one.returncode == 0, one.stderr

    def tables(db: Path) -> set[str]:
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    shard_files = sorted((tmp_path / "data").glob("commerce*.db"))
    assert len(shard_files) == 4
    for db in shard_files:  # on every shard of the keyspace
        assert {"note", "tag"} <= tables(db), db
        assert "audit" not in tables(db)
    assert "audit" in tables(tmp_path / "data" / "lookup.db")
    with contextlib.closing(sqlite3.connect(shard_files[0])) as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'note'").fetchone()[0]
    assert "'a;b'" in sql

    shown = shardgate("vschema", "show", "--data-dir", "data", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert '"commerce"' in shown.stdout and '"customer_email_idx"' in shown.stdout

    version = shardgate("--version", cwd=tmp_path)
    assert version.returncode == 0
    assert version.stdout.startswith("shardgate ")


def test_transaction_inserting_customer_then_orders_on_the_embedded_default(
    shared_server: tuple[subprocess.Popen[str], str]
) -> None:
    """Issue 13 item 5: the order sequence is allocated while the session's transaction
    holds the lookup database (the customer's lookup row): on SQLite a second writer
    would wait for it and fail with 'database is locked'."""
    from shardgate.client import dbapi

    _, target = shared_server
    conn = dbapi.connect(target, timeout=30)
    try:
        cur = conn.cursor()
        started = time.monotonic()
        cur.execute("INSERT INTO customer (customer_id, email, name) VALUES (7, 'tx@x', 'T')")
        for sku in ("a", "b", "c"):
            cur.execute("INSERT INTO corder (customer_id, sku, price) VALUES (7, :s, 1)",
                        {"s": sku})
        conn.commit()
        assert time.monotonic() - started < 3
        cur.execute("INSERT INTO customer (customer_id, email, name) VALUES (8, 'rb@x', 'R')")
        cur.execute("INSERT INTO corder (customer_id, sku, price) VALUES (8, 'x', 1)")
        conn.rollback()
        cur.execute("INSERT INTO corder (customer_id, sku, price) VALUES (7, 'd', 1)")
        conn.commit()
        cur.execute("SELECT order_id, sku FROM corder WHERE customer_id = 7 ORDER BY order_id")
        rows = cur.fetchall()
        assert [r[1] for r in rows] == ["a", "b", "c", "d"]
        assert len({r[0] for r in rows}) == 4
        cur.execute("SELECT COUNT(*) FROM corder WHERE customer_id = 8")
        assert cur.fetchall() == [(0,)]
    finally:
        conn.close()
