"""``shardgate cluster up`` / ``cluster down``: a production-shaped cluster on one machine.

::

    shardgate cluster up (--cluster FILE | --topo URL) [--dir DIR] [--tablets-per-shard N]
                         [--port P] [--host H]
    shardgate cluster down [--dir DIR]

``up`` starts, as separate processes, ``N`` ``shardgate tablet`` processes
per shard (each registers in the topo store; one of each shard takes the
shard lease, the others stand by) and one ``shardgate gate --topo URL``,
waits until every tablet is registered and the gate listens, and returns.
What it started is in ``DIR/cluster-state.json`` (pids, commands, topo URL,
gate target) and each process logs to ``DIR/logs/<name>.log``. ``down``
sends SIGTERM to each (tablets drain, see ``docs/production.md``), waits,
sends SIGKILL to what is left, and removes the state file.

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
from typing import IO, Any

from shardgate.cli.common import shardgate_command
from shardgate.errors import FailedPrecondition, InvalidArgument, Unavailable
from shardgate.tablet.registry import KIND, TabletRoster
from shardgate.topo.local import open_topo, store_url_for
from shardgate.topo.store import TopoStore

DEFAULT_DIR = ".shardgate-cluster"
STATE_FILE = "cluster-state.json"
#: seconds ``up`` waits for every process to come up
START_TIMEOUT_S = 60.0
#: seconds ``down`` waits after SIGTERM before SIGKILL
STOP_TIMEOUT_S = 20.0


def add_parsers(commands: Any) -> None:
    """Add ``cluster up`` and ``cluster down`` to the ``shardgate`` parser."""
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
    up.add_argument("--port", type=int, default=15991, help="the gate's gRPC port")
    up.add_argument("--http-port", type=int, default=15000,
                    help="the gate's console port (0: off)")
    up.add_argument("--mysql-port", type=int, default=15306,
                    help="the gate's MySQL protocol port (0: off)")
    down = sub.add_parser("down", help="stop what `cluster up` started")
    down.add_argument("--dir", default=DEFAULT_DIR, help="state and logs of `cluster up`")


def run(args: argparse.Namespace) -> int:
    """Run ``cluster up`` or ``cluster down``."""
    if args.cluster_command == "up":
        return asyncio.run(_up(args))
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
    state_dir = Path(args.dir)
    state_path = state_dir / STATE_FILE
    if state_path.exists():
        raise FailedPrecondition(f"{state_path} exists: a cluster runs there; "
                                 f"`shardgate cluster down --dir {state_dir}` first")
    if _port_open(args.host, args.port):
        raise FailedPrecondition(f"port {args.port} is taken: pick another with --port")
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
        with open(logs / "gate.log", "ab") as log:
            started["gate"] = subprocess.Popen(
                shardgate_command("gate", "--topo", topo_url, "--host", args.host,
                                  "--port", str(args.port), "--no-auth",
                                  "--http-port", str(args.http_port),
                                  "--mysql-port", str(args.mysql_port)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _port_open(args.host, args.port):
            if started["gate"].poll() is not None or time.monotonic() > deadline:
                raise FailedPrecondition(f"the gate did not start: see {logs / 'gate.log'}")
            await asyncio.sleep(0.1)
    except BaseException:
        _stop({n: p.pid for n, p in started.items()})
        raise
    finally:
        await server.close()
    target = f"grpc://{args.host}:{args.port}"
    state = {"topo": topo_url, "gate": target,
             "pids": {n: p.pid for n, p in started.items()},
             "commands": {n: list(map(str, p.args)) for n, p in started.items()}}  # type: ignore[arg-type]
    state_path.write_text(json.dumps(state, indent=2))
    print(f"cluster up: {len(started) - 1} tablets ({args.tablets_per_shard} per shard) and a "
          f"gate at {target}; state in {state_path}", flush=True)
    print(f'try: shardgate sql --target {target} "select 1"', flush=True)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _stop(pids: dict[str, int]) -> list[str]:
    """SIGTERM every pid (gate first), SIGKILL survivors; the names that needed SIGKILL."""
    order = sorted(pids, key=lambda n: n != "gate")
    for name in order:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[name], signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(_alive(p) for p in pids.values()):
        time.sleep(0.1)
    killed = []
    for name in order:
        if _alive(pids[name]):
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
