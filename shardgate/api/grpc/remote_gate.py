"""A gate whose tablets are processes reached over gRPC (``shardgate gate --topo URL``).

The fleet that finds the tablets, checks their health and fails over between
them is the gate's (:mod:`shardgate.gate.fleet`); this module only gives it
its transport: a :class:`~shardgate.api.grpc.tablet_client.GrpcTabletClient`
per registered tablet, with the credentials the gate presents to tablets and
the per-call timeout.
"""

from __future__ import annotations

from shardgate.api.grpc.security import ClientSecurity
from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.auth.guard import Guard
from shardgate.gate import Gate
from shardgate.gate.fleet import (
    DEFAULT_FAILOVER_TIMEOUT_S,
    DEFAULT_HEALTH_INTERVAL_S,
    Connect,
    HealthCheck,
    TabletFleet,
    open_fleet_gate,
)
from shardgate.gate.limits import GateLimits
from shardgate.tablet.client import TabletClient
from shardgate.tablet.registry import TabletRecord
from shardgate.topo.server import TopoServer


def grpc_tablets(*, call_timeout: float | None = None,
                 security: ClientSecurity | None = None) -> Connect:
    """Connects the fleet to each tablet over gRPC: ``security`` is what the gate
    presents to tablets (their users file or CA decides), ``call_timeout`` bounds
    each call (None: none)."""

    def connect(rec: TabletRecord, gate_id: str) -> tuple[TabletClient, HealthCheck]:
        client = GrpcTabletClient(
            rec.address, rec.keyspace, rec.shard, rec.dialect, rec.placeholder,
            timeout=call_timeout, gate_id=gate_id, security=security,
            supports_twopc=rec.supports_twopc, collation=rec.collation,
            gives_wire=rec.gives_wire)
        return client, client.health

    return connect


async def open_remote_gate(
    topo: TopoServer,
    *,
    owns_topo: bool = True,
    health_interval: float = DEFAULT_HEALTH_INTERVAL_S,
    failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S,
    call_timeout: float | None = None,
    watch_interval: float | None = None,
    guard: Guard | None = None,
    limits: GateLimits | None = None,
    tablet_security: ClientSecurity | None = None,
    direct_statements: bool = True,
) -> tuple[Gate, TabletFleet]:
    """A gate with no tablet of its own: every shard is served by tablet processes,
    reached over gRPC (:func:`~shardgate.gate.fleet.open_fleet_gate`); with
    ``direct_statements`` (the default) autocommit SELECTs and writes of plain tables
    go to the shard databases through the gate's own pools (:mod:`shardgate.gate.direct`).

    The gate follows ``topo`` (topology and tablet records). Close the gate
    first, then the fleet.
    """
    return await open_fleet_gate(
        topo, grpc_tablets(call_timeout=call_timeout, security=tablet_security),
        owns_topo=owns_topo, health_interval=health_interval,
        failover_timeout=failover_timeout, watch_interval=watch_interval, guard=guard,
        limits=limits, direct_statements=direct_statements)
