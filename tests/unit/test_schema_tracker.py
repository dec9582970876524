"""The schema tracker (issue 32): what it reads, keeps, forgets and refuses.

The shard is a fake answering the catalog query (a unit test of the tracker's
bookkeeping); reads from real SQLite, PostgreSQL and MariaDB shards are in
tests/integration/sql/test_schema_tracking.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardgate.errors import Code, ShardgateError, Unavailable, Unsupported
from shardgate.gate import schema_tracker
from shardgate.gate.schema_tracker import SchemaTracker
from shardgate.result import Result
from shardgate.sql.dialects import Dialect
from shardgate.sql.schema import ColumnsUnknown, Schema

ROWS = [("t", "id", "BIGINT"), ("t", "Name", "varchar(20)"), ("u", "id", "int"),
        ("sg_queue_x", "id", "int"), ("u", "t_id", "bigint")]


class FakeShard:
    """Answers the catalog query with ``rows``; ``gate`` (if set) holds each answer
    until released; ``fail`` raises instead."""

    dialect = Dialect.SQLITE
    placeholder = "?"

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = list(ROWS)
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail: ShardgateError | None = None

    async def execute(self, sql: str, params: list[Any]) -> Result:
        self.calls.append(sql)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return Result(fields=["table", "column", "type"], rows=list(self.rows))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tracker(shard: FakeShard, clock: Clock | None = None) -> SchemaTracker:
    return SchemaTracker(lambda ks: ((ks, "-"), shard),  # type: ignore[arg-type,return-value]
                         clock or Clock())


async def test_reads_a_keyspace_once_in_column_order_without_internal_tables() -> None:
    shard = FakeShard()
    t = tracker(shard)
    with pytest.raises(ColumnsUnknown) as unknown:
        t.schema.table("ks", "t")
    assert unknown.value.code is Code.UNIMPLEMENTED and unknown.value.keyspace == "ks"
    await t.load("ks")
    await t.load("ks")
    assert len(shard.calls) == 1 and "pragma_table_info" in shard.calls[0]
    table = t.schema.table("ks", "T")  # names compare without case
    assert table is not None and table.names == ("id", "Name")
    assert [c.type for c in table.columns] == ["bigint", "varchar(20)"]
    assert table.find("name") is not None and table.find("nope") is None
    u = t.schema.table("ks", "u")
    assert u is not None and u.names == ("id", "t_id")
    assert t.schema.table("ks", "sg_queue_x") is None  # shardgate's own tables left out
    assert t.schema.table("ks", "nosuch") is None
    with pytest.raises(ColumnsUnknown):
        t.schema.table("other", "t")  # per keyspace


async def test_concurrent_loads_share_one_read() -> None:
    shard = FakeShard()
    shard.gate = asyncio.Event()
    t = tracker(shard)
    waiters = [asyncio.create_task(t.load("ks")) for _ in range(5)]
    await asyncio.sleep(0)
    shard.gate.set()
    await asyncio.gather(*waiters)
    assert len(shard.calls) == 1 and t.reads == 1
    assert t.schema.table("ks", "t") is not None


async def test_forget_drops_what_was_read_and_a_read_in_flight() -> None:
    shard = FakeShard()
    t = tracker(shard)
    await t.load("ks")
    await t.load("other")
    t.forget("other")
    assert "ks" in t.schema.keyspaces and "other" not in t.schema.keyspaces
    t.forget()
    assert t.schema == Schema()
    # a read that started before a forget (a DDL) may be older than it: not kept
    shard.gate = asyncio.Event()
    loading = asyncio.create_task(t.load("ks"))
    while len(shard.calls) < 3:  # the catalog query is on its way
        await asyncio.sleep(0)
    t.forget()
    shard.rows.append(("t", "added", "int"))
    shard.gate.set()
    await loading
    assert "ks" not in t.schema.keyspaces
    shard.gate = None
    await t.load("ks")
    found = t.schema.table("ks", "t")
    assert found is not None and found.names == ("id", "Name", "added")


async def test_a_failed_read_refuses_for_a_while_then_reads_again() -> None:
    shard = FakeShard()
    shard.fail = Unavailable("shard ks/- is down")
    clock = Clock()
    t = tracker(shard, clock)
    await t.load("ks")  # never raises: the failure is the keyspace's state
    with pytest.raises(Unsupported) as refused:
        t.schema.table("ks", "t")
    assert not isinstance(refused.value, ColumnsUnknown)
    assert refused.value.code is Code.UNIMPLEMENTED and "is down" in refused.value.message
    await t.load("ks")
    assert len(shard.calls) == 1  # kept, not read again at once
    clock.now += schema_tracker.RETRY_S
    with pytest.raises(ColumnsUnknown):  # expired: unknown again, so read again
        t.schema.table("ks", "t")
    shard.fail = None
    await t.load("ks")
    assert len(shard.calls) == 2 and t.schema.table("ks", "t") is not None


async def test_a_shard_that_does_not_answer_is_a_failed_read(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema_tracker, "READ_TIMEOUT_S", 0.05)
    shard = FakeShard()
    shard.gate = asyncio.Event()  # never set
    t = tracker(shard)
    await asyncio.wait_for(t.load("ks"), 5)  # bounds the test itself
    with pytest.raises(Unsupported, match="did not answer"):
        t.schema.table("ks", "t")
