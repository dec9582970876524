"""What the console's pages and JSON APIs show, built from the gate (one place for both)."""

from __future__ import annotations

import asyncio
import difflib
import json
import time
from collections import deque
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from shardgate.backends.urls import parse_url, redacted
from shardgate.errors import InvalidArgument, ShardgateError
from shardgate.gate import Gate, worker
from shardgate.queues.inbox.registry import InboxRegistry
from shardgate.queues.router import queue_options_of
from shardgate.queues.segmented.queue import SegmentedQueue
from shardgate.tablet import TabletClient
from shardgate.tablet.registry import LEASE_HOLDER
from shardgate.topo.store import Record

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


def _position_sql(kind: str) -> str:
    """The SQL giving the end of a database's change log now (one row, one column)."""
    match kind:
        case "sqlite":
            from shardgate.backends.changes.sqlite import SQLiteChangeLog

            return SQLiteChangeLog.position_sql
        case "postgresql":
            from shardgate.backends.changes.postgres import PostgresChangeLog

            return PostgresChangeLog.position_sql
        case "mysql":
            from shardgate.backends.changes.mysql import MySQLChangeLog

            return MySQLChangeLog.position_sql
    return ""


#: why a SQLite shard shows no change-log position
NO_CAPTURE_NOTE = "none yet: SQLite logs changes from the first change stream on"


#: how long the page waits for one shard's log position (an unreachable shard says so)
POSITION_TIMEOUT_S = 2.0


async def _log_position(tablet: TabletClient, kind: str) -> tuple[str, str]:
    """(position, note) of one shard, read through its tablet."""
    sql = _position_sql(kind)
    try:
        async with asyncio.timeout(POSITION_TIMEOUT_S):
            if kind == "sqlite":
                from shardgate.backends.changes.sqlite import CHANGE_TABLE

                found = await tablet.execute(
                    f"SELECT 1 FROM sqlite_master WHERE name = '{CHANGE_TABLE}'", [])
                if not found.rows:
                    return "", NO_CAPTURE_NOTE
            res = await tablet.execute(sql, [])
    except ShardgateError as exc:
        return "", f"unknown: {exc.message}"
    except TimeoutError:
        return "", f"unknown: no answer in {POSITION_TIMEOUT_S:g} s"
    position = str(res.rows[0][0]) if res.rows and res.rows[0][0] is not None else ""
    return position, "" if position else "no change log"


async def log_positions(gate: Gate) -> dict[tuple[str, str], tuple[str, str]]:
    """Each serving shard's change-log end read now through its tablet (all shards at
    once), and a note when there is none (a tablet's stream reader knows a position
    only once something streams the shard)."""
    asked: dict[tuple[str, str], Awaitable[tuple[str, str]]] = {}
    for ks in gate.topology.keyspaces.values():
        for shard in ks.shards:
            tablet = gate.tablets.get((ks.name, shard.name))
            kind = parse_url(shard.url).kind
            if tablet is not None and _position_sql(kind):
                asked[(ks.name, shard.name)] = _log_position(tablet, kind)
    return dict(zip(asked, await asyncio.gather(*asked.values()), strict=True))


def _lease_holder(tablet: dict[str, Any] | None, procs: list[dict[str, Any]]) -> str:
    """Who holds the shard's lease: a registered tablet's alias, this gate's in-process
    tablet, or "" (nobody this gate can see: another process, or none yet)."""
    for t in procs:
        if t.get("role") == LEASE_HOLDER:
            return str(t.get("alias"))
    if tablet and tablet.get("lease_holder"):
        return f"in-process ({worker.current().label()})"
    return ""


def _reader_lag(gate: Gate, keyspace: str, shard: str) -> float | None:
    """Seconds the shard's change-stream reader is behind (None: no reader runs here)."""
    client = gate.tablets.get((keyspace, shard))
    stream = getattr(getattr(client, "tablet", None), "_changes", None)
    watermark = getattr(stream, "watermark", None)
    if not isinstance(watermark, float) or not watermark:
        return None
    return max(0.0, time.time() - watermark)


def cluster_doc(gate: Gate, registered: dict[tuple[str, str], list[dict[str, Any]]] | None = None,
                positions: dict[tuple[str, str], tuple[str, str]] | None = None
                ) -> dict[str, Any]:
    """Keyspaces and shards with redacted URLs, serving state, lease holders and
    change-log positions (``positions``: :func:`log_positions`)."""
    out = []
    for ks in gate.topology.keyspaces.values():
        shards = []
        for shard in ks.shards:
            tablet = gate.tablets.get((ks.name, shard.name))
            described = tablet.describe() if tablet is not None else None
            procs = (registered or {}).get((ks.name, shard.name), [])
            reader = (described or {}).get("position") or ""
            position, note = (positions or {}).get((ks.name, shard.name), ("", ""))
            shards.append({
                "name": shard.name,
                "key_range": shard.name if ks.sharded else "-",
                "backend": parse_url(shard.url).kind,
                "url": redacted(shard.url),
                "serving": True,
                "tablet": described,
                "tablets": procs,
                "lease_holder": _lease_holder(described, procs),
                "log_position": position,
                "log_note": note,
                "reader_position": reader,
                "reader_lag_seconds": _reader_lag(gate, ks.name, shard.name),
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




#: what the workflows page may ask of a reshard or MoveTables workflow, by its state
WORKFLOW_ACTIONS: dict[str, tuple[str, ...]] = {
    "running": ("vdiff", "switch_reads", "switch_writes"),
    "switched": ("complete",),
}


def workflow_doc(name: str, version: int, doc: dict[str, Any]) -> dict[str, Any]:
    """One workflow record as the workflows page shows it: progress, streams' lag,
    the last VDiff, and the actions its state allows (reshard and MoveTables)."""
    kind = name.split(":", 1)[0]
    streams = doc.get("streams") or {}
    rows = sum(int(t.get("rows", 0)) for s in streams.values() if isinstance(s, dict)
               for t in (s.get("tables") or {}).values() if isinstance(t, dict))
    estimate = int(doc.get("estimate") or 0)
    state = str(doc.get("state", ""))
    done = state in ("running", "cutover", "switched", "reversing")
    progress = doc.get("progress")
    if progress is None and kind in ("reshard", "movetables"):
        progress = 1.0 if done else (min(1.0, rows / estimate) if estimate else 0.0)
    actions = WORKFLOW_ACTIONS.get(state, ()) if kind in ("reshard", "movetables") else ()
    if doc.get("reads_switched"):
        actions = tuple(a for a in actions if a != "switch_reads")
    return {
        "name": name, "version": version, "kind": kind, "type": doc.get("kind", kind),
        "state": state, "progress": progress, "rows_copied": rows, "estimate": estimate,
        "reads_switched": bool(doc.get("reads_switched")),
        "streams": {n: {"state": s.get("state"), "lag_s": s.get("lag_s"),
                        "error": s.get("error")}
                    for n, s in streams.items() if isinstance(s, dict)},
        "last_vdiff": doc.get("last_vdiff"), "error": doc.get("error"),
        "actions": list(actions), "record": doc,
    }


def workflows_doc(records: list[Record]) -> list[dict[str, Any]]:
    """The workflow records as the page shows them; a switch's journal record
    (``journal:<workflow record>``) goes with its workflow (``journal``), not apart."""
    journals = {r.name.removeprefix("journal:"): r.doc for r in records
                if r.name.startswith("journal:")}
    out = []
    for r in records:
        if r.name.startswith("journal:") and r.name.removeprefix("journal:") in {
                x.name for x in records}:
            continue
        doc = workflow_doc(r.name, r.version, r.doc or {})
        doc["journal"] = journals.get(r.name)
        out.append(doc)
    return out


def parse_workflow_name(name: str) -> tuple[str, str, str]:
    """``reshard:ks.wf`` -> ``("reshard", "ks", "wf")`` (InvalidArgument otherwise)."""
    kind, _, rest = name.partition(":")
    keyspace, _, workflow = rest.partition(".")
    if kind not in ("reshard", "movetables") or not keyspace or not workflow:
        raise InvalidArgument(f"{name!r} is not a reshard or MoveTables workflow record "
                              "(reshard:<keyspace>.<workflow>, movetables:<keyspace>.<workflow>)")
    return kind, keyspace, workflow


#: seconds between two queue samples kept for the charts, and samples kept per queue
QUEUE_SAMPLE_S = 2.0
QUEUE_SAMPLES_KEPT = 300


class QueueHistory:
    """Recent figures of every queue table (depth, fired/s, acked/s summed over its
    shards), sampled whenever the queue page's API is read: the queue charts show
    the last ``QUEUE_SAMPLES_KEPT`` samples, at most one per ``QUEUE_SAMPLE_S``."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], deque[list[float]]] = {}

    def add(self, queues: list[dict[str, Any]], now: float | None = None) -> None:
        at = time.time() if now is None else now
        for q in queues:
            shards = q.get("shards")
            if q.get("storage") == "segmented" or not isinstance(shards, list):
                continue
            key = (str(q["keyspace"]), str(q["queue"]))
            ring = self._series.setdefault(key, deque(maxlen=QUEUE_SAMPLES_KEPT))
            if ring and at - ring[-1][0] < QUEUE_SAMPLE_S:
                continue
            depth = sum(int((s.get("depth") or {}).get("to_be_fired") or 0) for s in shards)
            fired = sum(int(s.get("fired") or 0) for s in shards)
            acked = sum(int(s.get("acked") or 0) for s in shards)
            fired_s = acked_s = 0.0
            if ring:  # rates from the leaders' counters since the last sample
                then, _, f0, a0, _, _ = ring[-1]
                fired_s = max(0.0, (fired - f0) / (at - then))
                acked_s = max(0.0, (acked - a0) / (at - then))
            ring.append([round(at, 3), depth, fired, acked, round(fired_s, 3),
                         round(acked_s, 3)])

    def series(self, keyspace: str, queue: str) -> list[list[float]]:
        """``[time, pending, fired, acked, fired/s, acked/s]`` samples, oldest first
        (``fired``/``acked``: the leaders' counters since they took the lease)."""
        return list(self._series.get((keyspace, queue), ()))


QUEUE_HISTORY_KEY = web.AppKey("queue_history", QueueHistory)
