"""Every shell and Python example in README.md and docs/ runs as printed (issues 18 and 34).

The module is one reader's session: one directory in which ``shardgate up`` (the
embedded default cluster, default ports: gRPC 15991, MySQL 15306, console 15000)
serves from the start, as ``make up`` leaves it. README.md, then each docs page,
runs in that directory, block by block in the order printed, each block as a
user pastes it:

* ``sh`` blocks: each command through ``bash`` (continuation lines joined),
  with ``.venv/bin`` as ``make up`` leaves it (``shardgate`` of this checkout,
  ``python``, ``activate``). README.md gets only what it tells the reader
  (``. .venv/bin/activate``); docs pages assume ``shardgate`` is on PATH. A
  command that serves until stopped (``shardgate up`` without ``--check``,
  ``gate``, ``tablet``) starts in the background, must come up and stay up,
  and is stopped (SIGTERM) when its page is done; ``shardgate up`` itself (and
  ``make up``) is the module's server, already running. ``export NAME=VALUE``
  holds for the page's later blocks. ``make`` and ``pip install`` lines are the
  install steps CI runs itself (``make test``), not run again here.
* ``python`` blocks: each one a program in a file, run with ``python FILE``:
  nothing is injected (no ``gate``, no ``spark``, no top-level ``await``). A
  block whose fence reads ```` ```python continued ```` continues the program
  of the python block before it (pasted into the same interpreter: spark.md's
  blocks share one Spark session); the chain runs once, as one file, where its
  last block is printed.

Spark reads the machine's defaults from ``SPARK_CONF_DIR`` (few shuffle partitions,
no UI, a quick JVM), as a small machine would set them. Pages that name a PostgreSQL database (``postgresql://postgres@127.0.0.1:5432/DB``)
get it created, empty. Other block kinds (``sql``, ``yaml``, ``json``, diagrams)
are not programs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.test_cli import REPO_ROOT, cli_env
from tests.ports import bindable

DOC_FILES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
#: the default ports of `shardgate up`, which the pages print
PORTS = {"--port": 15991, "--mysql-port": 15306, "--http-port": 15000}
STEP_TIMEOUT_S = 300
SERVE_START_S = 60
_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.M | re.S)
_SERVERS = re.compile(r"^shardgate (up(?!.*--check)|gate|tablet)\b")
_INSTALL = re.compile(r"^(make (?!up|doctor)|pip install)")
#: the README's make targets, as what they run once installed
_MAKE = {"make up": "shardgate up", "make doctor": "shardgate doctor"}
_SOURCE = re.compile(r"^\. \S+/activate\b")
_EXPORT = re.compile(r"^export (\w+)=(.*)$")


@dataclass(frozen=True)
class Block:
    lang: str
    line: int
    text: str
    #: the fence says ``python continued``: part of the program of the block before
    continued: bool = False


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(m.group(1), text.count("\n", 0, m.start()) + 1, m.group(3),
              "continued" in m.group(2).split())
        for m in _FENCE.finditer(text)
        if m.group(1) in ("sh", "python")
    ]


def programs(found: list[Block]) -> list[Block | list[Block]]:
    """The page's steps in order: each sh block, and each Python program (a block and the
    ``continued`` blocks after it) where its last block is."""
    steps: list[Block | list[Block]] = []
    chain: list[Block] = []
    for block in found:
        if block.lang == "python" and block.continued:
            assert chain, f"line {block.line}: `python continued` follows no python block"
            steps.remove(chain)
            chain.append(block)
            steps.append(chain)
        elif block.lang == "python":
            chain = [block]
            steps.append(chain)
        else:
            steps.append(block)
    return steps


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


def _venv_bin(cwd: Path) -> Path:
    """``.venv/bin`` as ``make up`` leaves it: ``shardgate`` (this checkout), ``python``
    (this interpreter, with shardgate and its extras) and ``activate``."""
    bin_dir = cwd / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, run in (("shardgate", f"{shlex.quote(sys.executable)} -m shardgate.cli"),
                      ("python", shlex.quote(sys.executable))):
        exe = bin_dir / name
        exe.write_text(f'#!/bin/sh\nexec {run} "$@"\n')
        exe.chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"; export PATH\n')
    return bin_dir


#: the machine's Spark defaults (``$SPARK_CONF_DIR/spark-defaults.conf``), as a small test
#: machine would set them: the pages' Spark sessions and commands start as printed
SPARK_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.python.worker.reuse": "true",
}


def _spark_conf(conf_dir: Path) -> Path:
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items()))
    return conf_dir


class Site:
    """The module's directory and its ``shardgate up``; one page at a time in it."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.bin_dir = _venv_bin(cwd)
        self.base_env = cli_env()
        self.base_env["PATH"] = os.pathsep.join(
            p for p in self.base_env["PATH"].split(os.pathsep)
            if not (Path(p) / "shardgate").exists())
        self.base_env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        self.base_env["SPARK_CONF_DIR"] = str(_spark_conf(cwd.parent / "spark-conf"))
        self.up: subprocess.Popen[str] | None = None
        self.doc: Path = REPO_ROOT / "README.md"
        self.env: dict[str, str] = {}
        self.prelude: list[str] = []
        self.servers: list[tuple[str, subprocess.Popen[str]]] = []

    # -- the module's server ---------------------------------------------------------------

    def start(self) -> None:
        taken = [f"{port} ({flag})" for flag, port in PORTS.items() if not bindable(port)]
        assert not taken, (f"ports {', '.join(taken)} are taken: the pages print shardgate "
                           "up's default ports, so stop what holds them")
        log = (self.cwd / "shardgate-up.log").open("w")
        self.up = subprocess.Popen(
            [str(self.bin_dir / "shardgate"), "up"], cwd=self.cwd, env=self.base_env,
            stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        log.close()
        self._wait_listening(self.up, "shardgate up", PORTS["--port"])

    def stop(self) -> None:
        if self.up is not None:
            _stop("shardgate up", self.up)

    def _wait_listening(self, proc: subprocess.Popen[str], cmd: str, port: int) -> None:
        deadline = time.monotonic() + SERVE_START_S
        while bindable(port):
            if proc.poll() is not None:
                pytest.fail(f"`{cmd}` exited {proc.returncode}\n{self._log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"`{cmd}` did not listen on {port} in {SERVE_START_S}s")
            time.sleep(0.1)

    def _log(self) -> str:
        path = self.cwd / "shardgate-up.log"
        return path.read_text() if path.exists() else ""

    # -- one page --------------------------------------------------------------------------

    def open_page(self, doc: Path) -> None:
        self.doc = doc
        self.env = dict(self.base_env)
        if doc.name != "README.md":  # docs pages assume shardgate is installed
            self.env["PATH"] = os.pathsep.join([str(self.bin_dir), self.env["PATH"]])
        self.prelude = []
        for db in sorted(set(re.findall(r"postgresql://postgres@127\.0\.0\.1:5432/(\w+)",
                                        doc.read_text()))):
            _postgres_database(db)

    def close_page(self) -> None:
        for cmd, proc in reversed(self.servers):
            _stop(cmd, proc)
        self.servers = []

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
            line = _MAKE[line]
            if line == "shardgate up":
                return  # the module's server
            line = line.replace("shardgate", str(self.bin_dir / "shardgate"), 1)
        if _INSTALL.match(line):
            return
        export = _EXPORT.match(line)
        if export:
            self.env[export.group(1)] = self._bash(f"printf %s {export.group(2)}", block)
            return
        if _SERVERS.match(line):
            self.serve(line, block)
            return
        self._bash(line, block)

    def _bash(self, line: str, block: Block) -> str:
        cmd = " && ".join([*self.prelude, line])
        done = subprocess.run(["bash", "-c", cmd], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        assert done.returncode == 0, (
            f"{self.where(block)}: `{cmd}` exited {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
        return done.stdout

    def serve(self, cmd: str, block: Block) -> None:
        if cmd.split() == ["shardgate", "up"]:
            return  # the module's server
        port = re.search(r"--port (\d+)", cmd)
        proc = subprocess.Popen(["bash", "-c", " && ".join([*self.prelude, cmd])],
                                cwd=self.cwd, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.servers.append((cmd, proc))
        if port:
            self._wait_listening(proc, cmd, int(port.group(1)))
        elif proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"{self.where(block)}: `{cmd}` exited {proc.returncode}\n{out}\n{err}")

    def program(self, chain: list[Block]) -> None:
        """A Python program (a block, or a chain of ``continued`` ones) run from a file."""
        name = f"{self.doc.stem}_{chain[0].line}.py"
        (self.cwd / name).write_text("".join(b.text for b in chain))
        done = subprocess.run([str(self.bin_dir / "python"), name], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        lines = ", ".join(str(b.line) for b in chain)
        assert done.returncode == 0, (
            f"{self.doc.relative_to(REPO_ROOT)} (python at line {lines}) exited "
            f"{done.returncode}:\n{done.stdout}\n{done.stderr}")


def _stop(cmd: str, proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"`{cmd}` did not stop on SIGTERM")
    else:
        proc.communicate()  # its pipes closed


def _postgres_database(name: str) -> None:
    import psycopg

    from tests.conftest import require_server

    require_server("postgres")
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The reader's directory with ``shardgate up`` serving, for every page."""
    here = Site(tmp_path_factory.mktemp("docs") / "work")
    here.cwd.mkdir(exist_ok=True)
    try:
        here.start()
        yield here
    finally:
        here.stop()


def test_fences_parse_into_programs() -> None:
    page = "```sh\na\n```\n```python\nx = 1\n```\n```sh\nb\n```\n```python continued\n" \
           "print(x)\n```\n```python\ny\n```\n"
    found = [Block(m.group(1), 0, m.group(3), "continued" in m.group(2).split())
             for m in _FENCE.finditer(page)]
    steps = programs(found)
    assert [s.text if isinstance(s, Block) else [b.text for b in s] for s in steps] == [
        "a\n", "b\n", ["x = 1\n", "print(x)\n"], ["y\n"]]


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_examples_run_as_printed(doc: Path, site: Site) -> None:
    found = blocks(doc)
    if not found:
        assert "```sh" not in doc.read_text() and "```python" not in doc.read_text()
        return
    site.open_page(doc)
    try:
        for step in programs(found):
            if isinstance(step, Block):
                for cmd in commands(step.text):
                    site.sh(cmd, step)
            else:
                site.program(step)
    finally:
        site.close_page()
