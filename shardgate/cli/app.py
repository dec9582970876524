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
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from shardgate.errors import ShardgateError

#: each command and the module of its group, in the order ``--help`` lists them. To run
#: a command only its group's module is loaded (they load most of shardgate between
#: them: 2.1 CPU-s for all, 1.3 for ``sql``'s; every CLI call paid for all of them)
GROUPS: dict[str, str] = {
    "up": "serve", "gate": "serve", "tablet": "serve",
    "cluster": "cluster",
    "sql": "sql", "schema": "sql", "twopc": "sql",
    "topo": "topo", "vschema": "topo", "lookup-vindex": "topo",
    "reshard": "reshard",
    "movetables": "movetables",
    "queue": "queue",
    "stream": "stream",
    "spark": "spark",
    "inbox": "inbox",
    "doctor": "doctor",
}

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


def _group(name: str) -> ModuleType:
    return importlib.import_module(f"shardgate.cli.{name}")


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``shardgate`` command; with ``command`` (one of
    :data:`GROUPS`), a parser that knows only that command's group (any other command
    gets the whole parser, so usage errors and ``--help`` read the same)."""
    parser = CommandParser(
        prog="shardgate",
        description="A sharded database over ordinary SQL databases, in the spirit of Vitess.",
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups = [GROUPS[command]] if command in GROUPS else list(dict.fromkeys(GROUPS.values()))
    for name in groups:
        _group(name).add_parsers(commands)
    return parser


class VersionAction(argparse.Action):
    """``--version``: print ``shardgate VERSION`` and exit. The version is read when asked
    (:mod:`importlib.metadata` costs a CLI call 0.05-0.09 CPU-s)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS,
                 help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser._print_message(f"shardgate {_version()}\n", sys.stdout)
        parser.exit()


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("shardgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


# -- main ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardgate`` command; return its exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command_of(words)).parse_args(words)
    args.argv = words  # `gate --workers` re-runs it
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        group = _group(GROUPS[args.command])
        if args.command == "doctor":
            from shardgate.cli.common import local_topology

            local = local_topology(args) if args.cluster or args.data_dir else None
            result: int = group.run(args, local)
            return result
        result = group.run(args)
        return result
    except ShardgateError as exc:
        print(f"error {exc.code.value}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
