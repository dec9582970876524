"""Resharding MariaDB sources, reference tables and tables numbered by a sequence
(issue 21): a 2 -> 4 split of MariaDB shards onto MariaDB shards while writers write
through a gate; VDiff clean; every row exactly once on the shard its keyspace id
names; the reference table whole on every new shard (changes made during the copy
included, each once); a table whose ids come from a sequence keeps counting upward
after the switch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.gate.cutover import HOLD_S
from shardgate.keys import parse_shard_name
from shardgate.topo.model import WRITES_FROZEN, Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows.test_reshard import (
    DDL,
    HASH,
    ROWS,
    Model,
    Writers,
    _wait,
    check_placement,
)

pytestmark = pytest.mark.mysql
assert isinstance(HASH, SingleColumn)
VINDEX: SingleColumn = HASH

VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]},
                      "countries": {"type": "reference"},
                      "s": {"column_vindexes": [{"column": "id", "name": "hash"}],
                            "auto_increment": {"column": "id", "sequence": "seq.s_seq"}}}}
SEQ_VSCHEMA = {"sharded": False, "tables": {"s_seq": {"type": "sequence"}}}


async def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    backend = open_backend(url)
    try:
        return [tuple(r) for r in (await backend.execute(sql)).rows]
    finally:
        await backend.close()


async def _cluster(make_database: Any, tmp_path: Path) -> tuple[str, Gate, dict[str, str], Model]:
    shards = {name: make_database("mysql", f"kind{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict({"keyspaces": {
        "app": {"shards": shards, "vschema": VSCHEMA},
        "seq": {"shards": {"0": make_database("mysql", "kseq")}, "vschema": SEQ_VSCHEMA}}}))
    await server.close()
    gate = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    q = gate.session("seq", identity=TRUSTED)
    await gate.execute(q, "CREATE TABLE s_seq (id INT PRIMARY KEY, next_id BIGINT, cache BIGINT)")
    await gate.execute(q, "INSERT INTO s_seq (id, next_id, cache) VALUES (0, 1, 5)")
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, DDL)
    await gate.execute(s, "CREATE TABLE countries (code VARCHAR(8) PRIMARY KEY, "
                          "name VARCHAR(64) NOT NULL)")
    await gate.execute(s, "CREATE TABLE s (id BIGINT PRIMARY KEY, note VARCHAR(32) NOT NULL)")
    await gate.execute(s, "INSERT INTO countries (code, name) VALUES ('fr', 'France'), "
                          "('de', 'Germany'), ('it', 'Italy')")
    model: Model = {}
    for start in range(1, ROWS + 1, 250):
        ids = range(start, min(start + 250, ROWS + 1))
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                           + ", ".join(f"({i}, 'v{i}', 0)" for i in ids))
        model.update({i: (f"v{i}", 0) for i in ids})
    return topo, gate, shards, model


async def _numbered(gate: Gate, note: str, count: int) -> list[int]:
    """Insert ``count`` rows into ``s`` without ids (the sequence gives them); their ids."""
    s = gate.session("app", identity=TRUSTED)
    ids = []
    for k in range(count):
        res = await gate.execute(s, "INSERT INTO s (note) VALUES (:n)", {"n": f"{note}{k}"})
        ids.append(int(res.insert_id or 0))
    return ids


async def test_split_mariadb_sources_with_reference_and_sequence_tables(
    make_database: Any, tmp_path: Path
) -> None:
    topo, gate, sources, model = await _cluster(make_database, tmp_path)
    four = {n: make_database("mysql", f"kfour{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    numbered = await _numbered(gate, "before", 12)
    writers = Writers(gate, model)
    writers.start()
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())), workflow="kinds")
    flow = ReshardWorkflow(server, spec, batch=200)
    try:
        await flow.create()
        assert flow.state == "running"
        # reference rows are copied by the first source's stream only
        assert set(flow.doc["streams"]["-80"]["tables"]) == {"countries", "s", "t"}
        assert set(flow.doc["streams"]["80-"]["tables"]) == {"s", "t"}
        # changes during the workflow: reference writes reach every target once
        s = gate.session("app", identity=TRUSTED)
        await gate.execute(s, "INSERT INTO countries (code, name) VALUES ('es', 'Spain')")
        await gate.execute(s, "UPDATE countries SET name = 'Italia' WHERE code = 'it'")
        await gate.execute(s, "DELETE FROM countries WHERE code = 'de'")
        numbered += await _numbered(gate, "copying", 6)

        reports = {r.table: r for r in await flow.vdiff()}
        assert set(reports) == {"countries", "s", "t"}
        for r in reports.values():
            assert r.clean, r.to_doc()
        assert reports["t"].matching > ROWS // 2
        assert reports["countries"].matching == 3 * len(four)  # per target
        assert reports["s"].matching == len(numbered)

        await flow.switch_reads()
        out = await flow.switch_writes()
        assert flow.state == "switched" and out["frozen_s"] < HOLD_S, out
        await _wait(lambda: set(four) <= {x.name for x in gate.topology.keyspace("app").shards},
                    "writes did not switch")
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 5, "writers stalled")
        after = await _numbered(gate, "after", 12)
        await flow.complete()
    finally:
        await writers.halt()
        await flow.close()
        await server.close()
        await gate.close()
    assert min(writers.counts.values()) > 0, writers.counts
    assert writers.slowest < 5.0

    # ids keep counting upward: after the switch, past every id given before it;
    # a new gate (no cached block) goes on past those
    assert after == sorted(after) and min(after) > max(numbered), (numbered, after)
    gate2 = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    try:
        fresh = await _numbered(gate2, "fresh", 3)
    finally:
        await gate2.close()
    assert min(fresh) > max(after), (after, fresh)

    await check_placement(four, model)
    everywhere = {("es", "Spain"), ("fr", "France"), ("it", "Italia")}
    seen: dict[int, str] = {}
    for name, url in four.items():
        assert set(await _rows(url, "SELECT code, name FROM countries")) == everywhere, name
        kr = parse_shard_name(name)
        for (i,) in await _rows(url, "SELECT id FROM s"):
            assert kr.contains(VINDEX.map([i])[0][0]), f"s row {i} is on {name}"
            assert i not in seen, f"s row {i} on {seen[i]} and {name}"
            seen[int(i)] = name
    assert set(seen) == set(numbered + after + fresh)
    # the MariaDB sources were left frozen, with their rows
    with pytest.raises(ShardgateError, match=WRITES_FROZEN):
        await _rows(sources["-80"], "DELETE FROM t")
    assert (await _rows(sources["-80"], "SELECT COUNT(*) FROM t"))[0][0] > 0
