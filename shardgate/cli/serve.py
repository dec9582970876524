"""The serving processes: ``shardgate up``, ``shardgate gate`` and ``shardgate tablet``.

``up`` runs the gate and every tablet in one process, ``gate`` the gate of a
cluster file, ``tablet`` one shard's tablet; each serves gRPC until a signal::

    shardgate up [--data-dir DIR] [--cluster FILE] [--topo URL] [--host H] [--port P] [--check]
                 [security flags] [--acl-file F [--acl-dry-run]] [LIMITS] [--drain-timeout S]
                 [MySQL listener flags]
    shardgate gate (--topo URL | --cluster FILE) [--host H] [--port P]
                   (--users-file F | --tls-ca CA | --no-auth) [security flags]
                   [--acl-file F [--acl-dry-run]] [LIMITS]
                   [MySQL listener flags] [--failover-timeout S] [--health-interval S]
                   [--drain-timeout S] [--workers N]
    shardgate tablet (--topo URL | --cluster FILE) --keyspace KS --shard S
                     [--host H] [--port P] [--advertise HOST] [--alias NAME]
                     [--heartbeat S] [--idle-timeout S] [--drain-timeout S]
                     [--http-port P] (--users-file F | --tls-ca CA | --no-auth)
                     [--allow-user NAME ...] [security flags]
                     [--max-result-rows N] [--max-result-bytes N] [--pool-timeout S]
                     [--transaction-cap N] [--transaction-cap-per-user F]

``gate`` has no tablets of its own: it finds the tablet processes of every
shard in the topo store (see ``docs/production.md``); ``up`` runs gate and
tablets in one process.

Each command first checks every port it will listen on and names all the taken
ones with their flags in one ``UNAVAILABLE`` error, before it sets up or prints
anything (:mod:`shardgate.cli.listen_ports`).

Security flags: ``--users-file F`` (callers' users, Vitess's static file),
``--tls-cert F --tls-key F`` (serve TLS; reloaded when the files change),
``--tls-ca F`` (require client certificates signed by it: mTLS, the
certificate's common name is the caller), ``--insecure-bind-anyway`` (listen
on a non-loopback address without TLS and authentication). ``up`` serves
without authentication on loopback unless given a users file or a CA; ``gate``
and ``tablet`` need ``--no-auth`` for that (see :mod:`shardgate.auth.listen`).

LIMITS are ``--transaction-timeout S``, ``--session-idle-timeout S``,
``--query-timeout S``, ``--max-result-rows N``, ``--max-result-bytes N`` and
``--pool-timeout S`` (see :mod:`shardgate.gate.limits`; 0 turns one off).
``up`` and ``tablet`` also take ``--transaction-cap N`` (transactions open at
once per shard, 20) and ``--transaction-cap-per-user F`` (one user's share of
it: a fraction below 1 or a count; 0, the default: none).

``gate`` opens no tablet of its own: it finds the ``tablet`` processes of
every shard in the topo store and fails over between them (see
:mod:`shardgate.gate.fleet` and ``docs/production.md``).

On SIGTERM (or SIGINT) ``up`` and ``gate`` drain before they stop: new calls are
refused ``UNAVAILABLE`` "gate draining" (clients send them again, to another gate
when they name several), open transactions get ``--drain-timeout`` seconds to end
(then they are rolled back and answered ``ABORTED``); see
:mod:`shardgate.api.grpc.gate_drain`.

``gate --workers N`` runs N gate processes sharing the ports under a supervisor
(see :mod:`shardgate.cli.workers`). ``up`` has no ``--workers``: its tablets
(shard leases, queue managers) live in its process and must not run N times.

``up`` without ``--cluster`` runs the embedded default cluster (SQLite files
under the data directory, created the first time; see
:mod:`shardgate.topo.embedded`).

``up`` and ``gate`` also serve the MySQL protocol on ``--mysql-port``
(15306; 0: off), on ``--mysql-host`` (default: ``--host``), with the same
users as gRPC (``--users-file``; ``up`` and ``gate --no-auth`` serve loopback
clients without a password) and its own TLS (``--mysql-tls-cert``/
``--mysql-tls-key``, ``--mysql-require-tls``). Nothing serves MySQL on a
non-loopback address without users.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import signal
import sys
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from shardgate.aio import wait_for
from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.gate_drain import GateDrain
from shardgate.api.grpc.remote_gate import open_remote_gate
from shardgate.api.grpc.security import ServerSecurity, TLSFiles
from shardgate.api.grpc.server import serve
from shardgate.api.grpc.tablet_service import DEFAULT_IDLE_TIMEOUT_S, serve_tablet_service
from shardgate.api.http import HttpServer
from shardgate.api.http.tablet import serve_tablet_http
from shardgate.api.mysql import DEFAULT_MYSQL_PORT, MysqlListener, TlsConfig, serve_mysql
from shardgate.auth import StaticUsers
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED
from shardgate.auth.listen import INSECURE_FLAG, check_listen
from shardgate.backends._pool import DEFAULT_POOL_TIMEOUT_S
from shardgate.cli.common import (
    CLUSTER_FILE_NAME,
    DEFAULT_DATA_DIR,
    add_listen_args,
    add_tablet_client_args,
    format_result,
    tablet_credentials,
)
from shardgate.cli.listen_ports import Listener, check_free
from shardgate.cli.workers import PARENT_CHECK_S, check_count, parse_slot, supervise
from shardgate.errors import FailedPrecondition, InvalidArgument, Unavailable
from shardgate.gate import Gate, worker
from shardgate.gate.fleet import DEFAULT_FAILOVER_TIMEOUT_S, DEFAULT_HEALTH_INTERVAL_S
from shardgate.gate.limits import (
    DEFAULT_SESSION_IDLE_TIMEOUT_S,
    DEFAULT_TRANSACTION_TIMEOUT_S,
    SERVER_QUERY_TIMEOUT_MS,
    GateLimits,
)
from shardgate.queues.router import queue_options_of
from shardgate.result import DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_RESULT_ROWS, ResultLimits
from shardgate.tablet import Tablet
from shardgate.tablet.lease import hurry_all
from shardgate.tablet.registry import DEFAULT_HEARTBEAT_S, DRAINING, SERVING, TabletRegistration
from shardgate.tablet.retire import until_retired
from shardgate.tablet.tablet import DEFAULT_TRANSACTION_CAP
from shardgate.topo import write_cluster_file
from shardgate.topo.embedded import (
    COMMERCE_DDL,
    LOOKUP_DDL,
    SEQUENCE_ROWS,
    embedded_topology,
)
from shardgate.topo.local import open_topo
from shardgate.topo.server import TopoServer

#: Seconds in-flight RPCs get to finish on shutdown (after a gate's drain: none of them
#: in a transaction).
SHUTDOWN_GRACE_S = 5.0
#: Seconds a draining tablet gives open transactions and statements in flight; a
#: draining gate, open transactions.
DEFAULT_DRAIN_S = 10.0
DEFAULT_TABLET_PORT = 15999


TOPO_HELP = (
    "topo store URL (sqlite:///…, postgresql://…, mysql://…, etcd://HOST:PORT/prefix); "
    "default: the SQLite store "
    "beside the cluster file (NAME.topo.db), seeded from the file the first time"
)


DEFAULT_HTTP_PORT = 15000


def add_http_arg(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument("--http-port", type=int, default=default,
                   help="console, /debug and /metrics over HTTP on this port (0: off)")


#: ``--event-loop`` choices: uvloop when installed (``pip install 'shardgate[fast]'``)
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def add_event_loop_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                   help="the event loop serving calls: uvloop costs gRPC about a quarter less "
                   "CPU per call (docs/operations.md); auto (default): uvloop when installed")


def run_loop(main: Coroutine[Any, Any, int], kind: str = "auto") -> int:
    """Run ``main`` on the event loop ``kind`` asks for (see :data:`EVENT_LOOPS`)."""
    if kind != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            if kind == "uvloop":
                main.close()
                raise FailedPrecondition(
                    "--event-loop uvloop: uvloop is not installed "
                    "(pip install 'shardgate[fast]')") from None
        else:
            result: int = uvloop.run(main)
            return result
    return asyncio.run(main)


def add_parsers(commands: Any) -> None:
    """Add the ``up``, ``gate`` and ``tablet`` subcommands to the ``shardgate`` parser."""
    up = commands.add_parser(
        "up", help="run gate and tablets in one process (default: an embedded SQLite cluster)"
    )
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                    help="directory of the embedded cluster (created the first time)")
    up.add_argument("--cluster", help="serve this cluster file instead of the embedded one")
    up.add_argument("--topo", help=TOPO_HELP)
    add_listen_args(up)
    add_event_loop_arg(up)
    _add_security_args(up, no_auth_flag=False)
    _add_acl_args(up)
    add_http_arg(up, DEFAULT_HTTP_PORT)
    _add_mysql_args(up)
    up.add_argument(
        "--check",
        action="store_true",
        help="set up, run one insert and select through the gate, print them and exit",
    )
    _add_gate_limits(up)
    _add_gate_drain(up)
    _add_transaction_caps(up)

    gate = commands.add_parser(
        "gate", help="serve a gate over gRPC that reaches `shardgate tablet` processes")
    gate.add_argument("--cluster", help="cluster file (YAML): seeds its topo store")
    gate.add_argument("--topo", help=TOPO_HELP)
    add_listen_args(gate)
    add_event_loop_arg(gate)
    _add_security_args(gate, no_auth_flag=True)
    _add_acl_args(gate)
    _add_gate_limits(gate)
    _add_gate_drain(gate)
    add_http_arg(gate, DEFAULT_HTTP_PORT)
    _add_mysql_args(gate)
    add_tablet_client_args(gate)
    gate.add_argument("--failover-timeout", type=float, default=DEFAULT_FAILOVER_TIMEOUT_S,
                      help="seconds a statement waits for a shard's new lease holder")
    gate.add_argument("--health-interval", type=float, default=DEFAULT_HEALTH_INTERVAL_S,
                      help="seconds between tablet health checks")
    gate.add_argument("--via-tablets", action="store_true",
                      help="send every statement to the tablets (by default the gate runs "
                      "autocommit SELECTs and writes of plain tables on the shard databases "
                      "itself, found by their URLs in the topo store)")
    gate.add_argument("--workers", type=int, default=1, metavar="N",
                      help="serve with N gate processes sharing the ports (SO_REUSEPORT), "
                      "under a supervisor; 1 (the default): this process serves")
    gate.add_argument("--worker-slot", help=argparse.SUPPRESS)  # I/N: set by the supervisor

    tablet = commands.add_parser("tablet", help="serve one shard's tablet over gRPC")
    tablet.add_argument("--cluster", help="cluster file (YAML): seeds its topo store")
    tablet.add_argument("--topo", help=TOPO_HELP)
    tablet.add_argument("--keyspace", required=True, help="keyspace of the shard to serve")
    tablet.add_argument("--shard", required=True, help="the shard to serve (-80, 80-, ...)")
    add_listen_args(tablet, port=DEFAULT_TABLET_PORT)
    add_event_loop_arg(tablet)
    add_http_arg(tablet, 0)
    _add_security_args(tablet, no_auth_flag=True)
    tablet.add_argument("--allow-user", action="append", metavar="NAME",
                        help="only this caller (a gate's user or certificate name) may call; "
                        "repeat for several (default: anyone the users file or CA admits)")

    tablet.add_argument("--advertise", help="host gates dial to reach this tablet "
                                            "(default: --host)")
    tablet.add_argument("--alias", help="the tablet's name in the topo store "
                                        "(default: KEYSPACE-SHARD-<random>)")
    tablet.add_argument("--heartbeat", type=float, default=DEFAULT_HEARTBEAT_S,
                        help="seconds between topo store heartbeats")
    tablet.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                        help="roll back a transaction whose gate has been silent this many "
                             "seconds")
    tablet.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_S,
                        help="on SIGTERM, seconds open transactions and statements in flight "
                             "get to finish")
    _add_result_limits(tablet)
    _add_transaction_caps(tablet)


def _add_gate_drain(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_S,
                        help="on SIGTERM, seconds open transactions get to finish (new "
                             "work is refused UNAVAILABLE 'gate draining'); then they are "
                             "rolled back (ABORTED) and the gate stops")


def _add_transaction_caps(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transaction-cap", type=int, default=DEFAULT_TRANSACTION_CAP, metavar="N",
        help="transactions open at once per shard (Vitess's "
        "--queryserver-config-transaction-cap); the pool holds N connections for them and "
        "a few more for autocommit statements (default %(default)s)")
    parser.add_argument(
        "--transaction-cap-per-user", type=float, default=0.0, metavar="F",
        help="one user's share of --transaction-cap per shard: a fraction (0.4) or a count "
        "(5); its next BEGIN fails at once with RESOURCE_EXHAUSTED (Vitess's transaction "
        "limiter; default 0: no per-user cap)")


def _add_result_limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-result-rows", type=int, default=DEFAULT_MAX_RESULT_ROWS,
                        metavar="N", help="refuse Execute results with more rows "
                        "(StreamExecute is not limited; default %(default)s; 0: none)")
    parser.add_argument("--max-result-bytes", type=int, default=DEFAULT_MAX_RESULT_BYTES,
                        metavar="N", help="refuse Execute results larger than this "
                        "(estimated; default %(default)s; 0: none)")
    parser.add_argument("--pool-timeout", type=float, default=DEFAULT_POOL_TIMEOUT_S,
                        metavar="S", help="how long a statement waits for a shard "
                        "connection before RESOURCE_EXHAUSTED (default %(default)s)")


def _add_gate_limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transaction-timeout", type=float, default=DEFAULT_TRANSACTION_TIMEOUT_S, metavar="S",
        help="roll back transactions open longer than S seconds (default %(default)s; 0: never)")
    parser.add_argument(
        "--session-idle-timeout", type=float, default=DEFAULT_SESSION_IDLE_TIMEOUT_S,
        metavar="S", help="forget sessions unused for S seconds (default %(default)s; 0: never)")
    parser.add_argument(
        "--query-timeout", type=float, default=None, metavar="S",
        help="cancel statements running longer than S seconds (decimals allowed: 0.25); "
        "sessions change it with SET query_timeout_ms = N (default "
        f"{SERVER_QUERY_TIMEOUT_MS / 1000:g}; 0: none)")
    # the flag's name before every duration was in seconds: still taken, no longer shown
    parser.add_argument("--query-timeout-ms", type=int, default=None, help=argparse.SUPPRESS)
    _add_result_limits(parser)


def _query_timeout_ms(args: argparse.Namespace) -> int:
    """``--query-timeout S`` (or the older ``--query-timeout-ms N``) in milliseconds."""
    if args.query_timeout is not None and args.query_timeout_ms is not None:
        raise InvalidArgument("give --query-timeout S (seconds) or the older "
                              "--query-timeout-ms N, not both")
    if args.query_timeout_ms is not None:
        return int(args.query_timeout_ms)
    if args.query_timeout is not None:
        return round(float(args.query_timeout) * 1000)
    return SERVER_QUERY_TIMEOUT_MS


def gate_limits(args: argparse.Namespace) -> GateLimits:
    """The gate limits the command line asks for."""
    return GateLimits(
        transaction_timeout_s=args.transaction_timeout or None,
        session_idle_timeout_s=args.session_idle_timeout or None,
        query_timeout_ms=_query_timeout_ms(args),
        result_limits=ResultLimits(args.max_result_rows, args.max_result_bytes),
        pool_timeout_s=args.pool_timeout,
        transaction_cap=getattr(args, "transaction_cap", DEFAULT_TRANSACTION_CAP),
        transaction_cap_per_user=getattr(args, "transaction_cap_per_user", 0.0),
    )

def _add_security_args(p: argparse.ArgumentParser, *, no_auth_flag: bool) -> None:
    p.add_argument("--users-file", help="users allowed to call (Vitess static auth JSON)")
    p.add_argument("--tls-cert", help="serve TLS with this certificate (PEM)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument("--tls-ca", help="require client certificates signed by this CA (mTLS)")
    if no_auth_flag:
        p.add_argument("--no-auth", action="store_true",
                       help="serve without authentication (loopback addresses only)")
    p.add_argument(INSECURE_FLAG, dest="insecure_bind_anyway", action="store_true",
                   help="DANGEROUS: listen on a non-loopback address without TLS and "
                   "authentication")


def _add_acl_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--acl-file", help="table ACLs (Vitess table_groups JSON); a bad file "
                   "stops the start")
    p.add_argument("--acl-dry-run", action="store_true",
                   help="check the ACLs but only count and log denials")


def server_security(args: argparse.Namespace) -> ServerSecurity:
    """The listener's security from its flags (files read and checked here)."""
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        tls = TLSFiles(
            cert=Path(args.tls_cert) if args.tls_cert else None,
            key=Path(args.tls_key) if args.tls_key else None,
            ca=Path(args.tls_ca) if args.tls_ca else None,
        )
    users = StaticUsers.load(args.users_file) if args.users_file else None
    allowed = getattr(args, "allow_user", None)
    return ServerSecurity(users=users, tls=tls,
                          allowed_users=frozenset(allowed) if allowed else None)


def _guard(args: argparse.Namespace) -> Guard:
    """The gate's guard: with ``--acl-file`` its table ACLs (strict: a bad file raises)."""
    if args.acl_dry_run and not args.acl_file:
        raise InvalidArgument("--acl-dry-run needs --acl-file")
    acl = TableACL.load(args.acl_file) if args.acl_file else None
    return Guard(acl, dry_run=args.acl_dry_run)



def _add_mysql_args(p: argparse.ArgumentParser) -> None:
    """The MySQL listener's flags of ``up`` and ``gate``."""
    p.add_argument("--mysql-port", type=int, default=DEFAULT_MYSQL_PORT,
                   help="MySQL protocol port (0: off)")
    p.add_argument("--mysql-host", help="MySQL listen address (default: --host)")
    p.add_argument("--mysql-tls-cert", help="TLS certificate (PEM) for the MySQL listener")
    p.add_argument("--mysql-tls-key", help="TLS private key (PEM) for the MySQL listener")
    p.add_argument("--mysql-require-tls", action="store_true",
                   help="refuse MySQL clients that do not switch to TLS")


def mysql_tls(args: argparse.Namespace) -> TlsConfig | None:
    """The MySQL listener's TLS from its flags (checked before anything opens).

    Its users are the gRPC listener's (``--users-file``); ``up`` and ``gate
    --no-auth`` serve loopback clients without them, and nothing serves a
    non-loopback address without users.
    """
    if bool(args.mysql_tls_cert) != bool(args.mysql_tls_key):
        raise InvalidArgument("--mysql-tls-cert and --mysql-tls-key go together")
    if args.mysql_require_tls and not args.mysql_tls_cert:
        raise InvalidArgument("--mysql-require-tls needs --mysql-tls-cert and --mysql-tls-key")
    return TlsConfig(args.mysql_tls_cert, args.mysql_tls_key, args.mysql_require_tls) \
        if args.mysql_tls_cert else None


def run(args: argparse.Namespace) -> int:
    """Run ``up``, ``gate`` or ``tablet``."""
    match args.command:
        case "up":
            return run_loop(_up(args), args.event_loop)
        case "gate":
            check_count(args.workers)
            if args.workers > 1:
                return asyncio.run(_supervise(args))
            return run_loop(_gate(args), args.event_loop)
    return run_loop(_tablet(args), args.event_loop)


async def _up(args: argparse.Namespace) -> int:
    security, guard = server_security(args), _guard(args)
    if not args.check:  # every port first: nothing set up or printed when one is taken
        check_free(gate_listeners(args))
    if args.cluster or args.topo:
        gate = await _open_gate(args.cluster, args.topo, guard, gate_limits(args))
    else:
        gate = await _open_embedded(Path(args.data_dir), args.topo, guard, gate_limits(args))
        cluster_file = (Path(args.data_dir) / CLUSTER_FILE_NAME).resolve()
        print(f"embedded cluster ready: {cluster_file}", flush=True)
    try:
        if args.check:
            # the embedded default's sequences get back the block the check drew from
            return await _check(gate, give_back=not (args.cluster or args.topo))
        # `up` is the laptop mode: it asks for no authentication (loopback only).
        await _serve_until_signal(gate, args, security, no_auth=True)
        return 0
    finally:
        await gate.close()


def gate_listeners(args: argparse.Namespace) -> list[Listener]:
    """The gRPC, MySQL and console listeners ``up`` / ``gate`` will open (flag, host, port)."""
    ports = [("--port", args.host, args.port)]
    if args.mysql_port:
        ports.append(("--mysql-port", args.mysql_host or args.host, args.mysql_port))
    if args.http_port:
        ports.append(("--http-port", args.host, args.http_port))
    return ports


async def _supervise(args: argparse.Namespace) -> int:
    """``gate --workers N``: check everything a worker would, seed the topo store once,
    then run N workers sharing the ports (see :mod:`shardgate.cli.workers`)."""
    if not args.cluster and not args.topo:
        raise InvalidArgument("shardgate gate needs --topo URL or --cluster FILE")
    mysql_tls(args)
    security = server_security(args)
    _guard(args)
    check_listen(args.host, tls=security.tls is not None, auth=security.authenticates,
                 no_auth=args.no_auth, insecure=args.insecure_bind_anyway, what="gate")
    topo = await open_topo(args.cluster, url=args.topo)  # seeds it from --cluster once
    await topo.close()
    ports = gate_listeners(args)
    check_free(ports)
    argv = getattr(args, "argv", None) or sys.argv[1:]
    return await supervise(argv, args.workers, ports)


async def _gate(args: argparse.Namespace) -> int:
    """A gate with no tablet of its own: it finds tablet processes in the topo store.

    With ``--worker-slot`` (set by ``--workers N``'s supervisor) it is one worker:
    its listeners share their ports and it stops when its supervisor is gone.
    """
    if not args.cluster and not args.topo:
        raise InvalidArgument("shardgate gate needs --topo URL or --cluster FILE")
    mysql_tls(args)  # flags checked before anything opens
    security, guard = server_security(args), _guard(args)
    slot = parse_slot(args.worker_slot) if args.worker_slot else None
    if slot is not None:
        worker.set_worker(*slot)
    else:  # (a worker shares its supervisor's ports)
        check_free(gate_listeners(args))
    topo = await open_topo(args.cluster, url=args.topo)
    try:
        gate, fleet = await open_remote_gate(topo, owns_topo=False,
                                             health_interval=args.health_interval,
                                             failover_timeout=args.failover_timeout,
                                             guard=guard, limits=gate_limits(args),
                                             tablet_security=tablet_credentials(args),
                                             direct_statements=not args.via_tablets)
    except BaseException:
        await topo.close()
        raise
    try:
        found = len(fleet.roster.live())
        print(f"gate following {topo.location}: {found} tablet(s) registered", flush=True)
        await _serve_until_signal(gate, args, security, no_auth=args.no_auth,
                                  reuse_port=slot is not None,
                                  parent=os.getppid() if slot is not None else None)
        return 0
    finally:
        await gate.close()
        await fleet.close()
        await topo.close()


async def _open_gate(cluster: str | None, topo_url: str | None, guard: Guard | None,
                     limits: GateLimits | None = None) -> Gate:
    """A gate following the topo store (seeded from ``cluster`` when it is empty)."""
    topo = await open_topo(cluster, url=topo_url)
    try:
        return await Gate.from_topo(topo, guard=guard, limits=limits)
    except BaseException:
        await topo.close()
        raise


async def _open_embedded(
    data_dir: Path, topo_url: str | None = None, guard: Guard | None = None,
    limits: GateLimits | None = None,
) -> Gate:
    """The gate of the embedded cluster in ``data_dir``, created and set up if needed.

    Idempotent: the cluster file is written once and seeds the topo store
    beside it (``cluster.topo.db``); the DDL is ``IF NOT EXISTS`` and the
    sequence rows are inserted only when missing.
    """
    cluster_file = data_dir / CLUSTER_FILE_NAME
    if not cluster_file.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        write_cluster_file(embedded_topology(data_dir), cluster_file)
    gate = await _open_gate(str(cluster_file), topo_url, guard, limits)
    try:
        await _set_up_embedded(gate)
    except BaseException:
        await gate.close()
        raise
    return gate


async def _set_up_embedded(gate: Gate) -> None:
    commerce = gate.session("commerce", identity=TRUSTED)
    for ddl in COMMERCE_DDL:
        await gate.execute(commerce, ddl)
    lookup = gate.session("lookup", identity=TRUSTED)
    for ddl in LOOKUP_DDL:
        await gate.execute(lookup, ddl)
    for seq in SEQUENCE_ROWS:
        found = await gate.execute(lookup, f"SELECT id FROM {seq} WHERE id = 0")
        if not found.rows:
            await gate.execute(
                lookup, f"INSERT INTO {seq} (id, next_id, cache) VALUES (0, 1, 1000)"
            )


async def _check(gate: Gate, *, give_back: bool = False) -> int:
    """One insert and one select through a real gRPC server on a free port.

    Both run in a transaction that is rolled back: the check leaves no row in
    the user's tables (the customer, its lookup row). The sequence block the
    insert drew (committed on its own, as sequences are) is given back with
    ``give_back`` (the embedded default), so a fresh cluster's first customer
    is still 1.
    """
    before = await _sequence_positions(gate) if give_back else {}
    host = "127.0.0.1"
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
    await _give_back_blocks(gate, before)
    if len(selected.rows) != 1:
        print(f"error INTERNAL: expected 1 row back, got {len(selected.rows)}", file=sys.stderr)
        return 1
    print("check passed", flush=True)
    return 0


async def _sequence_positions(gate: Gate) -> dict[str, int]:
    """The next value of each sequence of the embedded default (its ``lookup`` shard)."""
    client = gate.tablets[("lookup", gate.topology.keyspace("lookup").shards[0].name)]
    found = {}
    for seq in SEQUENCE_ROWS:
        res = await client.execute(f"SELECT next_id FROM {seq} WHERE id = 0", [])
        if res.rows:
            found[seq] = int(res.rows[0][0])
    return found


async def _give_back_blocks(gate: Gate, before: dict[str, int]) -> None:
    """Set each sequence back to ``before`` unless something else drew from it since
    (compare-and-swap on the value this process's block left: another gate's block
    would have moved it further)."""
    if not before:
        return
    client = gate.tablets[("lookup", gate.topology.keyspace("lookup").shards[0].name)]
    ph = client.placeholder
    after = await _sequence_positions(gate)
    for seq, old in before.items():
        now = after.get(seq, old)
        if now != old:
            await client.execute(f"UPDATE {seq} SET next_id = {ph} WHERE id = 0 AND next_id = {ph}",
                                 [old, now])


async def _serve_until_signal(
    gate: Gate, args: argparse.Namespace, security: ServerSecurity, *, no_auth: bool,
    reuse_port: bool = False, parent: int | None = None,
) -> None:
    """Serve MySQL (when on), the console (when on), then gRPC, until a signal: once
    the gRPC port answers, every listener is up.

    ``reuse_port``: share the ports with the other workers; ``parent``: also stop
    when this process (the workers' supervisor) is gone.
    """
    tls = mysql_tls(args)
    users = security.users
    if not reuse_port:  # one gate process: its shards' leases held from the start, not per
        gate.compete_for_leases()  # queue (workers front tablet processes, which hold them)
    host = args.host
    # the gRPC listener's rules first: the MySQL and HTTP listeners follow the same users
    check_listen(host, tls=security.tls is not None, auth=security.authenticates,
                 no_auth=no_auth, insecure=args.insecure_bind_anyway, what="gate")
    listener: MysqlListener | None = None
    console: HttpServer | None = None
    mysql_line = ""
    if args.mysql_port:
        mysql_host = args.mysql_host or host
        listener, mysql_port = await serve_mysql(gate, mysql_host, args.mysql_port,
                                                 users=users, tls=tls,
                                                 **({"reuse_port": True} if reuse_port else {}))
        mysql_line = (f"shardgate MySQL listener on {mysql_host}:{mysql_port}\n"
                      f"try: mariadb -h {mysql_host} -P {mysql_port} -u app commerce "
                      '-e "select * from customer"')
    try:
        if args.http_port:
            console = HttpServer(gate, host, args.http_port, users=users, reuse_port=reuse_port)
            try:
                http_bound = await console.start()
            except OSError as exc:
                raise Unavailable(
                    f"cannot listen on {host}:{args.http_port} for the console: "
                    f"{exc.strerror}; pass --http-port N (0: no console)") from exc
        drain = GateDrain(gate, f"the gate at {host}:{args.port}")
        server, bound = await serve(gate, host, args.port, security=security, no_auth=no_auth,
                                    insecure=args.insecure_bind_anyway, reuse_port=reuse_port,
                                    drain=drain)
        try:
            scheme = "grpcs" if security.tls is not None else "grpc"
            target = f"{scheme}://{host}:{bound}"
            if console is not None:
                print(f"shardgate console on http://{host}:{http_bound}/", flush=True)
            print(f"shardgate gate listening on {target}", flush=True)
            print(f'try: shardgate sql --target {target} "select * from customer"', flush=True)
            if mysql_line:
                print(mysql_line, flush=True)
            await _until_signal(parent)
            print("draining", flush=True)
            drained = await drain.run(args.drain_timeout)
            print(f"drained in {drained.seconds:.2f} s ({drained.open_at_start} open "
                  f"transaction(s) at the start, {drained.ended} rolled back, "
                  f"{drained.refused} call(s) refused); shutting down", flush=True)
        finally:
            await server.stop(SHUTDOWN_GRACE_S)
    finally:
        if console is not None:
            await console.stop()
        if listener is not None:
            await listener.stop()
    print("stopped", flush=True)


async def _until_signal(parent: int | None = None) -> None:
    """Wait for SIGINT or SIGTERM (handled while waiting, not raised), or until
    ``parent`` is no longer this process's parent (it died)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if parent is None:
            await stop.wait()
        while not stop.is_set() and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await wait_for(stop.wait(), PARENT_CHECK_S)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _first(*aws: Coroutine[Any, Any, Any]) -> Any:
    """The result of whichever of ``aws`` ends first; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _tablet(args: argparse.Namespace) -> int:
    """One shard's tablet: serve, register in the topo store, drain on SIGTERM."""
    if not args.cluster and not args.topo:
        raise InvalidArgument("shardgate tablet needs --topo URL or --cluster FILE")
    security = server_security(args)
    check_free([("--port", args.host, args.port), ("--http-port", args.host, args.http_port)])
    topo_server = await open_topo(args.cluster, url=args.topo)
    try:
        topo = await topo_server.load_topology()
        shard = topo.keyspace(args.keyspace).any_shard(args.shard)  # pending: a target
        tablet = Tablet.open(
            args.keyspace, args.shard, shard.url, pool_timeout_s=args.pool_timeout,
            result_limits=ResultLimits(args.max_result_rows, args.max_result_bytes),
            idle_transaction_timeout_s=args.idle_timeout or None,
            transaction_cap=args.transaction_cap,
            transaction_cap_per_user=args.transaction_cap_per_user)
        try:
            await _serve_tablet(args, topo_server, tablet, security, shard.url)
            return 0
        finally:
            await tablet.close()
    finally:
        await topo_server.close()


async def _serve_tablet(args: argparse.Namespace, topo_server: TopoServer, tablet: Tablet,
                        security: ServerSecurity, url: str) -> None:
    class _G:  # queue_options_of needs only .vschema
        pass

    g: Any = _G()
    g.vschema = (await topo_server.load_topology()).build_vschema()
    tablet.queues.configure(queue_options_of(g, args.keyspace))
    tablet.queues.start()
    http = None
    if args.http_port:
        http, http_port = await serve_tablet_http(tablet, args.host, args.http_port,
                                                  users=security.users)
        print(f"tablet http on http://{args.host}:{http_port}/metrics", flush=True)
    server, port, servicer = await serve_tablet_service(
        tablet, args.host, args.port, security=security, no_auth=args.no_auth,
        insecure=args.insecure_bind_anyway, idle_timeout=args.idle_timeout)
    alias = args.alias or f"{args.keyspace}-{args.shard}-{uuid.uuid4().hex[:8]}"
    registration = TabletRegistration(
        topo_server.store, tablet, alias, f"{args.advertise or args.host}:{port}",
        heartbeat_s=args.heartbeat,
        health=lambda: DRAINING if servicer.draining else SERVING)
    loop = asyncio.get_running_loop()
    # SIGUSR1: a planned hand-over is coming (`cluster restart --rolling`): try for the
    # shard lease every few milliseconds for a while instead of every half second
    loop.add_signal_handler(signal.SIGUSR1, hurry_all)
    try:
        await registration.start()
        print(f"shardgate tablet {args.keyspace}/{args.shard} ({alias}) listening on "
              f"grpc://{args.host}:{port}", flush=True)
        # until SIGTERM, or until the topology no longer names this shard at this URL
        why = await _first(_until_signal(), until_retired(
            topo_server, args.keyspace, args.shard, url))
        print(f"retiring: {why}" if why else "draining", flush=True)
        await servicer.drain(args.drain_timeout)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        await registration.stop()
        await server.stop(1.0)
        await servicer.close()
        if http is not None:
            await http.cleanup()
    print("stopped", flush=True)
