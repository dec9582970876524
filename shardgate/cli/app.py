"""The ``shardgate`` command: the parser and the dispatch to one module per command group.

Configuration (flags, files) is read in :mod:`shardgate.cli` and only there.
Each group's usage is in its module's docstring: :mod:`~shardgate.cli.serve`
(``up``, ``gate``, ``tablet``), :mod:`~shardgate.cli.sql` (``sql``, ``schema
apply``, ``twopc resolve``), :mod:`~shardgate.cli.topo` (``topo``, ``vschema``,
``lookup-vindex``), :mod:`~shardgate.cli.reshard`,
:mod:`~shardgate.cli.movetables`, :mod:`~shardgate.cli.queue`,
:mod:`~shardgate.cli.stream`, :mod:`~shardgate.cli.spark`,
:mod:`~shardgate.cli.inbox` and :mod:`~shardgate.cli.doctor`; and
``shardgate --version``.

Exit codes: 0 success, 1 a shardgate error (printed as ``error CODE: message``
on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

from shardgate.cli import (
    cluster,
    doctor,
    inbox,
    movetables,
    queue,
    reshard,
    serve,
    spark,
    sql,
    stream,
    topo,
)
from shardgate.cli.common import local_topology
from shardgate.errors import ShardgateError

# -- argument parsing ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``shardgate`` command."""
    parser = argparse.ArgumentParser(
        prog="shardgate",
        description="A sharded database over ordinary SQL databases, in the spirit of Vitess.",
    )
    parser.add_argument("--version", action="version", version=f"shardgate {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_parsers(commands)
    cluster.add_parsers(commands)
    sql.add_parsers(commands)
    topo.add_parsers(commands)
    reshard.add_parsers(commands)
    movetables.add_parsers(commands)
    queue.add_parsers(commands)
    stream.add_parsers(commands)
    spark.add_parsers(commands)
    inbox.add_parsers(commands)
    doctor.add_parsers(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("shardgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


# -- main ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardgate`` command; return its exit code."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `gate --workers` re-runs it
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        match args.command:
            case "up" | "gate" | "tablet":
                return serve.run(args)
            case "cluster":
                return cluster.run(args)
            case "sql" | "schema" | "twopc":
                return sql.run(args)
            case "topo" | "vschema" | "lookup-vindex":
                return topo.run(args)
            case "reshard":
                return reshard.run(args)
            case "movetables":
                return movetables.run(args)
            case "queue":
                return queue.run(args)
            case "stream":
                return stream.run(args)
            case "spark":
                return spark.run(args)
            case "inbox":
                return inbox.run(args)
            case "doctor":
                local = local_topology(args) if args.cluster or args.data_dir else None
                return doctor.run(args, local)
    except ShardgateError as exc:
        print(f"error {exc.code.value}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command!r}")
