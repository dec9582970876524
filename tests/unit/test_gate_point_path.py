"""The gate's point path: the same shard, result and bookkeeping as the general route."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from shardgate.auth.identity import TRUSTED
from shardgate.engine.plan import Plan
from shardgate.engine.route import Route
from shardgate.gate import Gate
from shardgate.gate.cursor import SessionCursor
from shardgate.planner import build_plan
from shardgate.result import ExecuteOptions, Result
from shardgate.sql.classify import WriteTarget
from shardgate.sql.parse import parse
from shardgate.tablet.client import TabletClient
from shardgate.topo import Topology
from shardgate.vschema import VSchema

SHARDS = ("-40", "40-80", "80-c0", "c0-")


class Recording(TabletClient):
    """A tablet answering every statement with one row naming its shard."""

    dialect = "postgres"
    placeholder = "%s"

    def __init__(self, shard: str, calls: list[tuple[str, str, tuple[Any, ...]]]) -> None:
        self.keyspace, self.shard, self.calls = "ks", shard, calls

    async def execute(self, sql: str, params: Sequence[Any], transaction_id: int | None = None,
                      options: ExecuteOptions | None = None, *,
                      target: WriteTarget | None = None) -> Result:
        self.calls.append((self.shard, sql, tuple(params)))
        return Result(fields=["id", "shard"], rows=[(params[0] if params else None, self.shard)])

    def stream_execute(self, sql: str, params: Sequence[Any]) -> AsyncIterator[
            tuple[list[str], list[tuple[Any, ...]]]]:
        raise NotImplementedError

    async def begin(self, caller: str | None = None) -> int:
        return 1

    async def commit(self, transaction_id: int) -> None:
        pass

    async def rollback(self, transaction_id: int) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture
def gate() -> tuple[Gate, list[tuple[str, str, tuple[Any, ...]]]]:
    topo = Topology.from_dict({"default_keyspace": "ks", "keyspaces": {"ks": {
        "shards": {s: f"postgresql://127.0.0.1/unused_{i}" for i, s in enumerate(SHARDS)},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}})
    calls: list[tuple[str, str, tuple[Any, ...]]] = []
    g = Gate(topo, {("ks", s): Recording(s, calls) for s in SHARDS})
    g.schema.kinds[("ks", "t")] = {}  # no column types to read from the recording tablets
    return g, calls


def _route(gate: Gate, sql: str) -> Route:
    planned = gate.plan(sql, "ks")
    assert isinstance(planned, Plan) and isinstance(planned.instructions, Route)
    return planned.instructions


def test_which_routes_are_points(gate: tuple[Gate, list[Any]]) -> None:
    g, _ = gate
    assert _route(g, "SELECT id FROM t WHERE id = :id").point
    assert _route(g, "SELECT id FROM t WHERE id = 5").point
    assert not _route(g, "SELECT id FROM t WHERE id IN (1, 2)").point
    assert not _route(g, "SELECT id FROM t").point
    assert not _route(g, "SELECT id FROM t ORDER BY id LIMIT 3").point
    assert not _route(g, "UPDATE t SET v = 1 WHERE id = :id").point


def test_point_reads_and_the_direct_path() -> None:
    """One definition of a point read (Route.point: the MySQL listener runs it whole);
    the gate's direct path takes those it routes without I/O, and unsharded reads."""
    vs = VSchema.from_json({
        "s": {"sharded": True,
              "vindexes": {"hash": {"type": "hash"},
                           "by_e": {"type": "lookup_unique",
                                    "params": {"table": "m", "from": "e", "to": "k"}}},
              "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]},
                         "u": {"column_vindexes": [{"column": "e", "name": "by_e"}]}}},
        "plain": {"tables": {"p": {}}},
    })

    def route(sql: str) -> Route:
        planned = build_plan(parse(sql), sql, vs, "s")
        assert isinstance(planned.instructions, Route)
        return planned.instructions

    by_hash = route("SELECT id FROM t WHERE id = :id")
    assert (by_hash.point, by_hash.direct) == (True, True)
    by_lookup = route("SELECT e FROM u WHERE e = :e")  # its shard needs the lookup read
    assert (by_lookup.point, by_lookup.direct) == (True, False)
    unsharded = route("SELECT * FROM plain.p")  # may be long: streamed by the listener
    assert (unsharded.point, unsharded.direct) == (False, True)
    for sql in ("SELECT id FROM t", "SELECT id FROM t WHERE id IN (1, 2)",
                "UPDATE t SET v = 1 WHERE id = :id", "UPDATE plain.p SET v = 1"):
        assert (route(sql).point, route(sql).direct) == (False, False), sql


async def test_point_reads_reach_the_shard_the_general_route_finds(
        gate: tuple[Gate, list[tuple[str, str, tuple[Any, ...]]]]) -> None:
    g, calls = gate
    s = g.session("ks", identity=TRUSTED)
    route = _route(g, "SELECT id FROM t WHERE id = :id")
    cursor = SessionCursor(g, s)
    cursor.reads = True
    seen = set()
    for i in range(64):
        calls.clear()
        res = await g.execute(s, "SELECT id FROM t WHERE id = :id", {"id": i})
        assert calls == [(res.rows[0][1], "SELECT id FROM t WHERE id = %s", (i,))]
        assert [res.rows[0][1]] == await route.shards(cursor, {"id": i})
        seen.add(res.rows[0][1])
    assert seen == set(SHARDS)  # the ids spread over every shard
    assert s.shard_calls == 64


async def test_point_reads_keep_the_bookkeeping(
        gate: tuple[Gate, list[tuple[str, str, tuple[Any, ...]]]]) -> None:
    g, _ = gate
    s = g.session("ks", identity=TRUSTED)
    sample = "shardgate_gate_api_seconds_count"
    labels = {"operation": "Execute", "keyspace": "ks", "statement": "SELECT"}
    before = REGISTRY.get_sample_value(sample, labels) or 0.0
    rows_before = REGISTRY.get_sample_value(
        "shardgate_gate_rows_returned_total", {"operation": "Execute", "keyspace": "ks"}) or 0.0
    for i in range(3):
        await g.execute(s, "SELECT id FROM t WHERE id = :id", {"id": i})
    assert REGISTRY.get_sample_value(sample, labels) == before + 3
    assert REGISTRY.get_sample_value(
        "shardgate_gate_rows_returned_total",
        {"operation": "Execute", "keyspace": "ks"}) == rows_before + 3
    (stats,) = [q for q in g.query_stats() if q.query.startswith("SELECT id FROM t")]
    assert stats.count == 3 and stats.shard_calls == 3 and stats.rows == 3
    entry = g.querylog.recent(1)[0]
    assert (entry.keyspace, entry.rows, entry.shard_calls, entry.error) == ("ks", 1, 1, None)
    assert entry.session == f"{id(s):x}"
    assert g.live.snapshot() == []  # finished statements leave the live list
    assert s.busy == 0 and g.sessions.transaction_expired(s, 0.0) is False


async def test_values_the_point_path_leaves_to_the_general_route(
        gate: tuple[Gate, list[tuple[str, str, tuple[Any, ...]]]]) -> None:
    g, calls = gate
    s = g.session("ks", identity=TRUSTED)
    # NULL matches no row: one shard answers a query over no rows (the fields)
    await g.execute(s, "SELECT id FROM t WHERE id = :id", {"id": None})
    assert len(calls) == 1 and calls[0][0] == SHARDS[0] and calls[0][1] != \
        "SELECT id FROM t WHERE id = %s"
    with pytest.raises(Exception, match="is a list"):
        await g.execute(s, "SELECT id FROM t WHERE id = :id", {"id": [1, 2]})


async def test_a_reported_end_still_fails_the_next_point_read(
        gate: tuple[Gate, list[tuple[str, str, tuple[Any, ...]]]]) -> None:
    g, _ = gate
    s = g.session("ks", identity=TRUSTED)
    s.ended = "the gate rolled back this session's transaction: test"
    with pytest.raises(Exception, match="ABORTED"):
        await g.execute(s, "SELECT id FROM t WHERE id = :id", {"id": 1})
    await g.execute(s, "SELECT id FROM t WHERE id = :id", {"id": 1})  # reported once
