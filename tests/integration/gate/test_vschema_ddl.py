"""Durable VSchema changes (issue 14): ALTER VSCHEMA, CREATE/DROP QUEUE, DROP TABLE and
``shardgate vschema apply`` through one gate reach a second gate *process* following the
same topo store (SQLite and PostgreSQL stores) within a second, and survive restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from tests.acceptance.test_cli import cli_env, free_port, wait_for_port

#: A change must reach the other gate within this (the issue's bound).
PROPAGATION_S = 1.0
COMMAND_TIMEOUT_S = 120

COMMERCE = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "email_idx": {"type": "consistent_lookup_unique", "owner": "customer",
                      "params": {"table": "lookup.customer_email_idx", "from": "email",
                                 "to": "keyspace_id"}},
    },
    "tables": {"customer": {"column_vindexes": [{"column": "customer_id", "name": "hash"},
                                                {"column": "email", "name": "email_idx"}]}},
}


def cluster(tmp_path: Path) -> Topology:
    db = tmp_path / "shards"
    db.mkdir(exist_ok=True)
    return Topology.from_dict({"keyspaces": {
        "commerce": {"shards": {"-80": f"sqlite:///{db}/c1.db", "80-": f"sqlite:///{db}/c2.db"},
                     "vschema": COMMERCE},
        "lookup": {"shards": {"0": f"sqlite:///{db}/lookup.db"}, "vschema": {"sharded": False}},
    }, "default_keyspace": "commerce"})


@pytest.fixture(params=["sqlite", "postgres"])
def topo_url(request: pytest.FixtureRequest, tmp_path: Path, make_database: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'topo.db'}"
    url: str = make_database("postgres", "vsddl_topo")
    return url


@pytest.fixture
async def seeded(tmp_path: Path, topo_url: str) -> AsyncIterator[str]:
    server = TopoServer(open_topo_store(topo_url))
    try:
        await server.import_topology(cluster(tmp_path))
        gate = Gate.open(await server.load_topology(), topo=server)
        try:
            s = gate.session("commerce", identity=TRUSTED)
            await gate.execute(s, "CREATE TABLE customer (customer_id BIGINT PRIMARY KEY, "
                                  "email VARCHAR(64), name VARCHAR(64))")
            await gate.execute(gate.session("lookup", identity=TRUSTED),
                               "CREATE TABLE customer_email_idx (email VARCHAR(64) PRIMARY KEY, "
                               "keyspace_id VARBINARY(16))")
        finally:
            await gate.close()
    finally:
        await server.close()
    yield topo_url


class GateProcess:
    """``shardgate gate --topo URL`` in a process of its own."""

    def __init__(self, url: str, cwd: Path) -> None:
        self.url, self.cwd = url, cwd
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardgate.cli", "up", "--http-port", "0", "--mysql-port", "0",
             "--topo", self.url,
             "--port", str(self.port)],
            cwd=self.cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        wait_for_port(self.proc, self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
        self.proc = None

    @property
    def target(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"


@pytest.fixture
def second_gate(seeded: str, tmp_path: Path) -> Iterator[GateProcess]:
    proc = GateProcess(seeded, tmp_path)
    proc.start()
    yield proc
    proc.stop()


async def within(what: Callable[[], Awaitable[bool]], timeout: float) -> float:
    """Seconds until ``what()`` is true; fails after ``timeout``."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(ShardgateError):
            if await what():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"not true within {timeout}s")
        await asyncio.sleep(0.01)


async def variant(client: GateClient, sql: str) -> str | None:
    plan = await client.explain(sql)
    return plan.get("Variant") or plan.get("Instructions", {}).get("Variant")


def stored(topo_url: str, keyspace: str) -> dict[str, Any]:
    """The VSchema of ``keyspace`` in the topo store, read in this process (a ``vschema
    get`` process costs a second of CPU; the CLI's get is tested once, below)."""

    async def read() -> dict[str, Any]:
        server = TopoServer(open_topo_store(topo_url))
        try:
            return (await server.keyspace_vschema(keyspace))[0]
        finally:
            await server.close()

    return asyncio.run(read())


def shardgate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardgate.cli", *args], cwd=cwd,
                          env=cli_env(), capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)


async def test_changes_reach_a_second_gate_process_and_survive_restarts(
    seeded: str, second_gate: GateProcess, tmp_path: Path
) -> None:
    server = TopoServer(open_topo_store(seeded))
    gate = await Gate.from_topo(server)
    s = gate.session("commerce", identity=TRUSTED)
    client = GateClient(second_gate.target, keyspace="commerce")
    note = "SELECT * FROM note WHERE customer_id = 7"
    try:
        # ALTER VSCHEMA through gate 1: a new table routed by hash
        await gate.execute(s, "CREATE TABLE note (customer_id BIGINT, body VARCHAR(64))")
        with pytest.raises(ShardgateError) as err:
            await client.explain(note)
        assert err.value.code is Code.NOT_FOUND
        await gate.execute(s, "ALTER VSCHEMA ON note ADD VINDEX hash(customer_id)")
        assert gate.explain(note, "commerce")["Instructions"]["Variant"] == "EqualUnique"

        async def routed() -> bool:
            return await variant(client, note) == "EqualUnique"
        assert await within(routed, 5) < PROPAGATION_S
        await client.execute("INSERT INTO note (customer_id, body) VALUES (7, 'hi')")
        assert (await gate.execute(s, note)).rows == [(7, "hi")]

        # CREATE QUEUE through gate 1: gate 2 reads the queue table
        await gate.execute(s, "CREATE QUEUE jobs2 (user_id BIGINT) SHARD BY user_id USING hash")

        async def counted() -> bool:
            r = await client.execute("SELECT COUNT(*) FROM jobs2")
            return r.rows == [(0,)]
        assert await within(counted, 5) < PROPAGATION_S

        # vschema apply (the CLI, on the store): gate 2 follows
        doc, _ = await server.keyspace_vschema("lookup")  # (the CLI's get: the test below)
        doc["tables"] = {"settings": {}}
        (tmp_path / "lookup.json").write_text(json.dumps(doc))
        applied = shardgate("vschema", "apply", "--keyspace", "lookup", "--topo", seeded,
                            str(tmp_path / "lookup.json"), cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr

        async def applied_there() -> bool:
            shown = await client.vschema()
            return "settings" in shown["lookup"].get("tables", {})
        assert await within(applied_there, 5) < PROPAGATION_S
    finally:
        await client.close()
        await gate.close()

    # both restart with the changes intact
    second_gate.stop()
    second_gate.start()
    server = TopoServer(open_topo_store(seeded))
    gate = await Gate.from_topo(server, watch=False)
    client = GateClient(second_gate.target, keyspace="commerce")
    try:
        assert gate.explain(note, "commerce")["Instructions"]["Variant"] == "EqualUnique"
        assert await variant(client, note) == "EqualUnique"
        assert (await client.execute(note)).rows == [(7, "hi")]
        assert (await client.execute("SELECT COUNT(*) FROM jobs2")).rows == [(0,)]
        assert gate.vschema.keyspace("commerce").tables["jobs2"].type == "queue"
        assert "settings" in gate.vschema.keyspace("lookup").tables
    finally:
        await client.close()
        await gate.close()


async def test_invalid_changes_are_refused_with_the_path_and_nothing_saved(
    seeded: str, tmp_path: Path
) -> None:
    server = TopoServer(open_topo_store(seeded))
    gate = await Gate.from_topo(server, watch=False)
    try:
        _, before = await server.keyspace_vschema("commerce")
        with pytest.raises(ShardgateError) as err:
            await gate.execute(gate.session("commerce", identity=TRUSTED),
                               "ALTER VSCHEMA ON note ADD VINDEX nope(a) USING no_such_type")
        assert err.value.code is Code.INVALID_ARGUMENT
        assert "commerce.vindexes.nope.type" in err.value.message
        assert (await server.keyspace_vschema("commerce"))[1] == before
    finally:
        await gate.close()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sharded": True, "tables": {"t": {}}}))
    out = shardgate("vschema", "apply", "--keyspace", "commerce", str(bad), "--topo", seeded,
                    cwd=tmp_path)
    assert out.returncode == 1
    assert "error INVALID_ARGUMENT" in out.stderr and "commerce.tables.t" in out.stderr
    server = TopoServer(open_topo_store(seeded))
    try:
        assert (await server.keyspace_vschema("commerce"))[1] == before
    finally:
        await server.close()


def test_vschema_apply_dry_run_and_concurrent_applies(seeded: str, tmp_path: Path) -> None:
    got = shardgate("vschema", "get", "--keyspace", "commerce", "--topo", seeded, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    version = int(got.stderr.split("version")[-1])
    doc = json.loads(got.stdout)
    doc["tables"]["note"] = {"column_vindexes": [{"column": "customer_id", "name": "hash"}]}
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    dry = shardgate("vschema", "apply", "--keyspace", "commerce", str(new), "--dry-run",
                    "--topo", seeded, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert '+    "note": {' in dry.stdout and "nothing saved" in dry.stdout
    assert "note" not in stored(seeded, "commerce")["tables"]

    # two applies expecting the same version: one wins, the other gets ABORTED
    other = tmp_path / "other.json"
    doc2 = json.loads(got.stdout)
    doc2["tables"]["memo"] = {"column_vindexes": [{"column": "customer_id", "name": "hash"}]}
    other.write_text(json.dumps(doc2))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", "vschema", "apply", "--keyspace", "commerce",
         str(f), "--expect-version", str(version), "--topo", seeded],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for f in (new, other)]
    results = [(*p.communicate(timeout=COMMAND_TIMEOUT_S), p.returncode) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, 1], results
    loser = next(r for r in results if r[2] == 1)
    assert "error ABORTED" in loser[1]
    final = stored(seeded, "commerce")
    winner = new if next(r for r in results if r[2] == 0) is results[0] else other
    assert final == json.loads(winner.read_text())


async def test_drop_table_with_lookups_needs_confirmation(seeded: str, tmp_path: Path) -> None:
    server = TopoServer(open_topo_store(seeded))
    gate = await Gate.from_topo(server, watch=False)
    s = gate.session("commerce", identity=TRUSTED)
    try:
        await gate.execute(s, "INSERT INTO customer (customer_id, email) VALUES (1, 'a@x')")
        with pytest.raises(ShardgateError) as err:
            await gate.execute(s, "DROP TABLE customer")
        assert err.value.code is Code.FAILED_PRECONDITION
        assert "owns lookup vindex(es) email_idx" in err.value.message
        assert "CONFIRM_DROP" in err.value.message
        # nothing changed
        assert "customer" in gate.vschema.keyspace("commerce").tables
        assert (await gate.execute(s, "SELECT email FROM customer WHERE email = 'a@x'")).rows
        await gate.execute(s, "DROP TABLE customer /*sg+ CONFIRM_DROP */")
        assert "customer" not in gate.vschema.keyspace("commerce").tables
        assert "email_idx" not in gate.vschema.keyspace("commerce").vindexes
    finally:
        await gate.close()
    for db in ("c1", "c2", "lookup"):
        with contextlib.closing(sqlite3.connect(tmp_path / "shards" / f"{db}.db")) as conn:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert not {"customer", "customer_email_idx"} & names, (db, names)
    # a restart sees the dropped state
    server = TopoServer(open_topo_store(seeded))
    gate = await Gate.from_topo(server, watch=False)
    try:
        assert "customer" not in gate.vschema.keyspace("commerce").tables
    finally:
        await gate.close()


async def test_drop_queue(seeded: str) -> None:
    server = TopoServer(open_topo_store(seeded))
    gate = await Gate.from_topo(server, watch=False)
    s = gate.session("commerce", identity=TRUSTED)
    try:
        await gate.execute(s, "CREATE QUEUE jobs (user_id BIGINT) SHARD BY user_id USING hash")
        await gate.execute(s, "INSERT INTO jobs (user_id) VALUES (1)")
        with pytest.raises(ShardgateError) as err:
            await gate.execute(s, "DROP QUEUE customer")
        assert err.value.code is Code.INVALID_ARGUMENT
        await gate.execute(s, "DROP QUEUE jobs")
        assert "jobs" not in gate.vschema.keyspace("commerce").tables
        await gate.execute(s, "DROP QUEUE IF EXISTS jobs")
        with pytest.raises(ShardgateError) as err:
            await gate.execute(s, "DROP QUEUE jobs")
        assert err.value.code is Code.NOT_FOUND
        # the name is free again
        await gate.execute(s, "CREATE QUEUE jobs (user_id BIGINT) SHARD BY user_id USING hash")
        assert (await gate.execute(s, "SELECT COUNT(*) FROM jobs")).rows == [(0,)]
    finally:
        await gate.close()
