"""``shardgate movetables``: move tables from one keyspace to another (vertical resharding).

::

    shardgate movetables create --source-keyspace A --target-keyspace B --tables t1,t2
                  [--vschema FILE] [--workflow W] [--batch N]
    shardgate movetables status --target-keyspace B [--workflow W] [--json]
    shardgate movetables run    --target-keyspace B [--follow]
    shardgate movetables vdiff  --target-keyspace B [--json]
    shardgate movetables switch-traffic --target-keyspace B (--reads | --writes) [--dry-run]
                  [--max-lag S]
    shardgate movetables reverse-traffic --target-keyspace B [--max-lag S]
    shardgate movetables complete --target-keyspace B
    shardgate movetables cancel   --target-keyspace B
                                      (each with [--topo URL | --cluster F | --data-dir D])

The commands after ``create`` are ``shardgate reshard``'s (the same output and
exit statuses); see docs/resharding.md, "MoveTables".
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from shardgate.cli import reshard
from shardgate.cli.common import open_store, store_args
from shardgate.cli.defaults import COPY_BATCH, MAX_LAG_S
from shardgate.cli.progress import Progress
from shardgate.errors import InvalidArgument


def add_parsers(commands: Any) -> None:
    """Add the ``movetables`` subcommands."""
    mt = commands.add_parser("movetables", help="move tables from one keyspace to another")
    cmds = mt.add_subparsers(dest="reshard_command", required=True, metavar="COMMAND")

    def common(name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = cmds.add_parser(name, help=help_)
        p.add_argument("--target-keyspace", required=True,
                       help="keyspace the tables move into")
        p.add_argument("--workflow", default="movetables", help="the workflow's name")
        store_args(p)
        return p

    create = common("create", "create (or resume) a MoveTables and copy the rows")
    create.add_argument("--source-keyspace", required=True,
                        help="keyspace the tables move out of")
    create.add_argument("--tables", required=True, help="tables to move, comma-separated")
    create.add_argument("--vschema", metavar="FILE",
                        help="JSON with the target keyspace's 'tables' entries (and "
                             "'vindexes'); required for a sharded target")
    create.add_argument("--batch", type=int, default=COPY_BATCH, help="rows per copy batch")
    for name, help_ in (("status", "the workflow's state, streams and lag"),
                        ("vdiff", "compare source and target at one consistent point")):
        p = common(name, help_)
        p.add_argument("--json", action="store_true", help="print JSON")
    run_ = common("run", "resume the copy, then catch up with the source")
    run_.add_argument("--follow", action="store_true",
                      help="keep catching up until interrupted (Ctrl-C / SIGTERM)")
    sw = common("switch-traffic", "serve reads, then writes, from the target keyspace")
    which = sw.add_mutually_exclusive_group(required=True)
    which.add_argument("--reads", action="store_true", help="switch reads")
    which.add_argument("--writes", action="store_true", help="switch writes")
    sw.add_argument("--dry-run", action="store_true", help="check and say what would happen")
    sw.add_argument("--max-lag", type=float, default=MAX_LAG_S,
                    help="refuse the write switch if the target lags more (seconds)")
    rv = common("reverse-traffic", "serve reads (and, after the write switch, writes) from "
                "the source keyspace again")
    rv.add_argument("--max-lag", type=float, default=MAX_LAG_S,
                    help="after the write switch: refuse if the source lags the target more "
                         "(seconds)")
    common("complete", "after the write switch: the tables belong to the target keyspace")
    common("cancel", "before the write switch (or after reverse-traffic): drop the target's "
           "copies and the rules")


def run(args: argparse.Namespace) -> int:
    """Run one ``movetables`` subcommand."""
    return asyncio.run(_run(args))


def _vschema(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"--vschema {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidArgument(f"--vschema {path}: must be a JSON object")
    return doc


async def _run(args: argparse.Namespace) -> int:
    from shardgate.workflows.movetables import MoveTablesWorkflow, movetables_spec

    server = await open_store(args)
    try:
        flow: MoveTablesWorkflow
        bar = Progress("copy")
        if args.reshard_command == "create":
            tables = tuple(t.strip() for t in args.tables.split(",") if t.strip())
            spec = await movetables_spec(server, source_keyspace=args.source_keyspace,
                                         target_keyspace=args.target_keyspace, tables=tables,
                                         workflow=args.workflow)
            flow = MoveTablesWorkflow(server, spec, vschema=_vschema(args.vschema),
                                      batch=args.batch, progress=bar)
        else:
            flow = await MoveTablesWorkflow.resume(server, args.target_keyspace, args.workflow,
                                                   progress=bar)
        try:
            return await reshard._command(flow, args, bar)
        finally:
            bar.end()
            await flow.close()
    finally:
        await server.close()
