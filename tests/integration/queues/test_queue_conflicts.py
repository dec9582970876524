"""A queue manager that loses a lock conflict keeps going (its invariant 8).

Seen in the reshard acceptance test: on MariaDB a fire write died in a deadlock with
producers' inserts, on SQLite an ack met a shard locked by a multi-shard writer; the
manager stopped and the gate's receiver subscription ended with ``ABORTED``. Here a
SQLite shard (busy timeout 100 ms) is write-locked from outside for 2 s while one
delivered event is due to fire again and another one's ack is written: the refire and
the ack both go through once the lock is gone, and the manager never stops.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.topo.model import Topology
from tests.integration.workflows.test_reshard_queue import VSCHEMA

QUEUE = ("CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(64)) SHARD BY user_id "
         "WITH (ack_wait = 1, min_backoff = 0.1, max_backoff = 0.2)")


async def test_a_lock_conflict_neither_stops_the_manager_nor_ends_the_receiver(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shardgate.queues.table.manager")
    path = tmp_path / "q.db"
    gate = Gate.open(Topology.from_dict({"keyspaces": {"app": {
        "shards": {"-": f"sqlite:///{path}?busy_timeout=100"}, "vschema": VSCHEMA}}}))
    s = gate.session("app", identity=TRUSTED)
    locker: sqlite3.Connection | None = None
    try:
        await gate.execute(s, QUEUE)
        await gate.execute(s, "INSERT INTO jobs (user_id, body) VALUES (1, 'first'), "
                              "(2, 'second')")
        stream = gate.queue_receive("app", "jobs")
        await anext(stream)  # fields
        got: dict[str, int] = {}
        while len(got) < 2:
            batch = await asyncio.wait_for(anext(stream), 10)
            got.update({e.values[-1]: e.id for e in batch.events})
        delivered = time.monotonic()
        # the shard locked by another writer over the time 'first' is due again (1 s)
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        ack = asyncio.create_task(gate.queue_ack("app", "jobs", "-", [got["second"]]))
        await asyncio.sleep(2.0)
        assert not ack.done(), "the ack went through a locked shard"
        locker.execute("ROLLBACK")
        released = time.monotonic()
        assert await asyncio.wait_for(ack, 10) == 1
        # 'first' (never acked) comes again, after the lock: its refire was retried
        batch = await asyncio.wait_for(anext(stream), 10)
        assert [e.values[-1] for e in batch.events] == ["first"]
        assert time.monotonic() >= released > delivered + 1.0
        assert await gate.queue_ack("app", "jobs", "-", [got["first"]]) == 1
        rows = (await gate.execute(s, "SELECT body, state FROM jobs ORDER BY body")).rows
        assert [tuple(r) for r in rows] == [("first", "acked"), ("second", "acked")]
        assert any("lock conflict" in r.getMessage() for r in caplog.records)
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        if locker is not None:
            locker.close()
        await gate.close()
