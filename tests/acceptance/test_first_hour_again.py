"""The first hour, second pass (issue 34): what a new user meets, through the real
``shardgate`` command, the real ``mariadb`` client and PyMySQL.

One ``shardgate up`` serves the whole module (free ports, its log in a file);
the tests that need a cluster of their own open one in-process (``--data-dir``),
which costs about a second.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest

from shardgate.cli.progress import Progress
from tests.acceptance.test_cli import (
    COMMAND_TIMEOUT_S,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    cli_env,
    free_port,
    shardgate,
    wait_for_port,
)

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


@dataclass
class Up:
    cwd: Path
    log: Path
    grpc: int
    mysql: int
    http: int

    @property
    def target(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc}"

    def sql(self, *args: str) -> subprocess.CompletedProcess[str]:
        return shardgate("sql", "--target", self.target, *args, cwd=self.cwd)

    def mariadb(self, sql: str) -> subprocess.CompletedProcess[str]:
        binary = shutil.which("mariadb") or shutil.which("mysql")
        if binary is None:
            pytest.fail("the mariadb command-line client is missing: apt-get install "
                        "mariadb-client")
        return subprocess.run(
            [binary, "-h", "127.0.0.1", "-P", str(self.mysql), "-u", "app", "--batch", "--skip-ssl",
             "commerce", "-e", sql], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)

    def page(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=10) as r:
            return str(r.read().decode())


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``shardgate up`` (the embedded default) on free ports, for the whole module."""
    cwd = tmp_path_factory.mktemp("up")
    served = Up(cwd, cwd / "up.log", free_port(), free_port(), free_port())
    with served.log.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardgate.cli", "up", "--data-dir", "data",
             "--port", str(served.grpc), "--mysql-port", str(served.mysql),
             "--http-port", str(served.http)],
            cwd=cwd, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(proc, served.grpc)  # the last listener it opens; then it prints
        deadline = time.monotonic() + START_TIMEOUT_S
        while "try: mariadb" not in served.log.read_text():  # its last line
            assert time.monotonic() < deadline and proc.poll() is None, served.log.read_text()
            time.sleep(0.05)
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)




# -- item 2: a syntax error in MySQL's words, at the first bad token ---------------------------


def test_mariadb_gets_1064_near_the_misspelt_word_and_the_log_one_line(up: Up) -> None:
    before = up.log.read_text()
    done = up.mariadb("SELCT * FROM customer")
    assert done.returncode == 1
    error = _error_line(done.stderr)
    assert error.startswith("ERROR 1064 (42000) at line 1: You have an error in your SQL "
                            "syntax"), done.stderr
    assert error.endswith("near 'SELCT * FROM customer' at line 1")
    for leak in ("\x1b[", "sqlglot", "<class", "Required keyword"):
        assert leak not in done.stderr
    logged = up.log.read_text()[len(before):].splitlines()
    assert len(logged) == 1 and "near 'SELCT * FROM customer' at line 1" in logged[0], logged


def test_mariadb_names_the_line_of_the_first_bad_token(up: Up) -> None:
    done = up.mariadb("SELECT 1,\n  2 FRM customer x")  # FRM: an alias; then `customer`
    assert done.returncode == 1
    error = _error_line(done.stderr)
    assert error.startswith("ERROR 1064 (42000)")
    assert error.endswith("near 'customer x' at line 2")


def _error_line(stderr: str) -> str:
    """The client's error line (it echoes the statement above it)."""
    found = [line for line in stderr.splitlines() if line.startswith("ERROR ")]
    assert len(found) == 1, stderr
    return found[0]


def test_pymysql_gets_1064_with_the_statement_from_the_bad_token(up: Up) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=up.mysql, user="app", database="commerce")
    try:
        with conn.cursor() as cur, pytest.raises(pymysql.err.ProgrammingError) as err:
            cur.execute("SELECT * FROM customer WHERE")
        errno, message = err.value.args
        assert errno == 1064
        assert message.startswith("You have an error in your SQL syntax")
        assert message.endswith("near 'WHERE' at line 1")
        with conn.cursor() as cur:  # the connection is still usable
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_grpc_points_at_the_misspelt_word_not_past_it(up: Up) -> None:
    done = up.sql("SELCT * FROM customer")
    assert done.returncode == 1
    assert done.stderr.strip() == ("error INVALID_ARGUMENT: syntax error at line 1, column 1 "
                                   "near 'SELCT': no statement starts with 'SELCT'")


# -- item 3: the query log shows every statement, bind variables as ? --------------------------


def test_queryz_and_querylogz_show_alter_vschema_and_question_marks(up: Up) -> None:
    done = up.sql("--keyspace", "commerce",
                  "ALTER VSCHEMA ON customer ADD VINDEX name_xx(name) USING xxhash")
    assert done.returncode == 0, done.stderr
    conn = pymysql.connect(host="127.0.0.1", port=up.mysql, user="app", database="commerce")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT customer_id FROM customer WHERE email = 'ql@example.com'")
    finally:
        conn.close()
    for page in ("/queryz", "/querylogz"):
        text = up.page(page)
        assert "ALTER VSCHEMA ON customer ADD VINDEX name_xx(name) USING xxhash" in text, page
        assert "email = ?" in text, page
        assert ":_l0" not in text, page


# -- item 4: every taken port named at once, before anything starts ----------------------------


def test_up_beside_a_running_one_names_every_taken_port_with_its_flag(
    up: Up, tmp_path: Path
) -> None:
    done = shardgate("up", "--data-dir", "data", "--port", str(up.grpc), "--mysql-port",
                     str(up.mysql), "--http-port", str(up.http), cwd=tmp_path)
    assert done.returncode == 1
    assert "ready" not in done.stdout and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error UNAVAILABLE: cannot listen on ")
    for flag, port in (("--port", up.grpc), ("--mysql-port", up.mysql),
                       ("--http-port", up.http)):
        assert f"127.0.0.1:{port} ({flag})" in lines[0]
    assert not (tmp_path / "data").exists()  # nothing was set up


# -- items 5 and 6: ids ----------------------------------------------------------------------


def test_a_fresh_clusters_first_customer_is_1_after_up_check(tmp_path: Path) -> None:
    checked = shardgate("up", "--check", "--data-dir", "data", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    done = shardgate("sql", "--data-dir", "data",
                     "INSERT INTO customer (email, name) VALUES ('first@example.com', 'First')",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OK, 1 row affected, insert id 1"


def test_insert_id_is_printed_only_when_the_gate_generated_one(up: Up) -> None:
    made = shardgate("schema", "apply", "--target", up.target, "--keyspace", "commerce",
                     "--sql", "CREATE TABLE memo (customer_id BIGINT, body TEXT)",
                     "--vindex", "customer_id:hash", cwd=up.cwd)
    assert made.returncode == 0, made.stderr
    rows = up.sql("--keyspace", "commerce",
                  "INSERT INTO memo (customer_id, body) VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    assert rows.returncode == 0, rows.stderr
    assert rows.stdout.strip() == "OK, 3 rows affected"
    generated = up.sql("--keyspace", "commerce",
                       "INSERT INTO customer (email) VALUES ('gen@example.com')")
    assert re.fullmatch(r"OK, 1 row affected, insert id \d+", generated.stdout.strip())


# -- item 7: progress in logs, the backfill's count --------------------------------------------


def test_progress_redraws_on_a_terminal_and_prints_lines_elsewhere() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    log, tty = io.StringIO(), Tty()
    for stream in (log, tty):
        bar = Progress("backfill", stream)
        for done in range(0, 101, 10):
            bar(done, 100)
        bar.end()
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [
        "backfill: 0/100 rows (0%)",  # where it starts (a resumed run: where it resumed)
        "backfill: 30/100 rows (30%)", "backfill: 50/100 rows (50%)",
        "backfill: 80/100 rows (80%)", "backfill: 100/100 rows (100%)"]
    assert tty.getvalue().count("\r") == 11 and tty.getvalue().endswith("(100%)\n")


def test_lookup_vindex_backfill_into_a_log_counts_what_it_inserted(up: Up) -> None:
    """While ``shardgate up`` serves, as the README runs it."""
    made = shardgate("schema", "apply", "--target", up.target, "--keyspace", "commerce",
                     "--sql", "CREATE TABLE pet (owner_id BIGINT, nick VARCHAR(32))",
                     "--vindex", "owner_id:hash", cwd=up.cwd)
    assert made.returncode == 0, made.stderr
    filled = up.sql("--keyspace", "commerce", "INSERT INTO pet (owner_id, nick) VALUES "
                    "(1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e')")
    assert filled.returncode == 0, filled.stderr
    done = shardgate("lookup-vindex", "create", "--data-dir", "data", "--keyspace", "commerce",
                     "--table-owner", "pet", "--columns", "nick", "--type",
                     "consistent_lookup", "--lookup-table", "lookup.pet_nick_lookup",
                     "--settle", "0", "--batch", "2", cwd=up.cwd)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(re.fullmatch(r"backfill: \d+/5 rows \(\d+%\)", x) for x in lines), lines
    assert lines[-1] == "backfill: 5/5 rows (100%)" and len(lines) <= 5
    assert "5 owner rows, 5 lookup rows (5 inserted by the backfill, 0 repaired" in done.stdout


# -- item 8: an unchanged VSchema saves nothing ------------------------------------------------


def test_applying_an_unchanged_vschema_keeps_its_version(up: Up) -> None:
    cluster = up.cwd
    got = shardgate("vschema", "get", "--data-dir", "data", "--keyspace", "commerce",
                    cwd=cluster)
    assert got.returncode == 0, got.stderr
    (cluster / "commerce.json").write_text(got.stdout)
    version = got.stderr.strip().rsplit(" ", 1)[1]
    applied = shardgate("vschema", "apply", "--data-dir", "data", "--keyspace", "commerce",
                        "commerce.json", "--expect-version", version, cwd=cluster)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith("unchanged: ")
    again = shardgate("vschema", "get", "--data-dir", "data", "--keyspace", "commerce",
                      cwd=cluster)
    assert again.stderr.strip() == got.stderr.strip()  # same version


# -- item 10: an unknown keyspace lists the known ones -----------------------------------------


@pytest.mark.parametrize("command", [
    ("vschema", "get", "--keyspace", "nope"),
    ("sql", "--keyspace", "nope", "SELECT * FROM customer"),
    ("queue", "stats", "--keyspace", "nope", "jobs"),
    ("inbox", "list", "--keyspace", "nope"),
])
def test_an_unknown_keyspace_lists_the_known_ones(up: Up, command: tuple[str, ...]) -> None:
    cluster = up.cwd
    done = shardgate(*command[:2], "--data-dir", "data", *command[2:], cwd=cluster) \
        if command[0] in ("vschema", "queue", "inbox") else \
        shardgate(command[0], "--data-dir", "data", *command[1:], cwd=cluster)
    assert done.returncode == 1
    assert done.stderr.startswith("error NOT_FOUND: keyspace 'nope' "), done.stderr
    assert "['commerce', 'lookup']" in done.stderr


def test_mysql_use_of_an_unknown_keyspace_lists_the_known_ones(up: Up) -> None:
    done = up.mariadb("USE nope")
    assert done.returncode == 1
    error = _error_line(done.stderr)
    assert error.startswith("ERROR 1049 (42000)") and "['commerce', 'lookup']" in error, error


# -- item 9: the server's hint is the README's command ---------------------------------------


def test_the_mysql_hint_up_prints_is_the_readmes_command(up: Up) -> None:
    hint = next(line for line in up.log.read_text().splitlines()
                if line.startswith("try: mariadb"))
    command = hint.removeprefix("try: ").replace(f"-P {up.mysql}", "-P 15306")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "-u app" in command and command in readme, command


# -- item 11: queue tail ---------------------------------------------------------------------


def test_queue_tail_shows_iso_times_and_the_queues_columns(up: Up) -> None:
    made = shardgate("queue", "create", "--target", up.target, "--keyspace", "commerce",
                     "CREATE QUEUE tailed (user_id BIGINT NOT NULL, body VARCHAR(64)) "
                     "SHARD BY user_id", cwd=up.cwd)
    assert made.returncode == 0, made.stderr
    assert up.sql("--keyspace", "commerce",
                  "INSERT INTO tailed (user_id, body) VALUES (7, 'hello')").returncode == 0
    done = shardgate("queue", "tail", "--target", up.target, "--keyspace", "commerce",
                     "tailed", cwd=up.cwd)
    assert done.returncode == 0, done.stderr
    head, _rule, row, *_ = done.stdout.splitlines()
    names = [c.strip() for c in head.split("|")]
    assert names[:5] == ["id", "state", "epoch", "priority", "time_scheduled"]
    assert names[-2:] == ["user_id", "body"]
    cells = dict(zip(names, (c.strip() for c in row.split("|")), strict=True))
    assert ISO.fullmatch(cells["time_scheduled"]), cells
    assert cells["time_next"] == "NULL" or ISO.fullmatch(cells["time_next"]), cells
    assert cells["time_acked"] == "NULL"
    assert (cells["user_id"], cells["body"]) == ("7", "hello")
