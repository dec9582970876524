"""Every shell and Python example in README.md and docs/ runs, as written (issue 18).

Each Markdown file is one scenario, run in a fresh directory in the order its
blocks appear:

* ``sh`` blocks: each command runs through the shell with this checkout's
  ``shardgate`` first on PATH (a `.venv/bin/shardgate` of its own). A command
  that serves until stopped (``shardgate up`` without ``--check``, ``shardgate
  gate``, ``shardgate tablet``) is started in the background, must come up and
  stay up, and is stopped (SIGTERM) when the file is done. ``make`` and ``pip
  install`` lines are the README's install steps: CI itself runs them
  (``.ci/run`` runs ``make test``, whose install is ``make up``'s plus extras),
  so they are not run again here.
* ``python`` blocks of README.md are whole programs, run as they are. Blocks of
  docs/ pages run in order in one asyncio program where top-level ``await``
  works and, as each page says, ``gate`` is an open :class:`~shardgate.gate.Gate`
  over ``cluster.yaml``, ``topology`` its topology and ``spark`` a local Spark
  session (started only for pages that use it).
* The directory holds ``cluster.yaml``: keyspaces ``commerce`` and ``lookup``
  (the embedded default of ``shardgate up``) and ``app`` (2 shards, no tables),
  on SQLite; pages that name a PostgreSQL database get it created, empty.

Other block kinds (``sql``, ``yaml``, ``json``, diagrams) are not programs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardgate.auth.identity import TRUSTED
from tests.acceptance.test_cli import REPO_ROOT, cli_env

DOC_FILES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
GATE_PORT = 15991
STEP_TIMEOUT_S = 240
SERVE_START_S = 30
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
_SERVERS = re.compile(r"^shardgate (up(?!.*--check)|gate|tablet)\b")
_INSTALL = re.compile(r"^(make|pip install)\b")
#: the README's make targets, as what they run once installed
_MAKE = {"make up": "shardgate up", "make doctor": "shardgate doctor"}
_SOURCE = re.compile(r"^\. \S+/activate\b")


@dataclass(frozen=True)
class Block:
    lang: str
    line: int
    text: str


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in _FENCE.finditer(text)
        if m.group(1) in ("sh", "python")
    ]


def commands(text: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments dropped."""
    joined = text.replace("\\\n", " ")
    out = []
    for raw in joined.splitlines():
        cmd = _strip_comment(raw).strip()
        if cmd:
            out.append(cmd)
    return out


def _strip_comment(line: str) -> str:
    i = _comment_start(line)
    return line if i is None else line[:i]


def _comment_start(line: str) -> int | None:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return None


def _env(bin_dir: Path | None) -> dict[str, str]:
    env = cli_env()
    path = [p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "shardgate").exists()]
    env["PATH"] = os.pathsep.join(([str(bin_dir)] if bin_dir else []) + path)
    env["PYSPARK_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def _shardgate_bin(cwd: Path) -> Path:
    """``.venv/bin`` as ``make up`` leaves it: ``shardgate`` (this checkout) and ``activate``."""
    bin_dir = cwd / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "shardgate"
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m shardgate.cli \"$@\"\n")
    exe.chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"; export PATH\n')
    return bin_dir


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Scenario:
    """One Markdown file's run: its directory, environment and background servers."""

    def __init__(self, doc: Path, tmp: Path) -> None:
        self.doc = doc
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.bin_dir = _shardgate_bin(self.cwd)
        # README.md: only what the reader is told (activate, or install into their PATH);
        # docs/ pages assume shardgate is installed.
        self.env = _env(self.bin_dir if doc.name != "README.md" else None)
        self.servers: list[tuple[str, subprocess.Popen[str]]] = []
        self.python_steps: list[Block] = []
        #: ``. .venv/bin/activate`` lines seen: later commands run after them
        self.prelude: list[str] = []

    def where(self, block: Block) -> str:
        return f"{self.doc.relative_to(REPO_ROOT)}:{block.line}"

    def sh(self, line: str, block: Block) -> None:
        first = line.split("&&")[0].strip()
        if _SOURCE.match(first):
            self.prelude.append(first)
            line = line[len(first):].lstrip("& ")
            if not line:
                return
        if line in _MAKE:  # make runs .venv/bin/shardgate itself, with no activation
            line = _MAKE[line].replace("shardgate", str(self.bin_dir / "shardgate"), 1)
        if _INSTALL.match(line):
            return
        if _SERVERS.match(line) or _SERVERS.match(line.replace(str(self.bin_dir) + "/", "")):
            self.serve(line, block)
            return
        cmd = " && ".join([*self.prelude, line])
        done = subprocess.run(cmd, shell=True, cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=STEP_TIMEOUT_S)
        assert done.returncode == 0, (
            f"{self.where(block)}: `{cmd}` exited {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )

    def serve(self, cmd: str, block: Block) -> None:
        key = cmd.replace(str(self.bin_dir) + "/", "")
        listens = "--port" not in key and key.split()[1] in ("up", "gate")
        if any(k == key for k, p in self.servers if p.poll() is None):
            return  # the page starts the same server again: it is running
        cmd = " && ".join([*self.prelude, cmd])
        if listens:
            assert _port_free(GATE_PORT), f"port {GATE_PORT} is taken: stop the gate running there"
        proc = subprocess.Popen(cmd, shell=True, cwd=self.cwd, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.servers.append((key, proc))
        deadline = time.monotonic() + SERVE_START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"{self.where(block)}: `{cmd}` exited {proc.returncode}\n{out}\n{err}")
            if not listens or not _port_free(GATE_PORT):
                if not listens:
                    time.sleep(2.0)  # up and still running
                    if proc.poll() is None:
                        return
                    continue
                return
            time.sleep(0.1)
        pytest.fail(f"{self.where(block)}: `{cmd}` did not come up in {SERVE_START_S}s")

    def program(self, block: Block) -> None:
        path = self.cwd / f"example_{block.line}.py"
        path.write_text(block.text)
        done = subprocess.run([sys.executable, str(path)], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        assert done.returncode == 0, f"{self.where(block)}:\n{done.stdout}\n{done.stderr}"

    def snippets(self, steps: list[Block]) -> None:
        """docs/ Python blocks, in order, in one async program (see the module docstring)."""
        runner = self.cwd / "run_examples.py"
        runner.write_text(_RUNNER)
        args = [sys.executable, str(runner), str(self.doc)] + [str(b.line) for b in steps]
        done = subprocess.run(args, cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S * 2)
        where = self.doc.relative_to(REPO_ROOT)
        assert done.returncode == 0, f"{where}:\n{done.stdout}\n{done.stderr}"

    def close(self) -> None:
        for cmd, proc in reversed(self.servers):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
                    pytest.fail(f"`{cmd}` did not stop on SIGTERM")


_RUNNER = textwrap.dedent('''
    """Runs a docs page's Python blocks in order, top-level await allowed."""
    import ast, asyncio, inspect, re, sys
    from pathlib import Path

    doc, lines = Path(sys.argv[1]), {int(n) for n in sys.argv[2:]}
    text = doc.read_text()
    fence = re.compile(r"^```python[^\\n]*\\n(.*?)^```", re.M | re.S)
    steps = [(text.count("\\n", 0, m.start()) + 1, m.group(1)) for m in fence.finditer(text)]
    steps = [(n, code) for n, code in steps if n in lines]

    async def main():
        from shardgate.gate import Gate
        from shardgate.topo import load_cluster_file
        topology = load_cluster_file("cluster.yaml")
        env = {"__name__": "__docs__", "topology": topology}
        if any("spark" in code for _, code in steps):
            from tests.integration.spark_session import start_spark
            env["spark"] = start_spark()
        gate = Gate.open(topology) if any("gate" in code for _, code in steps) else None
        env["gate"] = gate
        try:
            for n, code in steps:
                compiled = compile(code, f"{doc.name}:{n}", "exec",
                                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                if compiled.co_flags & inspect.CO_COROUTINE:
                    await asyncio.wait_for(eval(compiled, env), 120)
                else:  # plain code may run its own event loop (run_sync): not on this one
                    await asyncio.to_thread(eval, compiled, env)
        finally:
            if gate is not None:
                await gate.close()
            if "spark" in env:
                env["spark"].stop()

    asyncio.run(main())
''')


def _setup(scenario: Scenario, doc: Path) -> None:
    """The directory a page's examples expect (see the module docstring)."""
    if doc.name == "README.md":
        return
    cwd, env = scenario.cwd, scenario.env
    done = subprocess.run([sys.executable, "-m", "shardgate.cli", "up", "--check", "--data-dir",
                           "data"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cluster = yaml.safe_load((cwd / "data" / "cluster.yaml").read_text())
    cluster["keyspaces"]["app"] = {
        "shards": {name: f"sqlite:///{cwd / 'data' / f'app{name}.db'}" for name in ("-80", "80-")},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}},
    }
    (cwd / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    if doc.name == "spark.md":
        # The page writes into and reads from queue `jobs` of keyspace `app`, declared
        # in the cluster file (the Spark sources read the VSchema from it).
        cluster["keyspaces"]["app"]["vschema"]["tables"]["jobs"] = asyncio.run(
            _create_queue(cwd / "cluster.yaml", "app",
                          "CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(64)) "
                          "SHARD BY user_id")
        )
        (cwd / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    if str(GATE_PORT) in doc.read_text():
        # The page talks to a running gate at the default address.
        scenario.serve("shardgate up --cluster cluster.yaml", Block("sh", 0, ""))
    for db in sorted(set(re.findall(r"postgresql://postgres@127\.0\.0\.1:5432/(\w+)",
                                    doc.read_text()))):
        _postgres_database(db)


async def _create_queue(cluster_file: Path, keyspace: str, sql: str) -> Any:
    from shardgate.gate import Gate
    from shardgate.topo import load_cluster_file

    gate = Gate.open(load_cluster_file(cluster_file))
    try:
        await gate.execute(gate.session(keyspace, identity=TRUSTED), sql)
        name = sql.split()[2]
        return gate.topology.keyspace(keyspace).vschema["tables"][name]
    finally:
        await gate.close()


def _postgres_database(name: str) -> None:
    import psycopg

    from tests.conftest import require_server

    require_server("postgres")
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_examples_run_as_written(doc: Path, tmp_path: Path) -> None:
    found = blocks(doc)
    if not found:
        assert "```sh" not in doc.read_text() and "```python" not in doc.read_text()
        return
    scenario = Scenario(doc, tmp_path)
    try:
        _setup(scenario, doc)
        docs_page = doc.name != "README.md"
        for block in found:
            if block.lang == "sh":
                for cmd in commands(block.text):
                    scenario.sh(cmd, block)
            elif docs_page:
                scenario.python_steps.append(block)
            else:
                scenario.program(block)
        if scenario.python_steps:
            scenario.snippets(scenario.python_steps)
    finally:
        scenario.close()
