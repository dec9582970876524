"""``shardgate up`` / ``shardgate gate`` serving the MySQL protocol, used with the
``mariadb`` command-line client (Debian's ``mariadb-client``), as a person would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_cli import (
    COMMAND_TIMEOUT_S,
    STOP_TIMEOUT_S,
    cli_env,
    free_port,
    shardgate,
    wait_for_port,
)

SCRIPT = """\
INSERT INTO customer (email, name) VALUES ('ada@example.com', 'Ada'), ('bob@example.com', 'Bob');
SELECT name FROM customer WHERE email = 'ada@example.com';
BEGIN;
UPDATE customer SET name = 'Robert' WHERE email = 'bob@example.com';
COMMIT;
SELECT email, name FROM customer ORDER BY email;
SHOW TABLES;
SHOW VITESS_SHARDS;
USE `commerce:-40`;
SELECT COUNT(*) AS here FROM customer;
"""


def mariadb(port: int, *args: str, stdin: str | None = None,
            user: str = "root") -> subprocess.CompletedProcess[str]:
    binary = shutil.which("mariadb") or shutil.which("mysql")
    if binary is None:
        pytest.fail("the mariadb command-line client is missing: apt-get install mariadb-client")
    return subprocess.run(
        [binary, "-h", "127.0.0.1", "-P", str(port), "-u", user, "--batch",
         "--skip-ssl", *args],
        input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def _serve(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port, mysql_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", *args, "--port", str(port),
         "--mysql-port", str(mysql_port), "--http-port", "0"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(proc, mysql_port)
        yield proc, mysql_port
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=STOP_TIMEOUT_S)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``shardgate up`` (embedded SQLite cluster) with its MySQL listener on a free port."""
    yield from _serve(tmp_path, "up", "--data-dir", str(tmp_path / "data"))


def test_mariadb_client_runs_a_script(up: tuple[subprocess.Popen[str], int]) -> None:
    _, port = up
    done = mariadb(port, "commerce", stdin=SCRIPT)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[:2] == ["name", "Ada"]
    assert "ada@example.com\tAda" in out and "bob@example.com\tRobert" in out
    assert "Tables_in_commerce" in out and "customer" in out
    assert "commerce/-40" in out and "lookup/0" in out
    here = out[out.index("here") + 1]
    assert int(here) in (0, 1, 2)

    dup = mariadb(port, "commerce", "-e",
                  "INSERT INTO customer (email, name) VALUES ('ada@example.com', 'again')")
    assert dup.returncode == 1 and "ERROR 1062 (23000)" in dup.stderr
    missing = mariadb(port, "commerce", "-e", "SELECT * FROM nope")
    assert "ERROR 1146 (42S02)" in missing.stderr
    unknown_db = mariadb(port, "nowhere", "-e", "SELECT 1")
    assert "ERROR 1049 (42000)" in unknown_db.stderr


def test_gate_mysql_auth_flags(tmp_path: Path) -> None:
    done = shardgate("up", "--check", "--data-dir", "data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cluster = str(tmp_path / "data" / "cluster.yaml")

    # neither users nor --no-auth: the gate does not start (no listener would be safe)
    # (--http-port 0: the default 15000 may be another test's `shardgate up`, and taken
    # ports are reported before anything else is checked)
    refused = shardgate("gate", "--cluster", cluster, "--port", str(free_port()),
                        "--mysql-port", str(free_port()), "--http-port", "0", cwd=tmp_path)
    assert refused.returncode != 0 and "--no-auth" in refused.stderr, refused.stderr

    # never without users on a non-loopback address
    refused = shardgate("gate", "--cluster", cluster, "--port", str(free_port()),
                        "--mysql-port", str(free_port()), "--no-auth",
                        "--mysql-host", "0.0.0.0", "--http-port", "0", cwd=tmp_path)
    assert refused.returncode != 0 and "users file" in refused.stderr

    users = tmp_path / "users.json"
    users.write_text(json.dumps({"app": [{"Password": "pw1"}]}))
    served = _serve(tmp_path, "up", "--cluster", cluster, "--users-file", str(users))
    _, mysql_port = next(served)
    try:
        ok = mariadb(mysql_port, "commerce", "-papp-wrong", user="app", stdin="SELECT 1;")
        assert "ERROR 1045 (28000)" in ok.stderr
        ok = mariadb(mysql_port, "commerce", "-ppw1", "-e", "SELECT COUNT(*) FROM customer",
                     user="app")
        assert ok.returncode == 0 and ok.stdout.splitlines()[1] == "0", ok.stderr
    finally:
        served.close()
