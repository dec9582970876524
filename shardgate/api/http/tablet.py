"""A tablet's small HTTP server: ``/metrics``, ``/debug/health``, ``/debug/vars``."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from shardgate.api.http.auth import basic_auth
from shardgate.auth.users import StaticUsers
from shardgate.tablet import Tablet

TABLET_KEY = web.AppKey("tablet", Tablet)
STARTED_KEY = web.AppKey("tablet_started", float)


async def metrics(request: web.Request) -> web.Response:
    resp = web.Response(body=generate_latest(REGISTRY))
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


async def health(request: web.Request) -> web.Response:
    tablet = request.app[TABLET_KEY]
    try:
        await tablet.backend.ping()
    except Exception as exc:  # the database is down: say so, 503
        return web.json_response({"status": "unhealthy", "error": str(exc)}, status=503)
    return web.json_response({"status": "ok", "keyspace": tablet.keyspace,
                              "shard": tablet.shard, "lease_holder": tablet.queues.leader})


async def debug_vars(request: web.Request) -> web.Response:
    tablet = request.app[TABLET_KEY]
    return web.json_response({
        "keyspace": tablet.keyspace, "shard": tablet.shard, "backend": tablet.dialect,
        "lease_holder": tablet.queues.leader,
        "uptime_seconds": time.time() - request.app[STARTED_KEY],
    })


async def serve_tablet_http(
    tablet: Tablet, host: str, port: int, *, users: StaticUsers | None = None
) -> tuple[web.AppRunner, int]:
    """Start the tablet's HTTP server; return its runner (cleanup() stops it) and port.

    ``users``: who may read it (HTTP Basic), as for the tablet's gRPC service.
    """
    app = web.Application(middlewares=[basic_auth(users)])
    app[TABLET_KEY] = tablet
    app[STARTED_KEY] = time.time()
    app.add_routes([web.get("/metrics", metrics), web.get("/debug/health", health),
                    web.get("/debug/vars", debug_vars)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    return runner, int(sockets[0].getsockname()[1]) if sockets else port
