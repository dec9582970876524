"""Point selects and single-row inserts: in-process gate vs psycopg, same database.

One PostgreSQL database holds table ``t``. shardgate sees it as a sharded
keyspace with one shard (``-``) and a ``hash`` primary vindex, so every gate
statement is planned (cache hit), routed through the vindex and sent to the
shard; the reference sends the same SQL straight to psycopg 3 (async, with
the same auto-prepare). Both run one client, sequentially, same durability.

    python bench/gate_point_select.py [--seconds 3] [--smoke]

Prints ops/s for each and the ratio gate/direct (goal: >= 0.6 for point
selects by primary vindex with bind variables).

Then the console's cost: the same gate point selects with the gate's HTTP
server (console, /debug, /metrics) off and on, in interleaved rounds, with a
scraper reading ``/metrics`` and ``/debug/querylogz`` every second while it is
on (as Prometheus and an open console page would). Goal: within 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import psycopg

from shardgate.api.http import HttpServer
from shardgate.gate import Gate
from shardgate.topo import Topology

try:
    from bench._pg import drop_database, fresh_database
except ImportError:  # run as a script
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


async def main(seconds: float) -> None:
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
    session = gate.session("bench")
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
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    asyncio.run(main(0.2 if args.smoke else args.seconds))
