"""``shardgate gate --workers N``: N gate processes sharing the gate's ports.

One Python process runs one event loop on one core, and the gate's loop is
what limits an application's throughput (see ``docs/operations.md``). With
``--workers N`` the ``gate`` command becomes a **supervisor**: it checks the
flags and the ports, then starts N worker processes (``shardgate gate`` with
the same flags, each told its slot) that all listen on the same gRPC, MySQL
and HTTP ports with ``SO_REUSEPORT``; the kernel spreads new connections over
them. Each worker is a whole gate: its own sessions, plan cache, connections
to the tablets, topo watcher and health checks. Nothing in a ``gate`` must be
single: the tablets (shard leases, queue managers) are other processes, and
sequences reserve their blocks in transactions, as several gates do.

What a client sees: a connection (a gRPC channel, a MySQL connection) stays
on the worker that accepted it, and so does its session; a session is not
known to the other workers, so a client whose channel reconnects to another
worker gets ``NOT_FOUND`` for its old session id, as after a gate restart.
``SHOW SHARDGATE_WORKER`` names the worker answering.

Supervision, decided so:

* **Start**: the supervisor holds each port (a bound, not listening socket
  with ``SO_REUSEPORT``; a port 0 becomes a free port all workers share)
  before starting the workers, so no other program takes it in between,
  and waits until every worker printed its ``listening`` line. A worker that
  exits before that fails the start: the others are stopped, exit code 1.
* **A worker dies** later: it is restarted in its slot (its sessions are
  gone; its clients reconnect to whichever worker accepts them). More than
  :data:`MAX_RESTARTS` deaths within :data:`RESTART_WINDOW_S` means something
  is wrong that restarting does not fix: the supervisor says so loudly on
  stderr, stops every worker and exits 1, for the service manager to see.
* **SIGTERM / SIGINT**: forwarded to every worker as SIGTERM (each stops
  listening, finishes its calls within the gate's grace and closes); workers
  still running after :data:`STOP_TIMEOUT_S` are killed. Exit code 0 when
  every worker stopped cleanly.
* **The supervisor dies** (SIGKILL): each worker notices its parent is gone
  within a second and stops as on SIGTERM.

Workers run in sessions of their own (a terminal's Ctrl-C reaches the
supervisor only, which forwards it once); their output is forwarded line by
line, prefixed ``[worker I]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from shardgate.aio import wait_for
from shardgate.cli.common import shardgate_command
from shardgate.errors import InvalidArgument, Unavailable

#: deaths of workers within RESTART_WINDOW_S after which the supervisor gives up
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
#: seconds a worker has to print its listening line
START_TIMEOUT_S = 60.0
#: seconds workers have to stop after SIGTERM before they are killed
STOP_TIMEOUT_S = 20.0
#: how often a worker checks that its supervisor is alive
PARENT_CHECK_S = 1.0
#: the line a worker prints once every listener is up
READY_PREFIX = "shardgate gate listening on "


def parse_slot(text: str) -> tuple[int, int]:
    """``"I/N"`` (the hidden ``--worker-slot`` flag) as ``(I, N)``."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or not 1 <= i <= n:
        raise InvalidArgument(f"bad --worker-slot {text!r}: expected I/N with 1 <= I <= N")
    return i, n


def check_count(workers: int) -> None:
    """InvalidArgument unless ``workers`` is a sensible number of processes."""
    if not 1 <= workers <= 64:
        raise InvalidArgument(f"--workers {workers}: give 1 to 64 worker processes")


def reserve_port(host: str, port: int, flag: str) -> socket.socket:
    """A socket holding ``host:port`` for the workers (bound with ``SO_REUSEPORT``, not
    listening, so it takes no connection); port 0 picks a free port.

    ``UNAVAILABLE`` if anything already holds the port: sharing it with a stranger
    that also set ``SO_REUSEPORT`` would split its clients with it.
    """
    try:
        family, kind, proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    if port:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                raise Unavailable(
                    f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}; "
                    f"another process holds it: stop that one or pass {flag} N") from None
    held = socket.socket(family, kind, proto)
    try:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(sockaddr)
    except OSError as exc:
        held.close()
        raise Unavailable(f"cannot hold {host}:{port} for the workers: "
                          f"{exc.strerror or exc}") from None
    return held


@dataclass
class _Slot:
    """One worker slot: its current process and whether it printed its listening line."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    reaper: asyncio.Task[None] | None = None


class Supervisor:
    """Starts, watches and stops the worker processes of one ``gate --workers N``.

    Invariants: each slot has at most one live process; once :meth:`stop` began
    no worker is (re)started; every process started is waited for before
    :meth:`run` returns.
    """

    def __init__(self, argv: Sequence[str], count: int, ports: dict[str, int],
                 out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.argv, self.count, self.ports = list(argv), count, ports
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.slots = [_Slot(i + 1) for i in range(count)]
        self._deaths: list[float] = []
        self._stopping = False
        self._changed = asyncio.Event()

    def _command(self, slot: _Slot) -> list[str]:
        extra: list[str] = []
        for flag, port in self.ports.items():
            extra += [flag, str(port)]
        return shardgate_command(*self.argv, *extra, "--workers", "1",
                                 "--worker-slot", f"{slot.index}/{self.count}")

    async def _start(self, slot: _Slot) -> None:
        slot.ready = asyncio.Event()
        slot.proc = await asyncio.create_subprocess_exec(
            *self._command(slot), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        assert slot.proc.stdout is not None and slot.proc.stderr is not None
        slot.pumps = [asyncio.create_task(self._pump(slot, slot.proc.stdout, self.out)),
                      asyncio.create_task(self._pump(slot, slot.proc.stderr, self.err))]
        slot.reaper = asyncio.create_task(self._reap(slot, slot.proc))

    async def _pump(self, slot: _Slot, stream: asyncio.StreamReader, to: TextIO) -> None:
        """Forward a worker's output line by line; note its listening line."""
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(READY_PREFIX):
                slot.ready.set()
            print(f"[worker {slot.index}] {text}", file=to, flush=True)

    async def _reap(self, slot: _Slot, proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        await asyncio.gather(*slot.pumps, return_exceptions=True)
        self._changed.set()

    def _say(self, text: str, *, error: bool = False) -> None:
        print(f"shardgate gate supervisor: {text}", file=self.err if error else self.out,
              flush=True)

    async def _wait_ready(self, slots: Sequence[_Slot]) -> _Slot | None:
        """Wait until every slot is ready; the first slot whose worker exited instead."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for slot in slots:
                if slot.proc is not None and slot.proc.returncode is not None:
                    return slot
            if all(s.ready.is_set() for s in slots):
                return None
            if self._stopping:
                return None
            if time.monotonic() > deadline:
                return next(s for s in slots if not s.ready.is_set())
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._changed.wait(), 0.1)

    async def run(self) -> int:
        """Start the workers, supervise them until a signal, stop them; the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        self._stopping = True
        self._changed.set()

    async def _run(self) -> int:
        for slot in self.slots:
            await self._start(slot)
        failed = await self._wait_ready(self.slots)
        if failed is not None:
            self._say(f"worker {failed.index} did not start ({_how(failed)}); stopping",
                      error=True)
            await self.stop()
            return 1
        if self._stopping:
            return await self.stop()
        pids = ", ".join(str(s.proc.pid) for s in self.slots if s.proc is not None)
        self._say(f"{self.count} workers (pids {pids}) serving", error=False)
        while not self._stopping:
            self._changed.clear()
            dead = [s for s in self.slots if s.proc is not None and s.proc.returncode is not None]
            if not dead:
                await self._changed.wait()
                continue
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S] + \
                [now] * len(dead)
            if len(self._deaths) > MAX_RESTARTS:
                self._say(f"workers died {len(self._deaths)} times within "
                          f"{RESTART_WINDOW_S:.0f} s (last: worker {dead[0].index}, "
                          f"{_how(dead[0])}); giving up: stopping every worker", error=True)
                await self.stop()
                return 1
            for slot in dead:
                self._say(f"worker {slot.index} {_how(slot)}; restarting it", error=True)
                await self._start(slot)
            failed = await self._wait_ready(dead)
            if failed is not None and not self._stopping:
                self._say(f"worker {failed.index} did not start again ({_how(failed)}); "
                          "stopping every worker", error=True)
                await self.stop()
                return 1
        return await self.stop()

    async def stop(self) -> int:
        """SIGTERM every worker, kill those still running after STOP_TIMEOUT_S; 0 if every
        worker exited 0."""
        self._stopping = True
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        procs = [s.proc for s in self.slots if s.proc is not None]
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await asyncio.gather(*(p.wait() for p in procs))
        except TimeoutError:
            for proc in procs:
                if proc.returncode is None:
                    self._say(f"worker pid {proc.pid} did not stop in {STOP_TIMEOUT_S:.0f} s; "
                              "killing it", error=True)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.gather(*(p.wait() for p in procs))
        for slot in self.slots:
            await asyncio.gather(*slot.pumps, *([slot.reaper] if slot.reaper else []),
                                 return_exceptions=True)
        code = 0 if all(p.returncode == 0 for p in procs) else 1
        self._say("every worker stopped" if code == 0 else "stopped (a worker failed)",
                  error=code != 0)
        return code


def _how(slot: _Slot) -> str:
    code = slot.proc.returncode if slot.proc is not None else None
    if code is None:
        return "no listening line in time"
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


async def supervise(argv: Sequence[str], count: int,
                    ports: Sequence[tuple[str, str, int]]) -> int:
    """Run ``count`` workers of the gate command ``argv`` until a signal; the exit code.

    ``ports``: ``(flag, host, port)`` of each listener the workers share (port 0:
    a free one, the same for all); each is held while the workers run.
    """
    held: list[socket.socket] = []
    try:
        resolved: dict[str, int] = {}
        for flag, host, port in ports:
            sock = reserve_port(host, port, flag)
            held.append(sock)
            resolved[flag] = int(sock.getsockname()[1])
        return await Supervisor(argv, count, resolved).run()
    finally:
        for sock in held:
            sock.close()
