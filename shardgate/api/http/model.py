"""What the console's pages and JSON APIs show, built from the gate (one place for both)."""

from __future__ import annotations

import difflib
import json
from typing import Any

from aiohttp import web

from shardgate.backends.urls import parse_url, redacted
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.queues.router import queue_options_of

GATE_KEY = web.AppKey("gate", Gate)
STARTED_KEY = web.AppKey("started", float)


def cluster_doc(gate: Gate) -> dict[str, Any]:
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
    out = []
    for ks in gate.topology.keyspaces.values():
        for name in sorted(queue_options_of(gate, ks.name)):
            shards: list[dict[str, Any]] | str
            try:
                shards = await gate.queue_stats(ks.name, name)
            except ShardgateError as exc:
                shards = str(exc)
            out.append({"keyspace": ks.name, "queue": name, "shards": shards})
    return out


