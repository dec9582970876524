"""Gates and tablet processes on an etcd topo store (``--topo etcd://…``).

The tablets register with etcd leases: a SIGKILLed tablet's record is deleted by
etcd when its lease expires (about 3 s: three 1 s heartbeats), not left for a
heartbeat purge a minute later, and the gate's watch sees it go; the gate fails
over to the standby meanwhile. Two ``shardgate gate`` processes on the same store:
a client naming both goes on through the second when the first is SIGKILLed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.tablet.registry import EXPIRE_BEATS, KIND
from shardgate.topo import Topology
from tests.acceptance.test_cli import cli_env, free_port, wait_for_port
from tests.conftest import require_server
from tests.integration.tablet_procs import TabletProcesses, serve_with_processes

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pair(
    make_database: Callable[..., str], tmp_path: Path, etcd_url: str
) -> AsyncIterator[TabletProcesses]:
    """Keyspace ``app`` (one shard, table ``w``) served by 2 tablet processes on etcd."""
    require_server("postgres")
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {
        "app": {"shards": {"0": make_database("postgres", "etcd")},
                "vschema": {"sharded": False}}}})
    setup = Gate.open(topo)
    try:
        await setup.execute(setup.session(identity=TRUSTED),
                            "CREATE TABLE w (id BIGINT PRIMARY KEY, v VARCHAR(32))")
    finally:
        await setup.close()
    procs = await serve_with_processes(topo, tmp_path / "tablets", per_shard=2,
                                       topo_url=etcd_url)
    try:
        yield procs
    finally:
        await procs.close()


async def test_a_killed_tablets_record_goes_with_its_lease(pair: TabletProcesses) -> None:
    gate, store = pair.gate, pair.topo.store
    assert store.location.startswith("etcd://") and store.has_leases
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, "INSERT INTO w (id, v) VALUES (1, 'one')")
    holder = pair.holder("app", "0")
    standby = next(a for a in pair.shards[("app", "0")] if a != holder)
    assert await store.get(KIND, holder) is not None

    pair.kill(holder)
    killed = time.monotonic()
    while await store.get(KIND, holder) is not None:  # nobody deletes it but etcd
        assert time.monotonic() - killed < EXPIRE_BEATS + 3, "the record outlived its lease"
        await asyncio.sleep(0.05)
    gone_after = time.monotonic() - killed
    print(f"killed tablet's record deleted by etcd {gone_after:.2f} s after SIGKILL")
    assert gone_after > 1.0  # the lease ran out; no one deleted it at once
    # the gate's watch saw the delete: its roster no longer lists the dead tablet
    while holder in {r.alias for r in pair.fleet.roster.all()}:
        assert time.monotonic() - killed < EXPIRE_BEATS + 4
        await asyncio.sleep(0.05)
    # the standby took the shard over and the gate reaches it
    while pair.fleet.pick("app", "0") is None or pair.holder("app", "0") != standby:
        assert time.monotonic() - killed < 15, "no failover to the standby"
        await asyncio.sleep(0.05)
    assert (await gate.execute(s, "SELECT v FROM w WHERE id = 1")).rows == [("one",)]
    live = await store.list_records(KIND)
    assert [r.name for r in live] == [standby]


@contextlib.asynccontextmanager
async def gate_process(topo_url: str, port: int, log_path: Path) -> AsyncIterator[int]:
    """``shardgate gate --topo URL`` serving gRPC on ``port``; its pid. (Waited for in a
    thread: this loop runs the in-test gate, whose etcd calls must not stall.)"""
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardgate.cli", "gate", "--topo", topo_url, "--no-auth",
             "--port", str(port), "--mysql-port", "0", "--http-port", "0"],
            env=cli_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        try:
            await asyncio.to_thread(wait_for_port, proc, port)
            yield proc.pid
        finally:
            if proc.poll() is None:
                proc.kill()
            await asyncio.to_thread(proc.wait, 10)


async def test_a_client_naming_two_gates_goes_on_when_one_is_killed(
    pair: TabletProcesses, tmp_path: Path
) -> None:
    p1, p2 = free_port(), free_port()
    target = f"grpc://127.0.0.1:{p1},127.0.0.1:{p2}"
    async with (gate_process(pair.topo_url, p1, tmp_path / "g1.log") as pid1,
                gate_process(pair.topo_url, p2, tmp_path / "g2.log"),
                GateClient(target, keyspace="app", timeout=10) as client):
        await client.execute("INSERT INTO w (id, v) VALUES (7, 'seven')")
        os.kill(pid1, signal.SIGKILL)
        start = time.monotonic()
        rows = (await client.execute("SELECT v FROM w WHERE id = 7")).rows
        took = time.monotonic() - start
        print(f"client moved to the second gate {took * 1000:.0f} ms after SIGKILL")
        assert rows == [("seven",)] and took < 1.0
