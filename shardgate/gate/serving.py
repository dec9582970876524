"""What a gate serves, kept up with the topo store: topology, VSchema and tablets.

A :class:`TopologyFollower` watches the topo store (:mod:`shardgate.topo.watch`)
and applies each newer topology to its gate: checked first (an invalid one
changes nothing), then shards new to the gate get a tablet, a shard name
reused for another database gets a new tablet (the old one is closed in the
background), and the gate's cached plans, column kinds and sequence blocks
of sequences no longer served are dropped. Statements already running finish
on the topology they started with (their cursor holds it).

Invariant: every serving and pending shard of the gate's topology has a
tablet in its ``tablets``, and ``_tablet_urls`` names the database each of
them serves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from shardgate.engine.plan import Plan
from shardgate.errors import FailedPrecondition, NotFound
from shardgate.gate.catalog import Catalog
from shardgate.gate.limits import GateLimits
from shardgate.gate.plan_cache import PlanCache
from shardgate.gate.sequences import Sequences
from shardgate.queues import router as queue_router
from shardgate.sql.statements import GateStatement
from shardgate.tablet import LocalTabletClient, Tablet, TabletClient
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import Record
from shardgate.topo.watch import TopoWatcher
from shardgate.vschema import TableType, VSchema

#: opens the tablet client of a shard: (keyspace, shard, database url)
OpenTablet = Callable[[str, str, str], TabletClient]


class ServingGate(Protocol):
    """The gate's state a :class:`TopologyFollower` keeps up to date."""

    topology: Topology
    vschema: VSchema
    tablets: dict[tuple[str, str], TabletClient]
    topo: TopoServer
    plans: PlanCache[Plan | GateStatement]
    schema: Catalog
    sequences: Sequences


class TopologyFollower:
    """Keeps a gate serving the topo store's newest topology (see the module)."""

    def __init__(self, gate: ServingGate, open_tablet: OpenTablet | None) -> None:
        self._gate = gate
        #: opens a tablet for a shard that appears in a newer topology
        self._open_tablet = open_tablet
        self._watcher: TopoWatcher | None = None
        topology = gate.topology
        for ks in topology.keyspaces.values():
            for shard in ks.all_shards:
                if (ks.name, shard.name) not in gate.tablets:
                    raise NotFound(f"no tablet for shard {ks.name}/{shard.name}")
        #: the database URL each tablet serves, and tablets being closed after a reshard
        self._tablet_urls = {(ks.name, shard.name): shard.url
                             for ks in topology.keyspaces.values() for shard in ks.all_shards}
        self._retired: set[asyncio.Task[None]] = set()

    def watch(self, interval: float,
              on_records: Callable[[list[Record]], None] | None) -> None:
        """Follow the topo store (once: a second call changes nothing)."""
        if self._watcher is None:
            self._watcher = TopoWatcher(self._gate.topo, self.apply,
                                        version=self._gate.topology.version, interval=interval,
                                        on_records=on_records)
            self._watcher.start()

    async def poll(self) -> None:
        """Apply the store's topology now if it changed (the watcher's poll, if any)."""
        gate = self._gate
        if self._watcher is not None:
            await self._watcher.poll()
        elif await gate.topo.store.clock() > gate.topology.version:
            self.apply(await gate.topo.load_topology())

    def pending_tablets(self) -> list[TabletClient]:
        """The tablets of every pending shard (the targets of cut-overs under way)."""
        gate = self._gate
        return [gate.tablets[(ks.name, shard.name)] for ks in gate.topology.keyspaces.values()
                for shard in ks.pending if (ks.name, shard.name) in gate.tablets]

    @property
    def degraded(self) -> str | None:
        """Why the gate is serving a possibly stale topology (None: it is not)."""
        return None if self._watcher is None else self._watcher.degraded

    def apply(self, topology: Topology) -> bool:
        """Serve ``topology`` from now on; False if it is not newer than the current one.

        Checked first (an invalid topology changes nothing). Statements
        already running finish on the topology they started with (their
        cursor holds it); cached plans are dropped; shards new to the gate
        get a tablet.
        """
        gate = self._gate
        if topology.version and topology.version <= gate.topology.version:
            return False
        vschema = topology.build_vschema()
        tablets = gate.tablets
        for ks in topology.keyspaces.values():
            for shard in ks.all_shards:
                key = (ks.name, shard.name)
                known = self._tablet_urls.get(key)
                if key in tablets and known is not None and known != shard.url \
                        and self._open_tablet is not None:
                    # a shard name reused for another database (a reshard merging back
                    # to the names of shards it removed): the old tablet goes
                    old = tablets.pop(key)
                    self._retired.add(asyncio.get_running_loop().create_task(old.close()))
                if key not in tablets:
                    if self._open_tablet is None:
                        raise FailedPrecondition(
                            f"shard {ks.name}/{shard.name} appeared in the topology and this "
                            "gate cannot open a tablet for it"
                        )
                    tablets[key] = self._open_tablet(ks.name, shard.name, shard.url)
                self._tablet_urls[key] = shard.url
        gate.topology, gate.vschema = topology, vschema
        gate.plans.clear()
        gate.schema.forget()
        self._retain_sequences()
        # queues another gate created: without their options an in-process tablet
        # neither runs their manager nor signals the leader of its inserts
        queue_router.configure_local(gate)
        return True

    async def change_vschema(
        self, keyspace: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Change a keyspace's VSchema in the topo store, then serve it at once."""
        await self._gate.topo.update_vschema(keyspace, change)
        self.apply(await self._gate.topo.load_topology())

    def rebuild_vschema(self) -> None:
        """Rebuild the VSchema from the topology (changed at run time), drop cached plans."""
        gate = self._gate
        gate.vschema = gate.topology.build_vschema()
        gate.plans.clear()
        self._retain_sequences()

    def _retain_sequences(self) -> None:
        """Forget cached blocks of sequences the served VSchema no longer names."""
        gate = self._gate
        gate.sequences.retain({t.qualified for ks in gate.vschema.keyspaces.values()
                               for t in ks.tables.values() if t.type == TableType.SEQUENCE})

    def compete_for_leases(self) -> None:
        """Have every in-process tablet compete for its shard's lease now, as ``shardgate
        tablet`` does when it starts (otherwise a tablet competes once a queue receiver
        first subscribes). A serving gate calls it: the lease is the shard's, not a
        queue's, and the console names its holder from the start."""
        for tablet in self._gate.tablets.values():
            if isinstance(tablet, LocalTabletClient):
                tablet.tablet.queues.start()

    async def stop(self) -> None:
        """Stop following the store (the gate is closing)."""
        if self._watcher is not None:
            await self._watcher.stop()

    async def retired(self) -> None:
        """Wait for the tablets replaced by a newer topology to be closed."""
        for task in self._retired:
            with contextlib.suppress(Exception):
                await task


def local_tablets(limits: GateLimits, pool_size: int | None) -> OpenTablet:
    """Opens an in-process tablet per shard (``Gate.open``), with ``limits``' pool timeout,
    result limits and transaction caps; without ``pool_size``, each pool holds
    ``limits.transaction_cap`` connections for transactions and a few for autocommit
    statements. As a safety net for a transaction the gate lost track of, the
    tablets roll back one idle for twice the transaction timeout."""
    tx_timeout = limits.transaction_timeout_s
    idle = 2 * tx_timeout if tx_timeout is not None else None

    def open_tablet(keyspace: str, shard: str, url: str) -> TabletClient:
        return LocalTabletClient(Tablet.open(
            keyspace, shard, url, pool_size=pool_size, pool_timeout_s=limits.pool_timeout_s,
            result_limits=limits.result_limits, idle_transaction_timeout_s=idle,
            transaction_cap=limits.transaction_cap if pool_size is None else None,
            transaction_cap_per_user=limits.transaction_cap_per_user))

    return open_tablet
