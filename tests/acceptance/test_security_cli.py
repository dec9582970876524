"""``shardgate gate`` / ``tablet`` / ``sql`` with the security flags, as subprocesses.

Refusals at start (no authentication asked for, a non-loopback address
without TLS and authentication, a bad ACL file, a SQLite path leaving the
cluster directory), a gate with a users file and an ACL file serving the CLI
client, and no database password in what the commands print.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
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

CLUSTER = """\
default_keyspace: app
keyspaces:
  app:
    shards: {{"0": "{url}"}}
    vschema: {{sharded: false, tables: {{t: {{}}}}}}
"""
USERS = {"ann": [{"Password": "ann-pw"}], "rita": [{"Password": "rita-pw"}]}
ACL = {"table_groups": [{"name": "all", "table_names_or_prefixes": ["%"],
                         "readers": ["rita"], "writers": ["ann"], "admins": []}]}


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.format(url="sqlite:///app.db"))
    # The shard's table, made with sqlite3: a `shardgate sql --cluster` process (an
    # in-process gate, ~1.5 CPU-s) proved nothing here that the tests use
    with contextlib.closing(sqlite3.connect(tmp_path / "app.db")) as db:
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    (tmp_path / "users.json").write_text(json.dumps(USERS))
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    return path


def refused(*args: str, cwd: Path) -> str:
    if args[0] in ("gate", "up"):
        # no console or MySQL port: the defaults (15000, 15306) may be another test's
        # `shardgate up` (test_docs), and taken ports are reported before anything else
        args = (*args, "--http-port", "0", "--mysql-port", "0")
    done = shardgate(*args, cwd=cwd)
    assert done.returncode == 1, (args, done.stdout, done.stderr)
    return done.stderr


def test_gate_and_tablet_refuse_to_start_unsafely(cluster: Path, tmp_path: Path) -> None:
    c = str(cluster)
    port = str(free_port())
    err = refused("gate", "--cluster", c, "--port", port, cwd=tmp_path)
    assert "FAILED_PRECONDITION" in err and "--no-auth" in err
    err = refused("gate", "--cluster", c, "--port", port, "--host", "0.0.0.0", "--no-auth",
                  cwd=tmp_path)
    assert "refusing to listen on 0.0.0.0" in err and "TLS and authentication" in err
    err = refused("gate", "--cluster", c, "--port", port, "--host", "0.0.0.0",
                  "--users-file", "users.json", cwd=tmp_path)
    assert "refusing to listen on 0.0.0.0 (not loopback) without TLS" in err
    err = refused("tablet", "--cluster", c, "--keyspace", "app", "--shard", "0",
                  "--port", port, "--host", "0.0.0.0", "--no-auth", cwd=tmp_path)
    assert "refusing to listen on 0.0.0.0" in err
    err = refused("tablet", "--cluster", c, "--keyspace", "app", "--shard", "0",
                  "--port", port, cwd=tmp_path)
    assert "no authentication configured" in err


def test_bad_acl_file_stops_the_start(cluster: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad-acl.json"
    bad.write_text(json.dumps({"table_groups": [{"name": "x", "readers": ["a"]}]}))
    err = refused("gate", "--cluster", str(cluster), "--no-auth", "--port", str(free_port()),
                  "--acl-file", str(bad), cwd=tmp_path)
    assert "INVALID_ARGUMENT" in err and "$.table_groups[0]" in err
    bad.write_text(json.dumps({"table_groups": [
        {"name": "x", "table_names_or_prefixes": ["t"], "readers": ["a"]},
        {"name": "y", "table_names_or_prefixes": ["t"], "readers": ["b"]}]}))
    err = refused("up", "--cluster", str(cluster), "--port", str(free_port()),
                  "--acl-file", str(bad), cwd=tmp_path)
    assert "already in group 'x'" in err


def test_relative_sqlite_path_must_stay_in_the_cluster_directory(tmp_path: Path) -> None:
    inner = tmp_path / "cluster"
    inner.mkdir()
    (inner / "cluster.yaml").write_text(CLUSTER.format(url="sqlite:///../outside.db"))
    err = refused("sql", "--cluster", "cluster/cluster.yaml", "SELECT 1 FROM t", cwd=tmp_path)
    assert "leads out of the cluster directory" in err
    assert not (tmp_path / "outside.db").exists()


def test_passwords_never_printed(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.format(url="postgresql://postgres:s3cret-pw@127.0.0.1:1/nosuch"))
    runs = [shardgate(*args, cwd=tmp_path) for args in (
        ("sql", "--cluster", str(path), "SELECT id FROM t"),
        ("vschema", "show", "--cluster", str(path)),
        ("sql", "--cluster", str(path), "--explain", "SELECT id FROM t"))]
    for done in runs:
        assert "s3cret-pw" not in done.stdout + done.stderr, done.args
    failed = runs[0]  # the statement fails, its error names the URL with the password masked
    assert failed.returncode == 1 and "***" in failed.stderr


@pytest.fixture
def secured_gate(cluster: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", "up", "--cluster", str(cluster),
         "--port", str(port), "--users-file", "users.json", "--acl-file", "acl.json",
         "--http-port", "0", "--mysql-port", "0"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(proc, port)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def sql_as(user: str | None, target: str, sql: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = cli_env()
    if user is not None:
        env["SHARDGATE_USER"], env["SHARDGATE_PASSWORD"] = user, f"{user}-pw"
    return subprocess.run([sys.executable, "-m", "shardgate.cli", "sql", "--target", target, sql],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)


def test_cli_client_credentials_and_acls(secured_gate: str, tmp_path: Path) -> None:
    anonymous = sql_as(None, secured_gate, "SELECT id FROM t", tmp_path)
    assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
    wrote = sql_as("ann", secured_gate, "INSERT INTO t (id) VALUES (1)", tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    denied = sql_as("rita", secured_gate, "DELETE FROM t", tmp_path)
    assert denied.returncode == 1
    assert "PERMISSION_DENIED" in denied.stderr and "writer role on table app.t" in denied.stderr
    read = sql_as("rita", secured_gate, "SELECT id FROM t", tmp_path)
    assert read.returncode == 0 and "1 row" in read.stdout
    flags = subprocess.run(
        [sys.executable, "-m", "shardgate.cli", "sql", "--target", secured_gate,
         "--user", "ann", "--password", "ann-pw", "DROP TABLE t"],
        cwd=tmp_path, env={k: v for k, v in cli_env().items() if not k.startswith("SHARDGATE_")},
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert flags.returncode == 1 and "admin role" in flags.stderr
    assert os.path.exists(tmp_path / "app.db")
