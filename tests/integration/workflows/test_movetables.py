"""MoveTables (issue 21 item 2): two tables move from an unsharded keyspace to a 2-shard
keyspace while writers insert, update and delete through a gate with the same SQL (no
keyspace qualifier); VDiff is clean; reads are served by the source, then (outside
transactions) by the target after the read switch, then by the target for everything;
after ``complete`` every committed row is exactly once on the target shard its keyspace
id names, and the writers never saw an error (the gate holds writes across the cut-over).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.cli.app import main as cli_main
from shardgate.errors import FailedPrecondition, InvalidArgument, ShardgateError
from shardgate.gate import Gate
from shardgate.gate.cutover import HOLD_S
from shardgate.keys import parse_shard_name
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.movetables import MoveTablesWorkflow, movetables_spec

ROWS = 600
TABLES = ("t", "u")
DST_VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}}
ENTRIES = {"tables": {t: {"column_vindexes": [{"column": "id", "name": "hash"}]}
                      for t in TABLES}}
_HASH = create_vindex("hash", "hash", {})
assert isinstance(_HASH, SingleColumn)
HASH: SingleColumn = _HASH

Model = dict[tuple[str, int], tuple[str, int]]


class Writers:
    """Two writers through the gate (session keyspace ``src``, unqualified SQL), each on
    its own ids, keeping an exact model of what committed; any error fails the test."""

    def __init__(self, gate: Gate, model: Model) -> None:
        self.gate, self.model = gate, model
        self.stop = asyncio.Event()
        self.counts = {"insert": 0, "update": 0, "delete": 0}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.stop.clear()
        self.tasks = [asyncio.create_task(self._run(k)) for k in range(2)]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    async def _run(self, k: int) -> None:
        rnd = random.Random(k)
        s = self.gate.session("src", identity=TRUSTED)
        next_id = 10_000_000 * (k + 1)
        while not self.stop.is_set():
            table = rnd.choice(TABLES)
            mine = [i for (t, i) in self.model if t == table and i % 2 == k]
            op = rnd.random()
            if op < 0.4 or not mine:
                next_id += 2
                v = f"w{k}_{next_id}"
                await self.gate.execute(s, f"INSERT INTO {table} (id, v, n) VALUES (:i, :v, 0)",
                                        {"i": next_id, "v": v})
                self.model[(table, next_id)] = (v, 0)
                self.counts["insert"] += 1
            elif op < 0.8:
                i = rnd.choice(mine)
                v, n = self.model[(table, i)]
                res = await self.gate.execute(
                    s, f"UPDATE {table} SET v = :v, n = :n WHERE id = :i",
                    {"i": i, "v": v + "+", "n": n + 1})
                assert res.rows_affected == 1
                self.model[(table, i)] = (v + "+", n + 1)
                self.counts["update"] += 1
            else:
                i = rnd.choice(mine)
                res = await self.gate.execute(s, f"DELETE FROM {table} WHERE id = :i",
                                              {"i": i})
                assert res.rows_affected == 1
                del self.model[(table, i)]
                self.counts["delete"] += 1
            await asyncio.sleep(0.002)


async def _wait(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _cluster(make_database: Any, tmp_path: Path, kind: str
                   ) -> tuple[str, Gate, str, dict[str, str], Model]:
    src = make_database(kind, "mtsrc")
    dst = {name: make_database(kind, f"mtdst{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict({"keyspaces": {
        "src": {"shards": {"0": src}, "vschema": {"sharded": False}},
        "dst": {"shards": dst, "vschema": DST_VSCHEMA}}}))
    await server.close()
    gate = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    s = gate.session("src", identity=TRUSTED)
    model: Model = {}
    for table in TABLES:
        await gate.execute(s, f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, "
                              "v VARCHAR(64) NOT NULL, n INT NOT NULL)")
        values = ", ".join(f"({i}, '{table}{i}', 0)" for i in range(1, ROWS + 1))
        await gate.execute(s, f"INSERT INTO {table} (id, v, n) VALUES {values}")
        model.update({(table, i): (f"{table}{i}", 0) for i in range(1, ROWS + 1)})
    return topo, gate, src, dst, model


def _marker() -> int:
    """An id whose keyspace id is on the target shard -80."""
    kr = parse_shard_name("-80")
    return next(i for i in range(-1, -10_000, -1) if kr.contains(HASH.map([i])[0][0]))


async def _reads_target(gate: Gate, dst: dict[str, str], *, outside: bool, inside: bool
                        ) -> None:
    """A row written straight into the target (not the source) is what the gate reads
    outside a transaction iff ``outside``, inside one iff ``inside``."""
    backend = open_backend(dst["-80"])
    m = backend.placeholder
    marker = _marker()
    try:
        await backend.execute(f"INSERT INTO t (id, v, n) VALUES ({m}, 'marker', 0)", (marker,))
        s = gate.session("src", identity=TRUSTED)
        sql = "SELECT v FROM t WHERE id = :i"
        got = (await gate.execute(s, sql, {"i": marker})).rows
        assert got == ([("marker",)] if outside else []), got
        streamed = [r for chunk in [c async for c in gate.stream_execute(s, sql, {"i": marker})]
                    for r in chunk.rows]
        assert streamed == got
        await gate.execute(s, "BEGIN")
        got = (await gate.execute(s, sql, {"i": marker})).rows
        await gate.execute(s, "ROLLBACK")
        assert got == ([("marker",)] if inside else []), got
    finally:
        await backend.execute(f"DELETE FROM t WHERE id = {m}", (marker,))
        await backend.close()


async def _check_placement(dst: dict[str, str], model: Model) -> None:
    seen: Model = {}
    for name, url in dst.items():
        kr = parse_shard_name(name)
        backend = open_backend(url)
        try:
            for table in TABLES:
                rows = (await backend.execute(f"SELECT id, v, n FROM {table}")).rows
                for (i, v, n), ks in zip(rows, HASH.map([r[0] for r in rows]), strict=True):
                    assert kr.contains(ks[0]), f"{table} row {i} is on {name}"
                    assert (table, i) not in seen, f"{table} row {i} is on two shards"
                    seen[(table, int(i))] = (str(v), int(n))
        finally:
            await backend.close()
    assert seen == model


async def _move(kind: str, make_database: Any, tmp_path: Path,
                capsys: pytest.CaptureFixture[str]) -> None:
    topo, gate, src, dst, model = await _cluster(make_database, tmp_path, kind)
    server = TopoServer(open_topo_store(topo))
    spec = await movetables_spec(server, source_keyspace="src", target_keyspace="dst",
                                 tables=TABLES, workflow="wf")
    with pytest.raises(InvalidArgument, match="no vindex for table"):
        await MoveTablesWorkflow(server, spec).create()
    flow = MoveTablesWorkflow(server, spec, vschema=ENTRIES, batch=100)
    writers = Writers(gate, model)
    writers.start()
    try:
        await flow.create()
        assert flow.state == "running"
        await _wait(lambda: "src.t" in gate.vschema.routing_rules, "rules did not reach")
        # t and src.t still go to src; dst.t is addressable (the copy)
        await _reads_target(gate, dst, outside=False, inside=False)
        s = gate.session("src", identity=TRUSTED)
        n = (await gate.execute(s, "SELECT COUNT(*) FROM dst.t")).rows[0][0]
        assert n >= ROWS // 2

        reports = await flow.vdiff()
        assert sorted(r.table for r in reports) == sorted(TABLES)
        assert all(r.clean for r in reports), [r.to_doc() for r in reports]

        capsys.readouterr()
        code = await asyncio.to_thread(cli_main, [
            "movetables", "status", "--target-keyspace", "dst", "--workflow", "wf", "--json",
            "--topo", topo])
        assert code == 0, capsys.readouterr().err
        status = json.loads(capsys.readouterr().out)
        assert status["state"] == "running" and status["rows_copied"] >= 2 * ROWS // 2

        await flow.switch_reads()
        await _wait(lambda: bool(gate.vschema.read_routing_rules), "reads did not switch")
        await _reads_target(gate, dst, outside=True, inside=False)

        out = await flow.switch_writes()
        assert flow.state == "switched" and out["frozen_s"] < HOLD_S
        await _wait(lambda: gate.vschema.routing_rules.get("src.t") is not None
                    and gate.vschema.routing_rules["src.t"].target == ("dst", "t"),
                    "writes did not switch")
        await _reads_target(gate, dst, outside=True, inside=True)
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 5, "writers stalled")

        with pytest.raises(FailedPrecondition, match="has switched writes"):
            await flow.cancel()
        await flow.complete()
        assert await server.get_workflow(spec.record) is None
        await _wait(lambda: not gate.vschema.routing_rules, "complete did not reach")
        assert "t" not in gate.vschema.keyspace("src").tables
        assert "t" in gate.vschema.keyspace("dst").tables
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 5, "writers stalled")
    finally:
        await writers.halt()
        await flow.close()
        await server.close()
    assert min(writers.counts.values()) > 0, writers.counts
    s = gate.session("src", identity=TRUSTED)
    for table in TABLES:
        n = (await gate.execute(s, f"SELECT COUNT(*) FROM {table}")).rows[0][0]
        assert n == sum(1 for (t, _) in model if t == table)
    await gate.close()
    await _check_placement(dst, model)
    # the source's tables were renamed, frozen, and kept
    backend = open_backend(src)
    try:
        with pytest.raises(ShardgateError):
            await backend.execute("SELECT COUNT(*) FROM t")
        assert (await backend.execute("SELECT COUNT(*) FROM _sg_moved_wf_t")).rows[0][0] > 0
    finally:
        await backend.close()


async def test_movetables_on_sqlite_while_writing(
    make_database: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _move("sqlite", make_database, tmp_path, capsys)


@pytest.mark.postgres
async def test_movetables_on_postgres_while_writing(
    make_database: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _move("postgres", make_database, tmp_path, capsys)


async def test_cancel_drops_the_copies_and_rules(make_database: Any, tmp_path: Path) -> None:
    topo, gate, _, dst, _ = await _cluster(make_database, tmp_path, "sqlite")
    server = TopoServer(open_topo_store(topo))
    flow = MoveTablesWorkflow(server, await movetables_spec(
        server, source_keyspace="src", target_keyspace="dst", tables=("t",)), vschema=ENTRIES)
    try:
        await flow.create()
        await flow.switch_reads()
        await _wait(lambda: bool(gate.vschema.read_routing_rules), "read switch did not reach")
        # the CLI's reverse-traffic (the shared reshard runner) sends reads back to src
        await flow.release()
        code = await asyncio.to_thread(cli_main, [
            "movetables", "reverse-traffic", "--target-keyspace", "dst", "--topo", topo])
        assert code == 0
        await _wait(lambda: not gate.vschema.read_routing_rules, "reverse did not reach")
        await flow.cancel()
        await _wait(lambda: not gate.vschema.routing_rules
                    and not gate.vschema.read_routing_rules, "cancel did not reach")
        assert "t" not in gate.vschema.keyspace("dst").tables
        s = gate.session("src", identity=TRUSTED)
        assert (await gate.execute(s, "SELECT COUNT(*) FROM t")).rows[0][0] == ROWS
        backend = open_backend(dst["-80"])
        try:
            with pytest.raises(ShardgateError):
                await backend.execute("SELECT COUNT(*) FROM t")
        finally:
            await backend.close()
    finally:
        await flow.close()
        await server.close()
        await gate.close()
