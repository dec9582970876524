"""Online resharding (issue 21): split 2 -> 4 and merge 4 -> 2 while writers insert,
update and delete through a gate; VDiff clean; every committed row exactly once, on
the shard its keyspace id names, read directly from the shard databases; the writers
never see an error (the gate holds their writes across the cut-over). Also: the copy
resumes after the workflow process is SIGKILLed, and a cut-over that fails before its
journal leaves the sources serving.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardgate.api.http import HttpServer
from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.backends.base import transaction
from shardgate.cli.app import main as cli_main
from shardgate.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    ShardgateError,
    Unavailable,
)
from shardgate.gate import Gate
from shardgate.gate.cutover import HOLD_S
from shardgate.keys import parse_shard_name
from shardgate.topo.model import WRITES_FROZEN, Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows import cutover
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from shardgate.workflows.rowsql import MovingTable, RowWriter
from tests.acceptance.test_cli import cli_env

ROWS = 1500
WRITERS = 2
VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}
DDL = "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, n INT NOT NULL)"
HASH = create_vindex("hash", "hash", {})
assert isinstance(HASH, SingleColumn)

Model = dict[int, tuple[str, int]]


class Writers:
    """Writers through the gate, each on its own ids (id % WRITERS), keeping an exact
    model of what committed (a row enters it once committed: the writers update and
    delete rows they pick from it); any error fails the test, but with ``retry_held`` the
    gate's hold timeout (``UNAVAILABLE``: writes stayed paused by a cut-over for
    ``HOLD_S``; the statement did not run) is retried, as a client would, and counted
    in ``held_out``."""

    def __init__(self, gate: Gate, model: Model, *, retry_held: bool = False) -> None:
        self.gate, self.model = gate, model
        self.retry_held = retry_held
        self.held_out = 0
        self.stop = asyncio.Event()
        self.counts = {"insert": 0, "update": 0, "delete": 0}
        self.slowest = 0.0
        self.tasks: list[asyncio.Task[None]] = []
        #: each writer's last id, kept across halt() and start()
        self.last_ids: dict[int, int] = {}

    def start(self) -> None:
        self.stop.clear()
        self.tasks = [asyncio.create_task(self._run(k)) for k in range(WRITERS)]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    async def _run(self, k: int) -> None:
        rnd = random.Random(k)
        s = self.gate.session("app", identity=TRUSTED)
        next_id = self.last_ids.get(k, 10_000_000 * (k + 1))
        while not self.stop.is_set():
            mine = [i for i in self.model if i % WRITERS == k]
            op = rnd.random()
            if op < 0.4 or not mine:
                next_id = self.last_ids[k] = next_id + WRITERS
                v = f"w{k}_{next_id}"
                await self._execute(s, "INSERT INTO t (id, v, n) VALUES (:i, :v, 0)",
                                    {"i": next_id, "v": v})
                self.model[next_id] = (v, 0)
                self.counts["insert"] += 1
            elif op < 0.8:
                i = rnd.choice(mine)
                v, n = self.model[i]
                res = await self._execute(s, "UPDATE t SET v = :v, n = :n WHERE id = :i",
                                          {"i": i, "v": v + "+", "n": n + 1})
                assert res.rows_affected == 1, f"UPDATE of committed row {i}: {res}"
                self.model[i] = (v + "+", n + 1)
                self.counts["update"] += 1
            else:
                i = rnd.choice(mine)
                res = await self._execute(s, "DELETE FROM t WHERE id = :i", {"i": i})
                assert res.rows_affected == 1, f"DELETE of committed row {i}: {res}"
                del self.model[i]
                self.counts["delete"] += 1
            await asyncio.sleep(0.002)

    async def _execute(self, s: Any, sql: str, bind: dict[str, Any]) -> Any:
        while True:
            start = time.monotonic()
            try:
                return await self.gate.execute(s, sql, bind)
            except Unavailable as exc:
                if not (self.retry_held and "stayed paused" in str(exc)):
                    raise
                self.held_out += 1
            finally:
                self.slowest = max(self.slowest, time.monotonic() - start)


async def _rows_of(url: str) -> list[tuple[Any, ...]]:
    backend = open_backend(url)
    try:
        return [tuple(r) for r in (await backend.execute("SELECT id, v, n FROM t")).rows]
    finally:
        await backend.close()


async def check_placement(shards: dict[str, str], model: Model) -> None:
    """Every committed row exactly once, on the shard its keyspace id names."""
    seen: dict[int, tuple[str, int]] = {}
    for name, url in shards.items():
        kr = parse_shard_name(name)
        rows = await _rows_of(url)
        ksids = HASH.map([r[0] for r in rows])
        for (i, v, n), ks in zip(rows, ksids, strict=True):
            assert kr.contains(ks[0]), f"row {i} is on {name}, its keyspace id is {ks[0].hex()}"
            assert i not in seen, f"row {i} is on two shards"
            seen[int(i)] = (str(v), int(n))
    assert seen == model


async def _wait(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _reshard(topo: str, writers: Writers, gate: Gate, sources: list[str],
                   targets: dict[str, str],
                   serve_targets: Callable[[], Awaitable[None]] | None = None,
                   ) -> dict[str, Any]:
    """One whole workflow with the writers running; returns the cut-over's figures.
    ``serve_targets`` runs once the targets are in the topo store (pending): what an
    operator of tablet processes does then, start the targets' tablets."""
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=tuple(sources), targets=tuple(targets),
                       target_urls=tuple(sorted(targets.items())), workflow="wf")
    flow = ReshardWorkflow(server, spec, batch=200)
    try:
        await flow.create()
        assert flow.state == "running"
        if serve_targets is not None:
            await serve_targets()
        status = await flow.status()
        assert status["rows_copied"] >= ROWS // 2 and status["estimate"] > 0
        assert all(s["state"] == "running" for s in status["streams"].values())
        # the gate serves the sources only, though it knows the targets
        await _wait(lambda: set(targets) <= {s.name for s in
                                             gate.topology.keyspace("app").pending},
                    "the gate did not see the pending targets")
        assert {s.name for s in gate.topology.keyspace("app").shards} >= set(sources)

        reports = await flow.vdiff()
        assert [r.table for r in reports] == ["t"]
        assert reports[0].clean, reports[0].to_doc()
        assert reports[0].matching > ROWS // 2

        assert "dry run" in await flow.switch_reads(dry_run=True)
        await flow.switch_reads()
        await _wait(lambda: gate.topology.keyspace("app").read_shards is not None,
                    "reads did not switch")
        plan = await gate.explain_shards("SELECT COUNT(*) FROM t", "app", identity=TRUSTED)
        assert set(targets) <= {s.split("/")[1] for s in _shards_in(plan)}, plan
        await _read_from_target(gate, targets)

        # between the switches a follower keeps the targets (now serving reads) current,
        # and holds the workflow: other writing commands refuse
        await flow.release()
        follower = await ReshardWorkflow.resume(server, "app", "wf")
        stop = asyncio.Event()
        following = asyncio.create_task(follower.follow(stop))
        try:
            await _wait(lambda: follower.doc.get("runner") is not None, "no follower")
            mine = max(i for i in writers.model if i % WRITERS == 0)
            s = gate.session("app", identity=TRUSTED)
            # a bound for a stuck follower, not a speed goal: a resumed PostgreSQL reader
            # decodes from its slot's restart point, slow on a machine running 4 workers
            deadline = time.monotonic() + 30
            while not (await gate.execute(s, "SELECT v FROM t WHERE id = :i", {"i": mine})).rows:
                assert time.monotonic() < deadline, "the follower did not bring a write over"
                await asyncio.sleep(0.02)
            with pytest.raises(FailedPrecondition, match="works on"):
                await flow.switch_writes()
            status = await flow.status()
            assert status["runner_pid"] is not None
        finally:
            stop.set()
            await following
            await follower.close()

        before = writers.counts["insert"]
        out = await flow.switch_writes()
        assert flow.state == "switched"
        await _check_metrics(flow, gate)
        await _wait(lambda: set(targets) <= {s.name for s in gate.topology.keyspace("app").shards},
                    "writes did not switch")
        await _wait(lambda: writers.counts["insert"] > before + 5, "writers stalled")
        await flow.complete()
        assert await server.get_workflow(spec.record) is None
        assert not gate.topology.keyspace("app").pending or await _settled(gate, sources)
        return out
    finally:
        await flow.close()
        await server.close()


async def _check_metrics(flow: ReshardWorkflow, gate: Gate) -> None:
    """Rows copied, lag and the cut-over's pause: in ``status`` and on the console's /metrics."""
    status = await flow.status()
    figures = status["metrics"]
    assert figures["cutover_s"] is not None and 0 < figures["cutover_s"] < 5, figures
    assert figures["rows_copied"] == {n: s["rows_copied"] for n, s in status["streams"].items()}
    assert set(figures["lag_s"]) == set(status["streams"])
    server = HttpServer(gate, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{await server.start()}"
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
            text = await r.text()
    finally:
        await server.stop()
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for fam in text_string_to_metric_families(text) for x in fam.samples
               if x.name.startswith("shardgate_reshard_")}
    wf = flow.spec.record
    for source, n in figures["rows_copied"].items():
        key = (("source", source), ("workflow", wf))
        assert samples[("shardgate_reshard_rows_copied_total", key)] == n, samples
        assert ("shardgate_reshard_lag_seconds", key) in samples, samples
    assert samples[("shardgate_reshard_cutover_seconds", (("workflow", wf),))] \
        == pytest.approx(figures["cutover_s"]), samples


async def _read_from_target(gate: Gate, targets: dict[str, str]) -> None:
    """A row only the first target has (written to it directly) is what the gate reads."""
    name, url = sorted(targets.items(), key=lambda t: parse_shard_name(t[0]).start)[0]
    kr = parse_shard_name(name)
    marker = next(i for i in range(-1, -10_000, -1) if kr.contains(HASH.map([i])[0][0]))
    backend = open_backend(url)
    mark = backend.placeholder
    try:
        await backend.execute(f"INSERT INTO t (id, v, n) VALUES ({mark}, 'marker', 0)",
                              (marker,))
        s = gate.session("app", identity=TRUSTED)
        found = await gate.execute(s, "SELECT v FROM t WHERE id = :i", {"i": marker})
        assert found.rows == [("marker",)]
        await backend.execute(f"DELETE FROM t WHERE id = {mark}", (marker,))
    finally:
        await backend.close()


async def _settled(gate: Gate, sources: list[str]) -> bool:
    await _wait(lambda: not {s.name for s in gate.topology.keyspace("app").pending}
                & set(sources), "complete did not reach the gate")
    return True


def _shards_in(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*node.get("Shards", []), *(s for v in node.values() for s in _shards_in(v))]
    if isinstance(node, list):
        return [s for v in node for s in _shards_in(v)]
    return []


async def _cluster(make_database: Any, tmp_path: Path, kind: str, rows: int = ROWS
                   ) -> tuple[str, Gate, dict[str, str], Model]:
    shards = {name: make_database(kind, f"rs{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}))
    gate = await Gate.from_topo(server)
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, DDL)
    model: Model = {}
    for start in range(1, rows + 1, 250):
        ids = range(start, min(start + 250, rows + 1))
        values = ", ".join(f"({i}, 'v{i}', 0)" for i in ids)
        await gate.execute(s, f"INSERT INTO t (id, v, n) VALUES {values}")
        model.update({i: (f"v{i}", 0) for i in ids})
    return topo, gate, shards, model


async def test_split_two_to_four_and_merge_back_while_writing(
    make_database: Any, tmp_path: Path
) -> None:
    topo, gate, shards, model = await _cluster(make_database, tmp_path, "sqlite")
    writers = Writers(gate, model)
    writers.start()
    try:
        four = {n: make_database("sqlite", f"four{i}")
                for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
        split = await _reshard(topo, writers, gate, ["-80", "80-"], four)
        two = {n: make_database("sqlite", f"two{i}") for i, n in enumerate(("-80", "80-"))}
        merge = await _reshard(topo, writers, gate, list(four), two)
    finally:
        await writers.halt()
        await gate.close()
    assert min(writers.counts.values()) > 0, writers.counts
    for out in (split, merge):
        assert out["frozen_s"] < HOLD_S, out
    assert writers.slowest < 5.0
    await check_placement(two, model)
    # the old shards were left frozen with their rows, not served
    backend = open_backend(shards["-80"])
    try:
        with pytest.raises(ShardgateError, match=WRITES_FROZEN):
            await backend.execute("DELETE FROM t")
        assert (await backend.execute("SELECT COUNT(*) FROM t")).rows[0][0] > 0
    finally:
        await backend.close()


async def test_copy_resumes_after_sigkill(make_database: Any, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # enough rows that 10-row batches take seconds: the kill lands mid-copy
    topo, gate, _, model = await _cluster(make_database, tmp_path, "sqlite", rows=6000)
    writers = Writers(gate, model)
    writers.start()
    four = {n: make_database("sqlite", f"k{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    def args(batch: int) -> list[str]:
        return [sys.executable, "-m", "shardgate.cli", "reshard", "create", "--keyspace", "app",
                "--source=-80,80-", f"--target={','.join(four)}", "--batch", str(batch),
                "--topo", topo, *(f"--target-url={n}={u}" for n, u in four.items())]

    server = TopoServer(open_topo_store(topo))
    try:
        proc = await asyncio.create_subprocess_exec(
            *args(10), env=cli_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            rec = await server.get_workflow("reshard:app.reshard")
            copied = 0 if rec is None or rec.doc is None else sum(
                t["rows"] for s in rec.doc["streams"].values() for t in s["tables"].values())
            if copied >= 200:
                proc.send_signal(signal.SIGKILL)
                break
            assert proc.returncode is None, await proc.communicate()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        rec = await server.get_workflow("reshard:app.reshard")
        assert rec is not None and rec.doc is not None and rec.doc["state"] == "copying"
        saved = sum(t["rows"] for s in rec.doc["streams"].values() for t in s["tables"].values())
        assert saved >= 200

        # the same command (in this process: no second start-up) resumes from the saved
        # positions and finishes the copy
        capsys.readouterr()
        code = await asyncio.wait_for(asyncio.to_thread(cli_main, args(2000)[3:]), 120)
        said = capsys.readouterr()
        assert code == 0, said.err
        assert "running" in said.out
        # the bar on a terminal (`] N/`), a line per stage in a pipe (`copy: N/`, issue 34)
        progress = [int(m) for m in re.findall(r"(?:\]|copy:) (\d+)/", said.err)]
        assert progress and saved < progress[0] <= saved + 2000, (saved, progress[:3])
        code = await asyncio.to_thread(  # the command in this process: no second start-up
            cli_main, ["reshard", "status", "--keyspace", "app", "--json", "--topo", topo])
        assert code == 0, capsys.readouterr().err
        status = json.loads(capsys.readouterr().out)
        assert status["state"] == "running" and status["last_error"] is None
        assert set(status["streams"]) == {"-80", "80-"}
        assert all(s["state"] == "running" and s["behind"] is not None
                   for s in status["streams"].values())

        flow = await ReshardWorkflow.resume(server, "app")
        try:
            reports = await flow.vdiff()
            assert reports[0].clean, str(reports[0].to_doc())
            await flow.switch_reads()
            await flow.switch_writes()
            await flow.complete()
        finally:
            await flow.close()
        await _wait(lambda: set(four) == {s.name for s in gate.topology.keyspace("app").shards},
                    "the gate did not switch")
    finally:
        await writers.halt()
        await gate.close()
        await server.close()
    await check_placement(four, model)


async def test_failed_cutover_rolls_back_and_sources_keep_serving(
    make_database: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo, gate, shards, model = await _cluster(make_database, tmp_path, "sqlite")
    four = {n: make_database("sqlite", f"f{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())))
    flow = ReshardWorkflow(server, spec)
    writers = Writers(gate, model)
    try:
        await flow.create()
        await flow.switch_reads()
        writers.start()

        async def too_slow(*args: Any, **kwargs: Any) -> bool:
            return False  # the final catch-up "does not finish in time"

        monkeypatch.setattr(flow, "catch_up", too_slow)
        with pytest.raises(DeadlineExceeded):
            await flow.switch_writes()
        monkeypatch.undo()
        assert flow.state == "running"
        assert "DeadlineExceeded" in flow.doc["error"]
        assert await server.get_workflow(spec.journal) is None
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 5, "writers stalled")
        assert {s.name for s in gate.topology.keyspace("app").shards} == {"-80", "80-"}
        assert await flow.reverse_traffic()
        await flow.cancel()
        await _wait(lambda: not gate.topology.keyspace("app").pending, "cancel did not reach")
    finally:
        await writers.halt()
        await flow.close()
        await server.close()
        await gate.close()
    await check_placement(shards, model)
    assert cutover.CUTOVER_TIMEOUT_S > 0


@pytest.mark.mysql
async def test_split_to_mariadb_targets_while_writing(make_database: Any, tmp_path: Path) -> None:
    """Targets of another backend kind: their tables are created first."""
    topo, gate, _, model = await _cluster(make_database, tmp_path, "sqlite")
    four = {n: make_database("mysql", f"my{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    for url in four.values():
        backend = open_backend(url)
        try:
            await backend.execute(DDL)
        finally:
            await backend.close()
    writers = Writers(gate, model)
    writers.start()
    try:
        await _reshard(topo, writers, gate, ["-80", "80-"], four)
    finally:
        await writers.halt()
        await gate.close()
    await check_placement(four, model)


@pytest.mark.postgres
async def test_split_on_postgres_while_writing(make_database: Any, tmp_path: Path) -> None:
    topo, gate, _, model = await _cluster(make_database, tmp_path, "postgres")
    writers = Writers(gate, model)
    writers.start()
    try:
        four = {n: make_database("postgres", f"pgfour{i}")
                for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
        await _reshard(topo, writers, gate, ["-80", "80-"], four)
    finally:
        await writers.halt()
        await gate.close()
    await check_placement(four, model)


async def test_gate_holds_frozen_writes_and_aborts_frozen_transactions(
    make_database: Any, tmp_path: Path
) -> None:
    """A write a source refuses during a cut-over is held and replayed (here: the
    freeze is lifted without a switch, as a rolled-back cut-over does); a write in an
    explicit transaction rolls the transaction back with ABORTED."""
    _, gate, shards, _ = await _cluster(make_database, tmp_path, "sqlite")
    backend = open_backend(shards["-80"])
    trigger = ("CREATE TRIGGER _sg_deny_insert_t BEFORE INSERT ON t BEGIN SELECT "
               f"RAISE(ABORT, '{WRITES_FROZEN}: test'); END")
    try:
        on_80 = next(i for i in range(ROWS + 1, ROWS + 1000)
                     if parse_shard_name("-80").contains(HASH.map([i])[0][0]))
        await backend.execute(trigger)
        s = gate.session("app", identity=TRUSTED)
        await gate.execute(s, "BEGIN")
        await gate.execute(s, "UPDATE t SET n = 5 WHERE id = 1")
        with pytest.raises(Aborted, match="reshard"):
            await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, 'x', 0)", {"i": on_80})
        assert not s.in_transaction

        async def thaw() -> None:
            await asyncio.sleep(0.3)
            await backend.execute("DROP TRIGGER _sg_deny_insert_t")

        thawing = asyncio.create_task(thaw())
        start = time.monotonic()
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, 'held', 0)", {"i": on_80})
        held = time.monotonic() - start
        await thawing
        assert 0.3 <= held < 2.0, held
        found = await gate.execute(s, "SELECT v, n FROM t WHERE id IN (1, :i) ORDER BY id",
                                   {"i": on_80})
        assert found.rows == [("v1", 0), ("held", 0)]  # the aborted transaction left nothing
    finally:
        await backend.close()
        await gate.close()


async def test_gate_holds_frozen_batches_and_streamed_writes(
    make_database: Any, tmp_path: Path
) -> None:
    """ExecuteBatch and StreamExecute (the MySQL listener's path) hold a refused write
    like Execute: a batch in a transaction of its own is replayed whole, a streamed
    UPDATE is replayed; a batch in the caller's transaction gets ABORTED."""
    _, gate, shards, _ = await _cluster(make_database, tmp_path, "sqlite")
    backend = open_backend(shards["-80"])
    on_80 = [i for i in range(ROWS + 1, ROWS + 1000)
             if parse_shard_name("-80").contains(HASH.map([i])[0][0])][:2]
    old_80 = next(i for i in range(1, ROWS + 1)
                  if parse_shard_name("-80").contains(HASH.map([i])[0][0]))
    triggers = [f"CREATE TRIGGER _sg_deny_{op.lower()}_t BEFORE {op} ON t BEGIN SELECT "
                f"RAISE(ABORT, '{WRITES_FROZEN}: test'); END" for op in ("INSERT", "UPDATE")]

    async def freeze() -> None:
        for sql in triggers:
            await backend.execute(sql)

    async def thaw_later() -> None:
        await asyncio.sleep(0.3)
        for op in ("insert", "update"):
            await backend.execute(f"DROP TRIGGER _sg_deny_{op}_t")

    insert = "INSERT INTO t (id, v, n) VALUES (:i, 'b', 0)"
    try:
        s = gate.session("app", identity=TRUSTED)
        await freeze()
        # in the caller's transaction: ABORTED, the transaction rolled back
        await gate.execute(s, "BEGIN")
        out = await gate.execute_batch(s, [(insert, {"i": on_80[0]})], as_transaction=True)
        assert isinstance(out[0], Aborted) and not s.in_transaction, out
        # a transaction of the batch's own: held, then replayed whole
        thawing = asyncio.create_task(thaw_later())
        start = time.monotonic()
        out = await gate.execute_batch(s, [(insert, {"i": i}) for i in on_80],
                                       as_transaction=True)
        held = time.monotonic() - start
        await thawing
        assert all(not isinstance(r, ShardgateError) for r in out), out
        assert 0.3 <= held < 2.0, held
        # a streamed write (a Route write: UPDATE by primary vindex) is held too
        await freeze()
        thawing = asyncio.create_task(thaw_later())
        start = time.monotonic()
        chunks = [c async for c in gate.stream_execute(
            s, "UPDATE t SET n = 7 WHERE id = :i", {"i": old_80})]
        held = time.monotonic() - start
        await thawing
        assert sum(c.rows_affected for c in chunks) == 1, chunks
        assert 0.3 <= held < 2.0, held
        found = await gate.execute(s, "SELECT id, n FROM t WHERE id IN (:a, :b, :c) ORDER BY id",
                                   {"a": on_80[0], "b": on_80[1], "c": old_80})
        assert sorted(found.rows) == sorted([(on_80[0], 0), (on_80[1], 0), (old_80, 7)])
    finally:
        await backend.close()
        await gate.close()


async def test_copy_writes_postgres_targets_by_copy_and_upserts_keys_already_there(
    make_database: Any,
) -> None:
    """The copy's bulk write: COPY into a PostgreSQL target; a batch meeting a key the
    target has already (a batch retried) is upserted instead, in the same transaction."""
    backend = open_backend(make_database("postgres", "copyin"))
    try:
        await backend.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT, n INT)")
        table = MovingTable("t", ("id", "v", "n"), ("id",), "id", HASH)
        writer = RowWriter(backend, table)
        conn = await backend.acquire()
        try:
            async with transaction(conn):
                assert await writer.write_new(conn, [(1, "a", 1), (2, "b\tx\n", None)])
            async with transaction(conn):  # key 2 is there: the COPY gives way to the upsert
                assert not await writer.write_new(conn, [(2, "b2", 2), (3, "c", 3)])
        finally:
            await backend.release(conn)
        rows = (await backend.execute("SELECT id, v, n FROM t ORDER BY id")).rows
        assert [tuple(r) for r in rows] == [(1, "a", 1), (2, "b2", 2), (3, "c", 3)]
    finally:
        await backend.close()


async def _capture_on(url: str) -> bool | None:
    """Whether a shard database has shardgate's change capture (table or slot); None
    on MariaDB (the binlog is the server's: nothing per database to keep or drop)."""
    backend = open_backend(url)
    try:
        if backend.dialect == "mysql":
            return None
        sql = ("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
               if backend.dialect == "postgres" else
               "SELECT name FROM sqlite_master WHERE name = '_sg_changes'")
        return bool((await backend.execute(sql)).rows)
    finally:
        await backend.close()


async def _switch_and_reverse(kind: str, make_database: Any, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Split, switch reads and writes with writers running, reverse-traffic (a failed
    one first: it rolls back), check the sources directly, switch again, complete."""
    topo, gate, shards, model = await _cluster(make_database, tmp_path, kind)
    four = {n: make_database(kind, f"rev{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())))
    flow = ReshardWorkflow(server, spec, batch=300)
    writers = Writers(gate, model)
    writers.start()

    def serving() -> set[str]:
        return {s.name for s in gate.topology.keyspace("app").shards}

    try:
        await flow.create()
        await flow.switch_reads()
        await flow.switch_writes()
        assert flow.state == "switched"
        await _wait(lambda: serving() == set(four), "writes did not switch")
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 20, "writers stalled")
        await flow.run()  # in ``switched``: catches the sources up with the targets
        status = await flow.status()
        assert set(status["reverse_streams"]) == set(four), status
        assert all(s["position"] is not None for s in status["reverse_streams"].values())
        with pytest.raises(FailedPrecondition, match="reverse-traffic"):
            await flow.cancel()

        # a reverse cut-over whose final catch-up is "too slow" rolls back: the
        # targets serve on, and nothing is lost
        real = flow._reverse.catch_up

        async def too_slow(*, deadline: float | None = None,
                           until: Any = None) -> bool:
            if until is None:
                return await real(deadline=deadline)
            return False

        monkeypatch.setattr(flow._reverse, "catch_up", too_slow)
        with pytest.raises(DeadlineExceeded):
            await flow.reverse_traffic()
        monkeypatch.undo()
        assert flow.state == "switched" and "DeadlineExceeded" in flow.doc["error"]
        assert await server.get_workflow(flow._reverse.journal) is None
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 5, "writers stalled")
        assert serving() == set(four)

        out = await flow.reverse_traffic()
        assert "served by the sources" in out
        assert 0 < flow.doc["reverse_cutover_s"] < 5, flow.doc["reverse_cutover_s"]
        assert flow.state == "running" and not flow.doc.get("reads_switched")
        await _wait(lambda: serving() == {"-80", "80-"}, "writes did not return")
        assert gate.topology.keyspace("app").read_shards is None
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 20, "writers stalled")
        await writers.halt()
        # every change, whichever side it was made on, is on the sources exactly once
        await check_placement(shards, model)
        # the targets are pending and frozen (a stale gate's write is held, not lost)
        backend = open_backend(four["-40"])
        try:
            with pytest.raises(ShardgateError, match=WRITES_FROZEN):
                await backend.execute("DELETE FROM t")
        finally:
            await backend.close()

        writers.start()
        report = await flow.vdiff()  # the forward stream resumed where the reverse ended
        assert report[0].clean, report[0].to_doc()
        await flow.switch_reads()
        await flow.switch_writes()
        await _wait(lambda: serving() == set(four), "writes did not switch again")
        before = writers.counts["insert"]
        await _wait(lambda: writers.counts["insert"] > before + 20, "writers stalled")
        await flow.complete()
        assert await server.get_workflow(spec.record) is None
        assert await server.get_workflow(flow._reverse.journal) is None
    finally:
        await writers.halt()
        await flow.close()
        await server.close()
        await gate.close()
    assert min(writers.counts.values()) > 0, writers.counts
    await check_placement(four, model)
    # complete kept the targets' change capture (the keyspace's change streams read it
    # from the write switch on) and dropped the retired sources' (a PostgreSQL slot
    # nobody reads would keep their WAL forever)
    for url in four.values():
        assert await _capture_on(url) is not False, url
    for url in shards.values():
        assert not await _capture_on(url), url


async def test_reverse_traffic_after_write_switch_on_sqlite(
    make_database: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _switch_and_reverse("sqlite", make_database, tmp_path, monkeypatch)


@pytest.mark.postgres
async def test_reverse_traffic_after_write_switch_on_postgres(
    make_database: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _switch_and_reverse("postgres", make_database, tmp_path, monkeypatch)


@pytest.mark.mysql
async def test_reverse_traffic_after_write_switch_on_mariadb(
    make_database: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sources and targets on one MariaDB server: one binlog, one GTID position for
    every target, each reverse reader filtered to its target's schema."""
    await _switch_and_reverse("mysql", make_database, tmp_path, monkeypatch)
