"""The ``shardgate`` command. Configuration (flags, files) is read here and only here.

::

    shardgate up [--data-dir DIR] [--cluster FILE] [--host H] [--port P] [--check]
    shardgate gate --cluster FILE [--host H] [--port P]
    shardgate sql [--target grpc://H:P | --cluster FILE | --data-dir DIR]
                  [--keyspace KS] [--explain] "SQL"
    shardgate schema apply --keyspace KS (--file F.sql | --sql "DDL")
                  [--target ... | --cluster FILE | --data-dir DIR]
    shardgate vschema show [--cluster FILE | --data-dir DIR]
    shardgate twopc resolve [--cluster FILE | --data-dir DIR] [--grace SECONDS]
    shardgate --version

``up`` without ``--cluster`` runs the embedded default cluster (SQLite files
under the data directory, created the first time; see
:mod:`shardgate.topo.embedded`). Exit codes: 0 success, 1 a shardgate error
(printed as ``error CODE: message`` on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import signal
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import TokenType
from sqlglot.errors import SqlglotError

from shardgate import cli_doctor, cli_inbox, cli_queue, cli_spark, cli_stream
from shardgate.api.client import GateClient
from shardgate.api.server import serve
from shardgate.errors import InvalidArgument, NotFound, ShardgateError
from shardgate.gate import Gate, twopc
from shardgate.result import Result
from shardgate.sql.parse import GATE_DIALECT
from shardgate.topo import Topology, load_cluster_file, write_cluster_file
from shardgate.topo.embedded import (
    COMMERCE_DDL,
    LOOKUP_DDL,
    SEQUENCE_ROWS,
    embedded_topology,
)

DEFAULT_DATA_DIR = "./shardgate-data"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 15991
DEFAULT_TARGET = f"grpc://{DEFAULT_HOST}:{DEFAULT_PORT}"
CLUSTER_FILE_NAME = "cluster.yaml"
#: Seconds in-flight RPCs get to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0


# -- argument parsing ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``shardgate`` command."""
    parser = argparse.ArgumentParser(
        prog="shardgate",
        description="A sharded database over ordinary SQL databases, in the spirit of Vitess.",
    )
    parser.add_argument("--version", action="version", version=f"shardgate {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser(
        "up", help="run gate and tablets in one process (default: an embedded SQLite cluster)"
    )
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="embedded cluster directory")
    up.add_argument("--cluster", help="serve this cluster file instead of the embedded one")
    _add_listen_args(up)
    up.add_argument(
        "--check",
        action="store_true",
        help="set up, run one insert and select through the gate, print them and exit",
    )

    gate = commands.add_parser("gate", help="serve the gate of a cluster file over gRPC")
    gate.add_argument("--cluster", required=True, help="cluster file (YAML)")
    _add_listen_args(gate)

    sql = commands.add_parser("sql", help="run one SQL statement and print its result")
    _add_target_args(sql, remote=True)
    sql.add_argument("--keyspace", help="default keyspace of the session")
    sql.add_argument("--explain", action="store_true", help="print the plan instead (JSON)")
    sql.add_argument("sql", metavar="SQL", help="one statement; bind variables are not taken")

    schema = commands.add_parser("schema", help="schema changes")
    schema_cmds = schema.add_subparsers(dest="schema_command", required=True, metavar="COMMAND")
    apply = schema_cmds.add_parser("apply", help="run DDL on every shard of a keyspace")
    apply.add_argument("--keyspace", required=True, help="keyspace to change")
    source = apply.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="a .sql file of ;-separated DDL statements")
    source.add_argument("--sql", help="DDL statement(s)")
    _add_target_args(apply, remote=True)

    vschema = commands.add_parser("vschema", help="VSchema commands")
    vschema_cmds = vschema.add_subparsers(dest="vschema_command", required=True, metavar="COMMAND")
    show = vschema_cmds.add_parser("show", help="print the VSchema of every keyspace (JSON)")
    _add_target_args(show, remote=False)

    tpc = commands.add_parser("twopc", help="two-phase commit maintenance")
    tpc_cmds = tpc.add_subparsers(dest="twopc_command", required=True, metavar="COMMAND")
    resolve = tpc_cmds.add_parser(
        "resolve", help="commit or roll back the two-phase commits a dead gate left prepared"
    )
    _add_target_args(resolve, remote=False)
    resolve.add_argument(
        "--grace",
        type=float,
        default=twopc.DEFAULT_RESOLVE_GRACE_S,
        help="leave transactions younger than this many seconds to their gate "
        f"(default {twopc.DEFAULT_RESOLVE_GRACE_S:g})",
    )
    cli_queue.add_parsers(commands)
    cli_stream.add_parsers(commands)
    cli_spark.add_parsers(commands)
    cli_inbox.add_parsers(commands)
    cli_doctor.add_parsers(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("shardgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _add_listen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=DEFAULT_HOST, help=f"listen address ({DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port ({DEFAULT_PORT})")


def _add_target_args(p: argparse.ArgumentParser, *, remote: bool) -> None:
    where = p.add_mutually_exclusive_group()
    if remote:
        where.add_argument(
            "--target", help=f"a running gate, grpc://host:port (default {DEFAULT_TARGET})"
        )
    where.add_argument("--cluster", help="open this cluster file in-process")
    where.add_argument("--data-dir", help="open the cluster of `shardgate up --data-dir DIR`")


# -- main ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardgate`` command; return its exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        match args.command:
            case "up":
                return asyncio.run(_up(args))
            case "gate":
                return asyncio.run(_gate(args))
            case "sql":
                return asyncio.run(_sql(args))
            case "schema":
                return asyncio.run(_schema_apply(args))
            case "vschema":
                return _vschema_show(args)
            case "twopc":
                return asyncio.run(_twopc_resolve(args))
            case "queue" | "tablet":
                return cli_queue.run(args)
            case "stream":
                return cli_stream.run(args)
            case "spark":
                return cli_spark.run(args)
            case "inbox":
                return cli_inbox.run(args)
            case "doctor":
                local = _local_topology(args) if args.cluster or args.data_dir else None
                return cli_doctor.run(args, local)
    except ShardgateError as exc:
        print(f"error {exc.code.value}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command!r}")


# -- up / gate -------------------------------------------------------------------------------


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
        await _serve_until_signal(gate, args.host, args.port)
        return 0
    finally:
        await gate.close()


async def _gate(args: argparse.Namespace) -> int:
    gate = Gate.open(load_cluster_file(args.cluster))
    try:
        await _serve_until_signal(gate, args.host, args.port)
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
    """One insert and one select through a real gRPC server on a free port."""
    server, port = await serve(gate, host, 0)
    try:
        async with GateClient(f"grpc://{host}:{port}", keyspace="commerce") as client:
            email = f"check-{uuid.uuid4().hex[:12]}@example.com"
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        print("shutting down", flush=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await server.stop(SHUTDOWN_GRACE_S)
    print("stopped", flush=True)


# -- sql / schema / vschema ----------------------------------------------------------------


async def _sql(args: argparse.Namespace) -> int:
    if args.cluster or args.data_dir:
        gate = Gate.open(_local_topology(args))
        try:
            session = gate.session(args.keyspace)
            if args.explain:
                print(json.dumps(gate.explain(args.sql, session.keyspace), indent=2))
            else:
                print(format_result(await gate.execute(session, args.sql)))
        finally:
            await gate.close()
        return 0
    async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace) as client:
        if args.explain:
            print(json.dumps(await client.explain(args.sql), indent=2))
        else:
            print(format_result(await client.execute(args.sql)))
    return 0


async def _schema_apply(args: argparse.Namespace) -> int:
    if args.file is not None:
        try:
            text = args.file.read_text()
        except OSError as exc:
            raise NotFound(f"cannot read {args.file}: {exc.strerror}") from exc
    else:
        text = args.sql
    statements = split_statements(text)
    if not statements:
        raise InvalidArgument("no SQL statements to apply")
    if args.cluster or args.data_dir:
        gate = Gate.open(_local_topology(args))
        try:
            session = gate.session(args.keyspace)
            for stmt in statements:
                await gate.execute(session, stmt)
                print(f"OK  {_first_line(stmt)}")
        finally:
            await gate.close()
    else:
        async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace) as client:
            for stmt in statements:
                await client.execute(stmt)
                print(f"OK  {_first_line(stmt)}")
    print(f"applied {len(statements)} statement(s) to keyspace {args.keyspace}")
    return 0


def _vschema_show(args: argparse.Namespace) -> int:
    topology = _local_topology(args, default_data_dir=True)
    doc = {ks.name: ks.vschema for ks in topology.keyspaces.values()}
    print(json.dumps(doc, indent=2))
    return 0


async def _twopc_resolve(args: argparse.Namespace) -> int:
    gate = Gate.open(_local_topology(args, default_data_dir=True))
    try:
        report = await gate.resolve_transactions(grace_s=args.grace)
    finally:
        await gate.close()
    print(report)
    return 1 if report.errors else 0


def _local_topology(args: argparse.Namespace, *, default_data_dir: bool = False) -> Topology:
    if args.cluster:
        return load_cluster_file(args.cluster)
    data_dir = args.data_dir or (DEFAULT_DATA_DIR if default_data_dir else None)
    if data_dir is None:
        raise InvalidArgument("give --cluster FILE or --data-dir DIR")
    cluster_file = Path(data_dir) / CLUSTER_FILE_NAME
    if not cluster_file.exists():
        raise NotFound(
            f"{cluster_file} does not exist: run `shardgate up --data-dir {data_dir}` first"
        )
    return load_cluster_file(cluster_file)


# -- helpers -------------------------------------------------------------------------------


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` split on ``;`` (not inside strings or comments).

    Each statement is the original text from its first to its last token.
    """
    try:
        tokens = sqlglot.Dialect.get_or_raise(GATE_DIALECT).tokenize(text)
    except SqlglotError as exc:
        raise InvalidArgument(f"cannot split the SQL into statements: {exc}") from exc
    statements: list[str] = []
    start: int | None = None
    end = 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if start is not None:
                statements.append(text[start : end + 1])
            start = None
            continue
        if start is None:
            start = tok.start
        end = tok.end
    if start is not None:
        statements.append(text[start : end + 1])
    return statements


def _first_line(stmt: str) -> str:
    line = stmt.strip().splitlines()[0]
    return line if len(line) <= 80 else line[:77] + "..."


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


if __name__ == "__main__":
    sys.exit(main())
