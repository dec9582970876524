"""What the ``shardgate`` command groups share: defaults, target flags, the local
topology and the result table. Imported by every module of :mod:`shardgate.cli`;
imports none of them, and nothing heavy at import (the gate, the topo store and gRPC
are loaded by the functions that use them)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardgate.errors import InvalidArgument, NotFound

if TYPE_CHECKING:  # each is loaded by the function that needs it: a CLI call loads
    # only what its command runs (a remote command never loads the gate)
    from shardgate.api.grpc.security import ClientSecurity
    from shardgate.gate import Gate
    from shardgate.result import Result
    from shardgate.topo import Topology
    from shardgate.topo.server import TopoServer

DEFAULT_DATA_DIR = "./shardgate-data"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 15991
DEFAULT_TARGET = f"grpc://{DEFAULT_HOST}:{DEFAULT_PORT}"
CLUSTER_FILE_NAME = "cluster.yaml"


def shardgate_command(*args: str) -> list[str]:
    """The command line of ``shardgate ARGS`` with this interpreter."""
    return [sys.executable, "-m", "shardgate.cli", *args]


def add_listen_args(p: argparse.ArgumentParser, *, port: int = DEFAULT_PORT) -> None:
    """``--host`` and ``--port`` (default ``port``) of a command that serves gRPC."""
    p.add_argument("--host", default=DEFAULT_HOST, help="listen address")
    p.add_argument("--port", type=int, default=port, help="gRPC port")


def add_target_args(p: argparse.ArgumentParser, *, remote: bool) -> None:
    """Where a command runs: ``--cluster`` / ``--data-dir`` in-process, ``--target`` a gate."""
    where = p.add_mutually_exclusive_group()
    if remote:
        where.add_argument(
            "--target", help=f"a running gate, grpc://host:port (default {DEFAULT_TARGET})"
        )
    where.add_argument("--cluster", help="open this cluster file in-process")
    where.add_argument("--data-dir", help="open the cluster of `shardgate up --data-dir DIR`")
    if remote:
        add_client_security_args(p)


def add_client_security_args(p: argparse.ArgumentParser) -> None:
    """``--user``, ``--password``, ``--tls-ca``, ``--tls-cert``, ``--tls-key`` of a client
    (defaults: ``SHARDGATE_USER``, ``SHARDGATE_PASSWORD``, ``SHARDGATE_TLS_*``)."""
    p.add_argument("--user", help="user of the gate's users file (env SHARDGATE_USER)")
    p.add_argument("--password",
                   help="its password (env SHARDGATE_PASSWORD; prefer the environment)")
    p.add_argument("--tls-ca", help="CA that signed the gate's certificate (TLS; "
                   "env SHARDGATE_TLS_CA; a grpcs:// target uses the system's roots)")
    p.add_argument("--tls-cert", help="client certificate, for gates that require one")
    p.add_argument("--tls-key", help="the client certificate's key")


def add_tablet_client_args(p: argparse.ArgumentParser) -> None:
    """``--tablet-user`` and ``--tablet-tls-*``: what a command reaching tablet processes
    (``gate``, ``twopc resolve --topo``) presents to them."""
    p.add_argument("--tablet-user", help="the user presented to tablets "
                   "(their --users-file / --allow-user); password from "
                   "SHARDGATE_TABLET_PASSWORD")
    p.add_argument("--tablet-tls-ca", help="verify tablets' certificates with this CA")
    p.add_argument("--tablet-tls-cert", help="client certificate for tablets")
    p.add_argument("--tablet-tls-key", help="the client certificate's key")


def tablet_credentials(args: argparse.Namespace) -> ClientSecurity:
    """What is presented to tablets: ``--tablet-user`` with the password in
    ``SHARDGATE_TABLET_PASSWORD`` (never a flag: flags show in ``ps``), and TLS files."""
    from shardgate.api.grpc.security import ClientSecurity

    return ClientSecurity(
        user=args.tablet_user,
        password=os.environ.get("SHARDGATE_TABLET_PASSWORD") if args.tablet_user else None,
        tls_ca=Path(args.tablet_tls_ca) if args.tablet_tls_ca else None,
        tls_cert=Path(args.tablet_tls_cert) if args.tablet_tls_cert else None,
        tls_key=Path(args.tablet_tls_key) if args.tablet_tls_key else None,
    )


def client_security(args: argparse.Namespace) -> ClientSecurity:
    """The credentials and TLS files of a client command's flags and environment."""
    from shardgate.api.grpc.security import ClientSecurity

    return ClientSecurity.from_env(
        user=getattr(args, "user", None), password=getattr(args, "password", None),
        tls_ca=getattr(args, "tls_ca", None), tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
    )


def cluster_file_of(args: argparse.Namespace, *, default_data_dir: bool = False) -> Path:
    """The cluster file ``--cluster FILE`` or ``--data-dir DIR`` names (the default if asked)."""
    if args.cluster:
        return Path(args.cluster)
    data_dir = args.data_dir or (DEFAULT_DATA_DIR if default_data_dir else None)
    if data_dir is None:
        raise InvalidArgument("give --cluster FILE or --data-dir DIR")
    cluster_file = Path(data_dir) / CLUSTER_FILE_NAME
    if not cluster_file.exists():
        raise NotFound(
            f"{cluster_file} does not exist: run `shardgate up --data-dir {data_dir}` first"
        )
    return cluster_file


STORE_HELP = "the topo store (sqlite:///…, postgresql://…, mysql://…, etcd://HOST:PORT/prefix)"


def store_args(p: argparse.ArgumentParser) -> None:
    """``--topo URL | --cluster FILE | --data-dir DIR``: where the topo store is."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--topo", help=STORE_HELP)
    where.add_argument("--cluster", help="the store beside this cluster file")
    where.add_argument("--data-dir", help="the store of `shardgate up --data-dir DIR` "
                       "(default ./shardgate-data)")


async def open_store(args: argparse.Namespace) -> TopoServer:
    """The topo store ``--topo`` / ``--cluster`` / ``--data-dir`` names."""
    from shardgate.topo.local import open_topo

    if getattr(args, "topo", None):
        return await open_topo(url=args.topo)
    return await open_topo(cluster_file_of(args, default_data_dir=True))


def local_topology(args: argparse.Namespace, *, default_data_dir: bool = False) -> Topology:
    """The topology of ``--cluster FILE`` / ``--data-dir DIR`` (its topo store's, if any)."""
    from shardgate.topo.local import read_topology

    return read_topology(cluster_file_of(args, default_data_dir=default_data_dir))


async def local_gate(args: argparse.Namespace, *, default_data_dir: bool = False) -> Gate:
    """An in-process gate over the cluster of ``--cluster`` / ``--data-dir``.

    It reads and changes the cluster's topo store, so a VSchema change made
    here is kept and reaches running gates.
    """
    from shardgate.gate import Gate
    from shardgate.topo.local import open_topo

    topo = await open_topo(cluster_file_of(args, default_data_dir=default_data_dir))
    try:
        return await Gate.from_topo(topo, watch=False)
    except BaseException:
        await topo.close()
        raise


def format_value(v: Any) -> str:
    """A value as the table shows it: NULL, 0x-hex for bytes, str otherwise."""
    if v is None:
        return "NULL"
    if isinstance(v, bytes | bytearray | memoryview):
        return "0x" + bytes(v).hex()
    return str(v)


def format_result(result: Result) -> str:
    """A result as an aligned text table with a row count, or the write summary."""
    if not result.fields:
        text = f"OK, {result.rows_affected} {_plural(result.rows_affected, 'row')} affected"
        if result.insert_id is not None:
            text += f", insert id {result.insert_id}"
        return text
    cells = [[format_value(v) for v in row] for row in result.rows]
    widths = [len(f) for f in result.fields]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)]
    lines = [
        " | ".join(f.ljust(w) for f, w in zip(result.fields, widths, strict=True)).rstrip(),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in cells
    ]
    n = len(result.rows)
    lines.append(f"{n} {_plural(n, 'row')}")
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"
