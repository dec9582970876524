"""The ``shardgate inbox`` commands (wired into :mod:`shardgate.cli.app`).

::

    shardgate inbox create   --keyspace KS NAME [options]       [--cluster | --data-dir]
    shardgate inbox maintain --keyspace KS NAME [options]       (run it from cron)
    shardgate inbox buckets  --keyspace KS NAME [options]
    shardgate inbox append   --keyspace KS NAME USER BODY [options]
    shardgate inbox read     --keyspace KS NAME USER [--consumer C] [--limit N] [--commit]

``[options]`` are the inbox's options (:class:`~shardgate.queues.inbox.model.InboxOptions`):
``--granularity``, ``--retention``, ``--rescan-window``, ``--forward-insert``,
``--precreate``, ``--vindex``, ``--user-type``. Every process serving one inbox
must use the same ones (the granularity is checked against the tables).
The commands open the cluster in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from shardgate.cli.common import add_target_args, local_gate
from shardgate.errors import InvalidArgument
from shardgate.queues.inbox import model
from shardgate.queues.inbox.store import InboxStore


def add_parsers(commands: Any) -> None:
    """Add the ``inbox`` subcommands to the ``shardgate`` parser."""
    inbox = commands.add_parser("inbox", help="per-user inboxes: create, maintain, read, ...")
    sub = inbox.add_subparsers(dest="inbox_command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
        p.add_argument("--keyspace", required=True)
        p.add_argument("name", metavar="NAME", help="the inbox name")
        add_target_args(p, remote=False)
        p.add_argument("--granularity", choices=model.GRANULARITIES,
                       default=model.DEFAULT_GRANULARITY)
        p.add_argument("--retention", type=float, default=model.DEFAULT_RETENTION_S,
                       help="seconds (default 30 days)")
        p.add_argument("--rescan-window", type=float, default=model.DEFAULT_RESCAN_WINDOW_S,
                       help="seconds a read re-scans below its pointer")
        p.add_argument("--forward-insert", action="store_true")
        p.add_argument("--precreate", type=int, default=model.DEFAULT_PRECREATE)
        p.add_argument("--vindex", default=model.DEFAULT_VINDEX)
        p.add_argument("--user-type", choices=model.USER_TYPES, default=model.DEFAULT_USER_TYPE)
        return p

    command("create", "create the pointer table and the first buckets")
    command("maintain", "create buckets ahead, drop expired buckets whole")
    command("buckets", "list the bucket tables")
    append = command("append", "append one message to a user's inbox")
    append.add_argument("user")
    append.add_argument("body")
    read = command("read", "read a user's messages after a consumer's pointer")
    read.add_argument("user")
    read.add_argument("--consumer", default="cli")
    read.add_argument("--limit", type=int, default=20)
    read.add_argument("--commit", action="store_true", help="commit the consumer's pointer")


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_inbox(args))


def _options(args: argparse.Namespace) -> model.InboxOptions:
    return model.InboxOptions(
        granularity=args.granularity, retention_s=args.retention,
        rescan_window_s=args.rescan_window, forward_insert=args.forward_insert,
        precreate=args.precreate, vindex=args.vindex, user_type=args.user_type)


async def _inbox(args: argparse.Namespace) -> int:
    gate = await local_gate(args)
    try:
        store = InboxStore(gate, args.keyspace, args.name, _options(args))
        cmd = args.inbox_command
        if cmd in ("create", "maintain"):
            report = await (store.create() if cmd == "create" else store.maintain())
            print(json.dumps({"created": report.created, "dropped": report.dropped}))
        elif cmd == "buckets":
            await store.open()
            for b in store.buckets():
                print(b.table)
        elif cmd == "append":
            m = await store.append(_user(args), args.body)
            print(json.dumps({"ts": m.ts, "msg_id": m.msg_id}))
        else:
            user = _user(args)
            r = await store.read_committed(user, args.consumer, limit=args.limit)
            for m in r.messages:
                print(json.dumps({"ts": m.ts, "msg_id": m.msg_id, "body": m.body}))
            if args.commit and r.pointer is not None:
                await store.commit(user, args.consumer, r.pointer)
            print(json.dumps({"more": r.more,
                              "pointer": r.pointer.encode() if r.pointer else None}))
    finally:
        await gate.close()
    return 0


def _user(args: argparse.Namespace) -> Any:
    if args.user_type == "bigint":
        try:
            return int(args.user)
        except ValueError:
            raise InvalidArgument(
                f"user {args.user!r} is not an integer (the inbox's user type is bigint)"
            ) from None
    return args.user
