"""The ``shardgate`` command, one module per command group.

* :mod:`~shardgate.cli.app` - the parser and :func:`main` (the entry point);
* :mod:`~shardgate.cli.common` - what the groups share (defaults, target flags,
  the local topology, the result table);
* :mod:`~shardgate.cli.serve` - ``up``, ``gate``, ``tablet``;
* :mod:`~shardgate.cli.sql` - ``sql``, ``schema apply``, ``vschema show``, ``twopc resolve``;
* :mod:`~shardgate.cli.queue` - ``queue ...``;
* :mod:`~shardgate.cli.stream` - ``stream``;
* :mod:`~shardgate.cli.spark` - ``spark dump|archive``;
* :mod:`~shardgate.cli.inbox` - ``inbox ...``;
* :mod:`~shardgate.cli.doctor` - ``doctor``.
"""

from shardgate.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
