"""``shardgate gate --workers 2``: two gate processes share the gRPC, MySQL and HTTP ports.

A real supervisor process (the ``shardgate gate`` command) starts two worker
processes in front of one ``shardgate tablet`` process on PostgreSQL. Fresh
connections land on both workers (``SHOW SHARDGATE_WORKER`` names the one
answering), over gRPC and over MySQL; a killed worker is restarted in its
slot; SIGTERM to the supervisor stops every worker and exits 0.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pymysql
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.auth.identity import TRUSTED
from shardgate.cli.cluster import wait_for_tablets
from shardgate.cli.common import shardgate_command
from shardgate.gate import Gate
from shardgate.topo import Topology
from shardgate.topo.local import open_topo
from tests.conftest import require_server
from tests.integration.tablet_procs import start_tablet_process
from tests.ports import free_port

#: fresh connections to try before concluding a worker never answers (a miss is 2^-40)
TRIES = 40
TIMEOUT_S = 60.0


class Lines:
    """A process's output, line by line, read by a thread (waits have deadlines)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen = proc, []  # type: list[str]
        self._q: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def close(self) -> None:
        """After the process ended: let the reader reach the end, close the pipe."""
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, pattern: str, timeout: float = TIMEOUT_S) -> re.Match[str]:
        """The first line (from now) matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in {timeout}s; "
                                     f"output so far: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the process ended before {pattern!r}: {self.seen}")
            self.seen.append(line)
            if (m := re.search(pattern, line)) is not None:
                return m


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
async def topo_url(make_database: Callable[..., str], tmp_path: Path) -> str:
    """A topo store with keyspace ``app`` (one PostgreSQL shard, table ``t`` of 10 rows)."""
    require_server("postgres")
    url = make_database("postgres", "workers")
    topology = Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": {"-": url},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}})
    setup = Gate.open(topology)
    try:
        s = setup.session(identity=TRUSTED)
        await setup.execute(s, "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(16))")
        for i in range(10):
            await setup.execute(s, "INSERT INTO t (id, v) VALUES (:id, :v)",
                                {"id": i, "v": f"v{i}"})
    finally:
        await setup.close()
    store = f"sqlite:///{tmp_path / 'topo.db'}"
    topo = await open_topo(url=store)
    try:
        await topo.import_topology(topology)
    finally:
        await topo.close()
    return store


@pytest.fixture
async def tablet(topo_url: str) -> AsyncIterator[None]:
    proc = start_tablet_process(topo_url, "app", "-", "app-w-1")
    topo = await open_topo(url=topo_url)
    try:
        await wait_for_tablets(topo.store, {"app-w-1"}, lease_holders={("app", "-")})
        yield
    finally:
        await topo.close()
        proc.kill()
        proc.join(10)


async def _grpc_workers(port: int) -> set[tuple[int, int]]:
    """``(worker, pid)`` of the workers answering fresh gRPC channels (stops once two did)."""
    seen: set[tuple[int, int]] = set()
    for _ in range(TRIES):
        async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="app", timeout=30) as c:
            who = await c.execute("SHOW SHARDGATE_WORKER")
            row = await c.execute("SELECT id, v FROM t WHERE id = :id", {"id": 7})
        assert row.rows == [(7, "v7")]
        assert who.rows[0][1] == 2
        seen.add((who.rows[0][0], who.rows[0][2]))
        if len({w for w, _ in seen}) == 2:
            break
    return seen


def _mysql_workers(port: int) -> set[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    for _ in range(TRIES):
        conn = pymysql.connect(host="127.0.0.1", port=port, user="app", database="app",
                               connect_timeout=30, ssl_disabled=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW SHARDGATE_WORKER")
                index, count, pid = cur.fetchone()
                cur.execute("SELECT v FROM t WHERE id = 3")
                assert cur.fetchall() == (("v3",),)
        finally:
            conn.close()
        assert int(count) == 2
        seen.add((int(index), int(pid)))
        if len({w for w, _ in seen}) == 2:
            break
    return seen


def _start_workers(topo_url: str, mysql_port: int = 0,
                   http_port: int = 0) -> tuple[subprocess.Popen[str], Lines, set[int]]:
    """``shardgate gate --workers 2`` (gRPC on port 0); the process, its output and the
    workers' pids once it says they serve."""
    proc = subprocess.Popen(
        shardgate_command("gate", "--topo", topo_url, "--no-auth", "--port", "0",
                          "--mysql-port", str(mysql_port), "--http-port", str(http_port),
                          "--workers", "2"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True)
    out = Lines(proc)
    try:
        found = out.wait_for(r"supervisor: 2 workers \(pids (\d+), (\d+)\) serving")
    except BaseException:
        proc.kill()
        proc.wait(10)
        out.close()
        raise
    return proc, out, {int(p) for p in found.groups()}


async def test_two_workers_share_the_ports_restart_and_stop(topo_url: str, tablet: None) -> None:
    mysql_port, http = free_port(), free_port()
    proc, out, pids = _start_workers(topo_url, mysql_port, http)
    try:
        ports = {int(m.group(1)) for line in out.seen
                 if (m := re.search(r"listening on grpc://127\.0\.0\.1:(\d+)", line))}
        assert len(ports) == 1, out.seen  # port 0: one free port, shared
        port = ports.pop()

        grpc_seen = await _grpc_workers(port)
        assert {w for w, _ in grpc_seen} == {1, 2}, grpc_seen
        assert {p for _, p in grpc_seen} == pids
        mysql_seen = _mysql_workers(mysql_port)
        assert {w for w, _ in mysql_seen} == {1, 2}, mysql_seen
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/debug/health", timeout=30) as r:
            label = r.headers["X-Shardgate-Worker"]
            health = json.loads(r.read())
        assert health["worker"]["count"] == 2 and health["worker"]["pid"] in pids
        assert label == f"{health['worker']['index']}/2 pid {health['worker']['pid']}"

        # a worker that dies is restarted in its slot; both slots answer again
        victim = next(p for w, p in grpc_seen if w == 1)
        os.kill(victim, signal.SIGKILL)
        out.wait_for(r"worker 1 was killed by signal SIGKILL; restarting it")
        out.wait_for(r"\[worker 1\] shardgate gate listening on")
        again = await _grpc_workers(port)
        assert {w for w, _ in again} == {1, 2}, again
        assert victim not in {p for _, p in again}
        pids = {p for _, p in again}

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0, out.seen
        out.wait_for(r"supervisor: every worker stopped")
        assert not any(_alive(p) for p in pids | {victim})
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        out.close()


async def test_workers_stop_when_their_supervisor_is_killed(topo_url: str, tablet: None) -> None:
    proc, out, pids = _start_workers(topo_url)
    try:
        proc.kill()  # no chance to stop its workers: they notice it is gone
        proc.wait(10)
        deadline = time.monotonic() + TIMEOUT_S
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"workers {pids} outlived their supervisor"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        out.close()


def test_a_worker_that_cannot_start_fails_the_start(tmp_path: Path) -> None:
    """An empty topo store: each worker fails; the supervisor says so and exits 1."""
    proc = subprocess.run(
        shardgate_command("gate", "--topo", f"sqlite:///{tmp_path / 'empty.db'}", "--no-auth",
                          "--port", "0", "--mysql-port", "0", "--http-port", "0",
                          "--workers", "2"),
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=TIMEOUT_S)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert re.search(r"supervisor: worker \d did not start \(exited with code 1\); stopping",
                     proc.stderr), proc.stderr
    assert "[worker" in proc.stderr  # the worker's own error, forwarded
