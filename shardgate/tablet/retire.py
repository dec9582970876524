"""When a tablet process must stop serving: its shard left the topology.

A ``shardgate tablet`` serves one shard's database, named by the shard's URL in the
topo store when the tablet started. Two topology changes end that shard while the
process keeps running:

* a reshard's ``complete`` removes its sources from the keyspace (their databases
  keep their frozen rows);
* a later workflow may give the same shard name to a new database (a merge back to
  ``-80``/``80-``, a ``MoveTables`` target re-created).

A tablet still serving then would register as the lease holder of a shard it does not
serve (each database holds its own lease), and a gate could send the shard's reads and
writes to the old database. :func:`until_retired` watches for both and returns why;
the tablet then drains and exits as on SIGTERM.

Invariant: a tablet serves only while the topology names its shard (serving or
pending) with the URL it opened. Checked every :data:`RETIRE_CHECK_S`; a topo store
it cannot read is no reason to stop (the tablet keeps serving; the gates see the same
store).
"""

from __future__ import annotations

import asyncio

from shardgate.errors import NotFound, ShardgateError
from shardgate.topo.server import TopoServer

#: how often a tablet looks whether its shard is still in the topology (seconds)
RETIRE_CHECK_S = 1.0


async def until_retired(topo: TopoServer, keyspace: str, shard: str, url: str,
                        interval: float = RETIRE_CHECK_S) -> str:
    """Wait until the topology no longer names ``keyspace/shard`` at ``url``; why."""
    seen: int | None = None
    while True:
        await asyncio.sleep(interval)
        try:
            clock = await topo.store.clock()
            if clock == seen:
                continue
            topology = await topo.load_topology()
        except ShardgateError:
            continue  # the store is unreachable or busy: keep serving, look again
        seen = clock
        try:
            now = topology.keyspace(keyspace).any_shard(shard)
        except NotFound:
            return f"shard {keyspace}/{shard} is no longer in the topology"
        if now.url != url:
            return f"shard {keyspace}/{shard} now names another database"
