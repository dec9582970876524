"""The ``shardgate`` command loads only the group of the command it runs (issue 33 part 4:
every CLI call paid 2.1 CPU-s of imports for all groups; the docs and acceptance tests
make a few hundred)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

from shardgate.cli import defaults
from shardgate.cli.app import GROUPS, build_parser


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_groups_name_every_command_of_the_whole_parser_in_order() -> None:
    assert _commands(build_parser()) == list(GROUPS)


def test_a_command_parser_knows_its_group_and_parses_as_the_whole_one() -> None:
    for command, group in GROUPS.items():
        mine = _commands(build_parser(command))
        assert command in mine
        assert {GROUPS[c] for c in mine} == {group}
    argv = ["sql", "--target", "grpc://127.0.0.1:1", "SELECT 1"]
    assert vars(build_parser("sql").parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_running_a_command_loads_no_other_group() -> None:
    script = (
        "import sys\n"
        "from shardgate.cli.app import main\n"
        "try:\n"
        "    main(['queue', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('shardgate.cli.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    loaded = {m.rsplit(".", 1)[1] for m in eval(done.stdout.splitlines()[-1])}
    others = set(GROUPS.values()) - {"queue"}
    assert "queue" in loaded and not loaded & others, loaded


#: what a remote (gRPC) command must not load: the gate and what only the gate needs
SERVER_SIDE = ("shardgate.gate", "shardgate.planner", "shardgate.engine", "sqlglot", "psycopg",
               "aiomysql", "shardgate.api.grpc.server", "shardgate.api.grpc.tablet_service",
               "shardgate.topo.model", "shardgate.vschema")


def _loaded_by(argv: list[str]) -> set[str]:
    """The modules a ``shardgate ARGV`` call loads (run in a fresh interpreter)."""
    script = (
        "import sys\n"
        "from shardgate.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    loaded: set[str] = set(eval(done.stdout.splitlines()[-1]))
    return loaded


def test_a_remote_command_loads_the_client_not_the_gate() -> None:
    """Issue 33: ``sql --target`` loaded the gate, planner, sqlglot and the tablet service
    (0.8 CPU-s a call); a remote command loads the gRPC client only. Nothing answers on
    port 1: the calls fail UNAVAILABLE after loading what they run."""
    target = "grpc://127.0.0.1:1"
    for argv in (["sql", "--target", target, "SELECT 1"],
                 ["queue", "stats", "--target", target, "--keyspace", "ks", "q"],
                 ["vschema", "show", "--target", target]):
        loaded = _loaded_by(argv)
        assert "shardgate.api.grpc.client" in loaded, argv
        heavy = {m for m in loaded if m.split(".")[0] == "sqlglot"
                 or any(m == s or m.startswith(s + ".") for s in SERVER_SIDE)}
        assert not heavy, (argv, sorted(heavy))


def test_help_of_a_command_loads_neither_grpc_nor_the_gate() -> None:
    for command in ("sql", "queue", "topo", "inbox", "stream", "reshard", "movetables",
                    "cluster", "doctor", "spark"):
        loaded = _loaded_by([command, "--help"])
        heavy = {m for m in loaded if m.split(".")[0] in ("grpc", "sqlglot", "psycopg")
                 or m.startswith(("shardgate.gate", "shardgate.workflows", "shardgate.topo"))}
        assert not heavy, (command, sorted(heavy))


def test_the_parser_defaults_equal_the_constants_they_name() -> None:
    for name, where in defaults.MIRRORS.items():
        module, constant = where.split(":")
        assert getattr(defaults, name) == getattr(importlib.import_module(module), constant), \
            name
