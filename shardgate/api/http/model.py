"""What the console's pages and JSON APIs show, built from the gate (one place for both)."""

from __future__ import annotations

import difflib
import json
from typing import Any

from aiohttp import web

from shardgate.backends.urls import parse_url, redacted
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.queues.inbox.registry import InboxRegistry
from shardgate.queues.router import queue_options_of
from shardgate.queues.segmented.queue import SegmentedQueue

GATE_KEY = web.AppKey("gate", Gate)
STARTED_KEY = web.AppKey("started", float)
INBOXES_KEY = web.AppKey("inboxes", InboxRegistry)


async def registered_tablets(gate: Gate) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Tablet processes registered in the topo store, by shard (production mode)."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        records = await gate.topo.store.list_records("tablet")
    except ShardgateError:
        return out  # the store is unreachable: the page says degraded
    for r in records:
        doc = r.doc or {}
        out.setdefault((str(doc.get("keyspace")), str(doc.get("shard"))), []).append({
            "alias": r.name, "address": doc.get("address"), "role": doc.get("role"),
            "health": doc.get("health"), "position": doc.get("position"),
            "heartbeat_at": doc.get("heartbeat_at")})
    return out


def cluster_doc(gate: Gate, registered: dict[tuple[str, str], list[dict[str, Any]]] | None = None
                ) -> dict[str, Any]:
    """Keyspaces and shards with redacted URLs, serving state and lease holders."""
    out = []
    for ks in gate.topology.keyspaces.values():
        shards = []
        for shard in ks.shards:
            tablet = gate.tablets.get((ks.name, shard.name))
            shards.append({
                "name": shard.name,
                "key_range": shard.name if ks.sharded else "-",
                "backend": parse_url(shard.url).kind,
                "url": redacted(shard.url),
                "serving": True,
                "tablet": tablet.describe() if tablet is not None else None,
                "tablets": (registered or {}).get((ks.name, shard.name), []),
            })
        out.append({"name": ks.name, "sharded": ks.sharded, "collation": ks.collation,
                    "shards": shards})
    return {"keyspaces": out, "topology_version": gate.topology.version,
            "topo": gate.topo.location, "degraded": gate.degraded}


def vschema_diff(old: Any, new: Any, keyspace: str) -> str:
    a = json.dumps(old, indent=2, sort_keys=True).splitlines()
    b = json.dumps(new, indent=2, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, f"{keyspace} (saved)", f"{keyspace} (edited)",
                                          lineterm=""))


def queryz_doc(gate: Gate) -> list[dict[str, Any]]:
    out = []
    for st in gate.query_stats():
        out.append({"query": st.query, "count": st.count, "errors": st.errors,
                    "total_seconds": st.total_seconds, "max_seconds": st.max_seconds,
                    "mean_seconds": st.mean_seconds, "rows": st.rows,
                    "shard_calls": st.shard_calls})
    return out


async def queues_doc(gate: Gate) -> list[dict[str, Any]]:
    """Every queue of every keyspace: its storage and per-shard figures.

    Queue tables: depth per state, lag, rates (the tablets' stats). Segmented
    queues: datasets, jobs per state, the busiest keys and the keys blocked by a
    failed job, read from the shards' own tables.
    """
    out = []
    for ks in gate.topology.keyspaces.values():
        for name, opts in sorted(queue_options_of(gate, ks.name).items()):
            shards: list[dict[str, Any]] | str
            try:
                if opts.storage == "segmented":
                    shards = await segmented_doc(gate, ks.name, name)
                else:
                    shards = await gate.queue_stats(ks.name, name)
            except ShardgateError as exc:
                shards = str(exc)
            out.append({"keyspace": ks.name, "queue": name, "storage": opts.storage,
                        "shards": shards})
    return out


async def segmented_doc(gate: Gate, keyspace: str, queue: str) -> list[dict[str, Any]]:
    q = SegmentedQueue.from_gate(gate, keyspace, queue)
    try:
        return await q.inspect(keys=5)
    finally:
        await q.close()


async def segmented_request(gate: Gate, keyspace: str, queue: str, shard: str,
                            ids: list[int], action: str, reason: str | None) -> int:
    """Ask a segmented queue's consumer to ``retry`` or ``abort`` jobs; how many asked."""
    q = SegmentedQueue.from_gate(gate, keyspace, queue)
    try:
        for job_id in ids:
            await q.request(shard, job_id, action, reason)
    finally:
        await q.close()
    return len(ids)


async def inboxes_doc(registry: InboxRegistry, gate: Gate) -> list[dict[str, Any]]:
    """Every inbox store of every keyspace: its stored options and buckets."""
    out: list[dict[str, Any]] = []
    for ks in gate.topology.keyspaces.values():
        try:
            listed = await registry.list(ks.name)
        except ShardgateError:
            continue  # a keyspace whose first shard cannot be read shows no inboxes
        for inbox in listed:
            try:
                stats = await registry.stats(ks.name, inbox["name"])
                out.append({**stats, "bucket_count": len(stats.get("buckets", []))})
            except ShardgateError as exc:
                out.append({"keyspace": ks.name, "name": inbox["name"], "error": str(exc)})
    return out


