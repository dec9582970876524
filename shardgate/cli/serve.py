"""The serving processes: ``shardgate up``, ``shardgate gate`` and ``shardgate tablet``.

``up`` runs the gate and every tablet in one process, ``gate`` the gate of a
cluster file, ``tablet`` one shard's tablet; each serves gRPC until a signal::

    shardgate up [--data-dir DIR] [--cluster FILE] [--topo URL] [--host H] [--port P] [--check]
    shardgate gate (--topo URL | --cluster FILE) [--host H] [--port P]
                   [--failover-timeout S] [--health-interval S]
    shardgate tablet (--topo URL | --cluster FILE) --keyspace KS --shard S
                     [--host H] [--port P] [--advertise HOST] [--alias NAME]
                     [--heartbeat S] [--idle-timeout S] [--drain-timeout S]
                     [--metrics-port P]

``gate`` opens no tablet of its own: it finds the ``tablet`` processes of
every shard in the topo store and fails over between them (see
:mod:`shardgate.api.fleet` and ``docs/production.md``).

``up`` without ``--cluster`` runs the embedded default cluster (SQLite files
under the data directory, created the first time; see
:mod:`shardgate.topo.embedded`).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from shardgate.api.client import GateClient
from shardgate.api.fleet import (
    DEFAULT_FAILOVER_TIMEOUT_S,
    DEFAULT_HEALTH_INTERVAL_S,
    open_remote_gate,
)
from shardgate.api.server import serve
from shardgate.api.tablet_service import DEFAULT_IDLE_TIMEOUT_S, serve_tablet_service
from shardgate.cli.common import (
    CLUSTER_FILE_NAME,
    DEFAULT_DATA_DIR,
    add_listen_args,
    format_result,
)
from shardgate.errors import InvalidArgument
from shardgate.gate import Gate
from shardgate.queues.router import queue_options_of
from shardgate.tablet import Tablet
from shardgate.tablet.registry import DEFAULT_HEARTBEAT_S, DRAINING, SERVING, TabletRegistration
from shardgate.topo import write_cluster_file
from shardgate.topo.embedded import (
    COMMERCE_DDL,
    LOOKUP_DDL,
    SEQUENCE_ROWS,
    embedded_topology,
)
from shardgate.topo.local import open_topo
from shardgate.topo.server import TopoServer

#: Seconds in-flight RPCs get to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0
#: Seconds a draining tablet gives open transactions and statements in flight.
DEFAULT_DRAIN_S = 10.0
DEFAULT_TABLET_PORT = 15999


TOPO_HELP = (
    "topo store URL (sqlite:///…, postgresql://…, mysql://…); default: the SQLite store "
    "beside the cluster file (NAME.topo.db), seeded from the file the first time"
)


def add_parsers(commands: Any) -> None:
    """Add the ``up``, ``gate`` and ``tablet`` subcommands to the ``shardgate`` parser."""
    up = commands.add_parser(
        "up", help="run gate and tablets in one process (default: an embedded SQLite cluster)"
    )
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="embedded cluster directory")
    up.add_argument("--cluster", help="serve this cluster file instead of the embedded one")
    up.add_argument("--topo", help=TOPO_HELP)
    add_listen_args(up)
    up.add_argument(
        "--check",
        action="store_true",
        help="set up, run one insert and select through the gate, print them and exit",
    )

    gate = commands.add_parser(
        "gate", help="serve a gate over gRPC that reaches `shardgate tablet` processes")
    gate.add_argument("--cluster", help="cluster file (YAML): seeds its topo store")
    gate.add_argument("--topo", help=TOPO_HELP)
    add_listen_args(gate)
    gate.add_argument("--failover-timeout", type=float, default=DEFAULT_FAILOVER_TIMEOUT_S,
                      help="seconds a statement waits for a shard's new lease holder "
                           f"({DEFAULT_FAILOVER_TIMEOUT_S:.0f})")
    gate.add_argument("--health-interval", type=float, default=DEFAULT_HEALTH_INTERVAL_S,
                      help=f"seconds between tablet health checks ({DEFAULT_HEALTH_INTERVAL_S})")

    tablet = commands.add_parser("tablet", help="serve one shard's tablet over gRPC")
    tablet.add_argument("--cluster", help="cluster file (YAML): seeds its topo store")
    tablet.add_argument("--topo", help=TOPO_HELP)
    tablet.add_argument("--keyspace", required=True)
    tablet.add_argument("--shard", required=True)
    add_listen_args(tablet, port=DEFAULT_TABLET_PORT)
    tablet.add_argument("--advertise", help="host gates dial to reach this tablet "
                                            "(default: --host)")
    tablet.add_argument("--alias", help="the tablet's name in the topo store "
                                        "(default: KEYSPACE-SHARD-<random>)")
    tablet.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus metrics on this port (0: off)")
    tablet.add_argument("--heartbeat", type=float, default=DEFAULT_HEARTBEAT_S,
                        help=f"seconds between topo store heartbeats ({DEFAULT_HEARTBEAT_S})")
    tablet.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                        help="roll back a transaction whose gate has been silent this long "
                             f"(seconds, {DEFAULT_IDLE_TIMEOUT_S:.0f})")
    tablet.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_S,
                        help="on SIGTERM, seconds open transactions and statements in flight "
                             f"get to finish ({DEFAULT_DRAIN_S:.0f})")


def run(args: argparse.Namespace) -> int:
    """Run ``up``, ``gate`` or ``tablet``."""
    match args.command:
        case "up":
            return asyncio.run(_up(args))
        case "gate":
            return asyncio.run(_gate(args))
    return asyncio.run(_tablet(args))


async def _up(args: argparse.Namespace) -> int:
    if args.cluster:
        gate = await _open_gate(args.cluster, args.topo)
    else:
        gate = await _open_embedded(Path(args.data_dir), args.topo)
        cluster_file = (Path(args.data_dir) / CLUSTER_FILE_NAME).resolve()
        print(f"embedded cluster ready: {cluster_file}", flush=True)
    try:
        if args.check:
            return await _check(gate, args.host)
        await _serve_until_signal(gate, args.host, args.port)
        return 0
    finally:
        await gate.close()


async def _gate(args: argparse.Namespace) -> int:
    """A gate with no tablet of its own: it finds tablet processes in the topo store."""
    if not args.cluster and not args.topo:
        raise InvalidArgument("shardgate gate needs --topo URL or --cluster FILE")
    topo = await open_topo(args.cluster, url=args.topo)
    try:
        gate, fleet = await open_remote_gate(topo, owns_topo=False,
                                             health_interval=args.health_interval,
                                             failover_timeout=args.failover_timeout)
    except BaseException:
        await topo.close()
        raise
    try:
        found = len(fleet.roster.live())
        print(f"gate following {topo.location}: {found} tablet(s) registered", flush=True)
        await _serve_until_signal(gate, args.host, args.port)
        return 0
    finally:
        await gate.close()
        await fleet.close()
        await topo.close()


async def _open_gate(cluster: str | None, topo_url: str | None) -> Gate:
    """A gate following the topo store (seeded from ``cluster`` when it is empty)."""
    topo = await open_topo(cluster, url=topo_url)
    try:
        return await Gate.from_topo(topo)
    except BaseException:
        await topo.close()
        raise


async def _open_embedded(data_dir: Path, topo_url: str | None = None) -> Gate:
    """The gate of the embedded cluster in ``data_dir``, created and set up if needed.

    Idempotent: the cluster file is written once and seeds the topo store
    beside it (``cluster.topo.db``); the DDL is ``IF NOT EXISTS`` and the
    sequence rows are inserted only when missing.
    """
    cluster_file = data_dir / CLUSTER_FILE_NAME
    if not cluster_file.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        write_cluster_file(embedded_topology(data_dir), cluster_file)
    gate = await _open_gate(str(cluster_file), topo_url)
    try:
        await _set_up_embedded(gate)
    except BaseException:
        await gate.close()
        raise
    return gate


async def _set_up_embedded(gate: Gate) -> None:
    commerce = gate.session("commerce")
    for ddl in COMMERCE_DDL:
        await gate.execute(commerce, ddl)
    lookup = gate.session("lookup")
    for ddl in LOOKUP_DDL:
        await gate.execute(lookup, ddl)
    for seq in SEQUENCE_ROWS:
        found = await gate.execute(lookup, f"SELECT id FROM {seq} WHERE id = 0")
        if not found.rows:
            await gate.execute(
                lookup, f"INSERT INTO {seq} (id, next_id, cache) VALUES (0, 1, 1000)"
            )


async def _check(gate: Gate, host: str) -> int:
    """One insert and one select through a real gRPC server on a free port.

    Both run in a transaction that is rolled back: the check leaves no row in
    the user's tables (the customer, its lookup row, its sequence value).
    """
    server, port = await serve(gate, host, 0)
    try:
        async with GateClient(f"grpc://{host}:{port}", keyspace="commerce") as client:
            email = f"check-{uuid.uuid4().hex[:12]}@example.com"
            await client.execute("BEGIN")
            try:
                inserted = await client.execute(
                    "INSERT INTO customer (email, name) VALUES (:email, :name)",
                    {"email": email, "name": "shardgate up --check"},
                )
                print(format_result(inserted))
                selected = await client.execute(
                    "SELECT customer_id, email, name FROM customer WHERE email = :email",
                    {"email": email},
                )
                print(format_result(selected))
            finally:
                await client.execute("ROLLBACK")
    finally:
        await server.stop(None)
    if len(selected.rows) != 1:
        print(f"error INTERNAL: expected 1 row back, got {len(selected.rows)}", file=sys.stderr)
        return 1
    print("check passed", flush=True)
    return 0


async def _serve_until_signal(gate: Gate, host: str, port: int) -> None:
    server, bound = await serve(gate, host, port)
    target = f"grpc://{host}:{bound}"
    print(f"shardgate gate listening on {target}", flush=True)
    print(f'try: shardgate sql --target {target} "select * from customer"', flush=True)
    try:
        await _until_signal()
        print("shutting down", flush=True)
    finally:
        await server.stop(SHUTDOWN_GRACE_S)
    print("stopped", flush=True)


async def _until_signal() -> None:
    """Wait for SIGINT or SIGTERM (handled while waiting, not raised)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _tablet(args: argparse.Namespace) -> int:
    """One shard's tablet: serve, register in the topo store, drain on SIGTERM."""
    if not args.cluster and not args.topo:
        raise InvalidArgument("shardgate tablet needs --topo URL or --cluster FILE")
    topo_server = await open_topo(args.cluster, url=args.topo)
    try:
        topo = await topo_server.load_topology()
        shard = topo.keyspace(args.keyspace).shard(args.shard)
        tablet = Tablet.open(args.keyspace, args.shard, shard.url)
        try:
            await _serve_tablet(args, topo_server, tablet)
            return 0
        finally:
            await tablet.close()
    finally:
        await topo_server.close()


async def _serve_tablet(args: argparse.Namespace, topo_server: TopoServer, tablet: Tablet) -> None:
    class _G:  # queue_options_of needs only .vschema
        pass

    g: Any = _G()
    g.vschema = (await topo_server.load_topology()).build_vschema()
    tablet.queues.configure(queue_options_of(g, args.keyspace))
    tablet.queues.start()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host)
    server, port, servicer = await serve_tablet_service(tablet, args.host, args.port,
                                                        idle_timeout=args.idle_timeout)
    alias = args.alias or f"{args.keyspace}-{args.shard}-{uuid.uuid4().hex[:8]}"
    registration = TabletRegistration(
        topo_server.store, tablet, alias, f"{args.advertise or args.host}:{port}",
        heartbeat_s=args.heartbeat,
        health=lambda: DRAINING if servicer.draining else SERVING)
    try:
        await registration.start()
        print(f"shardgate tablet {args.keyspace}/{args.shard} ({alias}) listening on "
              f"grpc://{args.host}:{port}", flush=True)
        await _until_signal()
        print("draining", flush=True)
        await servicer.drain(args.drain_timeout)
    finally:
        await registration.stop()
        await server.stop(1.0)
        await servicer.close()
    print("stopped", flush=True)
