"""The ``shardgate spark`` commands (wired into :mod:`shardgate.cli`).

::

    shardgate spark dump    (--cluster F | --data-dir D) --keyspace K --table T
                            --lake PATH [--follow] [--key COL,COL] [--batch-rows N]
                            [--batch-interval S] [--retention S] [--buckets N]
                            [--numeric-as decimal|string]
    shardgate spark archive (--cluster F | --data-dir D) --keyspace K --queue Q
                            --before ISO --out PATH [--chunk-rows N]

Both take ``--master`` (default ``$SPARK_MASTER`` or ``local[2]``), print
progress lines on stderr and one JSON summary on stdout. ``dump --follow``
keeps applying changes until SIGINT/SIGTERM, then commits what it has and
prints its summary; it follows the cluster's topo store, so it keeps going
across a reshard's write switch (docs/spark.md, "Across a reshard").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from typing import Any

from shardgate.cli.common import cluster_file_of, local_topology
from shardgate.errors import FailedPrecondition, InvalidArgument


def add_parsers(commands: Any) -> None:
    """Add the ``spark`` subcommands to the ``shardgate`` parser."""
    spark = commands.add_parser("spark", help="pipeline jobs on Spark: dump, archive")
    sub = spark.add_subparsers(dest="spark_command", required=True, metavar="COMMAND")
    dump = sub.add_parser(
        "dump", help="a table's snapshot into a Delta lake table, kept up to date by the "
        "change stream")
    dump.add_argument("--table", required=True, help="the table to dump")
    dump.add_argument("--lake", required=True, help="directory of the lake (Delta) table")
    dump.add_argument("--follow", action="store_true",
                      help="keep applying changes until interrupted")
    dump.add_argument("--key", help="key columns, comma-separated (default: primary key)")
    dump.add_argument("--batch-rows", type=int, default=50_000, help="change rows per MERGE")
    dump.add_argument("--batch-interval", type=float, default=1.0,
                      help="a MERGE at least this often while changes come (s)")
    dump.add_argument("--retention", type=float, default=60.0,
                      help="seconds old lake versions stay readable before vacuum")
    dump.add_argument("--buckets", type=int, default=None,
                      help="lake partitions, a power of two (default: ~512 rows each)")
    dump.add_argument("--numeric-as", choices=("decimal", "string"), default="decimal",
                      help="type of unbounded NUMERIC columns (docs/types.md)")
    archive = sub.add_parser(
        "archive", help="acked queue events older than a cut-off into Parquet, then purged")
    archive.add_argument("--queue", required=True, help="the queue whose events to archive")
    archive.add_argument("--before", required=True,
                         help="cut-off, ISO 8601 (UTC unless an offset is given)")
    archive.add_argument("--out", required=True, help="directory of the archive")
    archive.add_argument("--chunk-rows", type=int, default=100_000,
                         help="events per chunk (written, then purged)")
    for p in (dump, archive):
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--cluster", help="cluster file (YAML)")
        where.add_argument("--data-dir", help="the cluster of `shardgate up --data-dir DIR`")
        p.add_argument("--keyspace", required=True, help="keyspace of the table or queue")
        p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"),
                       help="Spark master (default $SPARK_MASTER or local[2])")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _spark(master: str, app: str) -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise FailedPrecondition(
            f"the spark jobs need the 'spark' extra (pip install 'shardgate[spark]'): {exc}"
        ) from exc
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(master).appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def run(args: argparse.Namespace) -> int:
    topology = local_topology(args)
    if args.spark_command == "dump":
        return _dump(args, topology)
    return _archive(args, topology)


def _dump(args: argparse.Namespace, topology: Any) -> int:
    from shardgate.spark.jobs import DumpJob

    if args.batch_rows < 1 or args.batch_interval <= 0:
        raise InvalidArgument("--batch-rows must be >= 1 and --batch-interval > 0")
    key = [k.strip() for k in args.key.split(",") if k.strip()] if args.key else None
    spark = _spark(args.master, f"shardgate dump {args.keyspace}.{args.table}")
    stop = threading.Event()

    async def run() -> Any:
        if args.follow:
            # In the event loop, not in a signal handler: a second signal arriving while
            # the first one's Event.set() holds its lock would deadlock there.
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        return await job.run(follow=args.follow, stop=stop)

    try:
        job = DumpJob(
            topology, args.keyspace, args.table, args.lake, spark=spark, key=key,
            batch_rows=args.batch_rows, batch_interval_s=args.batch_interval,
            progress=_progress, retention_s=args.retention, buckets=args.buckets,
            numeric_as=args.numeric_as, cluster_file=str(cluster_file_of(args)),
        )
        summary = asyncio.run(run())
    finally:
        spark.stop()
    print(json.dumps(summary.to_dict(), indent=2))
    return 0


def _archive(args: argparse.Namespace, topology: Any) -> int:
    from shardgate.spark.jobs import ArchiveJob, parse_before

    before = parse_before(args.before)
    spark = _spark(args.master, f"shardgate archive {args.keyspace}.{args.queue}")
    try:
        job = ArchiveJob(spark, topology, args.keyspace, args.queue, before, args.out,
                         chunk_rows=args.chunk_rows, progress=_progress)
        summary = job.run_sync()
    finally:
        spark.stop()
    print(json.dumps(summary.to_dict(), indent=2))
    return 0
