"""The gate's HTTP server: the operator console, JSON under ``/debug/`` and ``/api/``, ``/metrics``.

Built on aiohttp: it runs on the gate's own event loop (no thread, no second
server process), its handlers are coroutines that call the gate directly,
and it serves the console's static files from the package (nothing is
loaded from a CDN). Transport only: every answer comes from the gate, the
topo store or prometheus_client's registry.

Routes:

* pages: ``/`` (cluster), ``/vschema``, ``/queryz``, ``/querylogz``, ``/queues``,
  ``/streams``, ``/workflows``
* ``/debug/vars``, ``/debug/health``, ``/debug/queryz``, ``/debug/querylogz``,
  ``/debug/schemaz``, ``/debug/query_plans``, ``/debug/querylog`` (server-sent events)
* ``/api/cluster``, ``/api/vindex_types``, ``/api/vschema/{keyspace}`` (GET,
  PUT to save), ``/api/vschema/{keyspace}/check`` (POST), ``/api/queues``,
  ``/api/live``, ``/api/live/{id}/kill`` (POST)
* ``/api/stats``: the charts' figures (calls, errors, p50/p99 per 10 s per keyspace
  and shard, from the gate's :class:`~shardgate.gate.stats.Timeline`; stream lag)
* ``/api/workflows`` and ``/api/workflows/{name}/{action}`` (POST, admin: ``vdiff``,
  ``switch_reads``, ``switch_writes``, ``complete`` of a reshard or MoveTables workflow)
* ``/metrics``: Prometheus text format
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from shardgate.aio import wait_for
from shardgate.api.http import pages
from shardgate.api.http.auth import basic_auth, identity_of
from shardgate.api.http.model import (
    GATE_KEY,
    INBOXES_KEY,
    QUEUE_HISTORY_KEY,
    STARTED_KEY,
    WORKFLOW_ACTIONS,
    QueueHistory,
    cluster_doc,
    inboxes_doc,
    log_positions,
    parse_workflow_name,
    queryz_doc,
    queues_doc,
    registered_tablets,
    segmented_request,
    vschema_diff,
    workflows_doc,
)
from shardgate.auth.acl import Role
from shardgate.auth.users import StaticUsers
from shardgate.errors import Code, InvalidArgument, ShardgateError, VSchemaError
from shardgate.gate import Gate, worker
from shardgate.queues.inbox.registry import InboxRegistry
from shardgate.topo.lint import check_vschema
from shardgate.topo.store import TopoConflict
from shardgate.vindexes.registry import describe_types
from shardgate.workflows import metrics as reshard_metrics
from shardgate.workflows.base import list_workflows
from shardgate.workflows.movetables import MoveTablesWorkflow
from shardgate.workflows.reshard import ReshardWorkflow

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: HTTP status for each shardgate error code
HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400, Code.NOT_FOUND: 404, Code.ALREADY_EXISTS: 409,
    Code.ABORTED: 409, Code.FAILED_PRECONDITION: 412, Code.PERMISSION_DENIED: 403,
    Code.UNIMPLEMENTED: 501, Code.UNAVAILABLE: 503, Code.RESOURCE_EXHAUSTED: 429,
}



def error_response(exc: ShardgateError) -> web.Response:
    body: dict[str, Any] = {"code": exc.code.value, "message": exc.message}
    if isinstance(exc, VSchemaError):
        body["path"] = exc.path
    return web.json_response(body, status=HTTP_STATUS.get(exc.code, 500))


@web.middleware
async def coded_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every shardgate error becomes JSON ``{code, message[, path]}`` with its HTTP status."""
    try:
        return await handler(request)
    except ShardgateError as exc:
        return error_response(exc)


def make_app(gate: Gate, users: StaticUsers | None = None) -> web.Application:
    """The console application for ``gate`` (``users``: who may use it; see :mod:`.auth`)."""
    app = web.Application(middlewares=[basic_auth(users), coded_errors],
                          client_max_size=4 * 1024 * 1024)
    app[GATE_KEY] = gate
    app[STARTED_KEY] = time.time()
    app[INBOXES_KEY] = InboxRegistry(gate)
    app[QUEUE_HISTORY_KEY] = QueueHistory()
    app.on_response_prepare.append(_worker_header)
    static = resources.files("shardgate.api.http") / "static"
    app.add_routes([
        web.get("/", pages.cluster_page),
        web.get("/vschema", pages.vschema_page),
        web.get("/queryz", pages.queryz_page),
        web.get("/querylogz", pages.querylogz_page),
        web.get("/queues", pages.queues_page),
        web.get("/streams", pages.streams_page),
        web.get("/workflows", pages.workflows_page),
        web.get("/debug/vars", debug_vars),
        web.get("/debug/health", debug_health),
        web.get("/debug/queryz", debug_queryz),
        web.get("/debug/querylogz", debug_querylogz),
        web.get("/debug/schemaz", debug_schemaz),
        web.get("/debug/query_plans", debug_query_plans),
        web.get("/debug/querylog", debug_querylog_stream),
        web.get("/api/cluster", api_cluster),
        web.get("/api/vindex_types", api_vindex_types),
        web.get("/api/vschema/{keyspace}", api_vschema_get),
        web.put("/api/vschema/{keyspace}", api_vschema_save),
        web.post("/api/vschema/{keyspace}/check", api_vschema_check),
        web.get("/api/queues", api_queues),
        web.get("/api/queues/{keyspace}/{queue}/failed", api_queue_failed),
        web.get("/api/inboxes", api_inboxes),
        web.get("/api/inboxes/{keyspace}/{name}", api_inbox_stats),
        web.post("/api/queues/{keyspace}/{queue}/{action}", api_queue_action),
        web.get("/api/live", api_live),
        web.get("/api/streams", api_streams),
        web.get("/api/workflows", api_workflows),
        web.post("/api/workflows/{name}/{action}", api_workflow_action),
        web.get("/api/stats", api_stats),
        web.post("/api/live/{id}/kill", api_live_kill),
        web.get("/metrics", metrics),
        web.static("/static", str(static)),
    ])
    return app


#: the response header naming the worker that answered (``index/count pid P``)
WORKER_HEADER = "X-Shardgate-Worker"


async def _worker_header(request: web.Request, response: web.StreamResponse) -> None:
    """Name the worker process that answered (the console's views are per worker)."""
    response.headers[WORKER_HEADER] = worker.current().label()


class HttpServer:
    """The console server of one gate, on ``host:port`` (0: a free port).

    ``reuse_port``: share the port with the other workers of ``gate --workers N``
    (``SO_REUSEPORT``; the kernel spreads connections over them).
    """

    def __init__(self, gate: Gate, host: str = "127.0.0.1", port: int = 15000, *,
                 users: StaticUsers | None = None, reuse_port: bool = False) -> None:
        self.gate, self.host, self.port, self.users = gate, host, port, users
        self.reuse_port = reuse_port
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Start listening; return the port."""
        self._runner = web.AppRunner(make_app(self.gate, self.users), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port,
                           reuse_port=True if self.reuse_port else None)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


# -- cluster -------------------------------------------------------------------------


async def api_cluster(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    return web.json_response(cluster_doc(gate, await registered_tablets(gate),
                                         await log_positions(gate)))


async def api_stats(request: web.Request) -> web.Response:
    """The charts' figures: ``?minutes=N`` (default 5, at most 10) of the gate's
    timeline, and each shard's stream lag now (the page keeps its own history of it)."""
    gate = request.app[GATE_KEY]
    try:
        minutes = min(10.0, max(0.5, float(request.query.get("minutes", "5"))))
    except ValueError:
        raise InvalidArgument("'minutes' must be a number") from None
    doc = gate.timeline.series(minutes)
    lag: list[dict[str, Any]] = []
    for ks in cluster_doc(gate)["keyspaces"]:
        for s in ks["shards"]:
            lag.append({"keyspace": ks["name"], "shard": s["name"],
                        "reader_lag_seconds": s["reader_lag_seconds"]})
    consumers = [c.as_dict() for c in gate.streams.snapshot()]
    return web.json_response({**doc, "stream_lag": lag, "consumers": consumers})


async def api_vindex_types(request: web.Request) -> web.Response:
    return web.json_response(describe_types())


# -- VSchema ---------------------------------------------------------------------------


async def api_vschema_get(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    doc, version = await gate.topo.keyspace_vschema(request.match_info["keyspace"])
    return web.json_response({"keyspace": request.match_info["keyspace"], "vschema": doc,
                              "version": version})


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"the request body is not JSON: {exc}") from exc


async def api_vschema_check(request: web.Request) -> web.Response:
    """Errors, warnings and the diff against the saved version; nothing is written."""
    gate = request.app[GATE_KEY]
    ks = request.match_info["keyspace"]
    doc = await _json_body(request)
    saved, version = await gate.topo.keyspace_vschema(ks)
    found = check_vschema(gate.topology, ks, doc)
    return web.json_response({**found, "diff": vschema_diff(saved, doc, ks),
                              "version": version})


async def api_vschema_save(request: web.Request) -> web.Response:
    """Save ``{"vschema": doc, "version": N}``: checked again here, compare-and-swap on N."""
    gate = request.app[GATE_KEY]
    ks = request.match_info["keyspace"]
    body = await _json_body(request)
    if not isinstance(body, dict) or "vschema" not in body:
        raise InvalidArgument('send {"vschema": {...}, "version": N}')
    doc = body["vschema"]
    version = body.get("version")
    if version is not None and not isinstance(version, int):
        raise InvalidArgument("'version' must be the integer version the edit started from")
    tables = sorted((doc.get("tables") or {}) if isinstance(doc, dict) else {})
    saved_tables = sorted(gate.topology.keyspace(ks).vschema.get("tables") or {})
    gate.guard.require(identity_of(request), ks, sorted({*tables, *saved_tables, ""}),
                       Role.ADMIN)
    found = check_vschema(gate.topology, ks, doc)
    if found["errors"]:
        first = found["errors"][0]
        raise VSchemaError(f"{ks}.{first['path']}" if first["path"] else ks, first["message"])
    try:
        _, new_version = await gate.topo.update_vschema(ks, lambda _old: doc, expect=version)
    except TopoConflict as exc:
        return error_response(exc)
    gate.apply_topology(await gate.topo.load_topology())
    return web.json_response({"keyspace": ks, "version": new_version,
                              "warnings": found["warnings"]})


# -- queries ---------------------------------------------------------------------------


async def debug_queryz(request: web.Request) -> web.Response:
    return web.json_response(queryz_doc(request.app[GATE_KEY]))


async def debug_querylogz(request: web.Request) -> web.Response:
    limit = int(request.query.get("limit", "300"))
    gate = request.app[GATE_KEY]
    return web.json_response([e.as_dict() for e in gate.querylog.recent(limit)])


async def debug_querylog_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one ``data:`` line of JSON per finished statement."""
    gate = request.app[GATE_KEY]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    q = gate.querylog.subscribe()
    try:
        while True:
            try:
                entry = await wait_for(q.get(), 15.0)
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
                continue
            await resp.write(f"data: {json.dumps(entry.as_dict())}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        gate.querylog.unsubscribe(q)
    return resp


async def debug_query_plans(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    out = []
    for (sql, keyspace), planned in gate.plans.items():
        describe = getattr(planned, "describe", None)
        out.append({"sql": sql, "keyspace": keyspace,
                    "plan": describe() if describe is not None else repr(planned)})
    return web.json_response(out)


async def api_streams(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    return web.json_response([c.as_dict() for c in gate.streams.snapshot()])


async def api_workflows(request: web.Request) -> web.Response:
    """Workflow records of the topo store (lookup-vindex backfills, resharding)."""
    gate = request.app[GATE_KEY]
    return web.json_response(workflows_doc(await gate.topo.list_workflows()), dumps=_dumps)


async def api_workflow_action(request: web.Request) -> web.Response:
    """Run ``vdiff``, ``switch_reads``, ``switch_writes`` or ``complete`` on a reshard or
    MoveTables workflow (admin of its keyspace), as ``shardgate reshard`` would."""
    gate = request.app[GATE_KEY]
    name, action = request.match_info["name"], request.match_info["action"]
    kind, keyspace, workflow = parse_workflow_name(name)
    if action not in {a for actions in WORKFLOW_ACTIONS.values() for a in actions}:
        raise InvalidArgument(f"unknown workflow action {action!r}: one of vdiff, "
                              "switch_reads, switch_writes, complete")
    gate.guard.require(identity_of(request), keyspace, [""], Role.ADMIN)
    flow_class = MoveTablesWorkflow if kind == "movetables" else ReshardWorkflow
    flow = await flow_class.resume(gate.topo, keyspace, workflow)
    try:
        out: Any
        match action:
            case "vdiff":
                reports = [r.to_doc() for r in await flow.vdiff()]
                out = {"tables": reports}
            case "switch_reads":
                out = {"message": await flow.switch_reads()}
            case "switch_writes":
                out = await flow.switch_writes()
            case _:
                out = {"message": await flow.complete()}
    finally:
        await flow.close()
    return web.json_response({"workflow": name, "action": action, "result": out},
                             dumps=_dumps)


async def api_live(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    return web.json_response([q.as_dict() for q in gate.live.snapshot()])


async def api_live_kill(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    try:
        qid = int(request.match_info["id"])
    except ValueError:
        raise InvalidArgument("the query id must be an integer") from None
    live = {q.id: q for q in gate.live.snapshot()}
    if qid in live:  # killing needs admin where the statement runs
        gate.guard.require(identity_of(request), live[qid].keyspace or "", [""], Role.ADMIN)
    if not gate.live.kill(qid):
        raise ShardgateError(f"query {qid} is not running", code=Code.NOT_FOUND)
    return web.json_response({"killed": qid})


# -- schema, vars, health --------------------------------------------------------------


async def debug_schemaz(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    return web.json_response({ks.name: ks.vschema for ks in gate.topology.keyspaces.values()})


async def debug_vars(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    return web.json_response({
        "uptime_seconds": time.time() - request.app[STARTED_KEY],
        "topology_version": gate.topology.version,
        "plan_cache": {"size": len(gate.plans), "hits": gate.plans.hits,
                       "misses": gate.plans.misses},
        "live_queries": len(gate.live.snapshot()),
        "keyspaces": sorted(gate.topology.keyspaces),
        "tablets": len(gate.tablets),
    })


async def debug_health(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    degraded = gate.degraded
    me = worker.current()
    body = {"status": "degraded" if degraded else "ok", "degraded": degraded,
            "topology_version": gate.topology.version,
            "worker": {"index": me.index, "count": me.count, "pid": me.pid}}
    return web.json_response(body, status=200)


# -- queues ----------------------------------------------------------------------------


async def api_queues(request: web.Request) -> web.Response:
    """Every queue's figures now, with the recent samples its charts draw (``history``)."""
    doc = await queues_doc(request.app[GATE_KEY])
    history = request.app[QUEUE_HISTORY_KEY]
    history.add(doc)
    for q in doc:
        q["history"] = history.series(q["keyspace"], q["queue"])
    return web.json_response(doc, dumps=_dumps)


async def api_queue_failed(request: web.Request) -> web.Response:
    """The newest failed events of a queue table (id, shard by routing, attempts)."""
    gate = request.app[GATE_KEY]
    ks, queue = request.match_info["keyspace"], request.match_info["queue"]
    limit = min(int(request.query.get("limit", "50")), 1000)
    table = gate.vschema.find_table(queue, ks, ks)
    rows = []
    for shard in gate.topology.keyspace(table.keyspace).shards:
        session = gate.session(table.keyspace, identity=identity_of(request))
        await gate.execute(session, f"USE `{table.keyspace}:{shard.name}`")
        res = await gate.execute(
            session, f"SELECT id, epoch, time_scheduled FROM {table.name} "
            f"WHERE state = 'failed' ORDER BY id DESC LIMIT {limit}")
        # ids are 64-bit: as strings, JavaScript numbers would round them
        rows += [{"shard": shard.name, "id": str(r[0]), "epoch": r[1],
                  "time_scheduled": str(r[2])} for r in res.rows]
    return web.json_response(rows)


async def api_queue_action(request: web.Request) -> web.Response:
    """``retry`` (ids), ``requeue_failed``, ``purge_acked``, ``purge_failed``, ``pause``,
    ``resume``; body ``{"shard": "-80", "ids": [...]}`` (shard optional: all)."""
    gate = request.app[GATE_KEY]
    body = await _json_body(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise InvalidArgument('send {"shard": "...", "ids": [...]}')
    raw = body.get("ids") or []
    if not isinstance(raw, list) or not all(
        isinstance(i, int) or (isinstance(i, str) and i.lstrip("-").isdigit()) for i in raw
    ):
        raise InvalidArgument("'ids' must be a list of event ids (integers or digit strings)")
    ids = [int(i) for i in raw]
    shard = body.get("shard")
    ks, queue, action = (request.match_info["keyspace"], request.match_info["queue"],
                         request.match_info["action"])
    gate.guard.require(identity_of(request), ks, [queue], Role.ADMIN)
    if action in ("retry_job", "abort_job"):  # segmented queues: by job id, on one shard
        if not isinstance(shard, str) or not ids:
            raise InvalidArgument(f"{action} needs 'shard' and the job 'ids'")
        reason = body.get("reason")
        asked = await segmented_request(gate, ks, queue, shard, ids, action.removesuffix("_job"),
                                        reason if isinstance(reason, str) else None)
        return web.json_response({"requested": asked})
    changed = await gate.queue_admin(request.match_info["keyspace"], request.match_info["queue"],
                                     request.match_info["action"], shard=shard, ids=ids)
    return web.json_response({"changed": changed})


async def api_inboxes(request: web.Request) -> web.Response:
    """Every inbox store: its stored options and buckets."""
    return web.json_response(await inboxes_doc(request.app[INBOXES_KEY], request.app[GATE_KEY]),
                             dumps=_dumps)


async def api_inbox_stats(request: web.Request) -> web.Response:
    """One inbox store; ``?counts=1`` also counts its messages and pointers (reads every
    bucket)."""
    stats = await request.app[INBOXES_KEY].stats(
        request.match_info["keyspace"], request.match_info["name"],
        counts=request.query.get("counts") in ("1", "true"))
    return web.json_response(stats, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


async def metrics(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    with contextlib.suppress(ShardgateError):  # topo store unreachable: the last figures
        reshard_metrics.COLLECTOR.update(list_workflows(await gate.topo.list_workflows()))
    body = generate_latest(REGISTRY)
    resp = web.Response(body=body)
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp

