"""The serving processes: ``shardgate up``, ``shardgate gate`` and ``shardgate tablet``.

``up`` runs the gate and every tablet in one process, ``gate`` the gate of a
cluster file, ``tablet`` one shard's tablet; each serves gRPC until a signal::

    shardgate up [--data-dir DIR] [--cluster FILE] [--host H] [--port P] [--check]
                 [MySQL listener flags]
    shardgate gate --cluster FILE [--host H] [--port P]
                   (--mysql-auth-file FILE | --mysql-no-auth) [MySQL listener flags]
    shardgate tablet --cluster FILE --keyspace KS --shard S [--host H] [--port P]
                     [--metrics-port P]

``up`` without ``--cluster`` runs the embedded default cluster (SQLite files
under the data directory, created the first time; see
:mod:`shardgate.topo.embedded`).

``up`` and ``gate`` also serve the MySQL protocol on ``--mysql-port``
(15306; 0: off), on ``--mysql-host`` (default: ``--host``). MySQL listener
flags: ``--mysql-auth-file`` (Vitess's static users file), ``--mysql-no-auth``
(``gate`` only; loopback only), ``--mysql-tls-cert``/``--mysql-tls-key``,
``--mysql-require-tls``. ``up`` serves loopback clients without a password when
no users file is given; ``gate`` serves MySQL only with a users file or
``--mysql-no-auth`` (without either it says so and serves gRPC alone), and
nothing serves MySQL on a non-loopback address without users.
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
from shardgate.api.mysql import DEFAULT_MYSQL_PORT, MysqlListener, TlsConfig, serve_mysql
from shardgate.api.server import serve
from shardgate.api.tablet_service import serve_tablet
from shardgate.auth.users import StaticUsers
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
from shardgate.topo import load_cluster_file, write_cluster_file
from shardgate.topo.embedded import (
    COMMERCE_DDL,
    LOOKUP_DDL,
    SEQUENCE_ROWS,
    embedded_topology,
)

#: Seconds in-flight RPCs get to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0
DEFAULT_TABLET_PORT = 15999


def add_parsers(commands: Any) -> None:
    """Add the ``up``, ``gate`` and ``tablet`` subcommands to the ``shardgate`` parser."""
    up = commands.add_parser(
        "up", help="run gate and tablets in one process (default: an embedded SQLite cluster)"
    )
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="embedded cluster directory")
    up.add_argument("--cluster", help="serve this cluster file instead of the embedded one")
    add_listen_args(up)
    _add_mysql_args(up, no_auth_flag=False)
    up.add_argument(
        "--check",
        action="store_true",
        help="set up, run one insert and select through the gate, print them and exit",
    )

    gate = commands.add_parser("gate", help="serve the gate of a cluster file over gRPC")
    gate.add_argument("--cluster", required=True, help="cluster file (YAML)")
    add_listen_args(gate)
    _add_mysql_args(gate, no_auth_flag=True)

    tablet = commands.add_parser("tablet", help="serve one shard's tablet over gRPC")
    tablet.add_argument("--cluster", required=True, help="cluster file (YAML)")
    tablet.add_argument("--keyspace", required=True)
    tablet.add_argument("--shard", required=True)
    add_listen_args(tablet, port=DEFAULT_TABLET_PORT)
    tablet.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus metrics on this port (0: off)")


def _add_mysql_args(p: argparse.ArgumentParser, *, no_auth_flag: bool) -> None:
    """The MySQL listener's flags of ``up`` and ``gate``."""
    p.add_argument("--mysql-port", type=int, default=DEFAULT_MYSQL_PORT,
                   help=f"MySQL protocol port ({DEFAULT_MYSQL_PORT}; 0: off)")
    p.add_argument("--mysql-host", help="MySQL listen address (default: --host)")
    p.add_argument("--mysql-auth-file",
                   help="Vitess static users file (JSON) for the MySQL listener")
    if no_auth_flag:
        p.add_argument("--mysql-no-auth", action="store_true",
                       help="serve MySQL clients without a password (loopback addresses only)")
    p.add_argument("--mysql-tls-cert", help="TLS certificate (PEM) for the MySQL listener")
    p.add_argument("--mysql-tls-key", help="TLS private key (PEM) for the MySQL listener")
    p.add_argument("--mysql-require-tls", action="store_true",
                   help="refuse MySQL clients that do not switch to TLS")


def mysql_needs_auth(args: argparse.Namespace) -> bool:
    """True when ``gate`` was given neither users nor ``--mysql-no-auth``: no MySQL listener."""
    return args.command == "gate" and not args.mysql_auth_file and not args.mysql_no_auth


def mysql_options(args: argparse.Namespace) -> tuple[StaticUsers | None, TlsConfig | None]:
    """The users and TLS settings of the MySQL listener, checked against the flags' rules.

    ``up`` serves loopback clients without users; ``gate`` serves MySQL only
    with ``--mysql-auth-file`` or ``--mysql-no-auth`` (see :func:`mysql_needs_auth`);
    neither ever serves a non-loopback address without users.
    """
    users = StaticUsers.load(args.mysql_auth_file) if args.mysql_auth_file else None
    if bool(args.mysql_tls_cert) != bool(args.mysql_tls_key):
        raise InvalidArgument("--mysql-tls-cert and --mysql-tls-key go together")
    if args.mysql_require_tls and not args.mysql_tls_cert:
        raise InvalidArgument("--mysql-require-tls needs --mysql-tls-cert and --mysql-tls-key")
    tls = TlsConfig(args.mysql_tls_cert, args.mysql_tls_key, args.mysql_require_tls) \
        if args.mysql_tls_cert else None
    return users, tls


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
        gate = Gate.open(load_cluster_file(args.cluster))
    else:
        gate = await _open_embedded(Path(args.data_dir))
        cluster_file = (Path(args.data_dir) / CLUSTER_FILE_NAME).resolve()
        print(f"embedded cluster ready: {cluster_file}", flush=True)
    try:
        if args.check:
            return await _check(gate, args.host)
        await _serve_until_signal(gate, args)
        return 0
    finally:
        await gate.close()


async def _gate(args: argparse.Namespace) -> int:
    mysql_options(args)  # flags checked before anything opens
    gate = Gate.open(load_cluster_file(args.cluster))
    try:
        await _serve_until_signal(gate, args)
        return 0
    finally:
        await gate.close()


async def _open_embedded(data_dir: Path) -> Gate:
    """The gate of the embedded cluster in ``data_dir``, created and set up if needed.

    Idempotent: the cluster file is written once; the DDL is ``IF NOT EXISTS``
    and the sequence rows are inserted only when missing.
    """
    cluster_file = data_dir / CLUSTER_FILE_NAME
    if cluster_file.exists():
        topology = load_cluster_file(cluster_file)
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        topology = embedded_topology(data_dir)
    gate = Gate.open(topology)
    try:
        await _set_up_embedded(gate)
    except BaseException:
        await gate.close()
        raise
    if not cluster_file.exists():
        write_cluster_file(topology, cluster_file)
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


async def _serve_until_signal(gate: Gate, args: argparse.Namespace) -> None:
    """Serve MySQL (when on), then gRPC, until a signal: once the gRPC port answers,
    both listeners are up."""
    users, tls = mysql_options(args)
    host = args.host
    listener: MysqlListener | None = None
    mysql_line = ""
    if args.mysql_port and mysql_needs_auth(args):
        mysql_line = ("MySQL listener off: shardgate gate serves MySQL clients only with "
                      "--mysql-auth-file FILE or --mysql-no-auth (loopback only)")
    elif args.mysql_port:
        mysql_host = args.mysql_host or host
        listener, mysql_port = await serve_mysql(gate, mysql_host, args.mysql_port,
                                                 users=users, tls=tls)
        mysql_line = (f"shardgate MySQL listener on {mysql_host}:{mysql_port}\n"
                      f"try: mariadb -h {mysql_host} -P {mysql_port} -u root commerce "
                      '-e "select * from customer"')
    try:
        server, bound = await serve(gate, host, args.port)
        try:
            target = f"grpc://{host}:{bound}"
            print(f"shardgate gate listening on {target}", flush=True)
            print(f'try: shardgate sql --target {target} "select * from customer"', flush=True)
            if mysql_line:
                print(mysql_line, flush=True)
            await _until_signal()
            print("shutting down", flush=True)
        finally:
            await server.stop(SHUTDOWN_GRACE_S)
    finally:
        if listener is not None:
            await listener.stop()
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
    topo = load_cluster_file(args.cluster)
    shard = topo.keyspace(args.keyspace).shard(args.shard)
    tablet = Tablet.open(args.keyspace, args.shard, shard.url)
    try:
        vschema = topo.build_vschema()

        class _G:  # queue_options_of needs only .vschema
            pass

        g: Any = _G()
        g.vschema = vschema
        tablet.queues.configure(queue_options_of(g, args.keyspace))
        tablet.queues.start()
        if args.metrics_port:
            start_http_server(args.metrics_port, addr=args.host)
        server, port = await serve_tablet(tablet, args.host, args.port)
        print(f"shardgate tablet {args.keyspace}/{args.shard} listening on "
              f"grpc://{args.host}:{port}", flush=True)
        await _until_signal()
        await server.stop(2.0)
        return 0
    finally:
        await tablet.close()
