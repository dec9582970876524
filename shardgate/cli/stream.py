"""``shardgate stream``: print a keyspace's change stream as JSON lines, resumably.

One line per row change::

    {"keyspace": "commerce", "shard": "-40", "table": "corder", "op": "update",
     "pk": [7], "before": {...}, "after": {...}, "token": "et1....",
     "timestamp": 1700000000.123, "safe_timestamp": 1700000000.0}

``--from-timestamp T`` starts at the first commit at or after ``T``;
``--from-token POS`` right after a serialized stream position. With
``--state-file F`` the position is saved to ``F`` after every transaction
(atomically), and a later run with the same file resumes exactly there: no
gap, no repeat. ``--count N`` stops after N row changes (scripts, tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardgate.cli.common import (
    DEFAULT_TARGET,
    add_target_args,
    client_security,
    local_gate,
)
from shardgate.errors import InvalidArgument

if TYPE_CHECKING:  # loaded when the command runs (``stream --help`` loads neither)
    from shardgate.streams.merge import StreamEvent, StreamPosition


def add_parsers(commands: Any) -> None:
    p = commands.add_parser("stream", help="print the change stream of a keyspace (JSON lines)")
    add_target_args(p, remote=True)
    p.add_argument("--keyspace", required=True, help="the keyspace to follow")
    p.add_argument("--key-range", help="only this key range (-80, 20-60, ...)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-timestamp", type=float, help="start at this time (epoch seconds)")
    start.add_argument("--from-token", help="start right after this saved stream position")
    p.add_argument("--state-file", type=Path, help="save the position here; resume from it")
    p.add_argument("--count", type=int, default=0, help="stop after this many row changes")
    p.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat interval (s)")


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_stream(args))


def _start(args: argparse.Namespace) -> tuple[float | str | None, StreamPosition]:
    from shardgate.streams.merge import StreamPosition

    if args.state_file is not None and args.state_file.exists():
        text = args.state_file.read_text().strip()
        if text:
            return text, StreamPosition.parse(text)
    if args.from_token:
        return args.from_token, StreamPosition.parse(args.from_token)
    since = args.from_timestamp if args.from_timestamp is not None else time.time()
    return args.from_timestamp, StreamPosition(since=since)


def _save(path: Path, position: StreamPosition) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(position.serialize() + "\n")
    os.replace(tmp, path)


async def _stream(args: argparse.Namespace) -> int:
    if args.count < 0:
        raise InvalidArgument("--count must be >= 0")
    start, position = _start(args)
    if args.cluster or args.data_dir:
        from shardgate.auth.identity import TRUSTED

        gate = await local_gate(args)
        try:
            events = gate.update_stream(
                args.keyspace, args.key_range, start, heartbeat_s=args.heartbeat,
                identity=TRUSTED,  # in-process: the cluster file's URLs reach the shards anyway
            )
            return await _print(events, args, position)
        finally:
            await gate.close()

    from shardgate.api.grpc.client import GateClient

    async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace,
                          security=client_security(args)) as client:
        events = client.update_stream(
            args.keyspace, args.key_range, start, heartbeat_s=args.heartbeat
        )
        return await _print(events, args, position)


async def _print(
    events: AsyncIterator[StreamEvent], args: argparse.Namespace, position: StreamPosition
) -> int:
    printed = 0
    out = sys.stdout
    try:
        async for event in events:
            for row in event.rows():
                line = {
                    "keyspace": row.keyspace, "shard": row.shard, "table": row.table,
                    "op": row.op, "pk": list(row.pk), "before": row.before, "after": row.after,
                    "token": row.token.serialize(), "timestamp": row.token.timestamp,
                    "safe_timestamp": event.safe_timestamp,
                }
                out.write(json.dumps(line, default=str) + "\n")
                printed += 1
            position.advance(event)
            if event.changes:
                out.flush()
                if args.state_file is not None:
                    _save(args.state_file, position)
            if args.count and printed >= args.count:
                break
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    if args.state_file is not None and position.tokens:
        _save(args.state_file, position)
    return 0
