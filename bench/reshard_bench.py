"""Resharding on PostgreSQL: copy rate, catch-up lag during the copy, write pause at cut-over.

Keyspace ``app`` on 2 PostgreSQL shards (``-80``, ``80-``); shard ``-80`` holds N rows
(COPied straight into it). The benchmark splits ``-80`` into ``-40`` and ``40-80``
in-process and prints, in one run:

1. **copy rate**: rows/s of the workflow's copy phase (``create``), against a raw
   ``COPY (SELECT ...) TO STDOUT | COPY ... FROM STDIN`` of the same rows between the
   same source and a scratch database on the same server (goal: >= 0.5x);
2. **catch-up lag during the copy**: writers insert and update through a gate at
   ``--copy-rate`` writes/s while the copy runs; the largest ``lag_s`` / ``behind``
   (WAL bytes) the streams recorded, and the lag once ``create`` returns;
3. **write pause at cut-over**: writers at ``--rate`` writes/s (aimed: about 1,000)
   through the gate while ``switch-traffic --writes`` runs: the longest single write,
   the writes/s actually reached, and the errors (goal: < 500 ms, none).

    python bench/reshard_bench.py [--rows 100000] [--rate 1000] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pg import drop_database, fresh_database

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.keys import parse_shard_name
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow

PREFIX = "sg_bench_reshard"
DDL = "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, n INT NOT NULL)"
VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}


def _load(url: str, rows: int) -> None:
    vindex = create_vindex("hash", "hash", {})
    assert isinstance(vindex, SingleColumn)
    kr = parse_shard_name("-80")
    with contextlib.closing(psycopg.connect(url, autocommit=True)) as conn:
        conn.execute(DDL)
        n, i = 0, 0
        with conn.cursor() as cur, cur.copy("COPY t (id, v, n) FROM STDIN") as copy:
            while n < rows:
                i += 1
                if kr.contains(vindex.map([i])[0][0]):
                    copy.write_row((i, f"value {i} " + "x" * 20, 0))
                    n += 1


def _raw_copy(src: str, dst: str, again: bool = False) -> tuple[int, float]:
    with contextlib.closing(psycopg.connect(src, autocommit=True)) as a, \
            contextlib.closing(psycopg.connect(dst, autocommit=True)) as b:
        b.execute("DROP TABLE t" if again else "SELECT 1")
        b.execute(DDL)
        start = time.perf_counter()
        n = 0
        with a.cursor().copy("COPY t (id, v, n) TO STDOUT") as out, \
                b.cursor().copy("COPY t (id, v, n) FROM STDIN") as into:
            for data in out:
                into.write(data)
        seconds = time.perf_counter() - start
        n = b.execute("SELECT COUNT(*) FROM t").fetchone()[0]  # type: ignore[index]
    return int(n), seconds


class Writers:
    """``tasks`` writers through the gate at ``rate`` writes/s together."""

    def __init__(self, gate: Gate, rate: float, tasks: int = 8) -> None:
        self.gate, self.rate, self.ntasks = gate, rate, tasks
        self.stop = asyncio.Event()
        self.done = 0
        self.errors: list[str] = []
        self.slowest = 0.0
        #: when (wall clock) the slowest write started
        self.slowest_at = 0.0
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, base: int) -> None:
        self.stop.clear()
        self.slowest, self.done, self.started = 0.0, 0, time.perf_counter()
        self.tasks = [asyncio.create_task(self._run(base + k * 10_000_000))
                      for k in range(self.ntasks)]

    async def halt(self) -> float:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        return self.done / (time.perf_counter() - self.started)

    async def _run(self, next_id: int) -> None:
        s = self.gate.session("app", identity=TRUSTED)
        interval = self.ntasks / self.rate
        due = time.perf_counter()
        while not self.stop.is_set():
            t0, wall = time.perf_counter(), time.time()
            try:
                await self.gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, 'w', 0)",
                                        {"i": next_id})
                self.done += 1
            except Exception as exc:  # counted and reported: the figure is "no error"
                self.errors.append(f"{type(exc).__name__}: {exc}")
            took = time.perf_counter() - t0
            if took > self.slowest:
                self.slowest, self.slowest_at = took, wall
            next_id += 1
            due += interval
            await asyncio.sleep(max(0.0, due - time.perf_counter()))


async def main(args: argparse.Namespace) -> None:
    names = [f"{PREFIX}_{n}" for n in ("a", "b", "c", "d", "raw", "topo")]
    src, other, t1, t2, raw, topo_db = (fresh_database(n) for n in names)
    try:
        _load(src, args.rows)
        with contextlib.closing(psycopg.connect(other, autocommit=True)) as conn:
            conn.execute(DDL)
        n_raw, raw_s = _raw_copy(src, raw)

        server = TopoServer(open_topo_store(topo_db))
        await server.import_topology(Topology.from_dict(
            {"keyspaces": {"app": {"shards": {"-80": src, "80-": other}, "vschema": VSCHEMA}}}))
        gate = await Gate.from_topo(server)
        flow_server = TopoServer(open_topo_store(topo_db))
        spec = ReshardSpec(keyspace="app", sources=("-80",), targets=("-40", "40-80"),
                           target_urls=(("-40", t1), ("40-80", t2)))
        flow = ReshardWorkflow(flow_server, spec)
        writers = Writers(gate, args.copy_rate, tasks=2)
        try:
            worst = {"lag_s": 0.0, "behind": 0}
            stop_watch = asyncio.Event()

            async def watch() -> None:
                while not stop_watch.is_set():
                    rec = await server.get_workflow(spec.record)
                    if rec is not None and rec.doc is not None:
                        for s in rec.doc["streams"].values():
                            worst["lag_s"] = max(worst["lag_s"], float(s.get("lag_s", 0)))
                    await asyncio.sleep(0.1)

            watcher = asyncio.create_task(watch())
            writers.start(1_000_000_000)
            start, cpu = time.perf_counter(), time.process_time()
            await flow.create()
            copy_s, cpu = time.perf_counter() - start, time.process_time() - cpu
            copy_rate = await writers.halt()
            stop_watch.set()
            await watcher
            status = await flow.status()
            copied = status["rows_copied"]
            print(f"copy: {copied} rows in {copy_s:.2f}s = {copied / copy_s:,.0f} rows/s "
                  f"(create: copy + catch-up); raw COPY|COPY: {n_raw} rows in {raw_s:.2f}s = "
                  f"{n_raw / raw_s:,.0f} rows/s; ratio {copied / copy_s / (n_raw / raw_s):.2f}x")
            rows_s = max(float(s.get("copy_s", 0.0)) for s in status["streams"].values())
            if rows_s > 0:
                print(f"copy phase alone (rows read and written, no slot creation or "
                      f"catch-up): {copied / rows_s:,.0f} rows/s; ratio "
                      f"{copied / rows_s / (n_raw / raw_s):.2f}x")
                # the shared machine's load moves both figures: the raw copy again, now
                n_again, again_s = _raw_copy(src, raw, again=True)
                print(f"raw COPY|COPY again after the copy: {n_again / again_s:,.0f} rows/s; "
                      f"copy phase ratio to it {copied / rows_s / (n_again / again_s):.2f}x; "
                      f"this process's CPU during create {cpu:.2f}s (writers included)")
            print(f"catch-up during the copy: writers at {copy_rate:,.0f} writes/s; largest "
                  f"recorded lag {worst['lag_s']:.2f}s; after create: "
                  + ", ".join(f"{k}: {v['lag_s']:.2f}s, {v['behind']} WAL bytes behind"
                              for k, v in status["streams"].items()))

            await flow.close()
            # the cut-over runs as operators run it: the CLI, in its own process
            await _cli(topo_db, "switch-traffic", "--reads")
            writers = Writers(gate, args.rate, tasks=args.tasks)
            writers.start(2_000_000_000)
            await asyncio.sleep(1.0)
            seen = asyncio.create_task(_serving(gate, "-40"))
            out = await _cli(topo_db, "switch-traffic", "--writes")
            await asyncio.sleep(1.0)
            reached = await writers.halt()
            print(f"write cut-over: {out.strip()}; writers at {reached:,.0f} writes/s; longest "
                  f"write {writers.slowest * 1000:.0f} ms; errors {len(writers.errors)} "
                  f"{writers.errors[:2]}")
            published = re.search(r"published at ([0-9.]+)", out)
            if published is not None and seen.done():
                at = float(published.group(1))
                print(f"timeline: the longest write started {1000 * (at - writers.slowest_at):.0f}"
                      f" ms before the switch was published; the gate served it "
                      f"{1000 * (seen.result() - at):.0f} ms after; the write ended "
                      f"{1000 * (writers.slowest_at + writers.slowest - at):.0f} ms after")
            seen.cancel()
            await _cli(topo_db, "complete")
        finally:
            await flow.close()
            await flow_server.close()
            await gate.close()
    finally:
        if not args.keep:
            for n in names:
                drop_database(n)


async def _serving(gate: Gate, shard: str) -> float:
    """When (wall clock) ``gate`` serves ``shard`` of ``app`` (polled every 2 ms)."""
    while shard not in {s.name for s in gate.topology.keyspace("app").shards}:
        await asyncio.sleep(0.002)
    return time.time()


async def _cli(topo: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shardgate.cli", "reshard", *args, "--keyspace", "app",
        "--topo", topo, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"reshard {' '.join(args)} failed: {err.decode()}")
    return out.decode()


def _args(argv: list[str] | None = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=1000.0, help="writes/s at the cut-over")
    p.add_argument("--tasks", type=int, default=16, help="writer tasks at the cut-over")
    p.add_argument("--copy-rate", type=float, default=200.0, help="writes/s during the copy")
    p.add_argument("--smoke", action="store_true", help="small and quick (CI)")
    p.add_argument("--keep", action="store_true", help="keep the databases")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.rate = 5000, 200.0
    return args


if __name__ == "__main__":
    asyncio.run(main(_args()))
