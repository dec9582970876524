"""The ``shardgate`` command's help: every option explained, every default stated, one unit
for durations (issue 34, item 10)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from shardgate.cli.app import HelpFormatter, build_parser, states_default
from shardgate.cli.serve import gate_limits
from shardgate.errors import InvalidArgument


def _options() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    """``(command path, its parser, option)`` of every option of every command."""
    todo = [("shardgate", build_parser())]
    while todo:
        path, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{path} {name}", sub) for name, sub in action.choices.items()]
            elif action.option_strings and not isinstance(
                    action, argparse._HelpAction | argparse._VersionAction):
                yield path, parser, action


def _shown_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    assert isinstance(formatter, HelpFormatter), "every command's help states defaults"
    text = formatter._get_help_string(action) or ""
    return text % {**vars(action), "default": action.default}


def test_the_walk_sees_every_command() -> None:
    paths = {path for path, _, _ in _options()}
    assert {"shardgate up", "shardgate vschema get", "shardgate vschema apply",
            "shardgate queue tail", "shardgate reshard switch-traffic"} <= paths


def test_every_option_says_what_it_does() -> None:
    missing = [f"{path} {a.option_strings[0]}" for path, _, a in _options()
               if a.help != argparse.SUPPRESS and not (a.help or "").strip()]
    assert missing == []


def test_every_option_with_a_default_states_it() -> None:
    silent = [f"{path} {a.option_strings[0]}: {_shown_help(p, a)!r}"
              for path, p, a in _options()
              if states_default(a) and "default" not in _shown_help(p, a).lower()]
    assert silent == []


def test_up_states_where_its_data_goes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--help"])
    assert "(default: ./shardgate-data)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "flags,expected_ms",
    [([], 30_000), (["--query-timeout", "2.5"], 2_500), (["--query-timeout", "0"], 0),
     (["--query-timeout-ms", "700"], 700)],  # the older flag still works (hidden)
)
def test_query_timeout_is_in_seconds_and_the_old_flag_still_works(
    flags: list[str], expected_ms: int
) -> None:
    args = build_parser().parse_args(["up", *flags])
    assert gate_limits(args).query_timeout_ms == expected_ms


def test_both_query_timeout_flags_are_refused() -> None:
    args = build_parser().parse_args(["up", "--query-timeout", "1", "--query-timeout-ms", "5"])
    with pytest.raises(InvalidArgument, match="not both"):
        gate_limits(args)


def test_every_duration_flag_is_in_seconds() -> None:
    """Durations are seconds (``S``, decimals allowed) everywhere the help shows them."""
    in_ms = [f"{path} {a.option_strings[0]}" for path, _, a in _options()
             if a.help != argparse.SUPPRESS and
             (a.option_strings[0].endswith("-ms") or (a.metavar == "N" and "ms" in (a.help or "")
                                                     .split()))]
    assert in_ms == []
