"""The event-loop thread's CPU per point select in ``Gate.execute`` (in-process gate).

One table ``t`` (10,000 rows) in a PostgreSQL and a MariaDB database, each
served as keyspace ``bench`` (one shard, ``hash`` primary vindex on ``id``)
by an in-process gate (``Gate.open``, with ``shardgate up``'s query timeout:
the timeout's bookkeeping is part of every statement). One client, sequentially,
``SELECT id, v FROM t WHERE id = :id``. The figure is the event-loop thread's
CPU time (``time.thread_time``) over the run divided by the selects: the
gate's routing, bookkeeping and the hand-off to the driver, plus the driver's
work on the loop thread (psycopg's async I/O; PyMySQL runs in a thread of its
own, which is not counted). Rounds alternate between the two backends.

    python bench/gate_execute_cpu.py [--seconds 3] [--rounds 3] [--profile] [--smoke]

``--profile`` prints cProfile's top functions of a run per backend instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import random
import statistics
import time

import pymysql

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.gate.limits import SERVER_QUERY_TIMEOUT_MS, GateLimits
from shardgate.topo import Topology

try:
    from bench._pg import drop_database, fresh_database
except ImportError:  # run as a script
    from _pg import drop_database, fresh_database  # type: ignore[no-redef]

DB = f"sg_bench_exec_cpu_{os.getpid()}"
ROWS = 10_000
MYSQL_HOST = os.environ.get("SHARDGATE_BENCH_MYSQL_HOST", "127.0.0.1")
MYSQL_PORT = int(os.environ.get("SHARDGATE_BENCH_MYSQL_PORT", "3306"))
SQL = "SELECT id, v FROM t WHERE id = :id"


def _mysql_admin() -> pymysql.connections.Connection:  # type: ignore[type-arg]
    return pymysql.connect(host=MYSQL_HOST, port=MYSQL_PORT, user="root", autocommit=True)


def fresh_mysql() -> str:
    conn = _mysql_admin()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{DB}`")
        cur.execute(f"CREATE DATABASE `{DB}` CHARACTER SET utf8mb4")
        cur.execute(f"CREATE TABLE `{DB}`.t (id BIGINT PRIMARY KEY, v VARCHAR(64))")
        for start in range(0, ROWS, 1000):
            cur.executemany(f"INSERT INTO `{DB}`.t VALUES (%s, %s)",
                            [(i, f"value {i}") for i in range(start, min(ROWS, start + 1000))])
    conn.close()
    return f"mysql://root@{MYSQL_HOST}:{MYSQL_PORT}/{DB}"


def drop_mysql() -> None:
    conn = _mysql_admin()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{DB}`")
    conn.close()


def fresh_pg() -> str:
    import psycopg

    url = fresh_database(DB)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s)",
                            [(i, f"value {i}") for i in range(ROWS)])
    return url


def topology(url: str) -> Topology:
    return Topology.from_dict({"default_keyspace": "bench", "keyspaces": {"bench": {
        "shards": {"-": url},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}})


async def run(gate: Gate, keys: list[int], seconds: float) -> tuple[int, float, float]:
    """Selects for about ``seconds``: (count, wall seconds, loop-thread CPU seconds)."""
    session = gate.session("bench", identity=TRUSTED)
    n = 0
    wall, cpu = time.perf_counter(), time.thread_time()
    deadline = wall + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            r = await gate.execute(session, SQL, {"id": keys[n & 4095]})
            assert len(r.rows) == 1
            n += 1
    return n, time.perf_counter() - wall, time.thread_time() - cpu


async def main(seconds: float, rounds: int, profile: bool) -> None:
    keys = [random.randrange(ROWS) for _ in range(4096)]
    limits = GateLimits(query_timeout_ms=SERVER_QUERY_TIMEOUT_MS)  # as `shardgate up` runs
    gates = {"postgresql": Gate.open(topology(fresh_pg()), pool_size=1, limits=limits),
             "mariadb": Gate.open(topology(fresh_mysql()), pool_size=1, limits=limits)}
    try:
        for gate in gates.values():
            await run(gate, keys, 0.3)  # warm up: connections, plan cache, prepared statements
        if profile:
            for name, gate in gates.items():
                prof = cProfile.Profile()
                prof.enable()
                n, _, _ = await run(gate, keys, seconds)
                prof.disable()
                print(f"\n{name}: {n} selects")
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        cpu: dict[str, list[float]] = {name: [] for name in gates}
        rate: dict[str, list[float]] = {name: [] for name in gates}
        for _ in range(rounds):
            for name, gate in gates.items():
                n, wall, used = await run(gate, keys, seconds)
                cpu[name].append(used / n * 1e6)
                rate[name].append(n / wall)
        print(f"in-process gate point select, one client; medians of {rounds} interleaved rounds "
              f"of {seconds:g} s ({os.cpu_count()} cores, shared with other work)")
        print(f"{'shard':<12}{'selects/s':>10}{'loop CPU us/select':>20}")
        for name in gates:
            print(f"{name:<12}{statistics.median(rate[name]):>10.0f}"
                  f"{statistics.median(cpu[name]):>20.0f}")
    finally:
        for gate in gates.values():
            await gate.close()
        drop_database(DB)
        drop_mysql()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile's top functions instead")
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    asyncio.run(main(0.3 if args.smoke else args.seconds, 1 if args.smoke else args.rounds,
                     args.profile))
