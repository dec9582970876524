"""Tablet processes for tests: a cluster's shards served by ``shardgate tablet`` processes.

Each tablet is a real separate process running ``shardgate tablet --topo URL``
(its own event loop, gRPC server, database pool and shard lease). They are
forked from a forkserver that imported shardgate once, so starting five of
them costs well under a second instead of an interpreter start-up each.
The gate the tests use is :func:`shardgate.api.fleet.open_remote_gate`: it
opens no tablet of its own and reaches the processes over gRPC.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shardgate.api.fleet import TabletFleet, open_remote_gate
from shardgate.api.security import ClientSecurity
from shardgate.cli.cluster import wait_for_tablets
from shardgate.gate import Gate
from shardgate.topo import Topology
from shardgate.topo.local import open_topo
from shardgate.topo.server import TopoServer

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["shardgate.cli.app", "shardgate.api.tablet_service",
                             "shardgate.backends.postgres", "shardgate.tablet.registry"])


def _run_tablet(argv: list[str]) -> None:
    os.setsid()  # a session of its own, like a separately started process
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
        draining on SIGTERM has its own test)."""
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
    proc = _CTX.Process(target=_run_tablet, args=(argv,), daemon=False)
    proc.start()
    return proc


async def serve_with_processes(
    topology: Topology, directory: Path, *, per_shard: int = 1, extra: tuple[str, ...] = (),
    failover_timeout: float = 10.0, tablet_security: ClientSecurity | None = None,
) -> TabletProcesses:
    """Import ``topology`` into a new topo store in ``directory``, start ``per_shard`` tablet
    processes per shard, wait until each shard has a lease holder, open the remote gate."""
    directory.mkdir(parents=True, exist_ok=True)
    topo_url = f"sqlite:///{directory / 'topo.db'}"
    topo = await open_topo(url=topo_url)
    await topo.import_topology(topology)
    procs: dict[str, multiprocessing.process.BaseProcess] = {}
    shards: dict[tuple[str, str], list[str]] = {}
    try:
        for ks in topology.keyspaces.values():
            for shard in ks.shards:
                for i in range(per_shard):
                    alias = f"{ks.name}-{shard.name.replace('-', '_') or '0'}-{i + 1}"
                    procs[alias] = start_tablet_process(topo_url, ks.name, shard.name, alias,
                                                        *extra)
                    shards.setdefault((ks.name, shard.name), []).append(alias)
        await wait_for_tablets(topo.store, set(procs), lease_holders=set(shards))
        gate, fleet = await open_remote_gate(topo, owns_topo=False,
                                             failover_timeout=failover_timeout,
                                             tablet_security=tablet_security)
        # the gate's first health answers decide where it sends: wait for every holder
        for ks_name, shard_name in shards:
            await fleet.wait_pick(ks_name, shard_name, time.monotonic() + 30)
    except BaseException:
        for proc in procs.values():
            proc.kill()
            proc.join(5)
        await topo.close()
        raise
    return TabletProcesses(topo_url, topo, gate, fleet, procs, shards)
