"""Following the topo store: every process sees every change within a bound.

How: **version polling** on the SQL stores, **etcd's watch** on etcd: between
two reads the watcher waits in :meth:`TopoStore.changed`, which sleeps
``interval`` on SQL and returns on the first watch event on etcd (a change
reaches a watching gate in milliseconds; the clock is still read at least every
few seconds). Every ``interval`` (200 ms by default) the polling watcher
reads the store's clock (one primary-key row). When it moved, the watcher
reads the records written since, and if a keyspace or the global record is
among them it reads the whole topology and hands it to ``on_topology``; other
kinds (workflows, tablets) go to ``on_records``. Polling works the same on a
SQLite file, PostgreSQL and MariaDB, costs one indexed read per interval, and
bounds the delay to ``interval`` plus one read, well under a second.

Invariants:

* ``version`` only moves forward and only after the callbacks ran: a change
  is delivered at least once, in clock order, never skipped.
* Losing the store never stops the process: the watcher keeps the last
  topology, sets ``degraded`` (with the error), logs once, and keeps
  polling; the first successful read clears it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shardgate.aio import cancel_and_wait
from shardgate.errors import ShardgateError
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import Record

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.2


class TopoWatcher:
    """Polls a :class:`TopoServer` and reports topology changes."""

    def __init__(
        self,
        server: TopoServer,
        on_topology: Callable[[Topology], object],
        *,
        version: int,
        interval: float = DEFAULT_INTERVAL,
        on_records: Callable[[list[Record]], None] | None = None,
    ) -> None:
        self.server = server
        self.on_topology = on_topology
        self.on_records = on_records
        self.version = version
        self.interval = interval
        self.degraded: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="topo-watch")

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_and_wait([task])

    async def poll(self) -> bool:
        """One poll; True if something changed. Raises what the store raises."""
        clock = await self.server.store.clock()
        if clock <= self.version:
            return False
        clock, records = await self.server.store.changes_since(self.version)
        if any(r.kind in ("keyspace", "cluster") for r in records):
            topo = await self.server.load_topology()
            self.on_topology(topo)
        others = [r for r in records if r.kind not in ("keyspace", "cluster")]
        if others and self.on_records is not None:
            self.on_records(others)
        self.version = clock
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except ShardgateError as exc:
                if self.degraded is None:
                    log.warning("topo store lost; serving topology version %d: %s",
                                self.version, exc)
                self.degraded = str(exc)
            except Exception as exc:  # a bug must not stop the watcher either
                log.exception("topo watcher failed")
                self.degraded = f"INTERNAL: {exc}"
            else:
                if self.degraded is not None:
                    log.warning("topo store reachable again at version %d", self.version)
                self.degraded = None
            await self.server.store.changed(self.version, self.interval)
