"""Schema tracking (issue 32) on real shards: the gate reads each keyspace's columns
from its first shard and uses them to qualify columns and expand ``*`` in joins it
runs itself, and to name ``ORDER BY`` positions under ``SELECT *``; DDL through the
gate and a new topology make it read them again; a shard that cannot answer makes
such statements refused (coded), never answered wrongly.

Expected rows are computed here from the rows inserted, not from the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.topo import Topology

from ..conftest import gate_for

SHARDED: dict[str, Any] = {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}},
    "tables": {"a": {"column_vindexes": [{"column": "id", "name": "hash"}]},
               "b": {"column_vindexes": [{"column": "id", "name": "hash"}]}},
}
A = [(1, 10, "ann"), (2, 20, "bob"), (3, 10, "cy"), (4, 30, "dee"), (5, None, "eve")]
B = [(1, 10, "x1"), (2, 10, "x2"), (3, 20, "y"), (4, 40, "z")]
C = [(7, 10, "seven"), (8, 30, "eight")]


def _topology(kind: str) -> Callable[[Callable[..., str]], Topology]:
    return lambda make_database: Topology.from_dict({"default_keyspace": "sk", "keyspaces": {
        "sk": {"shards": {"-80": make_database(kind, "st0"), "80-": make_database(kind, "st1")},
               "vschema": SHARDED},
        "uk": {"shards": {"0": make_database(kind, "stu")},
               "vschema": {"sharded": False, "tables": {"c": {}}}},
    }})


async def _gate(kind: str, make_database: Callable[..., str], stack: AsyncExitStack,
                tablets: str = "in-process", request: pytest.FixtureRequest | None = None,
                ) -> Gate:
    """A gate over two sharded and one unsharded database of ``kind``, closed with
    ``stack``: in this process or reaching tablet processes (see ``gate_for``)."""
    return await stack.enter_async_context(gate_for(
        kind, tablets, _topology(kind), make_database, request,  # type: ignore[arg-type]
        shape="tracking"))


async def _setup(gate: Gate) -> None:
    s = gate.session("sk", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE a (id BIGINT PRIMARY KEY, x INT, name VARCHAR(20))")
    await gate.execute(s, "CREATE TABLE b (id BIGINT PRIMARY KEY, x INT, label VARCHAR(20))")
    await gate.execute(s, "CREATE TABLE uk.c (cid INT PRIMARY KEY, x INT, note VARCHAR(20))")
    for table, rows in (("a (id, x, name)", A), ("b (id, x, label)", B),
                        ("uk.c (cid, x, note)", C)):
        for row in rows:
            await gate.execute(s, f"INSERT INTO {table} VALUES (:p0, :p1, :p2)",
                               {f"p{i}": v for i, v in enumerate(row)})


async def test_columns_qualified_and_stars_expanded_from_the_shards(
    backend_kind: str, tablets: str, make_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> None:
    stack = AsyncExitStack()
    gate = await _gate(backend_kind, make_database, stack, tablets, request)
    try:
        await _setup(gate)
        s = gate.session("sk", identity=TRUSTED)
        # a gate-side join (on x, not the vindex) with unqualified columns
        res = await gate.execute(
            s, "SELECT name, label FROM a JOIN b ON a.x = b.x WHERE label <> 'z' "
               "ORDER BY name, label")
        assert [f.lower() for f in res.fields] == ["name", "label"]
        assert [tuple(r) for r in res.rows] == sorted(
            (an, bl) for _, ax, an in A for _, bx, bl in B if ax == bx and bl != "z")
        # * across keyspaces, ordered by positions (a.id, then c.cid)
        res = await gate.execute(s, "SELECT * FROM a JOIN uk.c ON a.x = c.x ORDER BY 4 DESC, 1")
        assert [f.lower() for f in res.fields] == ["id", "x", "name", "cid", "x", "note"]
        assert [tuple(r) for r in res.rows] == sorted(
            (ra + rc for ra in A for rc in C if ra[1] == rc[1]), key=lambda r: (-r[3], r[0]))
        # t.* and an unqualified column, LEFT JOIN
        res = await gate.execute(s, "SELECT b.*, name FROM a LEFT JOIN b ON a.x = b.x "
                                    "ORDER BY name, 1")
        want: list[tuple[Any, ...]] = [(*rb, an) for _, ax, an in A for rb in B if ax == rb[1]]
        want += [(None, None, None, an) for _, ax, an in A if all(ax != rb[1] for rb in B)]
        assert [tuple(r) for r in res.rows] == sorted(want, key=lambda r: (r[3], r[0] or 0))
        # ORDER BY a position under SELECT * across shards
        res = await gate.execute(s, "SELECT * FROM a ORDER BY 3 DESC LIMIT 3")
        assert [tuple(r) for r in res.rows] == sorted(A, key=lambda r: r[2], reverse=True)[:3]
        assert gate.tracker.reads == 2  # each keyspace once
        # ambiguous, as the database says
        with pytest.raises(ShardgateError) as ambiguous:
            await gate.execute(s, "SELECT id FROM a JOIN b ON a.x = b.x")
        assert ambiguous.value.code is Code.INVALID_ARGUMENT

        # DDL through the gate: read again, cached plans dropped
        await gate.execute(s, "ALTER TABLE b ADD COLUMN extra INT")
        res = await gate.execute(s, "SELECT * FROM a JOIN b ON a.x = b.x ORDER BY 1, 4")
        assert [f.lower() for f in res.fields] == ["id", "x", "name", "id", "x", "label", "extra"]
        assert [tuple(r) for r in res.rows] == sorted(
            ra + rb + (None,) for ra in A for rb in B if ra[1] == rb[1])
        assert gate.tracker.reads == 3

        # a new topology: forgotten; EXPLAIN (which cannot wait) refuses until read
        sql = "SELECT name, note FROM a JOIN uk.c ON a.x = c.x"
        assert gate.apply_topology(replace(gate.topology, version=gate.topology.version + 1))
        with pytest.raises(ShardgateError) as unknown:
            gate.explain(sql)
        assert unknown.value.code is Code.UNIMPLEMENTED
        await gate.load_schema()
        assert gate.explain(sql)["Instructions"]["OperatorType"] == "Projection"
    finally:
        await stack.aclose()


async def test_a_shard_that_cannot_answer_refuses_with_a_code(
    make_database: Callable[..., str]
) -> None:
    stack = AsyncExitStack()
    gate = await _gate("sqlite", make_database, stack)
    try:
        await _setup(gate)
        s = gate.session("sk", identity=TRUSTED)
        _key, tablet = gate.first_shard("sk")
        await tablet.close()
        gate.schema.forget()  # (as after a DDL)
        with pytest.raises(ShardgateError) as refused:
            await gate.execute(s, "SELECT * FROM a JOIN b ON a.x = b.x")
        assert refused.value.code is Code.UNIMPLEMENTED
        assert "columns of sk." in refused.value.message and "not known" in refused.value.message
        # qualified columns need no schema: the join itself still runs where it can
        res = await gate.execute(s, "SELECT c.note FROM uk.c WHERE c.cid = 7")
        assert [tuple(r) for r in res.rows] == [("seven",)]
    finally:
        await stack.aclose()
