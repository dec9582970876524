"""MoveTables from a SHARDED keyspace (issue 21 item 2): tables of a 2-shard keyspace
(hash on ``id``) move to a 3-shard keyspace, one of them by another vindex column
(``t`` by ``g``), one numbered by a sequence (``s``), while writers insert, update and
delete through a gate with unqualified SQL. Copy and catch-up from both source shards,
VDiff over all shards, switch reads, switch writes (no writer error: the gate holds
writes across the cut-over), ``reverse-traffic`` (the reverse stream carried every
write made while the target served: the source shards hold the exact model), switch
forward again, complete: every committed row exactly once on the target shard its
keyspace id names, and the sequence never handed out an id twice. Tables MoveTables
cannot move correctly (a sequence table, another sequence) are refused at create.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import InvalidArgument, ShardgateError, Unsupported
from shardgate.gate import Gate
from shardgate.gate.cutover import HOLD_S
from shardgate.keys import parse_shard_name
from shardgate.topo.model import WRITES_FROZEN, Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.movetables import MoveTablesWorkflow, movetables_spec

ROWS = 400
SOURCES = ("-80", "80-")
TARGETS = ("-55", "55-aa", "aa-")
HASHED = {"column_vindexes": [{"column": "id", "name": "hash"}]}
SRC_VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
               "tables": {"t": HASHED, "keep": HASHED, "ref": {"type": "reference"},
                          "s": {**HASHED, "auto_increment": {"column": "id",
                                                             "sequence": "seq.s_seq"}}}}
DST_VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}}
SEQ_VSCHEMA = {"sharded": False, "tables": {"s_seq": {"type": "sequence"}}}
#: the target places ``t`` by ``g`` (the source by ``id``); ``s`` keeps its sequence
ENTRIES = {"tables": {"t": {"column_vindexes": [{"column": "g", "name": "hash"}]},
                      "s": HASHED}}
_HASH = create_vindex("hash", "hash", {})
assert isinstance(_HASH, SingleColumn)
HASH: SingleColumn = _HASH

#: (table, id) -> the other columns
Model = dict[tuple[str, int], tuple[Any, ...]]
#: where each table's rows live: by which column (the source's, the target's)
SOURCE_BY = {"t": "id", "s": "id"}
TARGET_BY = {"t": "g", "s": "id"}
COLUMNS = {"t": "id, g, v, n", "s": "id, note"}


def _g(i: int) -> int:
    return i * 7919 + 13


class Writers:
    """Through one gate (session keyspace ``src``, unqualified SQL): two writers on
    ``t`` (insert, update, delete, each on its own ids) and one inserting into ``s``
    without ids (the sequence numbers them; each id must exceed the last). Any error
    fails the test; ``model`` is exactly what committed."""

    def __init__(self, gate: Gate, model: Model) -> None:
        self.gate, self.model = gate, model
        self.stop = asyncio.Event()
        self.counts = {"insert": 0, "update": 0, "delete": 0, "numbered": 0}
        self.tasks: list[asyncio.Task[None]] = []
        self.last_seq = max((i for (t, i) in model if t == "s"), default=0)
        self.next_id = [10_000_000 * (k + 1) for k in range(2)]  # kept across restarts

    def start(self) -> None:
        self.stop.clear()
        self.tasks = [asyncio.create_task(self._run(k)) for k in range(2)]
        self.tasks.append(asyncio.create_task(self._numbered()))

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    async def _numbered(self) -> None:
        s = self.gate.session("src", identity=TRUSTED)
        while not self.stop.is_set():
            note = f"n{self.counts['numbered']}"
            res = await self.gate.execute(s, "INSERT INTO s (note) VALUES (:n)", {"n": note})
            i = int(res.insert_id or 0)
            assert i > self.last_seq, (i, self.last_seq)
            self.last_seq = i
            self.model[("s", i)] = (note,)
            self.counts["numbered"] += 1
            await asyncio.sleep(0.01)

    async def _run(self, k: int) -> None:
        rnd = random.Random(k)
        s = self.gate.session("src", identity=TRUSTED)
        while not self.stop.is_set():
            mine = [i for (t, i) in self.model if t == "t" and i % 2 == k]
            op = rnd.random()
            if op < 0.4 or not mine:
                self.next_id[k] += 2
                next_id = self.next_id[k]
                v = f"w{k}_{next_id}"
                await self.gate.execute(s, "INSERT INTO t (id, g, v, n) VALUES (:i, :g, :v, 0)",
                                        {"i": next_id, "g": _g(next_id), "v": v})
                self.model[("t", next_id)] = (_g(next_id), v, 0)
                self.counts["insert"] += 1
            elif op < 0.8:
                i = rnd.choice(mine)
                g, v, n = self.model[("t", i)]
                res = await self.gate.execute(
                    s, "UPDATE t SET v = :v, n = :n WHERE id = :i AND g = :g",
                    {"i": i, "g": g, "v": v + "+", "n": n + 1})
                assert res.rows_affected == 1
                self.model[("t", i)] = (g, v + "+", n + 1)
                self.counts["update"] += 1
            else:
                i = rnd.choice(mine)
                # g too: the gate routes by either keyspace's vindex (no scatter write,
                # which two SQLite writers could deadlock on)
                res = await self.gate.execute(s, "DELETE FROM t WHERE id = :i AND g = :g",
                                              {"i": i, "g": self.model[("t", i)][0]})
                assert res.rows_affected == 1
                del self.model[("t", i)]
                self.counts["delete"] += 1
            await asyncio.sleep(0.002)


async def _wait(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _cluster(make_database: Any, tmp_path: Path, kind: str
                   ) -> tuple[str, Gate, dict[str, str], dict[str, str], Model]:
    src = {name: make_database(kind, f"mss{i}") for i, name in enumerate(SOURCES)}
    dst = {name: make_database(kind, f"msd{i}") for i, name in enumerate(TARGETS)}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict({"keyspaces": {
        "src": {"shards": src, "vschema": SRC_VSCHEMA},
        "dst": {"shards": dst, "vschema": DST_VSCHEMA},
        "seq": {"shards": {"0": make_database(kind, "msq")}, "vschema": SEQ_VSCHEMA}}}))
    await server.close()
    gate = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    q = gate.session("seq", identity=TRUSTED)
    await gate.execute(q, "CREATE TABLE s_seq (id INT PRIMARY KEY, next_id BIGINT, cache BIGINT)")
    await gate.execute(q, "INSERT INTO s_seq (id, next_id, cache) VALUES (0, 1, 5)")
    s = gate.session("src", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT NOT NULL, "
                          "v VARCHAR(64) NOT NULL, n INT NOT NULL)")
    await gate.execute(s, "CREATE TABLE s (id BIGINT PRIMARY KEY, note VARCHAR(32) NOT NULL)")
    await gate.execute(s, "CREATE TABLE keep (id BIGINT PRIMARY KEY)")
    await gate.execute(s, "CREATE TABLE ref (id BIGINT PRIMARY KEY)")
    model: Model = {}
    values = ", ".join(f"({i}, {_g(i)}, 't{i}', 0)" for i in range(1, ROWS + 1))
    await gate.execute(s, f"INSERT INTO t (id, g, v, n) VALUES {values}")
    model.update({("t", i): (_g(i), f"t{i}", 0) for i in range(1, ROWS + 1)})
    for k in range(20):
        res = await gate.execute(s, "INSERT INTO s (note) VALUES (:n)", {"n": f"b{k}"})
        model[("s", int(res.insert_id or 0))] = (f"b{k}",)
    return topo, gate, src, dst, model


async def _check_placement(shards: dict[str, str], model: Model, by: dict[str, str]) -> None:
    """Every row of ``model`` exactly once, on the shard its keyspace id (the hash of
    column ``by[table]``) names, and nothing else."""
    seen: Model = {}
    for name, url in shards.items():
        kr = parse_shard_name(name)
        backend = open_backend(url)
        try:
            for table, cols in COLUMNS.items():
                rows = (await backend.execute(f"SELECT {cols} FROM {table}")).rows
                at = cols.split(", ").index(by[table])
                for row, ks in zip(rows, HASH.map([r[at] for r in rows]), strict=True):
                    key = (table, int(row[0]))
                    assert kr.contains(ks[0]), f"{key} is on {name}"
                    assert key not in seen, f"{key} is on two shards"
                    seen[key] = tuple(int(x) if isinstance(x, int) else str(x)
                                      for x in row[1:])
        finally:
            await backend.close()
    assert seen == model


def _routes_to(gate: Gate, keyspace: str) -> bool:
    rule = gate.vschema.routing_rules.get("src.t")
    return rule is not None and rule.target == (keyspace, "t") \
        and not gate.vschema.read_routing_rules


async def _progress(writers: Writers, n: int = 10) -> None:
    before = dict(writers.counts)
    await _wait(lambda: writers.counts["insert"] > before["insert"] + n
                and writers.counts["numbered"] > before["numbered"] + 2, "writers stalled")


async def _move_sharded(kind: str, make_database: Any, tmp_path: Path) -> None:
    topo, gate, src, dst, model = await _cluster(make_database, tmp_path, kind)
    server = TopoServer(open_topo_store(topo))
    spec = await movetables_spec(server, source_keyspace="src", target_keyspace="dst",
                                 tables=("t", "s"), workflow="wf")
    assert spec.sources == SOURCES and set(spec.targets) == set(TARGETS)
    flow = MoveTablesWorkflow(server, spec, vschema=ENTRIES, batch=100)
    writers = Writers(gate, model)
    writers.start()
    try:
        await flow.create()
        assert flow.state == "running"
        assert set(flow.doc["streams"]) == set(SOURCES)
        # the target's entry of s kept the sequence
        entry = flow.doc["target_vschema"]["tables"]["s"]
        assert entry["auto_increment"] == {"column": "id", "sequence": "seq.s_seq"}
        await _progress(writers)
        reports = {r.table: r for r in await flow.vdiff()}
        assert set(reports) == {"t", "s"}
        assert all(r.clean for r in reports.values()), [r.to_doc() for r in reports.values()]
        assert reports["t"].matching > ROWS // 2

        await flow.switch_reads()
        await _wait(lambda: bool(gate.vschema.read_routing_rules), "reads did not switch")
        out = await flow.switch_writes()
        assert flow.state == "switched" and out["frozen_s"] < HOLD_S, out
        await _wait(lambda: _routes_to(gate, "dst"), "writes did not switch")
        await _progress(writers, 20)
        status = await flow.status()
        assert set(status["reverse_streams"]) == set(TARGETS), status

        # back to the source, writers running: the reverse stream carried every write
        out2 = await flow.reverse_traffic()
        assert "served by the sources" in out2, out2
        assert flow.state == "running" and not flow.doc.get("reads_switched")
        await _wait(lambda: _routes_to(gate, "src"), "writes did not return")
        await _progress(writers, 20)
        await writers.halt()
        await _check_placement(src, model, SOURCE_BY)
        # the target's copies refuse writes (a stale gate's write is held, not lost)
        backend = open_backend(dst["-55"])
        try:
            with pytest.raises(ShardgateError, match=WRITES_FROZEN):
                await backend.execute("DELETE FROM t")
        finally:
            await backend.close()

        # forward again: the forward streams resumed where the reverse ended
        writers.start()
        await _progress(writers)
        reports = {r.table: r for r in await flow.vdiff()}
        assert all(r.clean for r in reports.values()), [r.to_doc() for r in reports.values()]
        await flow.switch_reads()
        await flow.switch_writes()
        await _wait(lambda: _routes_to(gate, "dst"), "writes did not switch again")
        await _progress(writers, 20)
        await flow.complete()
        assert await server.get_workflow(spec.record) is None
        await _wait(lambda: not gate.vschema.routing_rules, "complete did not reach")
        assert "t" not in gate.vschema.keyspace("src").tables
        assert "keep" in gate.vschema.keyspace("src").tables
        await _progress(writers)
    finally:
        await writers.halt()
        await flow.close()
        await server.close()
        await gate.close()
    assert min(writers.counts.values()) > 0, writers.counts
    await _check_placement(dst, model, TARGET_BY)
    for url in src.values():  # the sources' copies were renamed, kept
        backend = open_backend(url)
        try:
            with pytest.raises(ShardgateError):
                await backend.execute("SELECT COUNT(*) FROM t")
            assert (await backend.execute("SELECT COUNT(*) FROM _sg_moved_wf_t")).rows[0][0]
        finally:
            await backend.close()


async def test_movetables_sharded_source_on_sqlite(make_database: Any, tmp_path: Path) -> None:
    await _move_sharded("sqlite", make_database, tmp_path)


@pytest.mark.postgres
async def test_movetables_sharded_source_on_postgres(
    make_database: Any, tmp_path: Path
) -> None:
    await _move_sharded("postgres", make_database, tmp_path)


@pytest.mark.mysql
async def test_movetables_sharded_source_on_mariadb(make_database: Any, tmp_path: Path) -> None:
    """MariaDB both sides, one server (one binlog: every source and target schema's
    changes in it, each reader filtered to its schema), reverse-traffic included."""
    await _move_sharded("mysql", make_database, tmp_path)


async def test_movetables_refuses_what_it_cannot_move(make_database: Any,
                                                      tmp_path: Path) -> None:
    topo, gate, _, _, _ = await _cluster(make_database, tmp_path, "sqlite")
    await gate.close()
    server = TopoServer(open_topo_store(topo))
    try:
        # the sequence table itself: gates hand out its ids in cached blocks
        spec = await movetables_spec(server, source_keyspace="seq", target_keyspace="src",
                                     tables=("s_seq",), workflow="seqmove")
        flow = MoveTablesWorkflow(server, spec, vschema={"tables": {"s_seq": HASHED}})
        with pytest.raises(Unsupported, match="sequence table"):
            await flow.create()
        await flow.close()
        assert await server.get_workflow(spec.record) is None
        # a reference table of a sharded source: every source shard holds every row
        spec = await movetables_spec(server, source_keyspace="src", target_keyspace="dst",
                                     tables=("ref",), workflow="refmove")
        flow = MoveTablesWorkflow(server, spec, vschema={"tables": {"ref": HASHED}})
        with pytest.raises(Unsupported, match="reference table"):
            await flow.create()
        await flow.close()
        assert await server.get_workflow(spec.record) is None
        # a table numbered by a sequence, given another one on the target
        spec = await movetables_spec(server, source_keyspace="src", target_keyspace="dst",
                                     tables=("s",), workflow="other")
        other = {"tables": {"s": {**HASHED, "auto_increment": {"column": "id",
                                                               "sequence": "other_seq"}}}}
        flow = MoveTablesWorkflow(server, spec, vschema=other)
        with pytest.raises(InvalidArgument, match=r"sequence seq\.s_seq"):
            await flow.create()
        await flow.close()
        assert await server.get_workflow(spec.record) is None
        topology = await server.load_topology()
        assert "s" not in (topology.keyspace("dst").vschema.get("tables") or {})
    finally:
        await server.close()
