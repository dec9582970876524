"""Point selects by primary vindex through the MySQL listener vs straight to MariaDB vs gRPC.

One MariaDB database holds table ``t`` (10,000 rows). A ``shardgate gate``
process serves it as keyspace ``bench`` (one shard, ``hash`` primary vindex
on ``id``) over gRPC and the MySQL protocol. One client, sequentially:

* **mysql listener**: PyMySQL to the gate's MySQL port, ``SELECT id, v FROM t
  WHERE id = <n>`` (PyMySQL interpolates the value client-side, as usual);
* **direct**: the same PyMySQL statement straight to the MariaDB database;
* **grpc**: the gate's asyncio gRPC client, the same select with a bind variable;
* **bare proxy** (the floor of any proxy in Python): PyMySQL through a
  process of its own running an asyncio server that only copies bytes between
  the client and MariaDB (no parsing, no routing). A Python process in the
  path costs two more loopback round trips and event-loop wake-ups per
  statement; what that alone costs is the most any listener in Python can reach.

The four run in alternating rounds of 0.25 s, so a busy machine slows all
four alike and the ratios stay meaningful.

    python bench/mysql_point_select.py [--seconds 3] [--smoke]

Prints ops/s of each, and each one's ratio to direct (goal for the listener:
>= 0.5), and the listener's ratio to the bare proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pymysql

from shardgate.api.grpc.client import GateClient
from shardgate.topo import Topology, write_cluster_file

#: Per process, so two runs at once (two checkouts on one machine) do not drop each other's rows.
DB = f"sg_bench_mysql_point_{os.getpid()}"
ROWS = 10_000
HOST = os.environ.get("SHARDGATE_BENCH_MYSQL_HOST", "127.0.0.1")
PORT = int(os.environ.get("SHARDGATE_BENCH_MYSQL_PORT", "3306"))
START_TIMEOUT_S = 60
#: Seconds of one path before the next one's turn.
ROUND_S = 0.25


def _admin() -> pymysql.connections.Connection:  # type: ignore[type-arg]
    return pymysql.connect(host=HOST, port=PORT, user="root", autocommit=True)


def fresh_database() -> None:
    conn = _admin()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{DB}`")
        cur.execute(f"CREATE DATABASE `{DB}` CHARACTER SET utf8mb4")
        cur.execute(f"CREATE TABLE `{DB}`.t (id BIGINT PRIMARY KEY, v VARCHAR(64))")
        for start in range(0, ROWS, 1000):
            cur.executemany(f"INSERT INTO `{DB}`.t VALUES (%s, %s)",
                            [(i, f"value {i}") for i in range(start, min(ROWS, start + 1000))])
    conn.close()


def drop_database() -> None:
    conn = _admin()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{DB}`")
    conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gate(workdir: Path, event_loop: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """``shardgate gate`` over the database; its process, gRPC port and MySQL port."""
    topo = Topology.from_dict({"default_keyspace": "bench", "keyspaces": {"bench": {
        "shards": {"-": f"mysql://root@{HOST}:{PORT}/{DB}"},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}})
    cluster = workdir / "cluster.yaml"
    write_cluster_file(topo, cluster)
    grpc_port, mysql_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", "up", "--cluster", str(cluster),
         "--event-loop", event_loop,
         "--port", str(grpc_port), "--mysql-port", str(mysql_port), "--http-port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"shardgate gate exited: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        try:
            socket.create_connection(("127.0.0.1", mysql_port), timeout=1).close()
            return proc, grpc_port, mysql_port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("shardgate gate did not start")


PROXY = r'''
import asyncio, sys

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
    finally:
        writer.close()

async def handle(client_reader, client_writer):
    server_reader, server_writer = await asyncio.open_connection(sys.argv[1], int(sys.argv[2]))
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[3]))
    async with server:
        await server.serve_forever()

asyncio.run(main())
'''


def start_proxy() -> tuple[subprocess.Popen[bytes], int]:
    """The bare proxy (``PROXY``) in a process of its own, in front of MariaDB; its port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", PROXY, HOST, str(PORT), str(port)])
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the bare proxy did not start")


class Rate:
    """Operations and seconds of one path, summed over its rounds."""

    def __init__(self) -> None:
        self.ops = 0
        self.seconds = 0.0

    def per_second(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


def sync_round(seconds: float, op: Callable[[int], None], rate: Rate) -> None:
    """Run ``op(i)`` for about ``seconds``; add to ``rate``."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            op(rate.ops + n)
            n += 1
    rate.ops += n
    rate.seconds += time.perf_counter() - start


async def async_round(seconds: float, op: Callable[[int], Awaitable[None]], rate: Rate) -> None:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            await op(rate.ops + n)
            n += 1
    rate.ops += n
    rate.seconds += time.perf_counter() - start


def pymysql_op(conn: Any, keys: list[int]) -> Callable[[int], None]:
    cur = conn.cursor()

    def op(i: int) -> None:
        cur.execute("SELECT id, v FROM t WHERE id = %s", (keys[i & 4095],))
        assert len(cur.fetchall()) == 1

    return op


async def measure(grpc_port: int, mysql_port: int, proxy_port: int, seconds: float,
                  keys: list[int]) -> tuple[float, float, float, float]:
    """The four paths in alternating rounds (the machine's load hits all alike)."""
    direct_conn = pymysql.connect(host=HOST, port=PORT, user="root", database=DB,
                                  autocommit=True)
    listener_conn = pymysql.connect(host="127.0.0.1", port=mysql_port, user="root",
                                    database="bench", autocommit=True)
    proxy_conn = pymysql.connect(host="127.0.0.1", port=proxy_port, user="root", database=DB,
                                 autocommit=True)
    direct_op, listener_op = pymysql_op(direct_conn, keys), pymysql_op(listener_conn, keys)
    proxy_op = pymysql_op(proxy_conn, keys)
    rates = Rate(), Rate(), Rate(), Rate()
    rounds = max(1, int(seconds / ROUND_S))
    try:
        async with GateClient(f"grpc://127.0.0.1:{grpc_port}", keyspace="bench") as client:
            async def grpc_op(i: int) -> None:
                r = await client.execute("SELECT id, v FROM t WHERE id = :id",
                                         {"id": keys[i & 4095]})
                assert len(r.rows) == 1

            warm = Rate()
            sync_round(0.2, direct_op, warm)  # warm up: connections, plan cache
            sync_round(0.2, listener_op, warm)
            sync_round(0.2, proxy_op, warm)
            await async_round(0.2, grpc_op, warm)
            for _ in range(rounds):
                sync_round(ROUND_S, direct_op, rates[0])
                sync_round(ROUND_S, listener_op, rates[1])
                await async_round(ROUND_S, grpc_op, rates[2])
                sync_round(ROUND_S, proxy_op, rates[3])
    finally:
        direct_conn.close()
        listener_conn.close()
        proxy_conn.close()
    return (rates[0].per_second(), rates[1].per_second(), rates[2].per_second(),
            rates[3].per_second())


def main(seconds: float, event_loop: str) -> None:
    fresh_database()
    keys = [random.randrange(ROWS) for _ in range(4096)]
    with tempfile.TemporaryDirectory() as tmp:
        proc, grpc_port, mysql_port = start_gate(Path(tmp), event_loop)
        proxy, proxy_port = start_proxy()
        try:
            direct, listener, grpc, bare = asyncio.run(
                measure(grpc_port, mysql_port, proxy_port, seconds, keys))
        finally:
            for p in (proc, proxy):
                p.terminate()
                p.wait(timeout=30)
            drop_database()
    print("point select by primary vindex, one client (reference: PyMySQL straight to MariaDB); "
          f"the gate: `shardgate up --event-loop {event_loop}`, the bare proxy: asyncio")
    print(f"{'path':<28}{'ops/s':>10}{'ratio':>8}")
    print(f"{'direct (PyMySQL->MariaDB)':<28}{direct:>10.0f}{1.0:>8.2f}")
    print(f"{'mysql listener (PyMySQL)':<28}{listener:>10.0f}{listener / direct:>8.2f}")
    print(f"{'grpc (GateClient)':<28}{grpc:>10.0f}{grpc / direct:>8.2f}")
    print(f"{'bare proxy (PyMySQL)':<28}{bare:>10.0f}{bare / direct:>8.2f}")
    print(f"listener / bare proxy: {listener / bare:.2f} (the bare proxy is the floor of any "
          "Python process in the path)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    ap.add_argument("--event-loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                    help="the gate's event loop (auto: uvloop when installed)")
    args = ap.parse_args()
    main(0.2 if args.smoke else args.seconds, args.event_loop)
