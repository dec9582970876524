"""The gate's UpdateStream: one keyspace (or key range), its shards' streams merged.

``update_stream(gate, keyspace, key_range, start)`` resolves the shards whose
ranges meet ``key_range``, subscribes to each tablet's change stream and
interleaves them. Order is kept per shard (commit order); there is no global
order across shards, as in the design.

With every event goes ``safe_timestamp``: the smallest, over the shards, of
the latest commit time (or heartbeat watermark) seen on each. Every change
committed at or after it that the client has not received is still to come,
so restarting with ``start=safe_timestamp`` loses nothing (it may repeat
events; compare tokens to drop them). For an exact restart without repeats,
keep a :class:`StreamPosition` (``position.advance(event)``) and restart from it.

Key ranges: shards wholly inside the range pass unfiltered; shards that
straddle its edges are filtered row by row on the keyspace id computed with
the table's primary vindex (functional vindexes only; rows of tables without
one are left out of a partial range).

When the keyspace's shards change under the stream (the gate's topology is
replaced), the stream ends with ``UNAVAILABLE`` (retryable): restart it from
the last ``safe_timestamp``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardgate.aio import cancel_and_wait
from shardgate.backends.changes import Heartbeat, LogItem, RowChange, Transaction
from shardgate.errors import InvalidArgument, ShardgateError, Unavailable, Unsupported
from shardgate.event_token import EventToken, position_key
from shardgate.keys import FULL_RANGE, KeyRange, KeyspaceId, parse_key_range
from shardgate.ports import GateView, StreamShard
from shardgate.topo.model import Topology
from shardgate.vindexes.base import MultiColumn, SingleColumn

#: What the merge needs of the gate that composes it.
StreamGate = GateView[StreamShard]

_POSITION_PREFIX = "sp1."
QUEUE_ITEMS = 256


@dataclass(slots=True)
class RowEvent:
    """One row change with where it happened and its transaction's token."""

    keyspace: str
    shard: str
    table: str
    op: str
    pk: tuple[Any, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    token: EventToken


@dataclass(slots=True)
class StreamEvent:
    """One committed transaction of one shard (or a heartbeat, with no changes).

    ``token`` is the transaction's commit token (for a heartbeat: the shard's
    watermark and position). ``changes`` are its row changes in the key range.
    """

    keyspace: str
    shard: str
    token: EventToken
    changes: list[RowChange]
    safe_timestamp: float
    heartbeat: bool = False

    def rows(self) -> Iterator[RowEvent]:
        for c in self.changes:
            yield RowEvent(
                self.keyspace, self.shard, c.table, c.op, c.pk, c.before, c.after, self.token
            )


@dataclass
class StreamPosition:
    """Per shard, the last token received: an exact restart point (opaque when serialized).

    ``since`` is where the stream started for shards not heard from yet (a
    timestamp; None: the oldest token's time). Without it, a stream stopped
    before every shard had sent something would resume the silent shards from
    another shard's time and skip their earlier commits.
    """

    tokens: dict[str, EventToken] = field(default_factory=dict)
    since: float | None = None

    def advance(self, event: StreamEvent) -> None:
        self.tokens[event.token.shard] = event.token

    def start_of(self, shard: str, default: float) -> tuple[str | None, float | None]:
        """(position, timestamp) to resume ``shard`` (qualified ``keyspace/shard``) from."""
        token = self.tokens.get(shard)
        if token is not None:
            return token.position, None
        if self.since is not None:
            return None, self.since
        return None, min((t.timestamp for t in self.tokens.values()), default=default)

    def serialize(self) -> str:
        doc: dict[str, Any] = {
            "t": [[t.timestamp, t.shard, t.position] for t in self.tokens.values()]
        }
        if self.since is not None:
            doc["s"] = self.since
        raw = json.dumps(doc, separators=(",", ":"))
        return _POSITION_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def parse(cls, text: str) -> StreamPosition:
        if not text.startswith(_POSITION_PREFIX):
            raise InvalidArgument(f"not a stream position: {text[:40]!r}")
        body = text[len(_POSITION_PREFIX) :]
        try:
            doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            items, since = (doc, None) if isinstance(doc, list) else (doc["t"], doc.get("s"))
            tokens = [EventToken(float(ts), str(s), str(p)) for ts, s, p in items]
            since = None if since is None else float(since)
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidArgument(f"corrupt stream position {text[:40]!r}: {exc}") from exc
        return cls({t.shard: t for t in tokens}, since)


StartPoint = float | StreamPosition | str | None


def _ksid_function(
    gate: StreamGate, keyspace: str
) -> Callable[[str, dict[str, Any]], bytes | None]:
    """table, row image -> the row's keyspace id, or None when it cannot be computed."""
    ks = gate.vschema.keyspace(keyspace)

    def ksid_of(table: str, image: dict[str, Any]) -> KeyspaceId | None:
        t = ks.tables.get(table)
        cv = t.primary if t is not None else None
        if cv is None:
            return None
        vindex = cv.vindex
        if isinstance(vindex, SingleColumn):
            mapped = vindex.map([image.get(cv.columns[0])])
        elif isinstance(vindex, MultiColumn):
            mapped = vindex.map_multi([[image.get(c) for c in cv.columns]])
        else:
            raise Unsupported(
                f"cannot filter {keyspace}.{table} by key range: its primary vindex "
                f"{cv.name!r} is not functional; stream whole shards instead"
            )
        return mapped[0][0] if mapped and mapped[0] else None

    return ksid_of


async def update_stream(
    gate: StreamGate,
    keyspace: str,
    key_range: KeyRange | str | None = None,
    start: StartPoint = None,
    *,
    heartbeat_s: float = 1.0,
) -> AsyncIterator[StreamEvent]:
    """The merged change stream of ``keyspace`` (see the module docstring).

    ``start``: None (from now), a timestamp (commits at or after it), or a
    :class:`StreamPosition` (or its serialized form): right after it.
    """
    topology = gate.topology
    ks_topo = topology.keyspace(keyspace)
    kr = parse_key_range(key_range) if isinstance(key_range, str) else (key_range or FULL_RANGE)
    shard_names = ks_topo.shard_map.shards_for_range(kr)
    partial = {
        s.name
        for s in ks_topo.shards
        if s.name in shard_names and s.key_range.intersect(kr) != s.key_range
    }
    ksid_of = _ksid_function(gate, keyspace) if partial else None
    if isinstance(start, str):
        start = StreamPosition.parse(start)
    began = time.time()
    starts: dict[str, tuple[str | None, float | None]] = {}
    latest: dict[str, float] = {}
    for name in shard_names:
        qualified = f"{keyspace}/{name}"
        if isinstance(start, StreamPosition):
            position, since = start.start_of(qualified, began)
            starts[name] = (position, since)
            token = start.tokens.get(qualified)
            latest[name] = token.timestamp if token is not None else float(since or began)
        elif start is not None:
            starts[name] = (None, float(start))
            latest[name] = float(start)
        else:
            starts[name] = (None, None)
            latest[name] = began

    queue: asyncio.Queue[tuple[str, Transaction | Heartbeat | BaseException]] = asyncio.Queue(
        QUEUE_ITEMS
    )

    async def pump(name: str) -> None:
        tablet = gate.tablets[(keyspace, name)]
        position, timestamp = starts[name]
        items: AsyncIterator[LogItem] | None = None
        try:
            # Inside the try: a tablet that refuses the stream at once must reach the
            # consumer as an error, not leave it waiting for items that never come.
            items = tablet.update_stream(
                position=position, timestamp=timestamp, heartbeat_s=heartbeat_s
            )
            async for item in items:
                await queue.put((name, item))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await queue.put((name, exc))
        finally:
            if items is not None:
                with contextlib.suppress(Exception):
                    await items.aclose()  # type: ignore[attr-defined]

    tasks = [
        asyncio.create_task(pump(n), name=f"update-stream {keyspace}/{n}") for n in shard_names
    ]
    try:
        while True:
            try:
                name, item = await asyncio.wait_for(queue.get(), heartbeat_s)
            except TimeoutError:
                _check_topology(gate, topology, keyspace, shard_names)
                continue
            _check_topology(gate, topology, keyspace, shard_names)
            if isinstance(item, BaseException):
                if isinstance(item, ShardgateError):
                    raise item
                raise Unavailable(
                    f"the change stream of {keyspace}/{name} failed: {item!r}; restart the "
                    "stream from the last safe timestamp"
                ) from item
            if isinstance(item, Heartbeat):
                latest[name] = max(latest[name], item.watermark)
                if item.position is None:
                    continue
                yield StreamEvent(
                    keyspace, name, EventToken(item.watermark, f"{keyspace}/{name}",
                                               item.position),
                    [], min(latest.values()), heartbeat=True,
                )
                continue
            latest[name] = max(latest[name], item.token.timestamp)
            changes = item.changes
            if ksid_of is not None and name in partial:
                changes = [c for c in changes if _in_range(ksid_of, kr, c)]
            yield StreamEvent(keyspace, name, item.token, changes, min(latest.values()))
    finally:
        await cancel_and_wait(tasks, swallow=(Exception,))


def _in_range(
    ksid_of: Callable[[str, dict[str, Any]], bytes | None], kr: KeyRange, c: RowChange
) -> bool:
    for image in (c.after, c.before):
        if image is not None:
            ksid = ksid_of(c.table, image)
            if ksid is not None and kr.contains(ksid):
                return True
    return False


def _check_topology(
    gate: StreamGate, topology: Topology, keyspace: str, shard_names: list[str]
) -> None:
    if gate.topology is topology:
        return
    try:
        ks = gate.topology.keyspace(keyspace)
        current = ks.shard_map.names
    except ShardgateError:
        current = []
    if not set(shard_names) <= set(current) or any(
        ks.shard(n).key_range != topology.keyspace(keyspace).shard(n).key_range
        or ks.shard(n).url != topology.keyspace(keyspace).shard(n).url
        for n in shard_names
    ):
        raise Unavailable(
            f"the shards of keyspace {keyspace!r} changed under the change stream "
            f"(was {shard_names}, now {current}); restart it from the last safe timestamp"
        )


__all__ = ["RowEvent", "StreamEvent", "StreamPosition", "position_key", "update_stream"]
