"""``shardgate reshard``: split or merge the shards of a live keyspace.

::

    shardgate reshard create --keyspace KS --source -80 --target -40,40-80
                  --target-url -40=URL --target-url 40-80=URL [--workflow W] [--batch N]
    shardgate reshard status   --keyspace KS [--workflow W] [--json]
    shardgate reshard run      --keyspace KS [--workflow W] [--follow]
                                      (resume the copy, catch up; --follow: keep at it)
    shardgate reshard vdiff    --keyspace KS [--workflow W] [--json]
    shardgate reshard switch-traffic --keyspace KS (--reads | --writes) [--dry-run]
                  [--max-lag S]
    shardgate reshard reverse-traffic --keyspace KS [--max-lag S]
    shardgate reshard complete --keyspace KS
    shardgate reshard cancel   --keyspace KS
                                      (each with [--topo URL | --cluster F | --data-dir D])

Like ``lookup-vindex`` these work on the topo store and the shard databases
directly; running gates follow the keyspace record through their watchers.
``create`` with the same arguments resumes a workflow a crash interrupted.
See docs/resharding.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import TYPE_CHECKING, Any

from shardgate.cli.common import open_store, store_args
from shardgate.cli.defaults import COPY_BATCH, MAX_LAG_S
from shardgate.cli.progress import Progress
from shardgate.errors import InvalidArgument

if TYPE_CHECKING:  # the workflow (and the gate below it) load when a command runs
    from shardgate.workflows.base import Workflow


def add_parsers(commands: Any) -> None:
    """Add the ``reshard`` subcommands."""
    rs = commands.add_parser("reshard", help="split or merge the shards of a live keyspace")
    cmds = rs.add_subparsers(dest="reshard_command", required=True, metavar="COMMAND")

    def common(name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = cmds.add_parser(name, help=help_)
        p.add_argument("--keyspace", required=True, help="the keyspace to reshard")
        p.add_argument("--workflow", default="reshard", help="the workflow's name")
        store_args(p)
        return p

    create = common("create", "create (or resume) a reshard and copy the rows")
    create.add_argument("--source", required=True, help="source shards, comma-separated")
    create.add_argument("--target", required=True, help="target shards, comma-separated")
    create.add_argument("--target-url", action="append", default=[], metavar="SHARD=URL",
                        help="the database of a target shard (once per target)")
    create.add_argument("--batch", type=int, default=COPY_BATCH, help="rows per copy batch")
    for name, help_ in (("status", "the workflow's state, streams and lag"),
                        ("vdiff", "compare sources and targets at one consistent point")):
        p = common(name, help_)
        p.add_argument("--json", action="store_true", help="print JSON")
    run_ = common("run", "resume the copy, then catch up with the sources")
    run_.add_argument("--follow", action="store_true",
                      help="keep catching up until interrupted (Ctrl-C / SIGTERM)")
    sw = common("switch-traffic", "serve reads, then writes, from the targets")
    which = sw.add_mutually_exclusive_group(required=True)
    which.add_argument("--reads", action="store_true", help="switch reads")
    which.add_argument("--writes", action="store_true", help="switch writes")
    sw.add_argument("--dry-run", action="store_true", help="check and say what would happen")
    sw.add_argument("--max-lag", type=float, default=MAX_LAG_S,
                    help="refuse the write switch if the targets lag more (seconds)")
    rv = common("reverse-traffic", "serve reads (and, after the write switch, writes) from "
                "the sources again")
    rv.add_argument("--max-lag", type=float, default=MAX_LAG_S,
                    help="after the write switch: refuse if the sources lag more (seconds)")
    common("complete", "after the write switch: remove the sources from the keyspace")
    common("cancel", "before the write switch: remove the targets from the keyspace")


def run(args: argparse.Namespace) -> int:
    """Run one ``reshard`` subcommand."""
    return asyncio.run(_run(args))


def _shards(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _urls(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs:
        shard, sep, url = pair.partition("=")
        if not sep or not shard or not url:
            raise InvalidArgument(f"--target-url {pair!r}: give SHARD=URL")
        out.append((shard.strip(), url.strip()))
    return tuple(sorted(out))


async def _run(args: argparse.Namespace) -> int:
    from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow

    server = await open_store(args)
    try:
        cmd = args.reshard_command
        bar = Progress("copy")
        if cmd == "create":
            spec = ReshardSpec(keyspace=args.keyspace, sources=_shards(args.source),
                               targets=_shards(args.target), target_urls=_urls(args.target_url),
                               workflow=args.workflow)
            flow = ReshardWorkflow(server, spec, batch=args.batch, progress=bar)
        else:
            flow = await ReshardWorkflow.resume(server, args.keyspace, args.workflow,
                                                progress=bar)
        try:
            return await _command(flow, args, bar)
        finally:
            bar.end()
            await flow.close()
    finally:
        await server.close()


async def _command(flow: Workflow[Any], args: argparse.Namespace, bar: Progress) -> int:
    match args.reshard_command:
        case "run" if args.follow:
            await flow.run()
            bar.end()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            print(f"{flow.spec.record}: following the sources; Ctrl-C stops", file=sys.stderr)
            await flow.follow(stop)
            print(f"{flow.spec.record}: stopped following", file=sys.stderr)
        case "create" | "run":
            await (flow.create() if args.reshard_command == "create" else flow.run())
            bar.end()
            status = await flow.status()
            print(f"{flow.spec.record}: {status['state']}: {status['rows_copied']} rows "
                  "copied; the targets are caught up. Next: "
                  f"`shardgate {flow.command} vdiff`, then `switch-traffic --reads`, then "
                  "`--writes`")
        case "status":
            status = await flow.status()
            if args.json:
                print(json.dumps(status, indent=2, default=str))
            else:
                _print_status(status)
        case "vdiff":
            reports = await flow.vdiff()
            if args.json:
                print(json.dumps([r.to_doc() for r in reports], indent=2, default=str))
            else:
                print(f"{'table':20} {'processed':>10} {'matching':>10} {'mismatched':>10} "
                      f"{'extra src':>10} {'extra dst':>10}")
                for r in reports:
                    print(f"{r.table:20} {r.processed:>10} {r.matching:>10} {r.mismatched:>10} "
                          f"{r.extra_source:>10} {r.extra_target:>10}")
                    for s in r.samples:
                        print(f"    {s}")
            return 0 if all(r.clean for r in reports) else 3
        case "switch-traffic":
            if args.reads:
                print(await flow.switch_reads(dry_run=args.dry_run))
            else:
                out = await flow.switch_writes(dry_run=args.dry_run, max_lag_s=args.max_lag)
                if out.get("dry_run"):
                    print(f"dry run: would {out['plan']}")
                else:
                    print(f"writes switched ({flow.spec.record}) to "
                          f"{list(flow.spec.targets)}; the sources refused writes for "
                          f"{out['frozen_s'] * 1000:.0f} ms (final catch-up "
                          f"{out['catch_up_s'] * 1000:.0f} ms)")
                    print("cut-over steps: " + ", ".join(
                        f"{k[:-2]} {v * 1000:.0f} ms" for k, v in out.items()
                        if k.endswith("_s") and k != "frozen_s")
                        + f"; published at {out.get('published_at', 0.0):.3f}")
        case "reverse-traffic":
            print(await flow.reverse_traffic(max_lag_s=args.max_lag))
        case "complete":
            print(await flow.complete())
        case "cancel":
            print(await flow.cancel())
    return 0


def _print_status(status: dict[str, Any]) -> None:
    from shardgate.gate.cutover import HOLD_S

    print(f"{status['workflow']}: {status['state']}  rows copied {status['rows_copied']}/"
          f"{status['estimate']}  reads switched: {status['reads_switched']}")
    if status.get("runner_pid"):
        print(f"followed by process {status['runner_pid']}")
    if status.get("interrupted"):
        finish = ("finishes it (its journal is written)" if status["interrupted"] == "forward"
                  else "rolls it back (no journal yet)")
        what = "write" if status["state"] == "cutover" else "reverse"
        print(f"the {what} cut-over was interrupted (its process is gone): the "
              f"frozen shards refuse writes (gates hold them {HOLD_S:g} s, then fail them) "
              f"until the next command, e.g. `shardgate reshard run`, {finish}")
    if status.get("last_error"):
        print(f"last error: {status['last_error']}")
    paused = (status.get("metrics") or {}).get("cutover_s")
    if paused is not None:
        print(f"last write cut-over: writes paused {paused:.3f}s")
    print(f"{'stream':10} {'state':10} {'position':>16} {'behind':>10} {'lag s':>8}  last error")
    for name, s in status["streams"].items():
        print(f"{name:10} {s['state']:10} {s['position']!s:>16} {s['behind']!s:>10} "
              f"{s['lag_s']:>8.2f}  {s['last_error'] or ''}")
    for name, s in (status.get("reverse_streams") or {}).items():
        print(f"{name:10} {'reverse':10} {s['position']!s:>16} {s['behind']!s:>10} "
              f"{s['lag_s']:>8.2f}  (targets -> sources)")

