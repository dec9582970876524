"""Segmented queues over gRPC for producers: enqueue (single, batched, in a transaction) and nack.

On SQLite and MariaDB shards with in-process tablets, on PostgreSQL shards served by
``shardgate tablet`` processes, with a real gRPC server:

* a remote producer (another process, the synchronous client) enqueues jobs
  through the gate; a receiver gets every one of them;
* jobs enqueued in a session's transaction are invisible until COMMIT and gone
  after ROLLBACK;
* a nacked job is retried (attempt + 1) not before its retry time, and its
  reason is recorded in its status rows; a queue table refuses nack.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.auth.identity import TRUSTED
from shardgate.errors import FailedPrecondition, Unsupported
from shardgate.queues.events import QueueEvent
from shardgate.tablet import LocalTabletClient
from tests.acceptance.test_cli import cli_env
from tests.integration.conftest import Cluster, close_cluster, cluster_for, open_cluster

CREATE = ("CREATE QUEUE events (user_id BIGINT NOT NULL, body TEXT) SHARD BY user_id "
          "WITH (storage = segmented, ack_wait = 5, min_backoff = 0.05, max_backoff = 0.1, "
          "batch_size = 8)")
#: The remote producer: the synchronous client in a process of its own.
PRODUCER = """
import json, sys
from shardgate.client.queues import QueueClient
with QueueClient(sys.argv[1], keyspace="commerce", timeout=30) as q:
    one = q.enqueue("events", 1000, "single")
    many = q.enqueue_many("events", [(i, f"job {i}") for i in range(int(sys.argv[2]))])
print(json.dumps([one, *many]))
"""


@pytest.fixture
async def served(backend_kind: str, tablets: str, make_database: Callable[..., str],
                 request: pytest.FixtureRequest) -> AsyncIterator[tuple[Cluster, str]]:
    """Two shards (in-process tablets polling quicker than the defaults, or tablet
    processes on their defaults), the segmented queue, a gRPC server on the gate."""
    c = await cluster_for(backend_kind, tablets, make_database, request, shards=2)
    try:
        for client in c.gate.tablets.values():
            if isinstance(client, LocalTabletClient):
                client.tablet.queues.segmented_kwargs = {"poll_interval": 0.02,
                                                         "compaction_interval": 0.1}
        await c.gate.execute(c.gate.session("commerce", identity=TRUSTED), CREATE)
        server, port = await serve(c.gate, "127.0.0.1", 0)
        try:
            yield c, f"grpc://127.0.0.1:{port}"
        finally:
            await server.stop(None)
    finally:
        await close_cluster(c)


async def receive(client: GateClient, n: int, *, ack: bool = True) -> list[QueueEvent]:
    got: list[QueueEvent] = []

    async def run() -> None:
        async for batch in client.receive("events"):
            got.extend(batch.events)
            if ack:
                await client.ack(batch)
            if len(got) >= n:
                return

    await asyncio.wait_for(run(), 30)
    return got


async def test_remote_producer_process(served: tuple[Cluster, str]) -> None:
    cluster, target = served
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER, target, "25", env=cli_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    placed = [tuple(p) for p in json.loads(out)]
    assert len(set(placed)) == 26
    shards = {s.name for s in cluster.topology.keyspace("commerce").shards}
    assert {p[0] for p in placed} == shards
    async with GateClient(target, keyspace="commerce") as client:
        got = await receive(client, 26)
    assert sorted((e.shard, e.id) for e in got) == sorted(placed)
    assert sorted(e.values[1] for e in got) == sorted(["single", *(f"job {i}" for i in range(25))])


async def test_enqueue_in_a_transaction(served: tuple[Cluster, str]) -> None:
    cluster, target = served
    async with GateClient(target, keyspace="commerce") as client:
        await client.execute("BEGIN")
        await client.execute("INSERT INTO customer (customer_id, email) VALUES (1, 'a@x')")
        await client.enqueue_many("events", [(i, f"rolled back {i}") for i in range(6)])
        await client.execute("ROLLBACK")
        await client.execute("BEGIN")
        await client.execute("INSERT INTO customer (customer_id, email) VALUES (2, 'b@x')")
        placed = await client.enqueue_many("events", [(i, f"kept {i}") for i in range(6)])
        placed.append(await client.enqueue("events", 99, "kept 99"))
        # Not visible before COMMIT: count the jobs from another session's view.
        assert await job_count(cluster) == 0
        await client.execute("COMMIT")
        assert await job_count(cluster) == 7
        got = await receive(client, 7)
        assert sorted(e.values[1] for e in got) == sorted(
            [*(f"kept {i}" for i in range(6)), "kept 99"])
        assert sorted((e.shard, e.id) for e in got) == sorted(placed)
        rows = await client.execute("SELECT customer_id FROM customer ORDER BY customer_id")
        assert rows.rows == [(2,)]


async def job_count(cluster: Cluster) -> int:
    total = 0
    for (ks, _), client in cluster.gate.tablets.items():
        if ks == "commerce":
            res = await client.execute("SELECT COUNT(*) FROM events_job_state", [])
            total += int(res.rows[0][0])
    return total


async def test_nack_with_reason_and_retry_time(served: tuple[Cluster, str]) -> None:
    cluster, target = served
    async with GateClient(target, keyspace="commerce") as client:
        shard, job_id = await client.enqueue("events", 7, "flaky")
        got: list[tuple[QueueEvent, float]] = []
        retry_at = 0.0

        async def run() -> None:
            nonlocal retry_at
            async for batch in client.receive("events"):
                got.extend((e, time.time()) for e in batch.events)
                if len(got) == 1:  # the receiver stays subscribed: the job is still its
                    retry_at = time.time() + 0.6
                    assert await client.nack(batch, "backend down", retry_at=retry_at) == 1
                    continue
                await client.ack(batch)
                return

        await asyncio.wait_for(run(), 30)
        (first, _), (again, received_at) = got
        assert (first.shard, first.id, first.epoch) == (shard, job_id, 1)
        assert (again.shard, again.id, again.epoch) == (shard, job_id, 2)
        assert received_at >= retry_at
        tablet = cluster.gate.tablets[("commerce", shard)]
        res = await tablet.execute(
            "SELECT state, reason FROM events_job_status_1000 WHERE job_id = "
            + ("%s" if tablet.placeholder == "%s" else "?") + " ORDER BY seq", [job_id])
        assert [(str(s), r) for s, r in res.rows] == [
            ("executing", None), ("failed", "backend down"), ("executing", None),
            ("succeeded", None)]


async def test_nack_of_a_queue_table_is_refused(served: tuple[Cluster, str]) -> None:
    cluster, target = served
    await cluster.gate.execute(cluster.gate.session("commerce", identity=TRUSTED),
                               "CREATE QUEUE plain (user_id BIGINT NOT NULL) SHARD BY user_id")
    shard = cluster.topology.keyspace("commerce").shards[0].name
    async with GateClient(target, keyspace="commerce") as client:
        with pytest.raises(Unsupported, match="nack is for segmented queues"):
            await client.nack([QueueEvent(1, shard, 1, 0, 0, ())], "x", queue="plain")


async def test_enqueue_in_a_transaction_rolls_over_to_a_spare_dataset(
    backend_kind: str, make_database: Callable[..., str]
) -> None:
    """A full open dataset inside a transaction: the spare one takes over (ids go on
    increasing); without a spare the enqueue is refused before writing anything."""
    c = await open_cluster(backend_kind, make_database, shards=1)
    gate = c.gate
    try:
        await gate.execute(gate.session("commerce", identity=TRUSTED), CREATE.replace(
            "batch_size = 8", "batch_size = 8, dataset_max_rows = 3"))
        s = gate.session("commerce", identity=TRUSTED)
        await gate.execute(s, "BEGIN")
        first = await gate.queue_enqueue("commerce", "events", [(1, "a"), (2, "b"), (3, "c")],
                                         session=s)
        with pytest.raises(FailedPrecondition, match="no spare dataset"):
            await gate.queue_enqueue("commerce", "events", [(4, "d")], session=s)
        await gate.execute(s, "COMMIT")  # the first three only
        # Outside a transaction the producer rolls over and creates the next spare.
        outside = await gate.queue_enqueue("commerce", "events", [(5, "e")])
        await gate.execute(s, "BEGIN")
        inside = await gate.queue_enqueue(
            "commerce", "events", [(6, "f"), (7, "g"), (8, "h")], session=s)
        await gate.execute(s, "COMMIT")
        ids = [job_id for _, job_id in [*first, *outside, *inside]]
        assert ids == sorted(ids) and len(set(ids)) == 7
        shard = c.topology.keyspace("commerce").shards[0].name
        catalog = await gate.tablets[("commerce", shard)].execute(
            "SELECT n, state, job_rows FROM events_datasets ORDER BY n", [])
        assert [(str(r[1]), int(r[2])) for r in catalog.rows][:3] == [
            ("closed", 3), ("closed", 1), ("open", 3)]
        stored = []
        for n in [int(r[0]) for r in catalog.rows][:3]:  # (the view is the consumer's)
            res = await gate.tablets[("commerce", shard)].execute(
                f"SELECT job_id, payload FROM events_jobs_{n} ORDER BY job_id", [])
            stored += [(int(r[0]), str(r[1])) for r in res.rows]
        assert stored == list(zip(ids, "abcefgh", strict=True))
    finally:
        await gate.close()
