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
from typing import Any

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


class HelpFormatter(argparse.HelpFormatter):
    """Help that states every option's default: ``(default: X)`` is added to the text of
    an option with a default (not None, False or empty) unless the text names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if states_default(action) and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text


def states_default(action: argparse.Action) -> bool:
    """Whether ``action``'s help should state its default."""
    default = action.default
    return bool(action.option_strings) and default not in (None, False, argparse.SUPPRESS) \
        and default != [] and action.help != argparse.SUPPRESS


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose help states defaults; its subcommands' parsers too (a
    subparser is of its parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``shardgate`` command."""
    parser = CommandParser(
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
