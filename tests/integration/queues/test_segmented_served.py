"""Segmented queues served by the tablets: CREATE QUEUE, the gate's receive/ack, gRPC.

On SQLite and MariaDB shards with in-process tablets, on PostgreSQL shards served by
``shardgate tablet`` processes (the ``tablets`` rule of ``tests/integration/conftest.py``),
with real gRPC servers:

* ``CREATE QUEUE ... WITH (storage = segmented)`` creates the segmented tables on
  every shard and the VSchema entry;
* jobs stored with :class:`SegmentedQueue` or ``Gate.queue_enqueue`` reach receivers through
  ``Gate.queue_receive`` and through ``GateClient.receive`` (the tablets'
  segmented consumers, not the producer's process), as events carrying
  ``job_key`` / ``payload``; acks write ``succeeded`` (the ``<q>_job_state`` view);
* per key, a job is delivered only after every earlier job of its key was
  acked, also while one of them waits for its redelivery after ``ack_wait``;
* a receiver that goes away gives its jobs back at once (attempt + 1);
* a tablet that was never configured finds the queue from the database alone;
* bad segmented CREATE QUEUE statements are refused before touching a shard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.errors import InvalidArgument
from shardgate.gate import Gate
from shardgate.queues.ddl import parse_create_queue
from shardgate.queues.events import QueueEvent
from shardgate.queues.segmented.queue import SegmentedQueue
from shardgate.queues.segmented.served import SEGMENTED_FIELDS
from shardgate.tablet import LocalTabletClient, Tablet
from shardgate.tablet.queue_service import receive_batches
from tests.conftest import require_server
from tests.integration.conftest import Cluster, close_cluster, cluster_for, open_cluster

CREATE = ("CREATE QUEUE events (user_id BIGINT NOT NULL, body TEXT) SHARD BY user_id "
          "WITH (storage = segmented, ack_wait = {ack_wait}, min_backoff = 0.05, "
          "max_backoff = 0.1, batch_size = 8)")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def kind(request: pytest.FixtureRequest) -> str:
    k: str = request.param
    if k != "sqlite":
        require_server(k)
    return k


async def _cluster(kind: str, make_database: Callable[..., str], ack_wait: float,
                   tablets: str = "in-process", request: pytest.FixtureRequest | None = None,
                   ) -> Cluster:
    """Two shards, served in-process or (``tablets="processes"``) by tablet processes,
    and the segmented queue created through the gate. In-process tablets poll and
    compact quicker than the defaults; tablet processes run the defaults."""
    if tablets == "in-process":
        c = await open_cluster(kind, make_database, shards=2)
        for client in c.gate.tablets.values():  # quicker polling and compaction for tests
            assert isinstance(client, LocalTabletClient)
            client.tablet.queues.segmented_kwargs = {"poll_interval": 0.02,
                                                     "compaction_interval": 0.1}
    else:
        assert request is not None
        c = await cluster_for(kind, tablets, make_database, request, shards=2)
    try:
        await c.gate.execute(c.gate.session("commerce", identity=TRUSTED),
                             CREATE.format(ack_wait=ack_wait))
    except BaseException:
        await close_cluster(c)
        raise
    return c


@pytest.fixture
async def cluster(kind: str, tablets: str, make_database: Callable[..., str],
                  request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    c = await _cluster(kind, make_database, 1.0, tablets, request)
    try:
        yield c
    finally:
        await close_cluster(c)


@pytest.fixture
async def local_cluster(kind: str, make_database: Callable[..., str]) -> AsyncIterator[Cluster]:
    """In-process tablets only: for a test that opens a tablet of its own beside them."""
    c = await _cluster(kind, make_database, ack_wait=1.0)
    try:
        yield c
    finally:
        await close_cluster(c)


Stored = dict[tuple[str, int], tuple[int, str]]


async def store(gate: Gate, jobs: list[tuple[int, str]]) -> Stored:
    """Store ``(user_id, body)`` jobs (no consumer in this object); ``(shard, job id)`` ->
    job (job ids are unique per shard only). A :class:`SegmentedQueue` producer over
    in-process tablets; over tablet processes, through the gate (the producer class
    needs the shard databases in its process)."""
    if all(isinstance(c, LocalTabletClient) for c in gate.tablets.values()):
        placed = await SegmentedQueue.from_gate(gate, "commerce", "events").store_many(jobs)
    else:
        placed = await gate.queue_enqueue("commerce", "events", jobs)
    return dict(zip(placed, jobs, strict=True))


async def job_states(gate: Gate) -> dict[str, int]:
    """``state -> jobs`` over every shard, from the ``events_job_state`` view."""
    out: dict[str, int] = {}
    for (ks, _), client in gate.tablets.items():
        if ks != "commerce":
            continue
        res = await client.execute("SELECT state, COUNT(*) FROM events_job_state GROUP BY state",
                                   [])
        for state, n in res.rows:
            out[str(state)] = out.get(str(state), 0) + int(n)
    return out


async def test_create_queue_makes_segmented_tables(cluster: Cluster) -> None:
    gate = cluster.gate
    table = gate.vschema.keyspace("commerce").tables["events"]
    assert table.type == "queue" and table.options["storage"] == "segmented"
    for shard in cluster.topology.keyspace("commerce").shards:
        client = gate.tablets[("commerce", shard.name)]
        res = await client.execute("SELECT n, state FROM events_datasets", [])
        assert [(int(r[0]), str(r[1])) for r in res.rows] == [(1000, "open")]
    assert await job_states(gate) == {}
    # Again with IF NOT EXISTS: nothing changes; without it: refused.
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, CREATE.format(ack_wait=1).replace("QUEUE", "QUEUE IF NOT EXISTS", 1))
    with pytest.raises(InvalidArgument, match="already exists"):
        await gate.execute(s, CREATE.format(ack_wait=1))


async def test_tablet_process_finds_and_serves_it_from_the_database(
    local_cluster: Cluster
) -> None:
    """A tablet that was never configured (a separate ``shardgate tablet`` process) finds
    the segmented queue by the marker on its catalog and serves the shard's jobs."""
    cluster = local_cluster
    gate = cluster.gate
    shard = cluster.topology.keyspace("commerce").shards[0].name
    jobs = [(i, f"job {i}") for i in range(16)]
    placed = await gate.queue_enqueue("commerce", "events", jobs)
    mine = {job_id for s, job_id in placed if s == shard}
    assert mine
    tablet = Tablet.open("commerce", shard, cluster.shard_urls("commerce")[shard])
    tablet.queues.segmented_kwargs = {"poll_interval": 0.02, "compaction_interval": 0.1}
    try:
        assert await tablet.queues.detect() == ["events"]
        opts = tablet.queues.options["events"]
        assert opts.storage == "segmented" and opts.ack_wait == 1.0 and opts.batch_size == 8
        got: set[int] = set()

        async def run() -> None:
            stream = receive_batches(tablet.queues, "events")
            try:
                async for batch in stream:
                    if not batch.events:  # the first batch: the fields
                        continue
                    assert all(e.shard == shard for e in batch.events)
                    got.update(e.id for e in batch.events)
                    await tablet.queues.ack("events", [e.id for e in batch.events])
                    if got >= mine:
                        return
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

        await asyncio.wait_for(run(), 20)
        assert got == mine
    finally:
        await tablet.close()
    states = await gate.tablets[("commerce", shard)].execute(
        "SELECT state, COUNT(*) FROM events_job_state GROUP BY state", [])
    assert [(str(r[0]), int(r[1])) for r in states.rows] == [("succeeded", len(mine))]
    with pytest.raises(InvalidArgument, match="not a segmented queue"):
        await gate.queue_enqueue("commerce", "corder", [(1, "x")])


async def test_gate_receive_ack_order_and_redelivery(cluster: Cluster) -> None:
    gate = cluster.gate
    n_keys, per_key = 6, 8
    jobs = [(k, f"u{k} #{i}") for i in range(per_key) for k in range(n_keys)]
    stored = await store(gate, jobs)
    ids_of_key: dict[str, list[tuple[str, int]]] = {}
    for sid in sorted(stored):
        ids_of_key.setdefault(str(stored[sid][0]), []).append(sid)
    assert all(len({shard for shard, _ in v}) == 1 for v in ids_of_key.values())

    acked: set[tuple[str, int]] = set()
    violations: list[str] = []
    held_back: QueueEvent | None = None  # the one delivery left unacked on purpose
    redelivered: QueueEvent | None = None
    fields: list[str] = []

    async def run() -> None:
        nonlocal held_back, redelivered
        async for batch in gate.queue_receive("commerce", "events"):
            if not batch.events:
                fields.extend(batch.fields)
                continue
            to_ack: dict[str, list[int]] = {}
            for e in batch.events:
                key, body = e.values
                sid = (e.shard, e.id)
                assert stored[sid] == (int(key), body)  # payload and key as stored
                earlier = [i for i in ids_of_key[key] if i < sid]
                if not set(earlier) <= acked:
                    violations.append(f"job {e.id} of key {key} before {set(earlier) - acked}")
                if held_back is None and key == "0":
                    held_back = e  # not acked: must come back after ack_wait
                    continue
                if held_back is not None and e.id == held_back.id:
                    redelivered = e
                to_ack.setdefault(e.shard, []).append(e.id)
            for shard, ids in to_ack.items():
                assert await gate.queue_ack("commerce", "events", shard, ids) == len(ids)
                acked.update((shard, i) for i in ids)
            if len(acked) == len(stored):
                return

    t0 = time.monotonic()
    await asyncio.wait_for(run(), 30)
    assert violations == []
    assert fields == list(SEGMENTED_FIELDS)
    assert held_back is not None and redelivered is not None
    assert held_back.epoch == 1 and redelivered.epoch == 2
    assert time.monotonic() - t0 >= 1.0  # the redelivery waited for ack_wait
    assert await job_states(gate) == {"succeeded": len(stored)}

    stats = await gate.queue_stats("commerce", "events")
    assert len(stats) == len(cluster.topology.keyspace("commerce").shards) == 2
    assert sum(s["depth"].get("succeeded", 0) for s in stats) == len(stored)
    assert all(s["storage"] == "segmented" and s["leader"] for s in stats)
    assert sum(s["succeeded"] for s in stats) == len(stored)
    assert sum(s.get("failed", 0) for s in stats) == 1  # the ack_wait expiry, recorded


async def test_grpc_receive_and_ack(cluster: Cluster) -> None:
    gate = cluster.gate
    jobs = [(i, f"job {i}") for i in range(20)]
    stored = dict(zip(await gate.queue_enqueue("commerce", "events", jobs), jobs, strict=True))
    assert len(stored) == 20
    server, port = await serve(gate, "127.0.0.1", 0)
    got: list[QueueEvent] = []
    try:
        async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="commerce") as client:

            async def run() -> None:
                async for batch in client.receive("events"):
                    assert batch.fields == list(SEGMENTED_FIELDS)
                    got.extend(batch.events)
                    assert await client.ack(batch) == len(batch.events)
                    if len(got) >= len(stored):
                        return

            await asyncio.wait_for(run(), 30)
            stats = await client.queue_stats("events")
    finally:
        await server.stop(None)
    assert sorted((e.shard, e.id) for e in got) == sorted(stored)
    assert {(e.shard, e.id): (int(e.values[0]), e.values[1]) for e in got} == stored
    assert {e.shard for e in got} == {s.name for s in cluster.topology.keyspace("commerce").shards}
    assert await job_states(gate) == {"succeeded": len(stored)}
    assert sum(s["depth"]["succeeded"] for s in stats) == len(stored)


async def test_receiver_gone_gives_jobs_back_at_once(
    kind: str, tablets: str, make_database: Callable[..., str], request: pytest.FixtureRequest
) -> None:
    c = await _cluster(kind, make_database, 60.0, tablets, request)
    gate = c.gate
    try:
        stored = await store(gate, [(7, "a"), (7, "b"), (7, "c")])
        first = sorted(stored)[0][1]

        async def first_batch() -> list[QueueEvent]:
            stream = gate.queue_receive("commerce", "events")
            try:
                async for batch in stream:
                    if batch.events:
                        return batch.events
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
            raise AssertionError("stream ended")

        got = await asyncio.wait_for(first_batch(), 15)
        assert [(e.id, e.epoch) for e in got] == [(first, 1)]  # key 7: one at a time
        t0 = time.monotonic()
        again = await asyncio.wait_for(first_batch(), 15)  # well before ack_wait (60 s)
        assert time.monotonic() - t0 < 10
        assert [(e.id, e.epoch) for e in again] == [(first, 2)]
        assert await job_states(gate) == {"executing": 1, "pending": 2}
    finally:
        await close_cluster(c)


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE QUEUE q (k BIGINT, a TEXT, b TEXT) SHARD BY k WITH (storage = segmented)",
     "at most one payload column"),
    ("CREATE QUEUE q (k BIGINT, n BIGINT) SHARD BY k WITH (storage = segmented)",
     "must be text"),
    ("CREATE QUEUE q (k BIGINT, a TEXT) SHARD BY k WITH (storage = segmented, "
     "ordering_key = k)", "do not apply"),
])
def test_bad_segmented_create_queue(sql: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_create_queue(sql)


async def test_segmented_needs_a_functional_vindex(make_database: Callable[..., str]) -> None:
    c = await open_cluster("sqlite", make_database, shards=2)
    try:
        with pytest.raises(InvalidArgument, match="functional, single-column"):
            await c.gate.execute(
                c.gate.session("commerce", identity=TRUSTED),
                "CREATE QUEUE q (email VARCHAR(64), body TEXT) SHARD BY email "
                "USING customer_email_idx WITH (storage = segmented)")
        assert "q" not in c.gate.vschema.keyspace("commerce").tables
        c.gate.rebuild_vschema()
        assert "q" not in c.gate.vschema.keyspace("commerce").tables
    finally:
        await c.gate.close()
