"""``shardgate cluster up`` / ``down`` / ``restart --rolling``: a production-shaped cluster
on one machine.

::

    shardgate cluster up (--cluster FILE | --topo URL) [--dir DIR] [--tablets-per-shard N]
                         [--gates G] [--port P] [--host H]
    shardgate cluster down [--dir DIR]
    shardgate cluster restart --rolling [--dir DIR] [--settle S] [--stop-timeout S]

``up`` starts, as separate processes, ``N`` ``shardgate tablet`` processes
per shard (each registers in the topo store; one of each shard takes the
shard lease, the others stand by) and ``G`` ``shardgate gate --topo URL``
(ports ``P``, ``P+1``, ...), waits until every tablet is registered and the
gates listen, and returns.
What it started is in ``DIR/cluster-state.json`` (pids, commands, topo URL,
gate target) and each process logs to ``DIR/logs/<name>.log``. ``down``
sends SIGTERM to each (tablets drain, see ``docs/production.md``), waits,
sends SIGKILL to what is left, and removes the state file. ``restart
--rolling`` restarts them one at a time with the same command lines
(:mod:`shardgate.workflows.rolling_restart`), updating the state file's pids
after each.

:func:`start_tablet` and :func:`wait_for_tablets` are also what the tests
and ``bench/gate_hop.py`` use to run tablet processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from shardgate.cli.common import shardgate_command
from shardgate.cli.defaults import RESTART_SETTLE_S, RESTART_STOP_TIMEOUT_S
from shardgate.errors import FailedPrecondition, InvalidArgument, Unavailable

if TYPE_CHECKING:  # the topo store and the workflow load when a command runs
    from shardgate.topo.store import TopoStore
    from shardgate.workflows.rolling_restart import ClusterProcess

DEFAULT_DIR = ".shardgate-cluster"
STATE_FILE = "cluster-state.json"
#: seconds ``up`` waits for every process to come up
START_TIMEOUT_S = 60.0
#: seconds ``down`` waits after SIGTERM before SIGKILL
STOP_TIMEOUT_S = 20.0


def add_parsers(commands: Any) -> None:
    """Add ``cluster up``, ``down`` and ``restart`` to the ``shardgate`` parser."""
    cluster = commands.add_parser(
        "cluster", help="start or stop a local production-shaped cluster (separate processes)")
    sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="start tablets (N per shard) and a gate as processes")
    up.add_argument("--cluster", help="cluster file (YAML): seeds the topo store")
    up.add_argument("--topo", help="topo store URL (default: the one beside --cluster)")
    up.add_argument("--dir", default=DEFAULT_DIR, help="state and logs")
    up.add_argument("--tablets-per-shard", type=int, default=2,
                    help="tablet processes per shard (one holds the shard's lease)")
    up.add_argument("--host", default="127.0.0.1", help="listen address of every process")
    up.add_argument("--gates", type=int, default=1,
                    help="gate processes (gate i listens on each port + i)")
    up.add_argument("--port", type=int, default=15991, help="the (first) gate's gRPC port")
    up.add_argument("--http-port", type=int, default=15000,
                    help="the (first) gate's console port (0: off)")
    up.add_argument("--mysql-port", type=int, default=15306,
                    help="the (first) gate's MySQL protocol port (0: off)")
    down = sub.add_parser("down", help="stop what `cluster up` started")
    down.add_argument("--dir", default=DEFAULT_DIR, help="state and logs of `cluster up`")
    restart = sub.add_parser(
        "restart", help="restart what `cluster up` started, one process at a time (--rolling)")
    restart.add_argument("--rolling", action="store_true",
                         help="tablets one at a time (standbys, then a planned lease hand-over), "
                              "then gates one at a time")
    restart.add_argument("--dir", default=DEFAULT_DIR, help="state and logs of `cluster up`")
    restart.add_argument("--settle", type=float, default=RESTART_SETTLE_S,
                         help="seconds to wait after a process is back, so every gate sees it")
    restart.add_argument("--stop-timeout", type=float, default=RESTART_STOP_TIMEOUT_S,
                         help="seconds a process has to exit after SIGTERM before SIGKILL")


def run(args: argparse.Namespace) -> int:
    """Run ``cluster up``, ``down`` or ``restart``."""
    if args.cluster_command == "up":
        return asyncio.run(_up(args))
    if args.cluster_command == "restart":
        return asyncio.run(_restart(args))
    return _down(Path(args.dir))


def start_tablet(
    topo_url: str, keyspace: str, shard: str, alias: str, *,
    log: IO[bytes] | int | None = subprocess.DEVNULL, extra: tuple[str, ...] = (),
    host: str = "127.0.0.1",
) -> subprocess.Popen[bytes]:
    """Start one ``shardgate tablet`` process (on a free port) in a session of its own."""
    cmd = shardgate_command("tablet", "--topo", topo_url, "--keyspace", keyspace,
                            "--shard", shard, "--alias", alias, "--host", host, "--port", "0",
                            "--no-auth", *extra)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


async def wait_for_tablets(
    store: TopoStore, aliases: set[str], *, timeout: float = START_TIMEOUT_S,
    procs: list[subprocess.Popen[bytes]] | None = None,
    lease_holders: set[tuple[str, str]] | None = None,
) -> None:
    """Wait until every alias has a live record (and each shard of ``lease_holders`` a holder).

    FailedPrecondition if one of ``procs`` exits first; Unavailable at ``timeout``.
    """
    from shardgate.tablet.registry import KIND, TabletRoster

    deadline = time.monotonic() + timeout
    while True:
        roster = TabletRoster()
        roster.seed(await store.list_records(KIND))
        live = roster.live()
        have = {r.alias for r in live}
        held = {(r.keyspace, r.shard) for r in live if r.role == "lease_holder"}
        if aliases <= have and (lease_holders is None or lease_holders <= held):
            return
        for p in procs or ():
            if p.poll() is not None:
                raise FailedPrecondition(f"tablet process {p.args!r} exited {p.returncode}")
        if time.monotonic() > deadline:
            raise Unavailable(f"tablets {sorted(aliases - have)} did not register in {timeout} s")
        await asyncio.sleep(0.05)


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


async def _up(args: argparse.Namespace) -> int:
    if not args.cluster and not args.topo:
        raise InvalidArgument("shardgate cluster up needs --cluster FILE or --topo URL")
    if args.tablets_per_shard < 1:
        raise InvalidArgument("--tablets-per-shard must be at least 1")
    if args.gates < 1:
        raise InvalidArgument("--gates must be at least 1")
    state_dir = Path(args.dir)
    state_path = state_dir / STATE_FILE
    if state_path.exists():
        raise FailedPrecondition(f"{state_path} exists: a cluster runs there; "
                                 f"`shardgate cluster down --dir {state_dir}` first")
    gate_ports = [args.port + i for i in range(args.gates)]
    for port in gate_ports:
        if _port_open(args.host, port):
            raise FailedPrecondition(f"port {port} is taken: pick another with --port (gates "
                                     f"listen on {gate_ports[0]}..{gate_ports[-1]})")
    from shardgate.topo.local import open_topo, store_url_for

    topo_url = args.topo or store_url_for(args.cluster)
    server = await open_topo(args.cluster, url=args.topo)
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        topology = await server.load_topology()
        shards = [(ks.name, s.name) for ks in topology.keyspaces.values() for s in ks.shards]
        for ks, shard in shards:
            for i in range(1, args.tablets_per_shard + 1):
                alias = f"{ks}-{shard.replace('-', '_') or '0'}-{i}"
                with open(logs / f"{alias}.log", "ab") as log:
                    started[alias] = start_tablet(topo_url, ks, shard, alias, log=log,
                                                  host=args.host)
        await wait_for_tablets(server.store, set(started), procs=list(started.values()),
                               lease_holders=set(shards))
        for i, port in enumerate(gate_ports):
            name = "gate" if i == 0 else f"gate-{i + 1}"
            with open(logs / f"{name}.log", "ab") as log:
                started[name] = _spawn(shardgate_command(
                    "gate", "--topo", topo_url, "--host", args.host, "--port", str(port),
                    "--no-auth", "--http-port", str(args.http_port and args.http_port + i),
                    "--mysql-port", str(args.mysql_port and args.mysql_port + i)), log)
        deadline = time.monotonic() + START_TIMEOUT_S
        for i, port in enumerate(gate_ports):
            name = "gate" if i == 0 else f"gate-{i + 1}"
            while not _port_open(args.host, port):
                if started[name].poll() is not None or time.monotonic() > deadline:
                    raise FailedPrecondition(f"{name} did not start: see {logs / name}.log")
                await asyncio.sleep(0.1)
    except BaseException:
        _stop({n: p.pid for n, p in started.items()})
        raise
    finally:
        await server.close()
    target = "grpc://" + ",".join(f"{args.host}:{p}" for p in gate_ports)
    state = {"topo": topo_url, "gate": target,
             "pids": {n: p.pid for n, p in started.items()},
             "commands": {n: list(map(str, p.args)) for n, p in started.items()}}  # type: ignore[arg-type]
    state_path.write_text(json.dumps(state, indent=2))
    print(f"cluster up: {len(started) - args.gates} tablets ({args.tablets_per_shard} per shard) "
          f"and {args.gates} gate(s) at {target}; state in {state_path}", flush=True)
    print(f'try: shardgate sql --target {target} "select 1"', flush=True)
    return 0


def _spawn(command: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start one process of the cluster in a session of its own, logging to ``log``."""
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _is_gate(name: str) -> bool:
    return name == "gate" or name.startswith("gate-")


def _stop(pids: dict[str, int]) -> list[str]:
    """SIGTERM every pid (gate first), SIGKILL survivors; the names that needed SIGKILL."""
    from shardgate.workflows.rolling_restart import alive

    order = sorted(pids, key=lambda n: not _is_gate(n))
    for name in order:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[name], signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.1)
    killed = []
    for name in order:
        if alive(pids[name]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[name], signal.SIGKILL)
            killed.append(name)
    return killed


def _down(state_dir: Path) -> int:
    state_path = state_dir / STATE_FILE
    if not state_path.exists():
        raise FailedPrecondition(f"no cluster runs from {state_dir} ({state_path} is missing)")
    state = json.loads(state_path.read_text())
    killed = _stop({str(n): int(p) for n, p in state["pids"].items()})
    state_path.unlink()
    print(f"cluster down: stopped {len(state['pids'])} processes"
          + (f" ({', '.join(killed)} needed SIGKILL)" if killed else ""), flush=True)
    return 0


async def _restart(args: argparse.Namespace) -> int:
    """``cluster restart --rolling``: every process again, one at a time."""
    from shardgate.topo.store import open_topo_store
    from shardgate.workflows.rolling_restart import ClusterProcess, RollingRestart, alive

    if not args.rolling:
        raise InvalidArgument(
            "shardgate cluster restart needs --rolling (one process at a time); to stop "
            "everything at once run `shardgate cluster down` then `shardgate cluster up`")
    state_dir = Path(args.dir)
    state_path = state_dir / STATE_FILE
    if not state_path.exists():
        raise FailedPrecondition(f"no cluster runs from {state_dir} ({state_path} is missing)")
    state = json.loads(state_path.read_text())
    processes = [ClusterProcess(str(n), int(pid), [str(a) for a in state["commands"][n]])
                 for n, pid in state["pids"].items()]
    dead = sorted(p.name for p in processes if not alive(p.pid))
    if dead:
        raise FailedPrecondition(f"processes {dead} are not running: a rolling restart needs "
                                 "the whole cluster up (`cluster down`, then `cluster up`)")

    def start(name: str, command: list[str]) -> int:
        with open(state_dir / "logs" / f"{name}.log", "ab") as log:
            return _spawn(command, log).pid

    def restarted(proc: ClusterProcess) -> None:
        state["pids"][proc.name] = proc.pid  # written at once: the file stays true
        state_path.write_text(json.dumps(state, indent=2))

    store = open_topo_store(state["topo"])
    try:
        report = await RollingRestart(
            store, processes, start, on_restarted=restarted,
            progress=lambda line: print(line, flush=True), settle=args.settle,
            stop_timeout=args.stop_timeout).run()
    finally:
        await store.close()
    for line in report.lines():
        print(line, flush=True)
    return 0
