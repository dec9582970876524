"""Resharding on MariaDB: does catch-up keep up with unpaced writes?

Keyspace ``app`` on two MariaDB shards ``-80``, ``80-`` holding ``--rows`` rows,
split into four (``--sources 1``: one shard ``-`` into two), all on one server.
After ``create`` (the copy), ``--writers`` tasks in this process's one asyncio
loop insert and update rows of ``t`` through a gate
as fast as they can for ``--seconds``, while a follower (``ReshardWorkflow.follow``,
as ``reshard run --follow`` runs it) in the same loop keeps the targets caught up.
Each second it prints the writes/s committed, the row changes/s the catch-up applied
to the targets, and how far the stream is behind the source's binlog (transactions,
by GTID sequence number); then how long the follower takes to drain once the writers
stop.

    python bench/reshard_mariadb_catchup.py [--seconds 20] [--writers 4] [--rows 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows import catchup
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow

VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}
DDL = "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, n INT NOT NULL)"
ADMIN = {"host": "127.0.0.1", "port": 3306, "user": "root"}


def _database(name: str, drop: bool = False) -> str:
    conn = pymysql.connect(**ADMIN, autocommit=True)  # type: ignore[arg-type]
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            if not drop:
                cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    return f"mysql://root@127.0.0.1:3306/{name}"


class Counted:
    """Row changes the catch-up applied (wraps ``Applier.apply`` for the run)."""

    def __init__(self) -> None:
        self.rows = 0
        self.calls = 0
        self.apply_s = 0.0
        self._orig: Any = catchup.Applier.apply

    def __enter__(self) -> Counted:
        orig, me = self._orig, self

        async def apply(applier: catchup.Applier, txs: Any, keep: Any = None) -> None:
            t0 = time.perf_counter()
            await orig(applier, txs, keep)
            me.apply_s += time.perf_counter() - t0
            me.rows += sum(len(tx.changes) for tx in txs)
            me.calls += 1
        catchup.Applier.apply = apply  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        catchup.Applier.apply = self._orig  # type: ignore[method-assign]


async def _writer(gate: Gate, k: int, stop: asyncio.Event, done: list[int],
                  errors: list[str]) -> None:
    s = gate.session("app", identity=TRUSTED)
    i = 10_000_000 * (k + 1)
    while not stop.is_set():
        try:
            await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, 'w', 0)", {"i": i})
            await gate.execute(s, "UPDATE t SET n = n + 1 WHERE id = :i", {"i": i})
            done[0] += 2
        except Exception as exc:  # reported: the figure is "no error"
            errors.append(f"{type(exc).__name__}: {exc}")
        i += 1


async def _behind(flow: ReshardWorkflow) -> int:
    status = await flow.status()
    return sum(int(s["behind"] or 0) for s in status["streams"].values())


async def main(args: argparse.Namespace) -> None:
    tag = secrets.token_hex(3)
    if args.sources == 1:
        sources, targets = ["-"], ["-80", "80-"]
    else:
        sources, targets = ["-80", "80-"], ["-40", "40-80", "80-c0", "c0-"]
    names = [f"sg_bench_mcu_{n}_{tag}" for n in range(len(sources) + len(targets))]
    urls = [_database(n) for n in names]
    src = dict(zip(sources, urls, strict=False))
    dst = dict(zip(targets, urls[len(sources):], strict=True))
    tmp = tempfile.TemporaryDirectory()
    topo = f"sqlite:///{Path(tmp.name) / 'topo.db'}"
    try:
        server = TopoServer(open_topo_store(topo))
        await server.import_topology(Topology.from_dict(
            {"keyspaces": {"app": {"shards": src, "vschema": VSCHEMA}}}))
        gate = await Gate.from_topo(server)
        s = gate.session("app", identity=TRUSTED)
        await gate.execute(s, DDL)
        for start in range(1, args.rows + 1, 500):
            ids = range(start, min(start + 500, args.rows + 1))
            await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                               + ", ".join(f"({i}, 'v', 0)" for i in ids))
        spec = ReshardSpec(keyspace="app", sources=tuple(sources), targets=tuple(targets),
                           target_urls=tuple(sorted(dst.items())), workflow="bench")
        flow = ReshardWorkflow(server, spec)
        await flow.create()
        await flow.release()
        follower = await ReshardWorkflow.resume(server, "app", "bench")
        watcher = ReshardWorkflow(server, spec)
        stop_w, stop_f = asyncio.Event(), asyncio.Event()
        done, errors = [0], []
        with Counted() as counted:
            following = asyncio.create_task(follower.follow(stop_f))
            writers = [asyncio.create_task(_writer(gate, k, stop_w, done, errors))
                       for k in range(args.writers)]
            t0 = time.perf_counter()
            last = (t0, 0, 0)
            print(" t(s)  writes/s  applied/s  behind(tx)")
            while time.perf_counter() - t0 < args.seconds:
                await asyncio.sleep(1.0)
                now, behind = time.perf_counter(), await _behind(watcher)
                dt = now - last[0]
                print(f"{now - t0:5.1f}  {(done[0] - last[1]) / dt:8.0f}  "
                      f"{(counted.rows - last[2]) / dt:9.0f}  {behind:10d}")
                last = (now, done[0], counted.rows)
            stop_w.set()
            await asyncio.gather(*writers)
            total_s = time.perf_counter() - t0
            writes, applied = done[0], counted.rows
            t_stop = time.perf_counter()
            while await _behind(watcher) > 0 and time.perf_counter() - t_stop < 300:
                await asyncio.sleep(0.2)
            drain = time.perf_counter() - t_stop
            stop_f.set()
            await following
        print(f"writes: {writes} in {total_s:.1f}s = {writes / total_s:,.0f}/s "
              f"({len(errors)} errors); applied while writing: {applied} = "
              f"{applied / total_s:,.0f} rows/s in {counted.calls} applies "
              f"taking {counted.apply_s:.1f}s; "
              f"drained {drain:.1f}s after the writers stopped")
        if errors:
            print("first error:", errors[0])
        await follower.close()
        await watcher.close()
        await flow.close()
        await gate.close()
        await server.close()
    finally:
        for n in names:
            with contextlib.suppress(Exception):
                _database(n, drop=True)
        tmp.cleanup()


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--sources", type=int, choices=(1, 2), default=2,
                   help="1: split - into 2; 2: split -80,80- into 4 (one server)")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(_args(sys.argv[1:])))
