"""The ``shardgate inbox`` commands (wired into :mod:`shardgate.cli.app`).

::

    shardgate inbox create   --keyspace KS NAME [options]                  [target]
    shardgate inbox maintain --keyspace KS NAME                            (run it from cron)
    shardgate inbox buckets  --keyspace KS NAME
    shardgate inbox append   --keyspace KS NAME USER BODY
    shardgate inbox read     --keyspace KS NAME USER [--consumer C] [--limit N] [--commit]
    shardgate inbox stats    --keyspace KS NAME
    shardgate inbox list     --keyspace KS

``[target]`` is ``--target grpc://H:P`` (a running gate; the default when
neither of the others is given), ``--cluster FILE`` or ``--data-dir DIR``
(the cluster opened in this process); every command takes it.

``[options]`` are the inbox's options (:class:`~shardgate.queues.inbox.model.InboxOptions`):
``--granularity``, ``--retention``, ``--rescan-window``, ``--forward-insert``,
``--precreate``, ``--vindex``, ``--user-type``. ``create`` stores them with the
inbox (unset ones take their defaults); every other command uses the stored
ones, and an option given to it must equal the stored one
(``FAILED_PRECONDITION`` otherwise), so no process runs an inbox with a second
configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from shardgate.cli.common import DEFAULT_TARGET, add_target_args, local_gate
from shardgate.errors import FailedPrecondition, InvalidArgument
from shardgate.queues.inbox import model

if TYPE_CHECKING:  # loaded by the side that runs: a remote command never loads the gate
    from shardgate.api.grpc.client import GateClient
    from shardgate.gate import Gate
    from shardgate.queues.inbox.store import InboxRead, MaintainReport

#: CLI flag -> InboxOptions field
_FLAGS = {"granularity": "granularity", "retention": "retention_s",
          "rescan_window": "rescan_window_s", "forward_insert": "forward_insert",
          "precreate": "precreate", "vindex": "vindex", "user_type": "user_type"}


def add_parsers(commands: Any) -> None:
    """Add the ``inbox`` subcommands to the ``shardgate`` parser."""
    inbox = commands.add_parser("inbox", help="per-user inboxes: create, maintain, read, ...")
    sub = inbox.add_subparsers(dest="inbox_command", required=True, metavar="COMMAND")

    def command(name: str, help_: str, *, named: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
        p.add_argument("--keyspace", required=True, help="keyspace of the inbox")
        if named:
            p.add_argument("name", metavar="NAME", help="the inbox name")
        add_target_args(p, remote=True)
        if not named:
            return p
        p.add_argument("--granularity", choices=model.GRANULARITIES,
                       help=f"default {model.DEFAULT_GRANULARITY}")
        p.add_argument("--retention", type=float, help="seconds (default 30 days)")
        p.add_argument("--rescan-window", type=float,
                       help="seconds a read re-scans below its pointer "
                            f"(default {model.DEFAULT_RESCAN_WINDOW_S:g})")
        p.add_argument("--forward-insert", action="store_true", default=None,
                       help="create the next buckets ahead of time on insert")
        p.add_argument("--precreate", type=int, help=f"default {model.DEFAULT_PRECREATE}")
        p.add_argument("--vindex", help=f"default {model.DEFAULT_VINDEX}")
        p.add_argument("--user-type", choices=model.USER_TYPES,
                       help=f"default {model.DEFAULT_USER_TYPE}")
        return p

    command("create", "create the pointer table and the first buckets; store the options")
    command("maintain", "create buckets ahead, drop expired buckets whole")
    command("buckets", "list the bucket tables")
    command("stats", "the options, buckets, message and pointer counts (JSON)")
    command("list", "the keyspace's inboxes and their options", named=False)
    append = command("append", "append one message to a user's inbox")
    append.add_argument("user")
    append.add_argument("body")
    read = command("read", "read a user's messages after a consumer's pointer")
    read.add_argument("user")
    read.add_argument("--consumer", default="cli",
                      help="whose pointer to read after (and move with --commit)")
    read.add_argument("--limit", type=int, default=20, help="at most this many messages")
    read.add_argument("--commit", action="store_true", help="commit the consumer's pointer")


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_inbox(args))


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The inbox options given on the command line, by InboxOptions field."""
    return {field: getattr(args, flag) for flag, field in _FLAGS.items()
            if getattr(args, flag, None) is not None}


def _check_given(args: argparse.Namespace, stored: dict[str, Any]) -> None:
    """Options given to a command other than create must equal the stored ones."""
    diff = [f"{k}={v!r} (stored: {stored.get(k)!r})" for k, v in _given(args).items()
            if stored.get(k) != v]
    if diff:
        raise FailedPrecondition(
            f"inbox {args.keyspace}.{args.name} exists with other options: {'; '.join(diff)}; "
            "leave the options out to use the stored ones")


class _Local:
    """The commands on an in-process gate (``--cluster`` / ``--data-dir``)."""

    def __init__(self, gate: Gate, keyspace: str) -> None:
        from shardgate.queues.inbox.registry import InboxRegistry

        self.registry = InboxRegistry(gate)
        self.keyspace = keyspace

    async def create(self, name: str, options: model.InboxOptions) -> MaintainReport:
        return await self.registry.create(self.keyspace, name, options)

    async def maintain(self, name: str) -> MaintainReport:
        return await self.registry.maintain(self.keyspace, name)

    async def stats(self, name: str, counts: bool = False) -> dict[str, Any]:
        return await self.registry.stats(self.keyspace, name, counts=counts)

    async def inboxes(self) -> list[dict[str, Any]]:
        return await self.registry.list(self.keyspace)

    async def append(self, name: str, user: Any, body: str) -> model.Message:
        return await (await self.registry.get(self.keyspace, name)).append(user, body)

    async def read(self, name: str, user: Any, consumer: str, limit: int) -> InboxRead:
        store = await self.registry.get(self.keyspace, name)
        return await store.read_committed(user, consumer, limit=limit)

    async def commit(self, name: str, user: Any, consumer: str, pointer: model.Pointer) -> None:
        await (await self.registry.get(self.keyspace, name)).commit(user, consumer, pointer)


class _Remote:
    """The same commands against a running gate over gRPC."""

    def __init__(self, client: GateClient) -> None:
        self.client = client

    async def create(self, name: str, options: model.InboxOptions) -> MaintainReport:
        return await self.client.inbox_create(name, options)

    async def maintain(self, name: str) -> MaintainReport:
        return await self.client.inbox_maintain(name)

    async def stats(self, name: str, counts: bool = False) -> dict[str, Any]:
        return await self.client.inbox_stats(name, counts=counts)

    async def inboxes(self) -> list[dict[str, Any]]:
        return await self.client.inbox_list()

    async def append(self, name: str, user: Any, body: str) -> model.Message:
        return await self.client.inbox_append(name, user, body)

    async def read(self, name: str, user: Any, consumer: str, limit: int) -> InboxRead:
        return await self.client.inbox_read(name, user, consumer=consumer, limit=limit)

    async def commit(self, name: str, user: Any, consumer: str, pointer: model.Pointer) -> None:
        await self.client.inbox_commit(name, user, consumer, pointer)


async def _inbox(args: argparse.Namespace) -> int:
    if args.cluster or args.data_dir:
        gate = await local_gate(args)
        try:
            await _commands(args, _Local(gate, args.keyspace))
        finally:
            await gate.close()
        return 0
    from shardgate.api.grpc.client import GateClient

    async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace) as client:
        await _commands(args, _Remote(client))
    return 0


async def _commands(args: argparse.Namespace, on: _Local | _Remote) -> None:
    cmd = args.inbox_command
    if cmd == "list":
        for entry in await on.inboxes():
            print(json.dumps(entry, sort_keys=True))
        return
    if cmd == "create":
        report = await on.create(args.name, model.InboxOptions(**_given(args)))
        print(json.dumps({"created": report.created, "dropped": report.dropped}))
        return
    # Opens the inbox (NOT_FOUND if never created); counts only for `stats`.
    stats = await on.stats(args.name, cmd == "stats")
    _check_given(args, stats["options"])
    if cmd == "maintain":
        report = await on.maintain(args.name)
        print(json.dumps({"created": report.created, "dropped": report.dropped}))
    elif cmd == "buckets":
        for b in stats["buckets"]:
            print(b["table"])
    elif cmd == "stats":
        print(json.dumps(stats, sort_keys=True))
    elif cmd == "append":
        m = await on.append(args.name, _user(args, stats["options"]), args.body)
        print(json.dumps({"ts": m.ts, "msg_id": m.msg_id}))
    else:
        user = _user(args, stats["options"])
        r = await on.read(args.name, user, args.consumer, args.limit)
        for m in r.messages:
            print(json.dumps({"ts": m.ts, "msg_id": m.msg_id, "body": m.body}))
        if args.commit and r.pointer is not None:
            await on.commit(args.name, user, args.consumer, r.pointer)
        print(json.dumps({"more": r.more,
                          "pointer": r.pointer.encode() if r.pointer else None}))


def _user(args: argparse.Namespace, options: dict[str, Any]) -> Any:
    if options.get("user_type", model.DEFAULT_USER_TYPE) == "bigint":
        try:
            return int(args.user)
        except ValueError:
            raise InvalidArgument(
                f"user {args.user!r} is not an integer (the inbox's user type is bigint)"
            ) from None
    return args.user
