"""The application's path for benchmarks: client processes, gate and tablet processes.

:class:`ClientPool` keeps N client processes (started once, reused by every
run: an interpreter start per run would cost more than the run). A run tells
the first k of them a target and a duration; each connects, warms up and
says so; once all have, they are told one start time, run point selects
until the end and report how many they did (warm-up is never measured).
:func:`cpu_seconds` reads a process's utime+stime from ``/proc``, so the CPU
a gate spends per select is measured on the gate itself, over the same window.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from shardgate.cli.common import shardgate_command

SELECT_GATE = "SELECT id, v FROM t WHERE id = :id"
SELECT_PG = "SELECT id, v FROM t WHERE id = %s"
#: seconds between telling the warm clients the start time and that time
LEAD_S = 0.3
#: seconds clients may take to connect and warm up
WARM_TIMEOUT_S = 120.0
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent on anything but idling (``/proc/stat``: user, nice,
    system, irq, softirq and steal), since boot: what a run took from the machine."""
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def _client_main(conn: Connection, keys: Sequence[int]) -> None:
    """A client process: run each job it is sent, answer ``(ops, worker)``."""
    import MySQLdb  # noqa: F401  (imported before the first job, not during it)
    import psycopg  # noqa: F401

    import shardgate.api.grpc.client  # noqa: F401

    conn.send("ready")
    # one event loop for the process's life: grpc.aio binds itself to the first loop
    # it runs on, and calls on a later loop (a second asyncio.run) crawl
    loop = asyncio.new_event_loop()
    while True:
        job = conn.recv()
        if job is None:
            loop.close()
            return
        kind, target, seconds = job
        if kind == "gate":
            conn.send(loop.run_until_complete(_gate_job(conn, target, keys, seconds)))
        elif kind == "mysql":
            conn.send(_mysql_job(conn, target, keys, seconds))
        else:
            conn.send(_pg_job(conn, target, keys, seconds))


def _warm(conn: Connection) -> float:
    """Say this client is connected and warm; the start time every client is told."""
    conn.send("warm")
    start_at: float = conn.recv()
    time.sleep(max(0.0, start_at - time.time()))
    return start_at


async def _gate_job(conn: Connection, target: str, keys: Sequence[int],
                    seconds: float) -> tuple[int, int]:
    from shardgate.api.grpc.client import GateClient

    async with GateClient(target, keyspace="bench") as c:
        worker = (await c.execute("SHOW SHARDGATE_WORKER")).rows[0][0]
        for i in range(200):
            await c.execute(SELECT_GATE, {"id": keys[i & 4095]})
        end = _warm(conn) + seconds  # (blocks this loop: it has nothing else to do)
        n = 0
        while True:
            for _ in range(20):
                r = await c.execute(SELECT_GATE, {"id": keys[n & 4095]})
                assert len(r.rows) == 1
                n += 1
            if time.time() >= end:
                return n, worker


def _mysql_job(conn: Connection, target: str, keys: Sequence[int],
               seconds: float) -> tuple[int, int]:
    """mysqlclient (libmariadb, C) against the gate's MySQL listener at ``host:port``."""
    import MySQLdb

    host, port = target.rsplit(":", 1)
    # autocommit as psycopg's and GateClient's: MySQLdb's default (off) would run
    # every select of a client in one long transaction
    c = MySQLdb.connect(host=host, port=int(port), user="bench", database="bench",
                        autocommit=True)
    try:
        cur = c.cursor()
        cur.execute("SHOW SHARDGATE_WORKER")
        worker = int(cur.fetchone()[0])
        for i in range(200):
            cur.execute(SELECT_PG, (keys[i & 4095],))
            cur.fetchall()
        end = _warm(conn) + seconds
        n = 0
        while True:
            for _ in range(20):
                cur.execute(SELECT_PG, (keys[n & 4095],))
                assert len(cur.fetchall()) == 1
                n += 1
            if time.time() >= end:
                return n, worker
    finally:
        c.close()


def _pg_job(conn: Connection, url: str, keys: Sequence[int],
            seconds: float) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        for i in range(200):
            c.execute(SELECT_PG, (keys[i & 4095],)).fetchall()
        end = _warm(conn) + seconds
        n = 0
        while True:
            for _ in range(20):
                assert len(c.execute(SELECT_PG, (keys[n & 4095],)).fetchall()) == 1
                n += 1
            if time.time() >= end:
                return n, 0


@dataclass
class RunResult:
    """One run: operations per second, CPU µs per operation of each watched process (and
    of the client processes, ``clients``, and of the whole machine, ``machine``: clients,
    gate, tablet, PostgreSQL, the kernel and anything else running), and how many client
    connections each gate worker got."""

    ops_per_s: float
    cpu_us: dict[str, float]
    per_worker: dict[int, int] = field(default_factory=dict)


class ClientPool:
    """``n`` client processes, each one connection per run."""

    def __init__(self, n: int, keys: Sequence[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_client_main, args=(child, list(keys)), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        for conn in self._conns:
            if not conn.poll(120) or conn.recv() != "ready":
                raise RuntimeError("a client process did not start")

    def run(self, kind: str, target: str, clients: int, seconds: float,
            watch: dict[str, list[int]]) -> RunResult:
        """``clients`` clients of ``kind`` ("gate" or "pg") against ``target`` for
        ``seconds``; the CPU of the processes in ``watch`` (name -> pids) per operation."""
        for conn in self._conns[:clients]:
            conn.send((kind, target, seconds))
        for conn in self._conns[:clients]:  # connected and warmed up (not measured)
            if not conn.poll(WARM_TIMEOUT_S) or conn.recv() != "warm":
                raise RuntimeError(f"a {kind} client did not warm up in {WARM_TIMEOUT_S} s")
        start_at = time.time() + LEAD_S
        for conn in self._conns[:clients]:
            conn.send(start_at)
        time.sleep(max(0.0, start_at - time.time()))
        watch = {**watch, "clients": [p.pid for p in self._procs[:clients]]}
        before = {name: sum(cpu_seconds(p) for p in pids) for name, pids in watch.items()}
        machine = machine_busy_seconds()
        time.sleep(seconds)
        machine = machine_busy_seconds() - machine
        after = {name: sum(cpu_seconds(p) for p in pids) for name, pids in watch.items()}
        answers = [conn.recv() for conn in self._conns[:clients]]
        ops = sum(n for n, _ in answers)
        per_worker: dict[int, int] = {}
        for _, w in answers:
            per_worker[w] = per_worker.get(w, 0) + 1
        cpu = {name: 1e6 * (after[name] - before[name]) / ops for name in watch}
        cpu["machine"] = 1e6 * machine / ops
        return RunResult(ops / seconds, cpu, per_worker if kind != "pg" else {})

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a client that failed is gone already
                conn.send(None)
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


@dataclass
class GateProcess:
    """A ``shardgate gate`` process (``workers`` > 1: a supervisor and its workers)."""

    proc: subprocess.Popen[str]
    port: int
    mysql_port: int
    worker_pids: list[int]
    lines: list[str]

    @property
    def target(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def mysql_target(self) -> str:
        return f"127.0.0.1:{self.mysql_port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def start_gate(topo_url: str, workers: int, event_loop: str = "auto",
               timeout: float = 60.0, extra: Sequence[str] = ()) -> GateProcess:
    """Start ``shardgate gate --workers N`` (gRPC and MySQL on free ports, no console)
    and wait until it serves; its ports and worker pids."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mysql_port = int(s.getsockname()[1])
    cmd = shardgate_command("gate", "--topo", topo_url, "--no-auth", "--port", "0",
                            "--http-port", "0", "--mysql-port", str(mysql_port),
                            "--workers", str(workers), "--event-loop", event_loop, *extra)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()
    found: dict[str, Any] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if (m := re.search(r"listening on grpc://[\d.]+:(\d+)", line)) and workers == 1:
                found["port"], found["pids"] = int(m.group(1)), [proc.pid]
                ready.set()
            elif m:
                found["port"] = int(m.group(1))
            if m := re.search(r"\(pids ([\d, ]+)\) serving", line):
                found["pids"] = [int(p) for p in m.group(1).split(", ")]
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout) or "pids" not in found:
        proc.kill()
        raise RuntimeError(f"the gate did not start: {lines}")
    return GateProcess(proc, found["port"], mysql_port, found["pids"], lines)
