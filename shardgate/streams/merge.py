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

Across a reshard: at the write switch the stream drains each source to its
final position and goes on from the targets (:mod:`shardgate.streams.hop`).
When the gate's topology jumps past both the switch and ``complete`` (the
journal already moved to ``reshard_history``, the sources gone), the stream
hops over that completed switch the same way: the sources' databases keep
their logs to the final positions and the gate its tablets for them.

When the keyspace's shards change under the stream otherwise (the gate's
topology is replaced), the stream ends with ``UNAVAILABLE`` (retryable):
restart it from the last ``safe_timestamp``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends.changes import Heartbeat, LogItem, RowChange, Transaction
from shardgate.errors import Code, InvalidArgument, ShardgateError, Unavailable, Unsupported
from shardgate.event_token import EventToken, position_key
from shardgate.keys import FULL_RANGE, KeyRange, KeyspaceId, ShardId, parse_key_range
from shardgate.ports import GateView, StreamShard
from shardgate.streams.hop import MARK_MARGIN_S, Hop
from shardgate.topo.model import KeyspaceTopo, ShardTopo
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
    #: delivered around a reshard's write switch (see "Across a reshard" above): it
    #: may repeat a change delivered before; dedupe with the tokens
    hop: bool = False

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


@dataclass(eq=False)
class _Feed:
    """One shard's stream inside the merge.

    ``end``: the shard is a reshard's source being drained: its stream stops
    at this (final) position. ``waits``: the feeds of sources that must be
    drained before this shard's stream starts (a target of the hop). Events
    committed at or before ``mark_until`` are delivered with ``hop=True``.

    A feed is one database, not one shard name: a merge may reuse the names of
    shards an earlier split retired (``-80`` split, then merged back to a new
    ``-80``), so tasks, queue items and drained events belong to the feed.
    """

    name: str
    url: str
    key_range: KeyRange
    partial: bool
    position: str | None
    since: float | None
    end: str | None = None
    waits: tuple[_Feed, ...] = ()
    mark_until: float | None = None
    #: set once this (source) feed is read to its final position
    drained: asyncio.Event = field(default_factory=asyncio.Event)


_DRAINED = object()


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
    if isinstance(start, str):
        start = StreamPosition.parse(start)
    began = time.time()
    hop = Hop.of(ks_topo)
    feeds: dict[str, _Feed] = {}
    latest: dict[str, float] = {}
    #: targets of the hop whose token in ``start`` named an older shard of that name,
    #: with the token's time
    restart: dict[str, float] = {}
    if isinstance(start, StreamPosition):
        _refuse_lost_shards(ks_topo, start, hop)
        if hop is not None:
            start, restart = _drop_retired_tokens(ks_topo, start, hop)

    def add(shard: ShardTopo, position: str | None, since: float | None, ts: float,
            **extra: Any) -> _Feed:
        feed = feeds[shard.name] = _Feed(
            shard.name, shard.url, shard.key_range,
            shard.key_range.intersect(kr) != shard.key_range, position, since, **extra)
        latest[shard.name] = ts
        return feed

    def hop_over(h: Hop, ks: KeyspaceTopo, marked: bool) -> None:
        """Drain the feeds of ``h``'s sources, and add its targets (waiting for them)."""
        for name, feed in feeds.items():
            if name in h.sources:
                feed.end, feed.mark_until = h.sources[name], (math.inf if marked else None)
        for shard in ks.shards:
            if shard.name in feeds or not shard.key_range.intersects(kr):
                continue
            waits = tuple(feeds[s] for s in h.feeding(shard.name) if s in feeds)
            position = h.targets.get(shard.name)
            add(shard, position, None if position is not None else h.at - MARK_MARGIN_S,
                h.at, waits=waits,
                mark_until=None if position is not None else h.at + MARK_MARGIN_S)

    for name in ks_topo.shard_map.shards_for_range(kr):
        shard = ks_topo.shard(name)
        qualified = str(ShardId(keyspace, name))
        if isinstance(start, StreamPosition):
            position, since = start.start_of(qualified, began)
            token = start.tokens.get(qualified)
            add(shard, position, since,
                token.timestamp if token is not None else float(since or began))
        elif start is not None:
            add(shard, None, float(start), float(start))
        else:
            add(shard, None, None, began)
    if hop is not None and start is not None:
        # a start before the switch: drain the sources from it first
        drain: list[str] = []
        for source, final in hop.sources.items():
            try:
                shard = ks_topo.any_shard(source)
            except ShardgateError:
                continue
            if not shard.key_range.intersects(kr):
                continue
            if isinstance(start, StreamPosition):
                qualified = str(ShardId(keyspace, source))
                token = start.tokens.get(qualified)
                if token is not None:
                    if hop.drained(source, token.position):
                        continue
                    add(shard, token.position, None, token.timestamp, end=final)
                    drain.append(source)
                    continue
                if any(str(ShardId(keyspace, t)) in start.tokens for t in feeds
                       if t in hop.targets or t not in hop.sources):
                    continue  # the client was past the switch already
                position, since = start.start_of(qualified, began)
                if since is not None and since > hop.at:
                    continue
                add(shard, position, since, float(since or began), end=final)
                drain.append(source)
            elif float(start) <= hop.at:
                add(shard, None, float(start), float(start), end=final)
                drain.append(source)
        if drain or restart:
            for target in [n for n in feeds if n not in hop.sources]:
                tf = feeds[target]
                waits = tuple(feeds[s] for s in hop.feeding(target) if s in drain)
                if not waits and target not in restart:
                    continue
                tf.waits = waits
                has_token = isinstance(start, StreamPosition) and \
                    str(ShardId(keyspace, target)) in start.tokens
                if not has_token:
                    position = hop.targets.get(target)
                    tf.position, tf.since = position, (
                        None if position is not None else hop.at - MARK_MARGIN_S)
                    tf.mark_until = None if position is not None else hop.at + MARK_MARGIN_S
                    latest[target] = hop.at
                if target in restart:
                    tf.mark_until = max(tf.mark_until or -math.inf, restart[target])
    ksid_of = _ksid_function(gate, keyspace) if kr != FULL_RANGE else None

    queue: asyncio.Queue[tuple[_Feed, Transaction | Heartbeat | BaseException | object]] = \
        asyncio.Queue(QUEUE_ITEMS)

    async def pump(feed: _Feed) -> None:
        name = feed.name
        items: AsyncIterator[LogItem] | None = None
        try:
            for source in feed.waits:
                await source.drained.wait()
            if feed.end is not None and hop_end(feed, feed.position):
                await queue.put((feed, _DRAINED))
                return
            tablet = gate.tablets[(keyspace, name)]
            # Inside the try: a tablet that refuses the stream at once must reach the
            # consumer as an error, not leave it waiting for items that never come.
            items = tablet.update_stream(
                position=feed.position, timestamp=feed.since, heartbeat_s=heartbeat_s
            )
            async for item in items:
                pos = item.token.position if isinstance(item, Transaction) else item.position
                if feed.end is not None and isinstance(item, Transaction) \
                        and position_key(item.token.position) > position_key(feed.end):
                    await queue.put((feed, _DRAINED))  # (a frozen source has none)
                    return
                await queue.put((feed, item))
                if feed.end is not None and hop_end(feed, pos):
                    await queue.put((feed, _DRAINED))
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await queue.put((feed, exc))
        finally:
            if items is not None:
                with contextlib.suppress(Exception):
                    await items.aclose()  # type: ignore[attr-defined]

    def hop_end(feed: _Feed, position: str | None) -> bool:
        assert feed.end is not None
        return position is not None and position_key(position) >= position_key(feed.end)

    def beat(name: str, hb: Heartbeat) -> StreamEvent:
        assert hb.position is not None
        return StreamEvent(
            keyspace, name, EventToken(hb.watermark, str(ShardId(keyspace, name)), hb.position),
            [], min(latest.values()), heartbeat=True,
        )

    tasks: dict[_Feed, asyncio.Task[None]] = {}

    def spawn() -> None:
        for name, feed in feeds.items():
            if feed not in tasks:
                tasks[feed] = asyncio.create_task(
                    pump(feed), name=f"update-stream {keyspace}/{name}")

    def follow_topology() -> None:
        """The keyspace's shards changed: hop over a write switch, or end the stream."""
        nonlocal topology
        current = gate.topology
        if current is topology:
            return
        try:
            ks = current.keyspace(keyspace)
        except ShardgateError:
            raise _changed(keyspace, list(feeds), []) from None
        serving = set(ks.shard_map.names)
        new_hop = Hop.of(ks)
        hopping = False
        completed: list[Hop] = []
        for name, feed in feeds.items():
            try:
                now = ks.any_shard(name)
            except ShardgateError:
                if feed.end is not None:
                    # a source still being drained, removed by ``complete``: its database
                    # keeps its log (and the gate its tablet) to the final position
                    continue
                # the switch and ``complete`` both came since the last look: the
                # journal is in the keyspace's history now
                done = _completed_hop(ks, name, feed.url)
                if done is None:
                    raise _changed(keyspace, list(feeds), sorted(serving)) from None
                if done not in completed:
                    completed.append(done)
                continue
            if now.url != feed.url or now.key_range != feed.key_range:
                raise _changed(keyspace, list(feeds), sorted(serving))
            if name in serving or feed.end is not None:
                continue
            if new_hop is None or name not in new_hop.sources:
                raise _changed(keyspace, list(feeds), sorted(serving))
            hopping = True
        topology = current
        for done in completed:
            hop_over(done, ks, marked=True)
        if hopping and new_hop is not None:
            hop_over(new_hop, ks, marked=True)
        if completed or hopping:
            spawn()

    # Heartbeats with a position come for every transaction of other databases on
    # the same server (MariaDB's binlog is server-wide): at most one per shard per
    # ``heartbeat_s`` is passed on, the newest; the rest are held, not lost.
    loop = asyncio.get_running_loop()
    last_beat: dict[str, float] = {}
    held: dict[str, Heartbeat] = {}
    spawn()
    try:
        while True:
            try:
                feed, item = await wait_for(queue.get(), heartbeat_s)
            except TimeoutError:
                follow_topology()
                for name, hb in list(held.items()):
                    del held[name]
                    last_beat[name] = loop.time()
                    if name in feeds:
                        yield beat(name, hb)
                continue
            follow_topology()
            name = feed.name
            if item is _DRAINED:
                # this source is read to its final position: its targets may start
                feed.drained.set()
                if feeds.get(name) is feed:
                    del feeds[name]
                    latest.pop(name, None)
                    held.pop(name, None)
                continue
            if feeds.get(name) is not feed:
                continue  # (not expected) a feed no longer merged: its shard was replaced
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
                now = loop.time()
                if now - last_beat.get(name, -heartbeat_s) < heartbeat_s:
                    held[name] = item
                    continue
                held.pop(name, None)
                last_beat[name] = now
                yield beat(name, item)
                continue
            assert isinstance(item, Transaction)
            held.pop(name, None)  # this transaction's position is later
            latest[name] = max(latest[name], item.token.timestamp)
            changes = item.changes
            if ksid_of is not None and feed.partial:
                changes = [c for c in changes if _in_range(ksid_of, kr, c)]
            mark = feed.mark_until is not None and item.token.timestamp <= feed.mark_until
            yield StreamEvent(keyspace, name, item.token, changes, min(latest.values()),
                              hop=mark)
    finally:
        await cancel_and_wait(list(tasks.values()), swallow=(Exception,))


def _completed_hop(ks: KeyspaceTopo, source: str, url: str) -> Hop | None:
    """The completed write switch (``reshard_history``) that retired ``source`` (on
    database ``url``), when every one of its targets still serves on the database the
    switch wrote to (a later reshard of them: None, the stream ends ``UNAVAILABLE``)."""
    for hop in reversed(Hop.lineage(ks)):
        if source not in hop.sources or hop.source_urls.get(source) != url:
            continue
        for target, target_url in hop.target_urls.items():
            try:
                if ks.shard(target).url != target_url:
                    return None
            except ShardgateError:
                return None
        return hop
    return None


def _refuse_lost_shards(ks: KeyspaceTopo, start: StreamPosition, hop: Hop | None) -> None:
    """A position naming shards the keyspace no longer has (a reshard completed since):
    the changes between it and the switch are gone from the stream (``OUT_OF_RANGE``)."""
    known = {s.name for s in ks.all_shards}
    gone = sorted(s for s in (ShardId.parse(t.shard) for t in start.tokens.values())
                  if s.keyspace == ks.name and s.shard not in known)
    lost = [str(s) for s in gone]
    if lost and (hop is None or not {s.shard for s in gone} <= set(hop.sources)):
        raise ShardgateError(
            f"the stream position names shards {lost} that keyspace {ks.name!r} no longer has "
            "(a reshard completed after it was taken): the changes between it and the "
            "switch cannot be streamed; start again from a snapshot",
            code=Code.OUT_OF_RANGE,
        )


def _drop_retired_tokens(
    ks: KeyspaceTopo, start: StreamPosition, hop: Hop
) -> tuple[StreamPosition, dict[str, float]]:
    """``start`` without the tokens that name an older database of a hop target's name.

    A merge may reuse the names of shards an earlier split retired (``-80``
    split in four, the four merged back to a new ``-80``): a position taken
    before the merge's switch may hold a token ``keyspace/-80`` of the *old*
    ``-80``, whose log position means nothing in the new database. A token of
    the target itself cannot exist while a source feeding it is not drained
    (the target's stream starts after theirs end), nor be before the target's
    journal position (its stream starts there), nor be older than the switch:
    such a token is dropped and the target starts at its journal position
    once its sources are drained, its events up to the dropped token's time
    marked ``hop=True`` (a heartbeat's watermark may be a little older than
    the switch: then they may repeat). With no token of a source feeding it,
    the position was taken before an earlier reshard completed:
    ``OUT_OF_RANGE``. Returns the position and, per target whose token was
    dropped, that token's time.
    """
    tokens = dict(start.tokens)
    dropped: dict[str, float] = {}
    for shard in ks.shards:
        target = shard.name
        token = tokens.get(str(ShardId(ks.name, target)))
        if token is None or target in hop.sources:
            continue
        fed = [tokens[str(ShardId(ks.name, s))] for s in hop.feeding(target)
               if str(ShardId(ks.name, s)) in tokens]
        behind = any(not hop.drained(ShardId.parse(t.shard).shard, t.position) for t in fed)
        journal = hop.targets.get(target)
        if not behind and token.timestamp >= hop.at and (
                journal is None or not _before(token.position, journal)):
            continue
        if not fed:
            raise ShardgateError(
                f"the stream position's token of {token.shard} is older than the reshard "
                f"that created that shard (it names an earlier shard of the same name): the "
                "changes between it and the switch cannot be streamed; start again from a "
                "snapshot",
                code=Code.OUT_OF_RANGE,
            )
        del tokens[token.shard]
        dropped[target] = token.timestamp
    if not dropped:
        return start, dropped
    return StreamPosition(tokens, start.since), dropped


def _before(position: str, other: str) -> bool:
    """Whether log ``position`` is before ``other`` (False when they do not compare)."""
    try:
        return position_key(position) < position_key(other)
    except InvalidArgument:
        return False


def _in_range(
    ksid_of: Callable[[str, dict[str, Any]], bytes | None], kr: KeyRange, c: RowChange
) -> bool:
    for image in (c.after, c.before):
        if image is not None:
            ksid = ksid_of(c.table, image)
            if ksid is not None and kr.contains(ksid):
                return True
    return False


def _changed(keyspace: str, was: list[str], now: list[str]) -> Unavailable:
    return Unavailable(
        f"the shards of keyspace {keyspace!r} changed under the change stream "
        f"(was {was}, now {now}); restart it from the last safe timestamp"
    )


__all__ = ["Hop", "RowEvent", "StreamEvent", "StreamPosition", "position_key", "update_stream"]
