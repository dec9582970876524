"""Tablet processes for tests: a cluster's shards served by ``shardgate tablet`` processes.

Each tablet is a real separate process running ``shardgate tablet --topo URL``
(its own event loop, gRPC server, database pool and shard lease). They are
forked from a forkserver that imported shardgate once, so starting five of
them costs well under a second instead of an interpreter start-up each.
The gate the tests use is :func:`shardgate.api.grpc.remote_gate.open_remote_gate`: it
opens no tablet of its own and reaches the processes over gRPC.

:class:`SharedTablets` starts the processes (and their PostgreSQL databases)
once for a run or a test module; each test gets a new gate and empty databases
(:meth:`SharedTablets.open` / :meth:`SharedTablets.release`), the way the
in-process variant gets new databases.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from shardgate.api.grpc.remote_gate import open_remote_gate
from shardgate.api.grpc.security import ClientSecurity
from shardgate.cli.cluster import wait_for_tablets
from shardgate.gate import Gate
from shardgate.gate.fleet import TabletFleet
from shardgate.topo import Topology
from shardgate.topo.local import open_topo
from shardgate.topo.server import TopoServer

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["shardgate.cli.app", "shardgate.api.grpc.tablet_service",
                             "shardgate.backends.postgres", "shardgate.tablet.registry"])


def _run_tablet(argv: list[str], owner: int) -> None:
    os.setsid()  # a session of its own, like a separately started process
    # A tablet outliving the test run that started it (``owner``, killed before its
    # fixtures stopped the tablets) is an orphan nobody will stop: it ends itself. (Its
    # forkserver parent stays alive as long as any of its children does.)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()
    from shardgate.cli.app import main

    sys.exit(main(argv))


@dataclass
class TabletProcesses:
    """The tablet processes of a cluster and the remote gate reaching them."""

    topo_url: str
    topo: TopoServer
    gate: Gate
    fleet: TabletFleet
    #: alias -> process; ``shards[(ks, shard)]`` -> its aliases
    procs: dict[str, multiprocessing.process.BaseProcess] = field(default_factory=dict)
    shards: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: set when the processes belong to a :class:`SharedTablets` (``close`` leaves them)
    shared: SharedTablets | None = None

    def holder(self, keyspace: str, shard: str) -> str:
        """The alias of the shard's lease holder, as the gate sees it now."""
        found = self.fleet.pick(keyspace, shard)
        assert found is not None, f"no lease holder of {keyspace}/{shard}"
        return found.record.alias

    def kill(self, alias: str) -> None:
        """SIGKILL one tablet process."""
        proc = self.procs[alias]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)

    async def close(self) -> None:
        """Close the gate and SIGKILL the tablets (their database sessions end with them;
        draining on SIGTERM has its own test); shared tablets are released instead."""
        if self.shared is not None:
            await self.shared.release(self)
            return
        await self.gate.close()
        await self.fleet.close()
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
        for proc in self.procs.values():
            proc.join(10)
        await self.topo.close()


def start_tablet_process(
    topo_url: str, keyspace: str, shard: str, alias: str, *extra: str
) -> multiprocessing.process.BaseProcess:
    """Start one ``shardgate tablet`` process registered in the store at ``topo_url``."""
    argv = ["tablet", "--topo", topo_url, "--keyspace", keyspace, "--shard", shard,
            "--alias", alias, "--port", "0", "--no-auth", *extra]
    proc = _CTX.Process(target=_run_tablet, args=(argv, os.getpid()), daemon=False)
    proc.start()
    return proc


async def _start_processes(
    topology: Topology, topo_url: str, per_shard: int, extra: tuple[str, ...],
) -> tuple[dict[str, multiprocessing.process.BaseProcess], dict[tuple[str, str], list[str]]]:
    procs: dict[str, multiprocessing.process.BaseProcess] = {}
    shards: dict[tuple[str, str], list[str]] = {}
    for ks in topology.keyspaces.values():
        for shard in ks.shards:
            for i in range(per_shard):
                alias = f"{ks.name}-{shard.name.replace('-', '_') or '0'}-{i + 1}"
                procs[alias] = start_tablet_process(topo_url, ks.name, shard.name, alias, *extra)
                shards.setdefault((ks.name, shard.name), []).append(alias)
    return procs, shards


def _kill_all(procs: dict[str, multiprocessing.process.BaseProcess]) -> None:
    for proc in procs.values():
        if proc.is_alive():
            proc.kill()
    for proc in procs.values():
        proc.join(10)


async def serve_with_processes(
    topology: Topology, directory: Path, *, per_shard: int = 1, extra: tuple[str, ...] = (),
    failover_timeout: float = 10.0, tablet_security: ClientSecurity | None = None,
    topo_url: str | None = None,
) -> TabletProcesses:
    """Import ``topology`` into a new topo store in ``directory`` (or the empty one at
    ``topo_url``), start ``per_shard`` tablet processes per shard, wait until each shard
    has a lease holder, open the remote gate."""
    directory.mkdir(parents=True, exist_ok=True)
    topo_url = topo_url or f"sqlite:///{directory / 'topo.db'}"
    topo = await open_topo(url=topo_url)
    await topo.import_topology(topology)
    procs: dict[str, multiprocessing.process.BaseProcess] = {}
    shards: dict[tuple[str, str], list[str]] = {}
    try:
        procs, shards = await _start_processes(topology, topo_url, per_shard, extra)
        await wait_for_tablets(topo.store, set(procs), lease_holders=set(shards))
        gate, fleet = await open_remote_gate(topo, owns_topo=False,
                                             failover_timeout=failover_timeout,
                                             tablet_security=tablet_security)
        # the gate's first health answers decide where it sends: wait for every holder
        for ks_name, shard_name in shards:
            await fleet.wait_pick(ks_name, shard_name, time.monotonic() + 30)
    except BaseException:
        _kill_all(procs)
        await topo.close()
        raise
    return TabletProcesses(topo_url, topo, gate, fleet, procs, shards)


async def _open_gate(topo: TopoServer, shards: set[tuple[str, str]]) -> tuple[Gate, TabletFleet]:
    gate, fleet = await open_remote_gate(topo, owns_topo=False)
    try:
        # the gate's first health answers decide where it sends: wait for every holder
        for ks_name, shard_name in shards:
            await fleet.wait_pick(ks_name, shard_name, time.monotonic() + 30)
    except BaseException:
        await gate.close()
        await fleet.close()
        raise
    return gate, fleet


@dataclass
class SharedTablets:
    """One tablet process per shard of ``topology`` (PostgreSQL databases made for it),
    started once and used by many tests in turn.

    Invariant between two tests: no gate is open, every shard database is empty
    (schema ``public`` recreated, nothing prepared, no replication slot, no open
    transaction), and the topo store holds ``topology`` as imported at the start;
    the tablet processes keep running and keep their shard leases.
    """

    topology: Topology
    topo_url: str
    procs: dict[str, multiprocessing.process.BaseProcess]
    shards: dict[tuple[str, str], list[str]]

    @classmethod
    def start(cls, topology: Topology, directory: Path) -> SharedTablets:
        """Import ``topology`` into a new store in ``directory`` and start the tablets
        (synchronously, on a loop of its own in a thread: the fixture asking for it may
        be running in the test's loop)."""

        async def run() -> SharedTablets:
            directory.mkdir(parents=True, exist_ok=True)
            topo_url = f"sqlite:///{directory / 'topo.db'}"
            topo = await open_topo(url=topo_url)
            procs: dict[str, multiprocessing.process.BaseProcess] = {}
            try:
                await topo.import_topology(topology)
                procs, shards = await _start_processes(topology, topo_url, 1, ())
                await wait_for_tablets(topo.store, set(procs), lease_holders=set(shards))
            except BaseException:
                _kill_all(procs)
                raise
            finally:
                await topo.close()
            return cls(topology, topo_url, procs, shards)

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, run()).result()

    def urls(self) -> list[str]:
        """Every shard database URL."""
        return [sh.url for ks in self.topology.keyspaces.values() for sh in ks.shards]

    async def open(self) -> TabletProcesses:
        """A new gate reaching the tablets, on the topology as first imported."""
        dead = sorted(a for a, p in self.procs.items() if not p.is_alive())
        assert not dead, f"shared tablet processes died: {dead}"
        topo = await open_topo(url=self.topo_url)
        try:
            await topo.import_topology(self.topology, replace=True)
            gate, fleet = await _open_gate(topo, set(self.shards))
        except BaseException:
            await topo.close()
            raise
        return TabletProcesses(self.topo_url, topo, gate, fleet, self.procs, self.shards,
                               shared=self)

    async def release(self, procs: TabletProcesses) -> None:
        """End a test: its queues stop on every tablet (DROP QUEUE's RPC), the gate
        closes, the databases are emptied."""
        try:
            for ks in procs.gate.topology.keyspaces.values():
                queues = [t.name for t in procs.gate.vschema.keyspace(ks.name).tables.values()
                          if t.type == "queue"]
                for name in queues:
                    for sh in ks.shards:
                        await procs.gate.tablets[(ks.name, sh.name)].queue_forget(name)
        finally:
            await procs.gate.close()
            await procs.fleet.close()
            await procs.topo.close()
            await asyncio.to_thread(empty_postgres_databases, self.urls())

    def stop(self) -> None:
        """SIGKILL the tablet processes."""
        _kill_all(self.procs)


def empty_postgres_databases(urls: list[str]) -> None:
    """Empty PostgreSQL databases for the next test: roll back what is prepared, end
    transactions left open, drop replication slots and recreate schema ``public``
    (sessions that are idle, such as a tablet's lease, stay)."""
    from tests.conftest import _postgres_admin

    names = [urlsplit(u).path.lstrip("/") for u in urls]
    with _postgres_admin() as admin:
        prepared = admin.execute("SELECT gid, database FROM pg_prepared_xacts").fetchall()
        for name in names:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                " AND state LIKE 'idle in transaction%%'", (name,))
    for name in names:
        with _postgres_admin(name) as conn:
            for gid, db in prepared:
                if db == name:
                    with contextlib.suppress(Exception):
                        conn.execute(f"ROLLBACK PREPARED '{gid}'")
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE database = %s AND NOT active", (name,))
            conn.execute("SET lock_timeout = '20s'")
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
