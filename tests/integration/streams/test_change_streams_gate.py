"""The gate's UpdateStream over a 4-shard keyspace, and the event-token execute options."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.event_token import is_fresher
from shardgate.keys import parse_key_range
from shardgate.result import ExecuteOptions
from shardgate.streams.merge import StreamEvent, StreamPosition
from shardgate.topo import Topology
from tests.integration.conftest import Cluster

N = 40


async def _collect(
    events: AsyncIterator[StreamEvent], done: Callable[[list[StreamEvent]], bool],
    timeout: float = 20,
) -> list[StreamEvent]:
    got: list[StreamEvent] = []

    async def run() -> None:
        async for ev in events:
            got.append(ev)
            if done(got):
                return

    try:
        await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise AssertionError(f"stream incomplete after {timeout}s: {_orders(got)}") from None
    return got


async def _started(events: AsyncIterator[StreamEvent], shards: int = 4) -> None:
    """Wait until every shard's stream has answered (a heartbeat): it is reading."""
    seen: set[str] = set()
    await _collect(events, lambda g: seen.update(e.shard for e in g[-1:]) or len(seen) >= shards)


def _orders(events: list[StreamEvent]) -> list[tuple[str, int, str]]:
    return [
        (ev.shard, int(c.pk[0]), c.op)
        for ev in events
        for c in ev.changes
        if c.table == "corder"
    ]


async def _write(cluster: Cluster) -> None:
    gate = cluster.gate
    s = gate.session(identity=TRUSTED)
    for i in range(1, N + 1):
        await gate.execute(
            s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:o, :c, :s, :p)",
            {"o": i, "c": i, "s": f"sku{i}", "p": i * 10},
        )
    for i in range(1, N + 1, 4):
        await gate.execute(s, "UPDATE corder SET price = price + 1 WHERE customer_id = :c",
                           {"c": i})
    for i in range(2, N + 1, 5):
        await gate.execute(s, "DELETE FROM corder WHERE customer_id = :c", {"c": i})


def _expected_count() -> int:
    return N + len(range(1, N + 1, 4)) + len(range(2, N + 1, 5))


async def test_update_stream_merges_shards_and_resumes(streams_cluster: Cluster) -> None:
    gate = streams_cluster.gate
    began = time.time()
    events = gate.update_stream("commerce", heartbeat_s=0.2, identity=TRUSTED)
    want = _expected_count()
    await _started(events)  # "from now" starts where each shard's stream begins reading
    collect = asyncio.ensure_future(_collect(events, lambda g: len(_orders(g)) >= want))
    await _write(streams_cluster)
    got = await collect
    orders = _orders(got)
    assert len(orders) == want
    shard_map = streams_cluster.topology.keyspace("commerce").shard_map
    hash_vindex = gate.vschema.keyspace("commerce").vindexes["hash"]
    ksids = {i: hash_vindex.map([i])[0][0] for i in range(1, N + 1)}  # type: ignore[attr-defined]
    for shard, oid, _op in orders:
        assert shard_map.find(ksids[oid]) == shard
    # Per shard, per row: insert, then update(s), then delete, in commit order.
    for oid in range(1, N + 1):
        ops = [op for _s, o, op in orders if o == oid]
        exp = ["insert"] + (["update"] if oid % 4 == 1 else []) + (
            ["delete"] if oid % 5 == 2 else []
        )
        assert ops == exp, oid
    safe = [ev.safe_timestamp for ev in got]
    assert safe == sorted(safe)
    assert all(ev.safe_timestamp <= max(ev.token.timestamp, began) + 1 for ev in got)

    # Key ranges, started from a timestamp before the burst: whole shards
    # (-80 = -40 + 40-80) and a range cutting shards (20-60, filtered by ksid).
    for kr_name in ("-80", "20-60"):
        kr = parse_key_range(kr_name)
        sub = gate.update_stream("commerce", kr_name, start=began - 1, heartbeat_s=0.2,
                                  identity=TRUSTED)
        expect_ids = {i for i in range(1, N + 1) if kr.contains(ksids[i])}
        seen = await _collect(sub, lambda g, e=expect_ids: {o for _s, o, _ in _orders(g)} >= e)
        await sub.aclose()  # type: ignore[attr-defined]
        seen_ids = {o for _s, o, _ in _orders(seen)}
        assert seen_ids == expect_ids, kr_name

    # Exact resume from a saved position: the rest, no repeats.
    start = StreamPosition()
    mid = len(got) // 2
    for ev in got[: mid + 1]:
        start.advance(ev)
    rest_expected = _orders(got[mid + 1 :])
    resumed = gate.update_stream("commerce", start=start.serialize(), heartbeat_s=0.2,
                                 identity=TRUSTED)
    rest = await _collect(resumed, lambda g: len(_orders(g)) >= len(rest_expected))
    await resumed.aclose()  # type: ignore[attr-defined]
    assert sorted(_orders(rest)) == sorted(rest_expected)
    await events.aclose()  # type: ignore[attr-defined]


async def test_topology_change_ends_the_stream(streams_cluster: Cluster) -> None:
    gate = streams_cluster.gate
    events = gate.update_stream("commerce", heartbeat_s=0.1, identity=TRUSTED)
    first = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(0.3)
    doc: dict[str, Any] = {
        "keyspaces": {
            "commerce": {
                "shards": {
                    "-80": streams_cluster.shard_urls("commerce")["-40"],
                    "80-": streams_cluster.shard_urls("commerce")["80-c0"],
                },
                "vschema": gate.vschema.to_json()["commerce"],
            },
        }
    }
    old = gate.topology
    gate.topology = Topology.from_dict(doc)
    try:
        with pytest.raises(ShardgateError) as err:
            await asyncio.wait_for(first, 10)
            async for _ in events:
                pass
        assert err.value.code is Code.UNAVAILABLE
    finally:
        gate.topology = old
        await events.aclose()  # type: ignore[attr-defined]


async def test_event_token_options(streams_cluster: Cluster) -> None:
    gate = streams_cluster.gate
    s = gate.session(identity=TRUSTED)
    events = gate.update_stream("commerce", heartbeat_s=0.2, identity=TRUSTED)
    await _started(events)
    collect = asyncio.ensure_future(_collect(events, lambda g: len(_orders(g)) >= 1))
    await gate.execute(
        s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (7, 7, 'x', 1)"
    )
    got = await collect
    change = next(ev for ev in got if ev.changes)
    # The tablet has seen the change once the stream delivered it.
    res = await gate.execute(
        s, "SELECT price FROM corder WHERE customer_id = 7",
        options=ExecuteOptions(include_event_token=True, compare_event_token=change.token),
    )
    assert res.rows == [(1,)]
    assert res.event_token is not None and res.event_token.shard == change.token.shard
    assert res.fresher is True
    assert is_fresher(res.event_token, change.token)
    # A token from the future is not known to be older than the data.
    future = type(change.token)(change.token.timestamp + 3600, change.token.shard, "0")
    res = await gate.execute(
        s, "SELECT price FROM corder WHERE customer_id = 7",
        options=ExecuteOptions(compare_event_token=future),
    )
    assert res.fresher is False and res.event_token is None
    # Scatter: no single token; fresher only if every shard is.
    res = await gate.execute(
        s, "SELECT count(*) FROM corder",
        options=ExecuteOptions(include_event_token=True, compare_event_token=change.token),
    )
    assert res.event_token is None
    await events.aclose()  # type: ignore[attr-defined]
