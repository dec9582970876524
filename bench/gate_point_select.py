"""Point selects and single-row inserts: in-process gate vs psycopg, same database.

One PostgreSQL database holds table ``t``. shardgate sees it as a sharded
keyspace with one shard (``-``) and a ``hash`` primary vindex, so every gate
statement is planned (cache hit), routed through the vindex and sent to the
shard; the reference sends the same SQL straight to psycopg 3 (async, with
the same auto-prepare). Both run one client, sequentially, same durability.

    python bench/gate_point_select.py [--seconds 3] [--rounds 3] [--clients 1,8]
                                      [--workers 2] [--no-in-process] [--smoke]

Prints ops/s for each and the ratio gate/direct (goal: >= 0.6 for point
selects by primary vindex with bind variables).

Then **the application's path**: clients in processes of their own (1 and 8
of them, one connection each: GateClient over gRPC, and mysqlclient over the
gate's MySQL listener) against ``shardgate gate`` (a process, no tablet of
its own) in front of one ``shardgate tablet`` process, beside psycopg clients
in processes of their own against the same database (``--event-loop``: the
gate's and tablet's loop, uvloop when installed by default); the
gate's CPU per select (utime+stime of its worker processes from
``/proc/PID/stat`` over the run / selects) and the tablet's. A gate with
``--workers 2`` runs beside the 1-worker gate and the two are measured in
interleaved rounds (medians); the ratio is printed. The machine's other load
shares its cores with all of it: compare ratios within one run.

Then the console's cost: the same gate point selects with the gate's HTTP
server (console, /debug, /metrics) off and on, in interleaved rounds, with a
scraper reading ``/metrics`` and ``/debug/querylogz`` every second while it is
on (as Prometheus and an open console page would). Goal: within 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import psycopg

from shardgate.api.http import HttpServer
from shardgate.auth.identity import TRUSTED
from shardgate.cli.cluster import start_tablet, wait_for_tablets
from shardgate.gate import Gate
from shardgate.topo import Topology
from shardgate.topo.local import open_topo

try:
    from bench._app_path import ClientPool, GateProcess, RunResult, start_gate
    from bench._pg import drop_database, fresh_database
except ImportError:  # run as a script
    from _app_path import (  # type: ignore[no-redef]
        ClientPool,
        GateProcess,
        RunResult,
        start_gate,
    )
    from _pg import drop_database, fresh_database  # type: ignore[no-redef]

DB = "sg_bench_point"
ROWS = 10_000


async def timed(seconds: float, op: Callable[[int], Awaitable[None]]) -> float:
    """Run ``op(i)`` for ``seconds``; return operations per second."""
    for i in range(200):  # warm up: plan cache, prepared statements (ids below 0)
        await op(-1 - i)
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            await op(n)
            n += 1
        if time.perf_counter() >= deadline:
            break
    return n / (time.perf_counter() - start)


async def console_cost(
    gate: Gate, seconds: float, op: Callable[[int], Awaitable[None]], rounds: int = 3
) -> tuple[float, float]:
    """Median ops/s of ``op`` with the HTTP server off and on (scraped), interleaved."""
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        off.append(await timed(seconds, op))
        server = HttpServer(gate, "127.0.0.1", 0)
        port = await server.start()
        stop = asyncio.Event()

        async def scrape(port: int = port, stop: asyncio.Event = stop) -> None:
            async with aiohttp.ClientSession() as http:
                while not stop.is_set():
                    for path in ("/metrics", "/debug/querylogz"):
                        async with http.get(f"http://127.0.0.1:{port}{path}") as r:
                            await r.read()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)

        scraper = asyncio.create_task(scrape())
        try:
            on.append(await timed(seconds, op))
        finally:
            stop.set()
            await scraper
            await server.stop()
    return statistics.median(off), statistics.median(on)


def _median_run(runs: list[RunResult]) -> RunResult:
    """The run of median throughput (its CPU figures with it)."""
    return sorted(runs, key=lambda r: r.ops_per_s)[len(runs) // 2]


async def app_path(url: str, topology: Topology, keys: list[int], seconds: float,
                   rounds: int, clients: list[int], workers: int, event_loop: str) -> None:
    """Clients in processes of their own: psycopg, gate (1 worker), gate (``workers``)."""
    tmp = Path(tempfile.mkdtemp(prefix="sg-bench-app-"))
    topo_url = f"sqlite:///{tmp / 'topo.db'}"
    topo = await open_topo(url=topo_url)
    await topo.import_topology(topology)
    tablet_log = open(tmp / "tablet.log", "wb")  # noqa: SIM115 (closed below)
    tablet = start_tablet(topo_url, "bench", "-", "bench-app-1", log=tablet_log,
                          extra=("--event-loop", event_loop))
    gates: dict[int, GateProcess] = {}
    pool = ClientPool(max(clients), keys)
    try:
        try:
            await wait_for_tablets(topo.store, {"bench-app-1"},
                                   lease_holders={("bench", "-")})
        except Exception:
            print((tmp / "tablet.log").read_text()[-3000:])
            raise
        for w in sorted({1, workers}):
            gates[w] = start_gate(topo_url, w, event_loop)
        configs: list[tuple[str, str, int, int]] = []  # (label, kind, clients, workers)
        for c in clients:
            configs.append((f"psycopg, {c} client(s)", "pg", c, 0))
            configs.append((f"gate 1 worker, {c} client(s)", "gate", c, 1))
            configs.append((f"gate MySQL 1 worker, {c} client(s)", "mysql", c, 1))
            if workers > 1 and c == max(clients):
                configs.append((f"gate {workers} workers, {c} client(s)", "gate", c, workers))
        runs: dict[str, list[RunResult]] = {label: [] for label, *_ in configs}
        for _ in range(rounds):  # interleaved: each round runs every configuration once
            for label, kind, c, w in configs:
                if kind == "pg":
                    runs[label].append(pool.run("pg", url, c, seconds, {}))
                else:
                    g = gates[w]
                    target = g.target if kind == "gate" else g.mysql_target
                    runs[label].append(pool.run(kind, target, c, seconds, {
                        "gate": g.worker_pids, "tablet": [tablet.pid]}))
        med = {label: _median_run(r) for label, r in runs.items()}
        print(f"\napplication path: clients in processes of their own, one connection each; "
              f"gate = `shardgate gate` process -> `shardgate tablet` process -> PostgreSQL; "
              f"medians of {rounds} interleaved rounds of {seconds:g} s "
              f"(this machine: {os.cpu_count()} cores, shared with other work); "
              "clients: GateClient (gRPC), mysqlclient (gate MySQL listener), psycopg 3; "
              f"gate and tablet --event-loop {event_loop}")
        print(f"{'':<34}{'ops/s':>9}{'x psycopg':>11}{'gate CPU us/op':>16}"
              f"{'tablet CPU us/op':>18}{'clients us/op':>15}{'machine us/op':>15}"
              "  connections per worker")
        for label, _kind, c, _w in configs:
            r = med[label]
            ref = med[f"psycopg, {c} client(s)"].ops_per_s
            gate_cpu = f"{r.cpu_us['gate']:.0f}" if "gate" in r.cpu_us else "-"
            tablet_cpu = f"{r.cpu_us['tablet']:.0f}" if "tablet" in r.cpu_us else "-"
            split = " ".join(f"w{k}:{v}" for k, v in sorted(r.per_worker.items()))
            print(f"{label:<34}{r.ops_per_s:>9.0f}{r.ops_per_s / ref:>11.3f}{gate_cpu:>16}"
                  f"{tablet_cpu:>18}{r.cpu_us['clients']:>15.0f}{r.cpu_us['machine']:>15.0f}"
                  f"  {split}")
        c = max(clients)
        direct = med[f"psycopg, {c} client(s)"]
        budget = 1e6 * (os.cpu_count() or 1) / (0.35 * direct.ops_per_s)
        print(f"the machine's CPU budget per select at 0.35x psycopg with {c} clients "
              f"({0.35 * direct.ops_per_s:.0f} selects/s on {os.cpu_count()} cores): "
              f"{budget:.0f} us for everything (clients, gate, tablet, PostgreSQL, kernel); "
              f"psycopg's own path takes {direct.cpu_us['machine']:.0f} us of it")
        if workers > 1:
            c = max(clients)
            one = [r.ops_per_s for r in runs[f"gate 1 worker, {c} client(s)"]]
            many = [r.ops_per_s for r in runs[f"gate {workers} workers, {c} client(s)"]]
            ratios = [m / o for m, o in zip(many, one, strict=True)]
            print(f"gate {workers} workers / 1 worker, {c} clients: median ratio of rounds "
                  f"{statistics.median(ratios):.2f} (rounds: "
                  f"{', '.join(f'{x:.2f}' for x in ratios)}; goal >= 1.4)")
        print("goals (issue 17): >= 0.35x psycopg with 8 clients; gate CPU <= 250 us/select")
        c = max(clients)
        ref_cpu = med[f"psycopg, {c} client(s)"].cpu_us["machine"]
        for kind in ("gate", "gate MySQL"):
            r = med[f"{kind} 1 worker, {c} client(s)"]
            print(f"issue 31, {kind} 1 worker, {c} clients: machine CPU per select "
                  f"{r.cpu_us['machine'] / ref_cpu:.1f}x psycopg's (goal <= 4x); gate "
                  f"{r.cpu_us['gate']:.0f} us, tablet {r.cpu_us['tablet']:.0f} us per select "
                  "(goals <= 150 each)")
    finally:  # the processes go first: an orphaned tablet would keep the shard's lease
        for g in gates.values():
            g.stop()
        tablet.terminate()
        tablet.wait(30)
        tablet_log.close()
        await topo.close()
        pool.close()


async def main(seconds: float, rounds: int, clients: list[int], workers: int,
               in_process: bool, event_loop: str = "auto") -> None:
    url = fresh_database(DB)
    direct = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await direct.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
    await direct.execute("CREATE TABLE ins_direct (id BIGINT PRIMARY KEY, v TEXT)")
    await direct.execute("CREATE TABLE ins_gate (id BIGINT PRIMARY KEY, v TEXT)")
    async with direct.cursor() as cur:
        await cur.executemany("INSERT INTO t VALUES (%s, %s)",
                              [(i, f"value {i}") for i in range(ROWS)])
    await direct.execute("ANALYZE t")
    topo = Topology.from_dict({"keyspaces": {"bench": {
        "shards": {"-": url},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {t: {"column_vindexes": [{"column": "id", "name": "hash"}]}
                               for t in ("t", "ins_gate")}},
    }}})
    gate = Gate.open(topo, pool_size=1)
    session = gate.session("bench", identity=TRUSTED)
    keys = [random.randrange(ROWS) for _ in range(4096)]

    async def gate_select(i: int) -> None:
        r = await gate.execute(session, "SELECT id, v FROM t WHERE id = :id",
                               {"id": keys[i & 4095]})
        assert len(r.rows) == 1

    async def direct_select(i: int) -> None:
        cur = await direct.execute("SELECT id, v FROM t WHERE id = %s", (keys[i & 4095],))
        assert len(await cur.fetchall()) == 1

    async def gate_insert(i: int) -> None:
        await gate.execute(session, "INSERT INTO ins_gate (id, v) VALUES (:id, :v)",
                           {"id": i, "v": "x"})

    async def direct_insert(i: int) -> None:
        await direct.execute("INSERT INTO ins_direct (id, v) VALUES (%s, %s)", (i, "x"))

    try:
        if clients:
            await app_path(url, topo, keys, seconds, rounds, clients, workers, event_loop)
        if not in_process:
            return
        results = []
        for name, g_op, d_op in (("point select", gate_select, direct_select),
                                 ("single-row insert", gate_insert, direct_insert)):
            d = await timed(seconds, d_op)
            g = await timed(seconds, g_op)
            results.append((name, g, d))
        print(f"{'statement':<20}{'gate ops/s':>12}{'psycopg ops/s':>15}{'ratio':>8}")
        for name, g, d in results:
            print(f"{name:<20}{g:>12.0f}{d:>15.0f}{g / d:>8.2f}")
        off, on = await console_cost(gate, seconds, gate_select)
        print(f"console off {off:.0f} ops/s, on (scraped every 1 s) {on:.0f} ops/s: "
              f"ratio on/off {on / off:.3f} (medians of interleaved rounds; goal >= 0.95)")
    finally:
        await gate.close()
        await direct.close()
        drop_database(DB)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (application path)")
    ap.add_argument("--clients", default="1,8",
                    help="client processes of the application path runs, comma-separated "
                    "('' skips the application path)")
    ap.add_argument("--workers", type=int, default=2,
                    help="also a gate with this many workers (most clients only; 1: none)")
    ap.add_argument("--no-in-process", dest="in_process", action="store_false",
                    help="only the application path")
    ap.add_argument("--event-loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                    help="the gate's and tablet's event loop (auto: uvloop when installed)")
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    if args.smoke:
        asyncio.run(main(0.3, 1, [1, 2] if counts else [], args.workers, args.in_process,
                         args.event_loop))
    else:
        asyncio.run(main(args.seconds, args.rounds, counts, args.workers, args.in_process,
                         args.event_loop))
