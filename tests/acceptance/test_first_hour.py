"""The errors a new user meets first, as the ``shardgate`` command prints them (issue 18)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from tests.acceptance.test_cli import free_port, server, shardgate

__all__ = ["server"]  # the fixture, shared with test_cli


def test_sql_with_no_gate_says_where_it_looked_and_what_to_do(tmp_path: Path) -> None:
    port = free_port()
    done = shardgate("sql", "--target", f"grpc://127.0.0.1:{port}", "SELECT 1", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error UNAVAILABLE: nothing answers at grpc://127.0.0.1:{port}")
    assert "connection refused" in lines[0]
    assert "`shardgate up`" in lines[0] and "--target" in lines[0]
    assert "failed to connect to all addresses" not in lines[0]


def test_up_on_a_busy_port_prints_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = shardgate("up", "--data-dir", "data", "--port", str(port), "--http-port", "0",
                         "--mysql-port", "0", cwd=tmp_path)
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()
    assert err == [
        f"error UNAVAILABLE: cannot listen on 127.0.0.1:{port}: address already in use; "
        "another process (a running `shardgate up`?) holds it: stop that one or pass --port N"
    ], done.stderr


def test_unknown_column_names_the_column_not_the_shard_file(tmp_path: Path) -> None:
    assert shardgate("up", "--check", "--data-dir", "data", cwd=tmp_path).returncode == 0
    done = shardgate("sql", "--data-dir", "data", "SELECT nosuchcol FROM customer", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("error NOT_FOUND: unknown column 'nosuchcol' (shard database ")


def test_doctor_on_this_machine_and_with_a_server_down(tmp_path: Path) -> None:
    done = shardgate("doctor", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name in ("python", "postgresql 127.0.0.1:5432", "mariadb 127.0.0.1:3306", "redis "):
        assert any(line.startswith(f"ok    {name}") for line in lines), (name, done.stdout)
    assert "wal_level=logical" in done.stdout and "binlog_format=ROW" in done.stdout
    down = shardgate("doctor", "--postgres", f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                     cwd=tmp_path)
    assert down.returncode == 1
    assert "FAIL  postgresql 127.0.0.1:" in down.stdout and "not reachable" in down.stdout
    assert "fix: start the server" in down.stdout


def test_syntax_error_names_position_and_token_in_the_users_words(tmp_path: Path) -> None:
    assert shardgate("up", "--check", "--data-dir", "data", cwd=tmp_path).returncode == 0
    done = shardgate("sql", "--data-dir", "data", "SELECT * FROM customer WHERE name = 1 *",
                     cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error INVALID_ARGUMENT: syntax error at line 1, column 39 near '*': incomplete expression"
    )


def test_vschema_show_reads_a_running_gate_or_a_cluster(
    server: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    _, target = server
    shown = shardgate("vschema", "show", "--target", target, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert sorted(doc) == ["commerce", "lookup"]
    assert doc["commerce"]["tables"]["customer"]["column_vindexes"][0]["name"] == "hash"
    nowhere = shardgate("vschema", "show", "--target", f"grpc://127.0.0.1:{free_port()}",
                        cwd=tmp_path)
    assert nowhere.returncode == 1
    assert "nothing answers at" in nowhere.stderr and "`shardgate up`" in nowhere.stderr


def test_spark_jobs_take_the_data_dir_like_the_other_commands(tmp_path: Path) -> None:
    for job in (["dump", "--table", "corder", "--lake", "lake"],
                ["archive", "--queue", "jobs", "--before", "2024-05-01", "--out", "out"]):
        done = shardgate("spark", *job, "--data-dir", "nowhere", "--keyspace", "commerce",
                         cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip() == (
            "error NOT_FOUND: nowhere/cluster.yaml does not exist: "
            "run `shardgate up --data-dir nowhere` first"
        )
