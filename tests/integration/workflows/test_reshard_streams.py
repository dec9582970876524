"""Change streams across a reshard (issue 21 item 3): a gate UpdateStream over the
keyspace keeps going while a reshard splits 2 -> 4 and switches writes; every change
the writers committed arrives, in per-row commit order, with nothing left out; a
client resuming from a position taken before the switch gets every later change;
after ``complete`` such a position is refused (``OUT_OF_RANGE``), not silently
short.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.event_token import EventToken, Freshness
from shardgate.gate import Gate
from shardgate.streams.hop import Hop
from shardgate.streams.merge import StreamEvent, StreamPosition
from shardgate.topo.model import KeyspaceTopo
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows.test_reshard import _cluster, _wait

WRITERS = 2
#: row id -> its states in commit order: ("i"|"u", v) or ("d", None)
History = dict[int, list[tuple[str, str | None]]]


class LoggingWriters:
    """Writers through the gate on their own ids, logging every committed change."""

    def __init__(self, gate: Gate, ids: list[int]) -> None:
        self.gate = gate
        self.history: History = {}
        self.alive = {k: [i for i in ids if i % WRITERS == k] for k in range(WRITERS)}
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._run(k)) for k in range(WRITERS)]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    @property
    def changes(self) -> int:
        return sum(len(h) for h in self.history.values())

    async def _run(self, k: int) -> None:
        rnd = random.Random(k)
        s = self.gate.session("app", identity=TRUSTED)
        mine = self.alive[k]
        next_id = 10_000_000 * (k + 1)
        while not self.stop.is_set():
            op = rnd.random()
            if op < 0.4 or not mine:
                next_id += WRITERS
                v = f"w{next_id}"
                await self.gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, :v, 0)",
                                        {"i": next_id, "v": v})
                mine.append(next_id)
                self.history.setdefault(next_id, []).append(("i", v))
            elif op < 0.85:
                i = rnd.choice(mine)
                v = f"u{i}_{rnd.randrange(10**9)}"
                res = await self.gate.execute(s, "UPDATE t SET v = :v WHERE id = :i",
                                              {"i": i, "v": v})
                assert res.rows_affected == 1
                self.history.setdefault(i, []).append(("u", v))
            else:
                i = mine.pop(rnd.randrange(len(mine)))
                res = await self.gate.execute(s, "DELETE FROM t WHERE id = :i", {"i": i})
                assert res.rows_affected == 1
                self.history.setdefault(i, []).append(("d", None))
            await asyncio.sleep(0.003)


class Consumer:
    """Reads the keyspace's stream through the gate; keeps each row's changes, once
    per (shard, position) (repeats around the hop are allowed, and dropped here).
    With ``table``: the changes of that table only (others are read and skipped)."""

    def __init__(self, gate: Gate, start: Any, table: str | None = None) -> None:
        self.gate, self.start, self.table = gate, start, table
        self.history: History = {}
        self.seen: set[tuple[str, str, int, tuple[str, str | None]]] = set()
        self.events: list[StreamEvent] = []
        self.position = StreamPosition()
        self.shards: set[str] = set()
        #: repeats of a (shard, position, row) delivered without ``hop=True``
        self.unmarked_repeats: list[tuple[str, str, int]] = []
        self.error: BaseException | None = None
        #: cleared: the consumer takes no event (the stream's generator stays suspended,
        #: so it does not look at the gate's topology either) until it is set again
        self.running = asyncio.Event()
        self.running.set()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            stream = self.gate.update_stream("app", start=self.start, heartbeat_s=0.2,
                                                identity=TRUSTED)
            async with contextlib.aclosing(stream):  # closed here, not by the GC
                await self._read(stream)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.error = exc

    async def _read(self, stream: AsyncIterator[StreamEvent]) -> None:
        async for ev in stream:
            await self.running.wait()
            self.position.advance(ev)
            if ev.heartbeat:
                continue
            self.events.append(ev)
            self.shards.add(ev.shard)
            for c in ev.changes:
                if self.table is not None and c.table != self.table:
                    continue
                op = c.op[0]  # insert, update, delete
                state = ("d", None) if op == "d" else (op, str((c.after or {})["v"]))
                # the state too: a merge onto reused names starts new databases whose
                # positions can repeat the retired shards' (every state is unique per row)
                key = (ev.token.shard, ev.token.position, int(c.pk[0]), state)
                if key in self.seen:
                    if not ev.hop:
                        self.unmarked_repeats.append(key[:3])
                    continue
                self.seen.add(key)
                self.history.setdefault(int(c.pk[0]), []).append(state)

    @property
    def changes(self) -> int:
        return sum(len(h) for h in self.history.values())

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _received(consumer: Consumer, want: History, timeout: float = 60.0) -> None:
    """Wait until ``consumer`` has every change of ``want``, then compare per row."""
    deadline = time.monotonic() + timeout
    while any(len(consumer.history.get(i, [])) < len(h) for i, h in want.items()):
        assert consumer.error is None, consumer.error
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert consumer.error is None, consumer.error
    missing = {i: (h, consumer.history.get(i)) for i, h in want.items()
               if consumer.history.get(i) != h}
    assert not missing, f"{len(missing)} rows differ, e.g. {list(missing.items())[:3]}"
    assert not consumer.unmarked_repeats, consumer.unmarked_repeats[:5]


def _after(history: History, consumer: Consumer, upto: dict[int, int]) -> History:
    """Each row's changes after the first ``upto[row]`` (what a resumed stream owes)."""
    return {i: h[upto.get(i, 0):] for i, h in history.items() if h[upto.get(i, 0):]}


async def _split_while_streaming(make_database: Any, tmp_path: Path, kind: str) -> None:
    topo, gate, _, model = await _cluster(make_database, tmp_path, kind, rows=400)
    writers = LoggingWriters(gate, sorted(model))
    consumer = Consumer(gate, time.time())
    resumed: Consumer | None = None
    server = TopoServer(open_topo_store(topo))
    four = {n: make_database(kind, f"hop{kind[:2]}{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())), workflow="hop")
    flow = ReshardWorkflow(server, spec, batch=200)
    try:
        # the stream reads both shards (a heartbeat from each) before the first write: a
        # PostgreSQL shard's first stream waits for its slot, and a timestamp start
        # cannot reach back before the capture began
        await _wait(lambda: len(consumer.position.tokens) == 2, "the stream did not start",
                    timeout=60)
        writers.start()
        await flow.create()
        await flow.switch_reads()
        await _wait(lambda: writers.changes > 50 and consumer.changes > 20, "no changes yet",
                    timeout=30)
        # a client stops here: its position (tokens of the sources only) is kept
        saved = StreamPosition(dict(consumer.position.tokens), consumer.position.since)
        saved_text = saved.serialize()
        upto = {i: len(h) for i, h in consumer.history.items()}
        await flow.switch_writes()
        await _wait(lambda: set(four) <= {s.name for s in gate.topology.keyspace("app").shards},
                    "writes did not switch")
        ks = gate.topology.keyspace("app")
        hop = Hop.of(ks)
        assert hop is not None and set(hop.sources) == {"-80", "80-"}
        assert set(hop.targets) == set(four)
        at_switch = writers.changes
        await _wait(lambda: writers.changes > at_switch + 60, "writers stalled after the switch",
                    timeout=30)
        # the client comes back after the switch, from the position taken before it
        resumed = Consumer(gate, saved_text)
        await writers.halt()
        await _received(consumer, writers.history)
        assert set(four) <= consumer.shards, consumer.shards  # it hopped to the targets
        assert consumer.error is None
        await _received(resumed, _after(writers.history, consumer, upto))
        assert set(four) <= resumed.shards
        _check_token_order(ks, consumer.events)
        await resumed.stop()
        await consumer.stop()
        await flow.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "complete not seen")
        # after complete the sources are gone: the old position cannot be honoured
        late = Consumer(gate, saved_text)
        await _wait(lambda: late.task.done(), "a lost position was not refused")
        assert isinstance(late.error, ShardgateError), late.error
        assert late.error.code == Code.OUT_OF_RANGE
    finally:
        if not writers.stop.is_set():
            await writers.halt()
        await consumer.stop()
        if resumed is not None:
            await resumed.stop()
        await flow.close()
        await server.close()
        await gate.close()


async def _split_then_merge_while_streaming(make_database: Any, tmp_path: Path,
                                            kind: str) -> None:
    """Split 2 -> 4, complete, then merge 4 -> 2 onto new databases named ``-80`` and
    ``80-`` again (the names the split retired), one stream reading throughout."""
    topo, gate, _, model = await _cluster(make_database, tmp_path, kind, rows=400)
    writers = LoggingWriters(gate, sorted(model))
    consumer = Consumer(gate, time.time())
    resumed: Consumer | None = None
    server = TopoServer(open_topo_store(topo))
    four = {n: make_database(kind, f"sm{kind[:2]}{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    two = {n: make_database(kind, f"mm{kind[:2]}{i}") for i, n in enumerate(("-80", "80-"))}
    split = ReshardWorkflow(server, ReshardSpec(
        keyspace="app", sources=("-80", "80-"), targets=tuple(four),
        target_urls=tuple(sorted(four.items())), workflow="split"), batch=200)
    merge = ReshardWorkflow(server, ReshardSpec(
        keyspace="app", sources=tuple(four), targets=tuple(two),
        target_urls=tuple(sorted(two.items())), workflow="merge"), batch=200)

    def serving() -> dict[str, str]:
        return {s.name: s.url for s in gate.topology.keyspace("app").shards}

    try:
        await _wait(lambda: len(consumer.position.tokens) == 2, "the stream did not start",
                    timeout=60)
        writers.start()
        await split.create()
        await split.switch_reads()
        await _wait(lambda: writers.changes > 50 and consumer.changes > 20, "no changes yet",
                    timeout=30)
        # a client stops before the split: its tokens name the -80 and 80- the split retires
        early = StreamPosition(dict(consumer.position.tokens), consumer.position.since)
        await split.switch_writes()
        await _wait(lambda: serving() == four, "the split's writes did not switch")
        at_switch = writers.changes
        await _wait(lambda: writers.changes > at_switch + 60, "writers stalled after the split",
                    timeout=30)
        await split.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "split not completed")
        # the consumer reads the four shards; a client stops here, between the reshards
        await _wait(lambda: set(four) <= consumer.shards or consumer.error is not None,
                    "the stream did not hop to four", timeout=30)
        assert consumer.error is None, consumer.error
        saved_text = StreamPosition(dict(consumer.position.tokens),
                                    consumer.position.since).serialize()
        upto = {i: len(h) for i, h in consumer.history.items()}

        await merge.create()
        await merge.switch_reads()
        await merge.switch_writes()
        await _wait(lambda: serving() == two, "the merge's writes did not switch")
        hop = Hop.of(gate.topology.keyspace("app"))
        assert hop is not None and set(hop.sources) == set(four) and set(hop.targets) == set(two)
        # that client's tokens cannot resume the new -80 and 80-: refused, not short
        stale = Consumer(gate, early.serialize())
        await _wait(lambda: stale.task.done(), "a position of the retired shards was not refused")
        assert isinstance(stale.error, ShardgateError), stale.error
        assert stale.error.code == Code.OUT_OF_RANGE, stale.error
        at_merge = writers.changes
        await _wait(lambda: writers.changes > at_merge + 60, "writers stalled after the merge",
                    timeout=30)
        # the client comes back after the merge, from its position between the reshards
        resumed = Consumer(gate, saved_text)
        await writers.halt()
        await _received(consumer, writers.history)
        assert consumer.error is None
        await _received(resumed, _after(writers.history, consumer, upto))
        assert set(two) <= resumed.shards, resumed.shards
        # the new -80 and 80- delivered changes (not the retired shards of the same name)
        merged_rows = {int(c.pk[0]) for e in consumer.events[-20:] for c in e.changes}
        assert merged_rows and {e.shard for e in consumer.events[-20:]} <= set(two)
        await resumed.stop()
        await consumer.stop()
        await merge.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "merge not completed")
        # the position between the reshards names the four shards, gone now: refused
        late = Consumer(gate, saved_text)
        await _wait(lambda: late.task.done(), "a lost position was not refused")
        assert isinstance(late.error, ShardgateError), late.error
        assert late.error.code == Code.OUT_OF_RANGE
    finally:
        if not writers.stop.is_set():
            await writers.halt()
        await consumer.stop()
        if resumed is not None:
            await resumed.stop()
        await split.close()
        await merge.close()
        await server.close()
        await gate.close()


async def _switch_and_complete_unseen(make_database: Any, tmp_path: Path, kind: str) -> None:
    """A stream opened before a split that does not look at the topology from before
    the write switch until after ``complete`` (its consumer paused; a gate whose watch
    lagged): it follows the switch from ``reshard_history`` and goes on over the four
    new shards, every change once, nothing lost."""
    topo, gate, _, model = await _cluster(make_database, tmp_path, kind, rows=400)
    writers = LoggingWriters(gate, sorted(model))
    consumer = Consumer(gate, time.time())
    server = TopoServer(open_topo_store(topo))
    four = {n: make_database(kind, f"hc{kind[:2]}{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    flow = ReshardWorkflow(server, ReshardSpec(
        keyspace="app", sources=("-80", "80-"), targets=tuple(four),
        target_urls=tuple(sorted(four.items())), workflow="unseen"), batch=200)
    try:
        await _wait(lambda: len(consumer.position.tokens) == 2, "the stream did not start",
                    timeout=60)
        writers.start()
        await flow.create()
        await flow.switch_reads()
        await _wait(lambda: writers.changes > 50 and consumer.changes > 20, "no changes yet",
                    timeout=30)
        consumer.running.clear()
        await flow.switch_writes()
        await _wait(lambda: set(four) <= {s.name for s in gate.topology.keyspace("app").shards},
                    "writes did not switch")
        at_switch = writers.changes
        await _wait(lambda: writers.changes > at_switch + 60, "writers stalled after the switch",
                    timeout=30)
        await flow.complete()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "complete not seen")
        assert gate.topology.keyspace("app").history, "no reshard_history after complete"
        assert not consumer.shards & set(four)  # it has not looked since before the switch
        consumer.running.set()
        at_complete = writers.changes
        await _wait(lambda: writers.changes > at_complete + 30, "writers stalled after complete",
                    timeout=30)
        await writers.halt()
        await _received(consumer, writers.history)
        assert set(four) <= consumer.shards, consumer.shards
        assert consumer.error is None and not consumer.task.done()
    finally:
        if not writers.stop.is_set():
            await writers.halt()
        await consumer.stop()
        await flow.close()
        await server.close()
        await gate.close()


async def test_stream_follows_a_completed_split_it_did_not_see_on_sqlite(
    make_database: Any, tmp_path: Path
) -> None:
    await _switch_and_complete_unseen(make_database, tmp_path, "sqlite")


@pytest.mark.postgres
async def test_stream_follows_a_completed_split_it_did_not_see_on_postgres(
    make_database: Any, tmp_path: Path
) -> None:
    await _switch_and_complete_unseen(make_database, tmp_path, "postgres")


def _check_token_order(ks: KeyspaceTopo, events: list[StreamEvent]) -> None:
    """Across the hop: a source token is older than a target token after the
    journal; a target token at its journal position is not comparable with it."""
    hop = Hop.of(ks)
    assert hop is not None
    first = next(e for e in events if e.shard in hop.sources)
    src = first.token
    # a later target token of the same key range, with a stamp older than the source's
    # (as a skewed clock would give): the hop still orders them
    tgt = next(e.token for e in reversed(events) if first.shard in hop.feeding(e.shard))
    skewed = EventToken(src.timestamp - 5, tgt.shard, tgt.position)
    assert hop.compare(src, skewed) == Freshness.OLDER
    assert hop.compare(skewed, src) == Freshness.NEWER
    name = next(t for t in hop.targets if first.shard in hop.feeding(t))
    at_journal = EventToken(src.timestamp + 5, f"app/{name}", hop.targets[name])
    assert hop.compare(src, at_journal) == Freshness.UNKNOWN


async def test_stream_hops_over_a_split_on_sqlite(make_database: Any, tmp_path: Path) -> None:
    await _split_while_streaming(make_database, tmp_path, "sqlite")


@pytest.mark.postgres
async def test_stream_hops_over_a_split_on_postgres(make_database: Any, tmp_path: Path) -> None:
    await _split_while_streaming(make_database, tmp_path, "postgres")


async def test_stream_follows_a_split_then_a_merge_onto_reused_names_on_sqlite(
    make_database: Any, tmp_path: Path
) -> None:
    await _split_then_merge_while_streaming(make_database, tmp_path, "sqlite")


@pytest.mark.postgres
async def test_stream_follows_a_split_then_a_merge_onto_reused_names_on_postgres(
    make_database: Any, tmp_path: Path
) -> None:
    await _split_then_merge_while_streaming(make_database, tmp_path, "postgres")
