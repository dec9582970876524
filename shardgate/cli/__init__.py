"""The ``shardgate`` command, one module per command group.

* :mod:`~shardgate.cli.app` - the parser and the command's dispatch;
* :mod:`~shardgate.cli.common` - what the groups share (defaults, target flags,
  the local topology, the result table);
* :mod:`~shardgate.cli.serve` - ``up``, ``gate``, ``tablet``;
* :mod:`~shardgate.cli.sql` - ``sql``, ``schema apply``, ``vschema show``, ``twopc resolve``;
* :mod:`~shardgate.cli.queue` - ``queue ...``;
* :mod:`~shardgate.cli.stream` - ``stream``;
* :mod:`~shardgate.cli.spark` - ``spark dump|archive``;
* :mod:`~shardgate.cli.inbox` - ``inbox ...``;
* :mod:`~shardgate.cli.doctor` - ``doctor``;
* :mod:`~shardgate.cli.grpc_core` - gRPC core's I/O path, chosen before gRPC loads.

:func:`main` is the entry point: it chooses gRPC's I/O path first, then
loads the command (which loads gRPC); this package imports nothing else
eagerly for that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardgate.cli.grpc_core import prefer_iomgr

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardgate`` command; return its exit code (see :mod:`shardgate.cli.app`)."""
    prefer_iomgr()
    from shardgate.cli.app import main as run_command

    return run_command(argv)


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from shardgate.cli.app import build_parser

        return build_parser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
