"""``shardgate topo``, ``vschema`` and ``lookup-vindex``: the topo store's commands.

::

    shardgate topo import FILE.yaml [--replace]      [--topo URL | --cluster F | --data-dir D]
    shardgate topo export                             [--topo URL | --cluster F | --data-dir D]
    shardgate vschema show [--target grpc://H:P | --cluster FILE | --data-dir DIR | --topo URL]
    shardgate vschema get --keyspace KS               [--topo URL | --cluster F | --data-dir D]
    shardgate vschema apply --keyspace KS FILE.json [--dry-run] [--expect-version N]
                                                      [--topo URL | --cluster F | --data-dir D]
    shardgate lookup-vindex create --keyspace KS --table-owner T --columns C
                  --type consistent_lookup_unique --lookup-table LKS.T [--name V]
                  [--column-type SQLTYPE] [--ignore-nulls] [--batch N] [--settle S]
                                                      [--topo URL | --cluster F | --data-dir D]
    shardgate lookup-vindex externalize --keyspace KS --name V    [--topo ... ]
    shardgate lookup-vindex show [--name WORKFLOW]                [--topo ... ]

They all work on the topo store itself (``--topo URL``, or the store beside
``--cluster FILE`` / the ``--data-dir`` of ``shardgate up``, the default
``./shardgate-data``), never through a running gate: a change is written to
the store (validated first; an invalid one is refused with its JSON path and
nothing is saved) and running gates pick it up through their watchers.

``vschema get`` prints the keyspace's VSchema (JSON) and, on stderr, its
version; ``vschema apply`` replaces it with FILE.json, compare-and-swap on the
version read at the start (or on ``--expect-version``): if another change got
in first it fails with ``ABORTED`` and saves nothing; a file equal to the stored
VSchema saves nothing either (``unchanged``, the version stays). ``--dry-run``
prints a unified diff against the current VSchema and saves nothing.
``lookup-vindex create`` shows its backfill as a bar on a terminal and as a line
per stage otherwise (:mod:`shardgate.cli.progress`).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardgate.cli.common import (
    DEFAULT_TARGET,
    STORE_HELP,
    cluster_file_of,
    open_store,
    store_args,
)
from shardgate.cli.defaults import LOOKUP_BATCH, LOOKUP_SETTLE_S, LOOKUP_TYPES
from shardgate.cli.progress import Progress
from shardgate.errors import InvalidArgument, NotFound

if TYPE_CHECKING:
    from shardgate.topo.server import TopoServer

# The topo store, the gate and the workflow are imported by the command that uses them
# (``vschema get`` loads the store, not the gate).


def add_parsers(commands: Any) -> None:
    """Add the ``topo``, ``vschema`` and ``lookup-vindex`` subcommands."""
    topo = commands.add_parser("topo", help="the topo store: import and export the topology")
    topo_cmds = topo.add_subparsers(dest="topo_command", required=True, metavar="COMMAND")
    imp = topo_cmds.add_parser("import", help="write a cluster file's topology into the store")
    imp.add_argument("file", type=Path, help="cluster file (YAML)")
    imp.add_argument("--replace", action="store_true",
                     help="overwrite keyspaces already there and delete the others")
    store_args(imp)
    exp_ = topo_cmds.add_parser("export", help="print the stored topology as a cluster file")
    store_args(exp_)

    vschema = commands.add_parser("vschema", help="VSchema commands")
    vs_cmds = vschema.add_subparsers(dest="vschema_command", required=True, metavar="COMMAND")
    show = vs_cmds.add_parser(
        "show", help="print the VSchema of every keyspace (JSON), as a gate serves it")
    where = show.add_mutually_exclusive_group()
    where.add_argument("--target", help=f"a running gate (default {DEFAULT_TARGET})")
    where.add_argument("--topo", help=STORE_HELP)
    where.add_argument("--cluster", help="the store beside this cluster file")
    where.add_argument("--data-dir", help="the store of `shardgate up --data-dir DIR`")
    get = vs_cmds.add_parser("get", help="print one keyspace's VSchema (its version on stderr)")
    get.add_argument("--keyspace", required=True, help="the keyspace whose VSchema to print")
    store_args(get)
    apply = vs_cmds.add_parser("apply", help="replace one keyspace's VSchema with a JSON file")
    apply.add_argument("--keyspace", required=True, help="the keyspace whose VSchema to replace")
    apply.add_argument("file", type=Path, help="the new VSchema (JSON)")
    apply.add_argument("--dry-run", action="store_true",
                       help="validate and print the diff; save nothing")
    apply.add_argument("--expect-version", type=int,
                       help="fail (ABORTED) unless the keyspace is still at this version")
    store_args(apply)

    lv = commands.add_parser("lookup-vindex", help="add a lookup vindex to a live table")
    lv_cmds = lv.add_subparsers(dest="lookup_command", required=True, metavar="COMMAND")
    create = lv_cmds.add_parser(
        "create", help="create (or resume) the lookup table, backfill and verify it")
    create.add_argument("--keyspace", required=True, help="the owner table's keyspace")
    create.add_argument("--table-owner", required=True, help="the owner table")
    create.add_argument("--columns", required=True, help="the looked-up column")
    create.add_argument("--type", required=True, choices=LOOKUP_TYPES, dest="vindex_type",
                        help="the lookup vindex type")
    create.add_argument("--lookup-table", required=True,
                        help="keyspace.table to create (an unsharded keyspace)")
    create.add_argument("--name", default="", help="vindex name (default: the lookup table's)")
    create.add_argument("--column-type", help="SQL type of the lookup column "
                        "(default from the owner column: BIGINT or VARCHAR(255))")
    create.add_argument("--ignore-nulls", action="store_true",
                        help="rows whose column is NULL get no lookup row")
    create.add_argument("--batch", type=int, default=LOOKUP_BATCH, help="rows per step")
    create.add_argument("--settle", type=float, default=LOOKUP_SETTLE_S,
                        help="seconds for running gates to see the write_only vindex")
    store_args(create)
    ext = lv_cmds.add_parser("externalize", help="verify, then let the vindex route")
    ext.add_argument("--keyspace", required=True, help="the owner table's keyspace")
    ext.add_argument("--name", required=True, help="the vindex name")
    store_args(ext)
    lshow = lv_cmds.add_parser("show", help="print lookup-vindex workflow records")
    lshow.add_argument("--name", help="one workflow (lookup_vindex:KS.VINDEX)")
    store_args(lshow)


def run(args: argparse.Namespace) -> int:
    """Run ``topo``, ``vschema`` or ``lookup-vindex``."""
    match args.command:
        case "topo":
            return asyncio.run(_topo(args))
        case "vschema":
            return asyncio.run(_vschema(args))
    return asyncio.run(_lookup_vindex(args))


async def _topo(args: argparse.Namespace) -> int:
    import yaml

    if args.topo_command == "import":
        from shardgate.topo.file import load_cluster_file
        from shardgate.topo.local import open_topo, store_url_for

        topology = load_cluster_file(args.file)
        beside = cluster_file_of(args) if (args.cluster or args.data_dir) else args.file
        server = await open_topo(url=args.topo or store_url_for(beside))
        try:
            version = await server.import_topology(topology, replace=args.replace)
        finally:
            await server.close()
        print(f"imported {len(topology.keyspaces)} keyspace(s) into {server.location}, "
              f"version {version}")
        return 0
    server = await open_store(args)
    try:
        topology = await server.load_topology()
    finally:
        await server.close()
    print(f"# topo version {topology.version}")
    print(yaml.safe_dump(topology.to_dict(), sort_keys=False), end="")
    return 0


async def _vschema(args: argparse.Namespace) -> int:
    if args.vschema_command == "show" and not (args.topo or args.cluster or args.data_dir):
        from shardgate.api.grpc.client import GateClient  # only this form needs gRPC

        async with GateClient(args.target or DEFAULT_TARGET) as client:
            print(json.dumps(await client.vschema(), indent=2))
        return 0
    server = await open_store(args)
    try:
        match args.vschema_command:
            case "show":
                topology = await server.load_topology()
                print(json.dumps({k.name: k.vschema for k in topology.keyspaces.values()},
                                 indent=2))
            case "get":
                doc, version = await server.keyspace_vschema(args.keyspace)
                print(json.dumps(doc, indent=2))
                print(f"# keyspace {args.keyspace} version {version}", file=sys.stderr)
            case _:
                await _vschema_apply(server, args)
    finally:
        await server.close()
    return 0


async def _vschema_apply(server: TopoServer, args: argparse.Namespace) -> None:
    try:
        text = args.file.read_text()
    except OSError as exc:
        raise NotFound(f"cannot read {args.file}: {exc.strerror}") from exc
    try:
        new = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{args.file}: not valid JSON: {exc}") from exc
    if not isinstance(new, dict):
        raise InvalidArgument(f"{args.file}: a VSchema is a JSON object")
    current, version = await server.keyspace_vschema(args.keyspace)
    expect = args.expect_version if args.expect_version is not None else version
    _, saved = await server.update_vschema(args.keyspace, lambda _doc: new, expect=expect,
                                           dry_run=args.dry_run)
    if args.dry_run:
        diff = difflib.unified_diff(
            _lines(current), _lines(new), fromfile=f"{args.keyspace} (version {version})",
            tofile=str(args.file))
        sys.stdout.writelines(diff)
        print(f"dry run: the VSchema of {args.keyspace} is valid; nothing saved")
        return
    if saved == version:
        print(f"unchanged: {args.file} is the VSchema of keyspace {args.keyspace} already "
              f"(version {version}; nothing saved)")
        return
    print(f"applied {args.file} to keyspace {args.keyspace}: version {saved}")


def _lines(doc: Any) -> list[str]:
    return [line + "\n" for line in json.dumps(doc, indent=2, sort_keys=True).splitlines()]


async def _lookup_vindex(args: argparse.Namespace) -> int:
    server = await open_store(args)
    try:
        if args.lookup_command == "show":
            records = await server.list_workflows()
            docs = {r.name: r.doc for r in records
                    if r.doc is not None and (args.name is None or r.name == args.name)}
            print(json.dumps(docs, indent=2, default=str))
            return 0
        from shardgate.gate import Gate
        from shardgate.workflows.lookup_vindex import LookupVindexSpec, LookupVindexWorkflow

        gate = Gate.open(await server.load_topology(), topo=server)
        try:
            if args.lookup_command == "create":
                spec = LookupVindexSpec(
                    keyspace=args.keyspace, table=args.table_owner,
                    columns=tuple(c.strip() for c in args.columns.split(",")),
                    vindex_type=args.vindex_type, lookup_table=args.lookup_table,
                    name=args.name, column_type=args.column_type,
                    ignore_nulls=args.ignore_nulls)
                bar = Progress("backfill")
                flow = LookupVindexWorkflow(gate, server, spec, batch=args.batch,
                                            settle_s=args.settle, progress=bar)
                report = await flow.create()
                bar.end()
                print(f"{spec.workflow}: verified: {report.owner_rows} owner rows, "
                      f"{report.lookup_rows} lookup rows ({report.backfilled} inserted by "
                      f"the backfill, {report.repaired_missing} repaired, "
                      f"{report.deleted_orphans} orphans deleted); run "
                      f"`shardgate lookup-vindex externalize --keyspace {spec.keyspace} "
                      f"--name {spec.name}` to route by it")
            else:
                flow = await LookupVindexWorkflow.resume(gate, server, args.keyspace, args.name)
                await flow.externalize()
                print(f"{flow.spec.workflow}: externalized: vindex {args.keyspace}.{args.name} "
                      "now routes")
        finally:
            await gate.close()
    finally:
        await server.close()
    return 0

