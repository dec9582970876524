"""The ``shardgate queue`` commands (wired into :mod:`shardgate.cli.app`).

::

    shardgate queue create --keyspace KS "CREATE QUEUE q (...) ..."   [target]
    shardgate queue stats  --keyspace KS QUEUE [--json]               [target]
    shardgate queue tail   --keyspace KS QUEUE [--limit N]            [target]
    shardgate queue requeue-failed --keyspace KS QUEUE                [--cluster | --data-dir]
    shardgate queue purge  --keyspace KS QUEUE [--state acked|failed] [--cluster | --data-dir]
    shardgate queue segments list|stats --keyspace KS QUEUE [--json]  [--cluster | --data-dir]
    shardgate queue segments retry|abort --keyspace KS QUEUE --shard S JOB_ID... [--reason R]
                                                                      [--cluster | --data-dir]

``[target]`` is ``--target grpc://H:P`` (a running gate), ``--cluster FILE`` or
``--data-dir DIR`` (open the cluster in this process).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
from typing import Any

from shardgate.cli.common import (
    DEFAULT_TARGET,
    add_target_args,
    client_security,
    format_result,
    local_gate,
)
from shardgate.errors import InvalidArgument
from shardgate.result import Result

# The gRPC client, the gate and the queue stores are imported where a command uses
# them: a remote command does not load the gate, a local one not gRPC.


def add_parsers(commands: Any) -> None:
    """Add the ``queue`` subcommands to the ``shardgate`` parser."""
    queue = commands.add_parser("queue", help="durable queues: create, stats, tail, ...")
    sub = queue.add_subparsers(dest="queue_command", required=True, metavar="COMMAND")
    create = sub.add_parser("create", help="run a CREATE QUEUE statement")
    create.add_argument("sql", metavar="SQL")
    stats = sub.add_parser("stats", help="depth per state, lag, rates, in flight, per shard")
    stats.add_argument("--json", action="store_true", help="print JSON")
    tail = sub.add_parser("tail", help="the newest events: the queue's own columns (times "
                          "as ISO-8601, UTC), then its columns")
    tail.add_argument("--limit", type=int, default=20, help="how many events")
    requeue = sub.add_parser("requeue-failed", help="fire failed events again")
    purge = sub.add_parser("purge", help="delete acked (or failed) events now")
    purge.add_argument("--state", choices=["acked", "failed"], default="acked",
                       help="which events to delete")
    for p in (create, stats, tail, requeue, purge):
        p.add_argument("--keyspace", required=True, help="keyspace of the queue")
        add_target_args(p, remote=p in (create, stats, tail))
    for p in (stats, tail, requeue, purge):
        p.add_argument("queue", metavar="QUEUE")
    _add_segments_parsers(sub)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_queue(args))


async def _queue(args: argparse.Namespace) -> int:
    cmd = args.queue_command
    if cmd == "segments":
        return await _segments(args)
    local = bool(getattr(args, "cluster", None) or getattr(args, "data_dir", None))
    if not local and cmd in ("requeue-failed", "purge"):
        raise InvalidArgument(f"queue {cmd} needs --cluster FILE or --data-dir DIR")
    if not local:
        from shardgate.api.grpc.client import GateClient

        async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace,
                          security=client_security(args)) as client:
            if cmd == "create":
                print(format_result(await client.execute(args.sql)))
            elif cmd == "stats":
                _print_stats(await client.queue_stats(args.queue), args.json)
            else:
                print(format_result(tail_view(await client.execute(_tail_sql(args)))))
        return 0
    from shardgate.auth.identity import TRUSTED
    from shardgate.queues.table.store import QueueStore

    gate = await local_gate(args)
    try:
        session = gate.session(args.keyspace, identity=TRUSTED)
        if cmd == "create":
            print(format_result(await gate.execute(session, args.sql)))
        elif cmd == "stats":
            _print_stats(await gate.queue_stats(args.keyspace, args.queue), args.json)
        elif cmd == "tail":
            print(format_result(tail_view(await gate.execute(session, _tail_sql(args)))))
        else:
            total = 0
            ks = gate.topology.keyspace(args.keyspace)
            for shard in ks.shards:
                tc: Any = gate.tablets[(ks.name, shard.name)]
                store = QueueStore(args.queue, tc.dialect, tc.placeholder)
                backend = tc.tablet.backend
                conn = await backend.acquire()
                try:
                    if cmd == "requeue-failed":
                        total += await store.requeue_failed(conn)
                    else:
                        total += await _purge_state(store, conn, args.state)
                finally:
                    await backend.release(conn)
            print(f"{cmd}: {total} event(s)")
    finally:
        await gate.close()
    return 0


#: a queue table's own columns, as ``queue tail`` shows them first (times as ISO-8601)
TAIL_COLUMNS = ("id", "state", "epoch", "priority", "time_scheduled", "time_next", "time_acked")
_TIMES = frozenset({"time_scheduled", "time_next", "time_acked"})


def _tail_sql(args: argparse.Namespace) -> str:
    return (f"SELECT * FROM {args.queue} ORDER BY time_scheduled DESC "
            f"LIMIT {int(args.limit)}")


def tail_view(result: Result) -> Result:
    """The newest events as ``queue tail`` prints them: the queue's own columns first,
    their nanosecond times as ISO-8601 (UTC), then the queue's columns."""
    lower = [f.lower() for f in result.fields]
    order = [lower.index(c) for c in TAIL_COLUMNS if c in lower]
    order += [i for i, f in enumerate(lower) if f not in TAIL_COLUMNS]
    times = {i for i in order if lower[i] in _TIMES}
    return Result.of_rows(
        [result.fields[i] for i in order],
        [tuple(_iso(row[i]) if i in times else row[i] for i in order) for row in result.rows])


def _iso(ns: Any) -> Any:
    """Nanoseconds since the epoch as ISO-8601 (UTC, microseconds); 0 (no time yet: an
    event not fired) and None are NULL."""
    if not ns:
        return None
    if isinstance(ns, bool) or not isinstance(ns, int | float):
        return ns
    stamp = datetime.datetime.fromtimestamp(int(ns) // 1000 / 1e6, tz=datetime.UTC)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


async def _purge_state(store: Any, conn: Any, state: str) -> int:
    res = await conn.execute(f"DELETE FROM {store.quote(store.table)} WHERE state = {store.ph}",
                             [state])
    return int(res.rows_affected)


def _print_stats(stats: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(stats, indent=2, default=str))
        return
    head = ("shard", "to_be_fired", "fired", "acked", "failed", "lag_s", "in_flight",
            "fired/s", "acked/s", "retries", "blocked_keys", "leader")
    print("  ".join(f"{h:>11}" for h in head))
    for st in stats:
        d = st.get("depth", {})
        row = (st.get("shard"), d.get("to_be_fired"), d.get("fired"), d.get("acked"),
               d.get("failed"), f"{st.get('lag_seconds', 0):.3f}", st.get("in_flight", "-"),
               f"{st.get('fired_per_second', 0):.1f}", f"{st.get('acked_per_second', 0):.1f}",
               st.get("retries", "-"), st.get("blocked_keys", "-"), st.get("leader"))
        print("  ".join(f"{v!s:>11}" for v in row))


# -- segmented queues (shardgate.queues.segmented) ------------------------------------------


def _add_segments_parsers(sub: Any) -> None:
    seg = sub.add_parser("segments", help="segmented queues: datasets, stats, retry, abort")
    ssub = seg.add_subparsers(dest="segments_command", required=True, metavar="COMMAND")
    lst = ssub.add_parser("list", help="datasets per shard: state, rows, bytes on disk")
    st = ssub.add_parser("stats", help="jobs per state, pending per key, blocked keys")
    retry = ssub.add_parser("retry", help="retry jobs now (waiting or aborted ones)")
    abort = ssub.add_parser("abort", help="abort pending jobs")
    for p in (lst, st):
        p.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--keys", type=int, default=10, help="how many keys to show")
    for p in (lst, st, retry, abort):
        p.add_argument("--keyspace", required=True, help="keyspace of the queue")
        add_target_args(p, remote=False)
        p.add_argument("queue", metavar="QUEUE")
    for p in (retry, abort):
        p.add_argument("--shard", required=True, help="the shard holding the jobs")
        p.add_argument("--reason", default=None, help="recorded in the status row")
        p.add_argument("job_ids", metavar="JOB_ID", type=int, nargs="+")


async def _segments(args: argparse.Namespace) -> int:
    from shardgate.queues.segmented.queue import SegmentedQueue

    gate = await local_gate(args)
    try:
        q = SegmentedQueue.from_gate(gate, args.keyspace, args.queue)
        cmd = args.segments_command
        if cmd in ("retry", "abort"):
            for job_id in args.job_ids:
                await q.request(args.shard, job_id, cmd, args.reason)
            print(f"{cmd}: {len(args.job_ids)} job(s) requested on shard {args.shard}; the "
                  "shard's consumer applies them within its compaction interval")
            return 0
        info = await q.inspect(keys=getattr(args, "keys", 10))
        if args.json:
            print(json.dumps(info, indent=2, default=str))
        elif cmd == "list":
            print(f"{'shard':>8} {'dataset':>8} {'state':>8} {'rows':>9} {'bytes':>12} "
                  f"{'job ids':>22}")
            for shard in info:
                for d in shard["datasets"]:
                    ids = f"[{d['job_ids'][0]}, {d['job_ids'][1]})"
                    print(f"{shard['shard']:>8} {d['n']:>8} {d['state']:>8} {d['rows']:>9} "
                          f"{d['table_bytes']:>12} {ids:>22}")
        else:
            for shard in info:
                print(f"shard {shard['shard']}: datasets {len(shard['datasets'])}, jobs by "
                      f"state {shard['jobs_by_state']}")
                print(f"  pending per key: {shard['pending_per_key']}")
                print(f"  blocked keys (first failed job): {shard['blocked_keys']}")
        return 0
    finally:
        await gate.close()
