"""Rolling restart (and upgrade) of a production-shaped cluster: one process at a time.

``shardgate cluster restart --rolling`` runs :class:`RollingRestart` over the
processes ``cluster up`` started (their pids and command lines). The order:

1. **Tablets, shard by shard.** In each shard, first every standby: SIGTERM
   (it drains: see ``docs/production.md``), wait for it to exit, start its
   command again, wait until its record is back in the topo store (same
   alias, serving) and let gates see it (``settle``). Then a **planned lease
   hand-over**: the restarted standby is told to hurry for the lease (SIGUSR1:
   :meth:`shardgate.tablet.lease.ShardLease.hurry`), the lease holder gets
   SIGTERM (it refuses new statements with ``tablet draining``, which gates
   send to the new holder; it gives the lease up at once and finishes open
   transactions), the restarted standby takes the lease, and the old holder,
   once exited, is started again and comes back as a standby.
2. **Gates, one at a time.** SIGTERM (the gate drains: it refuses new work
   ``UNAVAILABLE`` "gate draining", lets open transactions end, then stops; see
   :mod:`shardgate.api.grpc.gate_drain`), wait for the exit (the drain
   included: ``StepReport.stop_s``), start again, wait until its port answers
   and ``settle``; only then the next gate. Clients naming every gate
   (``grpc://gate1,gate2``) move to another gate meanwhile.

Invariants: at most one process of the cluster is down at any time; a shard
always has a serving tablet except between its holder's SIGTERM and the
standby taking the lease (the hand-over, measured in :class:`StepReport`);
the lease moves only to a tablet already restarted, so every process runs
the new command line (or the new version) at the end. A step that does not
complete within its bound fails with ``UNAVAILABLE`` and stops the restart,
leaving the remaining processes as they were (running: nothing half-stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shardgate.errors import FailedPrecondition, Unavailable
from shardgate.tablet.registry import KIND, LEASE_HOLDER, SERVING, TabletRecord, TabletRoster
from shardgate.topo.store import TopoStore

#: seconds a restarted gate has to answer on its port, a tablet to register
DEFAULT_START_TIMEOUT_S = 60.0
#: seconds a process has to exit after SIGTERM before SIGKILL (beyond a tablet's drain)
DEFAULT_STOP_TIMEOUT_S = 30.0
#: seconds to wait after a process is back before the next step, so every gate sees it
#: (the SQL topo stores are polled every 200 ms; gates check tablets every 250 ms)
DEFAULT_SETTLE_S = 1.0
#: seconds the restarted standby has to take the lease after the holder's SIGTERM
DEFAULT_HANDOVER_TIMEOUT_S = 15.0
_POLL_S = 0.02

#: starts a process's command again: (name, command) -> its pid
Start = Callable[[str, list[str]], int]


@dataclass
class ClusterProcess:
    """One process of the cluster: its name (a tablet's alias, or ``gate``/``gate-N``)."""

    name: str
    pid: int
    command: list[str]

    @property
    def is_gate(self) -> bool:
        return self.name == "gate" or self.name.startswith("gate-")

    def option(self, flag: str) -> str | None:
        """The value of ``flag`` on its command line (``--port 15991``), if any."""
        for i, arg in enumerate(self.command[:-1]):
            if arg == flag:
                return self.command[i + 1]
        return None


@dataclass
class StepReport:
    """What one process's restart took (seconds)."""

    name: str
    old_pid: int
    new_pid: int
    #: SIGTERM until it exited (a tablet: its drain)
    stop_s: float
    #: start until registered and serving / listening
    start_s: float
    #: for a lease holder: SIGTERM until the restarted standby held the lease (topo record)
    handover_s: float | None = None
    killed: bool = False


@dataclass
class RestartReport:
    """Every step of a rolling restart, in order."""

    steps: list[StepReport] = field(default_factory=list)
    total_s: float = 0.0

    def lines(self) -> list[str]:
        """One line a step, then the total (what the command prints)."""
        out = []
        for s in self.steps:
            extra = f", lease handed over in {s.handover_s:.3f} s" if s.handover_s is not None \
                else ""
            killed = " (needed SIGKILL)" if s.killed else ""
            out.append(f"restarted {s.name}: pid {s.old_pid} -> {s.new_pid}, stopped in "
                       f"{s.stop_s:.2f} s{killed}, back in {s.start_s:.2f} s{extra}")
        out.append(f"rolling restart done: {len(self.steps)} processes in {self.total_s:.1f} s")
        return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie child of this process counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class RollingRestart:
    """Restart ``processes`` one at a time; see the module docstring for the order."""

    def __init__(
        self,
        store: TopoStore,
        processes: list[ClusterProcess],
        start: Start,
        *,
        on_restarted: Callable[[ClusterProcess], None] = lambda p: None,
        progress: Callable[[str], None] = lambda line: None,
        settle: float = DEFAULT_SETTLE_S,
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
        handover_timeout: float = DEFAULT_HANDOVER_TIMEOUT_S,
    ) -> None:
        self.store = store
        self.processes = {p.name: p for p in processes}
        self._start = start
        self._on_restarted = on_restarted
        self._progress = progress
        self.settle = settle
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.handover_timeout = handover_timeout

    async def _records(self) -> list[TabletRecord]:
        roster = TabletRoster()
        roster.seed(await self.store.list_records(KIND))
        return roster.live()

    async def plan(self) -> list[tuple[tuple[str, str], list[str], str | None]]:
        """Per shard (sorted): its standbys' names, then its lease holder's (None if none).

        FailedPrecondition if a tablet process is not registered (it must serve
        before the restart starts, or the restart would leave a shard without one).
        """
        records = {r.alias: r for r in await self._records()}
        tablets = [p for p in self.processes.values() if not p.is_gate]
        missing = sorted(p.name for p in tablets if p.name not in records)
        if missing:
            raise FailedPrecondition(
                f"tablets {missing} are not registered (serving) in the topo store: a rolling "
                "restart needs every tablet up first (see `shardgate cluster up`)")
        shards: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for p in tablets:
            rec = records[p.name]
            standbys, holders = shards.setdefault((rec.keyspace, rec.shard), ([], []))
            (holders if rec.role == LEASE_HOLDER else standbys).append(p.name)
        return [(shard, sorted(standbys), holders[0] if holders else None)
                for shard, (standbys, holders) in sorted(shards.items())]

    async def run(self) -> RestartReport:
        """Restart every tablet, then every gate; the report of each step."""
        began = time.monotonic()
        report = RestartReport()
        for _shard, standbys, holder in await self.plan():
            for name in standbys:
                report.steps.append(await self._restart_tablet(name))
            if holder is not None:
                report.steps.append(await self._restart_tablet(holder, to=standbys[:1]))
        for name in sorted(n for n, p in self.processes.items() if p.is_gate):
            report.steps.append(await self._restart_gate(name))
        report.total_s = time.monotonic() - began
        return report

    async def _stop(self, proc: ClusterProcess) -> tuple[float, bool]:
        """SIGTERM, wait for the exit (SIGKILL after ``stop_timeout``): seconds, killed."""
        began = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        killed = False
        while alive(proc.pid):
            if time.monotonic() - began > self.stop_timeout and not killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                killed = True
            await asyncio.sleep(_POLL_S)
        return time.monotonic() - began, killed

    def _restarted(self, proc: ClusterProcess) -> ClusterProcess:
        new = ClusterProcess(proc.name, self._start(proc.name, proc.command), proc.command)
        self.processes[proc.name] = new
        self._on_restarted(new)
        return new

    async def _restart_tablet(self, name: str, *, to: list[str] | None = None) -> StepReport:
        """Restart one tablet; with ``to``, hand its lease to the first of those first."""
        proc = self.processes[name]
        before = next((r for r in await self._records() if r.alias == name), None)
        since = before.started_at if before is not None else 0.0
        handover: float | None = None
        if to:
            self._progress(f"{name}: handing the lease to {to[0]}")
            target = self.processes[to[0]]
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, signal.SIGUSR1)  # hurry for the lease
        stop_began = time.monotonic()
        stopping = asyncio.ensure_future(self._stop(proc))
        try:
            if to:
                await self._wait_record(to[0], lambda r: r.role == LEASE_HOLDER,
                                        self.handover_timeout, "take the shard lease")
                handover = time.monotonic() - stop_began
            stop_s, killed = await stopping
        finally:
            if not stopping.done():
                stopping.cancel()
        self._progress(f"{name}: stopped (pid {proc.pid}); starting it again")
        began = time.monotonic()
        new = self._restarted(proc)
        await self._wait_record(name, lambda r: r.started_at > since and r.health == SERVING,
                                self.start_timeout, "register again", pid=new.pid)
        start_s = time.monotonic() - began
        await asyncio.sleep(self.settle)
        return StepReport(name, proc.pid, new.pid, stop_s, start_s, handover, killed)

    async def _wait_record(
        self, alias: str, ok: Callable[[TabletRecord], bool], timeout: float, what: str,
        pid: int | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            found = next((r for r in await self._records() if r.alias == alias), None)
            if found is not None and ok(found):
                return
            if pid is not None and not alive(pid):
                raise FailedPrecondition(f"tablet {alias} (pid {pid}) exited before it "
                                         f"could {what}: see its log")
            if time.monotonic() > deadline:
                raise Unavailable(f"tablet {alias} did not {what} within {timeout:.0f} s; "
                                  "the rolling restart stops here")
            await asyncio.sleep(_POLL_S)

    async def _restart_gate(self, name: str) -> StepReport:
        proc = self.processes[name]
        host = proc.option("--host") or "127.0.0.1"
        port = int(proc.option("--port") or 0)
        if not port:
            raise FailedPrecondition(f"{name}'s command names no --port: cannot tell when "
                                     "it is back")
        stop_s, killed = await self._stop(proc)
        self._progress(f"{name}: stopped (pid {proc.pid}); starting it again")
        began = time.monotonic()
        new = self._restarted(proc)
        while not port_open(host, port):
            if not alive(new.pid):
                raise FailedPrecondition(f"gate {name} (pid {new.pid}) exited before it "
                                         "listened: see its log")
            if time.monotonic() - began > self.start_timeout:
                raise Unavailable(f"gate {name} did not listen on {host}:{port} within "
                                  f"{self.start_timeout:.0f} s; the rolling restart stops here")
            await asyncio.sleep(_POLL_S)
        start_s = time.monotonic() - began
        await asyncio.sleep(self.settle)
        return StepReport(name, proc.pid, new.pid, stop_s, start_s, None, killed)
