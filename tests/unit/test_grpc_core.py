"""The ``shardgate`` command's choice of gRPC core's I/O path (before gRPC loads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shardgate.cli.grpc_core import CHOICE_VAR, IOMGR_EXPERIMENTS, prefer_iomgr


def _in_fresh_process(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GRPC_EXPERIMENTS", CHOICE_VAR)}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def test_the_command_asks_for_iomgr_before_grpc_loads() -> None:
    code = ("import os, sys, shardgate.cli; assert 'grpc' not in sys.modules; "
            "from shardgate.cli.grpc_core import prefer_iomgr; print(prefer_iomgr()); "
            "import grpc; print(os.environ['GRPC_EXPERIMENTS'])")
    assert _in_fresh_process(code).splitlines() == ["True", IOMGR_EXPERIMENTS]


def test_an_operators_setting_is_kept() -> None:
    code = ("import os; from shardgate.cli.grpc_core import prefer_iomgr; "
            "print(prefer_iomgr(), os.environ.get('GRPC_EXPERIMENTS'))")
    assert _in_fresh_process(code, GRPC_EXPERIMENTS="event_engine_poller") == \
        "False event_engine_poller"
    assert _in_fresh_process(code, **{CHOICE_VAR: "event-engine"}) == "False None"


def test_too_late_once_grpc_is_loaded() -> None:
    code = ("import os, grpc; from shardgate.cli.grpc_core import prefer_iomgr; "
            "print(prefer_iomgr(), os.environ.get('GRPC_EXPERIMENTS'))")
    assert _in_fresh_process(code) == "False None"


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(SystemExit, match="SHARDGATE_GRPC_IO"):
        prefer_iomgr({CHOICE_VAR: "fast"})
