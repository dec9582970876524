"""The gate -> tablet hop against the gate's own pools (issue #31): CPU per point select.

One PostgreSQL database holds table ``t`` (keyspace ``bench``, one shard ``-``,
``hash`` vindex), served by one ``shardgate tablet`` process found through a
SQLite topo store. Two ``shardgate gate`` processes on that store:

* **direct** (the default): autocommit SELECTs go from the gate to PostgreSQL
  through the gate's own pool (``shardgate/gate/direct.py``);
* **via tablets** (``--via-tablets``): every statement crosses the gRPC hop to
  the tablet process, which sends it to PostgreSQL (the path before).

Clients are processes of their own (``--clients`` of them, one connection each:
GateClient over gRPC, or mysqlclient over the gate's MySQL listener), beside
psycopg clients straight to the database, in interleaved rounds (medians).

    python bench/gate_hop.py [--seconds 3] [--rounds 3] [--clients 8] [--smoke]

Prints, per path: selects/s, the CPU per select of the gate process, of the
tablet process, of the clients and of the whole machine (``/proc/<pid>/stat``
and ``/proc/stat`` over the run), and the machine's CPU per select as a ratio to
psycopg's (issue #31's goals: gate and tablet <= 150 us each, machine <= 4x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import tempfile
from pathlib import Path

from shardgate.cli.cluster import start_tablet, wait_for_tablets
from shardgate.topo.local import open_topo

try:
    from bench._app_path import ClientPool, GateProcess, RunResult, start_gate
    from bench._pg import drop_database, fresh_database, point_table
except ImportError:  # run as a script
    from _app_path import (  # type: ignore[no-redef]
        ClientPool,
        GateProcess,
        RunResult,
        start_gate,
    )
    from _pg import (  # type: ignore[no-redef]
        drop_database,
        fresh_database,
        point_table,
    )

DB = "sg_bench_gate_hop"
ROWS = 10_000
#: the gates compared: label -> extra `shardgate gate` flags
GATES = {"direct": (), "via tablets": ("--via-tablets",)}


def _median(runs: list[RunResult]) -> RunResult:
    return sorted(runs, key=lambda r: r.ops_per_s)[len(runs) // 2]


async def main(seconds: float, rounds: int, clients: int) -> None:
    url = fresh_database(DB)
    topology = point_table(url, ROWS)
    keys = [random.randrange(ROWS) for _ in range(4096)]
    tmp = Path(tempfile.mkdtemp(prefix="sg-gate-hop-"))
    topo_url = f"sqlite:///{tmp / 'topo.db'}"
    topo = await open_topo(url=topo_url)
    await topo.import_topology(topology)
    tablet = start_tablet(topo_url, "bench", "-", "bench-hop-1", log=subprocess.DEVNULL)
    gates: dict[str, GateProcess] = {}
    pool = ClientPool(clients, keys)
    try:
        await wait_for_tablets(topo.store, {"bench-hop-1"}, lease_holders={("bench", "-")})
        for label, extra in GATES.items():
            gates[label] = start_gate(topo_url, 1, extra=extra)
        configs = [("psycopg", "pg", "")]
        for label in GATES:
            configs += [(f"{label}, gRPC", "gate", label), (f"{label}, MySQL", "mysql", label)]
        runs: dict[str, list[RunResult]] = {name: [] for name, *_ in configs}
        for _ in range(rounds):  # interleaved: each round runs every configuration once
            for name, kind, label in configs:
                if kind == "pg":
                    runs[name].append(pool.run("pg", url, clients, seconds, {}))
                    continue
                g = gates[label]
                target = g.target if kind == "gate" else g.mysql_target
                runs[name].append(pool.run(kind, target, clients, seconds, {
                    "gate": g.worker_pids, "tablet": [tablet.pid]}))
        med = {name: _median(r) for name, r in runs.items()}
        ref = med["psycopg"]
        print(f"point selects, {clients} client processes, medians of {rounds} interleaved "
              f"rounds of {seconds:g} s; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"{'':<22}{'ops/s':>8}{'gate us':>9}{'tablet us':>11}{'clients us':>12}"
              f"{'machine us':>12}{'x psycopg CPU':>15}")
        for name, _kind, _label in configs:
            r = med[name]
            gate = f"{r.cpu_us['gate']:.0f}" if "gate" in r.cpu_us else "-"
            tab = f"{r.cpu_us['tablet']:.0f}" if "tablet" in r.cpu_us else "-"
            print(f"{name:<22}{r.ops_per_s:>8.0f}{gate:>9}{tab:>11}"
                  f"{r.cpu_us['clients']:>12.0f}{r.cpu_us['machine']:>12.0f}"
                  f"{r.cpu_us['machine'] / ref.cpu_us['machine']:>15.1f}")
        print("goals (issue 31): gate <= 150 us and tablet <= 150 us per select; machine CPU "
              "per select <= 4x psycopg's")
    finally:
        for g in gates.values():
            g.stop()
        tablet.terminate()
        tablet.wait(30)
        pool.close()
        await topo.close()
        drop_database(DB)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    if args.smoke:
        asyncio.run(main(0.3, 1, 2))
    else:
        asyncio.run(main(args.seconds, args.rounds, args.clients))
