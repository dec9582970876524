"""The inboxes a gate serves to remote clients: one opened store per inbox, listing, stats.

The gate's gRPC service (and anything else serving inboxes for other
processes) asks :class:`InboxRegistry` for the store of ``(keyspace, name)``;
the store is opened once, **without options of its own**, so it adopts the
options stored with the inbox (:meth:`InboxStore.open`), and is reused by
every later call. Creating an inbox through the registry stores the
caller's options, or fails with ``FAILED_PRECONDITION`` if the inbox exists
with others.

Invariants: at most one store per ``(keyspace, name)`` (created under a
lock); a store is cached only after it opened (or created) successfully, so
a failed open is retried by the next call; a dropped inbox leaves the cache.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from shardgate.queues.inbox import sql
from shardgate.queues.inbox.model import InboxOptions
from shardgate.queues.inbox.store import InboxGate, InboxStore, MaintainReport


class InboxRegistry:
    """Opened inbox stores of one gate, by ``(keyspace, name)`` (see the module docstring)."""

    def __init__(self, gate: InboxGate) -> None:
        self.gate = gate
        self._stores: dict[tuple[str, str], InboxStore] = {}
        self._lock = asyncio.Lock()

    async def get(self, keyspace: str, name: str) -> InboxStore:
        """The opened store of inbox ``name`` (``NOT_FOUND`` if it was never created)."""
        key = (keyspace, name)
        found = self._stores.get(key)
        if found is not None:
            return found
        async with self._lock:
            found = self._stores.get(key)
            if found is None:
                found = InboxStore(self.gate, keyspace, name)
                await found.open()
                self._stores[key] = found
        return found

    async def create(
        self, keyspace: str, name: str, options: InboxOptions | None
    ) -> MaintainReport:
        """Create inbox ``name`` with ``options`` (None: the defaults, or the stored ones
        if it exists); idempotent with the same options."""
        async with self._lock:
            store = InboxStore(self.gate, keyspace, name, options)
            report = await store.create()
            self._stores[(keyspace, name)] = store
        return report

    async def maintain(self, keyspace: str, name: str) -> MaintainReport:
        return await (await self.get(keyspace, name)).maintain()

    async def drop(self, keyspace: str, name: str) -> None:
        """Drop inbox ``name`` (every table and its stored options)."""
        store = await self.get(keyspace, name)
        async with self._lock:
            self._stores.pop((keyspace, name), None)
        await store.drop()

    async def list(self, keyspace: str) -> list[dict[str, Any]]:
        """``[{"name", "options"}]`` of the inboxes of ``keyspace`` (from its first shard)."""
        ks = self.gate.topology.keyspace(keyspace)
        client = self.gate.tablets[(keyspace, ks.shards[0].name)]
        await client.execute(sql.options_ddl(client.dialect), [])
        res = await client.execute(sql.options_list_sql(), [])
        return [{"name": str(name), "options": json.loads(str(text))} for name, text in res.rows]

    async def stats(self, keyspace: str, name: str, *, counts: bool = False) -> dict[str, Any]:
        """The inbox's stored options and its buckets (time spans); with ``counts``, also
        the rows of every bucket and of the pointer table over every shard (exact
        counts: they read every bucket's index)."""
        store = await self.get(keyspace, name)
        await store.open()
        buckets = store.buckets()
        out: dict[str, Any] = {
            "keyspace": keyspace, "name": name, "options": store.options.stored(),
            "buckets": [{"table": b.table, "start_us": b.start, "end_us": b.end}
                        for b in buckets],
        }
        if counts:
            rows = await asyncio.gather(*(store.count_rows(b.table) for b in buckets))
            for entry, n in zip(out["buckets"], rows, strict=True):
                entry["rows"] = n
            out["messages"] = sum(rows)
            out["pointers"] = await store.count_rows(store.pointers_table)
        return out
