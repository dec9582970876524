"""The gate tells a tablet what a statement writes (issue 33): the tablet reads no SQL
text to find a queue write, in process and across the gRPC hop; a statement sent
without it (an older gate, the gate's own raw statements) is still read."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.api.grpc.tablet_service import serve_tablet
from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.sql import classify
from shardgate.tablet import LocalTabletClient, Tablet
from shardgate.tablet import queue_service as queue_service_module
from shardgate.tablet.queue_service import QueueWrite
from tests.integration.queues.test_queue_manager import create, open_gate


class Spies:
    """What the tablets' queue hooks saw: head reads and committed queue writes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tablets: list[Tablet]) -> None:
        self.read: list[str] = []
        self.committed: list[QueueWrite] = []

        def reading(sql: str) -> tuple[str, str] | None:
            self.read.append(sql)
            return classify.write_target(sql)

        monkeypatch.setattr(queue_service_module, "write_target", reading)
        for tablet in tablets:
            committed = tablet.queues.committed

            def seen(touched: Any, committed: Callable[[Any], None] = committed) -> None:
                self.committed.extend(touched)
                committed(touched)

            monkeypatch.setattr(tablet.queues, "committed", seen)


@pytest.fixture
async def gate(make_database: Callable[..., str]) -> AsyncIterator[Gate]:
    g = await open_gate("sqlite", make_database)
    try:
        await create(g)
        yield g
    finally:
        await g.close()


def _tablets(gate: Gate) -> list[Tablet]:
    clients = list(gate.tablets.values())
    assert all(isinstance(c, LocalTabletClient) for c in clients)
    return [c.tablet for c in clients]  # type: ignore[attr-defined]


async def test_gate_statements_are_not_read_again(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    spies = Spies(monkeypatch, _tablets(gate))
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO jobs (user_id, body) VALUES (1, 'a'), (2, 'b')")
    await gate.execute(s, "UPDATE jobs SET body = 'c' WHERE user_id = 1")
    await gate.execute(s, "SELECT body FROM jobs WHERE user_id = 2")
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "DELETE FROM jobs WHERE user_id = 2")
    await gate.execute(s, "COMMIT")
    # (the gate's own catalog reads, sent as text, are still read)
    assert [sql for sql in spies.read if "jobs" in sql.lower()] == []
    kinds = sorted((w.queue, w.kind) for w in spies.committed)
    # two shards' inserts (the rows hash apart or not: one write per shard touched),
    # one update, one delete (an update of the queue)
    assert ("jobs", "insert") in kinds and kinds.count(("jobs", "update")) == 2


async def test_the_target_crosses_the_grpc_hop(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    tablet = _tablets(gate)[0]
    spies = Spies(monkeypatch, [tablet])
    server, port = await serve_tablet(tablet)
    remote = await GrpcTabletClient.connect(f"grpc://127.0.0.1:{port}")
    try:
        ph = remote.placeholder
        insert = f"INSERT INTO jobs (user_id, body) VALUES ({ph}, 'x')"
        await remote.execute(insert, [7], target=("insert", "jobs"))
        await remote.execute("SELECT 1", [], target=classify.NOT_A_WRITE)
        assert spies.read == []
        assert [(w.queue, w.kind) for w in spies.committed] == [("jobs", "insert")]
        await remote.execute(insert, [8])  # not classified: the tablet reads its head
        assert spies.read == [insert]
        assert [(w.queue, w.kind) for w in spies.committed] == [("jobs", "insert")] * 2
    finally:
        await remote.close()
        await server.stop(None)


@pytest.mark.parametrize(("sql", "target"), [
    ("INSERT INTO jobs (a) VALUES (1)", ("insert", "jobs")),
    ("INSERT INTO app.jobs (a) SELECT 1", ("insert", "jobs")),
    ("INSERT IGNORE INTO `Jobs` (a) VALUES (1)", ("insert", "Jobs")),
    ("UPDATE jobs SET a = 1", ("update", "jobs")),
    ("DELETE FROM jobs WHERE a = 1", ("delete", "jobs")),
    ("SELECT a FROM jobs FOR UPDATE", classify.NOT_A_WRITE),
    ("CREATE TABLE x (a INT)", classify.NOT_A_WRITE),
])
def test_tree_write_target(sql: str, target: classify.WriteTarget) -> None:
    from shardgate.sql.parse import parse

    assert classify.tree_write_target(parse(sql)) == target
