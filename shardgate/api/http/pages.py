"""The console's HTML pages: server-rendered, with light JavaScript (static/console.js).

Every value shown is escaped; URLs are shown redacted. Pages read the same
documents the JSON APIs serve, so a page and its API cannot disagree.
"""

from __future__ import annotations

import html
import json
from typing import Any

from aiohttp import web

from shardgate.api.http.model import (
    GATE_KEY,
    cluster_doc,
    log_positions,
    queryz_doc,
    registered_tablets,
)

NAV = [("/", "Cluster"), ("/vschema", "VSchema"), ("/queryz", "Queries"),
       ("/querylogz", "Query log"), ("/queues", "Queues"), ("/streams", "Streams"),
       ("/workflows", "Workflows")]

#: a query slower than this (mean) is coloured on /queryz
SLOW_SECONDS = 0.1


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def layout(title: str, body: str, *, active: str, script: str = "") -> web.Response:
    nav = "".join(
        f'<a href="{href}" class="{"active" if href == active else ""}">{esc(name)}</a>'
        for href, name in NAV)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>shardgate · {esc(title)}</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body><header><span class="brand">shardgate</span><nav>{nav}</nav></header>
<main><h1>{esc(title)}</h1>{body}</main>
<script src="/static/console.js"></script>{script}</body></html>"""
    return web.Response(text=page, content_type="text/html")


def table(headers: list[str], rows: list[list[str]], *, id_: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{id_}"' if id_ else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


async def cluster_page(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    doc = cluster_doc(gate, await registered_tablets(gate), await log_positions(gate))
    rows = []
    for ks in doc["keyspaces"]:
        for s in ks["shards"]:
            tablet = s["tablet"] or {}
            procs = s["tablets"]
            holder = (f'<span class="holder">{esc(s["lease_holder"])}</span>'
                      if s["lease_holder"] else
                      '<span class="muted">none seen: another process, or not taken yet'
                      "</span>")
            # the shard's log end now; a stream reader's position (if one runs) beside it
            readers = ([(t["alias"], t["position"]) for t in procs if t.get("position")]
                       if procs else
                       [("reader", s["reader_position"])] if s["reader_position"] else [])
            position = (f'<code class="log-end">{esc(s["log_position"])}</code>'
                        if s["log_position"] else
                        f'<span class="muted log-note">{esc(s["log_note"])}</span>') + "".join(
                f'<br><small>{esc(who)} at <code>{esc(at)}</code></small>' for who, at in readers)
            if procs:  # production mode: the registered tablet processes
                kind = "<br>".join(f'{esc(t["alias"])} {esc(t["address"])}' for t in procs)
                holder += "<br>" + "<br>".join(
                    f'<small>{esc(t["alias"])}: {esc(t["role"])}</small>' for t in procs)
                health = "<br>".join(esc(t["health"]) for t in procs)
            else:
                kind = esc(tablet.get("kind", ""))
                health = esc(tablet.get("health", ""))
            rows.append([esc(ks["name"]), esc(s["name"]), esc(s["key_range"]),
                         esc(s["backend"]), f'<code>{esc(s["url"])}</code>',
                         "serving" if s["serving"] else "not serving",
                         kind, holder, health, position])
    status = (f'<p class="warning">degraded: {esc(doc["degraded"])}</p>'
              if doc["degraded"] else "")
    body = (f'<p>topology version {doc["topology_version"]} from '
            f'<code>{esc(doc["topo"])}</code></p>{status}'
            + table(["keyspace", "shard", "key range", "backend", "database", "state",
                     "tablet", "lease holder", "health", "change-log position"], rows,
                    id_="shards")
            + '<h2>Traffic, last 5 minutes</h2><div id="charts">loading…</div>')
    return layout("Cluster", body, active="/", script="<script>sg.clusterCharts()</script>")


async def vschema_page(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    names = sorted(gate.topology.keyspaces)
    chosen = request.query.get("keyspace", names[0] if names else "")
    side = "".join(
        f'<a href="/vschema?keyspace={esc(n)}" class="{"active" if n == chosen else ""}">'
        f"{esc(n)}</a>" for n in names)
    body = f"""
<div class="editor" data-keyspace="{esc(chosen)}">
  <aside class="keyspaces">{side}</aside>
  <section>
    <div class="toolbar">
      <button id="mode-form">Form</button> <button id="mode-json">JSON</button>
      <label class="upload">Upload <input type="file" id="upload" accept=".json"></label>
      <a id="download" download="{esc(chosen)}.vschema.json">Download</a>
      <button id="save" disabled>Save</button> <span id="status"></span>
    </div>
    <div id="form"></div>
    <textarea id="json" spellcheck="false" hidden></textarea>
    <h2>Checks</h2><ul id="findings"></ul>
    <h2>Relationships</h2><div id="relations"></div>
    <h2>Change</h2><pre id="diff"></pre>
  </section>
</div>"""
    return layout("VSchema editor", body, active="/vschema",
                  script="<script>sg.vschemaEditor()</script>")


async def queryz_page(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    rows = []
    for q in queryz_doc(gate):
        try:
            plan = json.dumps(gate.explain(q["query"]), indent=1)
        except Exception:  # a statement the gate answers itself has no plan to show
            plan = ""
        cls = "slow" if q["mean_seconds"] > SLOW_SECONDS else ""
        rows.append([f'<span class="{cls}">{esc(q["query"])}</span>', esc(q["count"]),
                     f'{q["total_seconds"]:.4f}', f'{q["max_seconds"]:.4f}', esc(q["rows"]),
                     esc(q["shard_calls"]), esc(q["errors"]),
                     f"<details><summary>plan</summary><pre>{esc(plan)}</pre></details>"])
    body = table(["query", "count", "total s", "max s", "rows", "shard calls", "errors",
                  "plan"], rows, id_="queryz")
    return layout("Queries", body, active="/queryz")


async def querylogz_page(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    live = [[esc(q.id), esc(q.keyspace), f"<code>{esc(q.sql)}</code>",
             f"{q.as_dict()['seconds']:.3f}",
             f'<button class="kill" data-id="{q.id}">kill</button>']
            for q in gate.live.snapshot()]
    log = [[esc(e.at), esc(e.keyspace), f"<code>{esc(e.sql)}</code>", f"{e.seconds:.4f}",
            esc(e.rows), esc(e.shard_calls), esc(e.error or "")]
           for e in gate.querylog.recent(300)]
    body = ("<h2>Live</h2>" + table(["id", "keyspace", "sql", "running s", ""], live, id_="live")
            + "<h2>Recent</h2>" + table(["time", "keyspace", "sql", "seconds", "rows",
                                         "shard calls", "error"], log, id_="querylog"))
    return layout("Query log", body, active="/querylogz",
                  script="<script>sg.killButtons()</script>")


async def queues_page(request: web.Request) -> web.Response:
    body = '<div id="queues">loading…</div>'
    return layout("Queues", body, active="/queues", script="<script>sg.queuesPage()</script>")


async def streams_page(request: web.Request) -> web.Response:
    body = '<div id="streams">loading…</div>'
    return layout("Change streams", body, active="/streams",
                  script="<script>sg.streamsPage()</script>")


async def workflows_page(request: web.Request) -> web.Response:
    body = '<p id="wf-status"></p><div id="workflows">loading…</div>'
    return layout("Workflows", body, active="/workflows",
                  script="<script>sg.workflowsPage()</script>")
