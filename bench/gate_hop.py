"""The cost of the gate -> tablet hop: point selects, in-process tablets vs tablet processes.

One PostgreSQL database holds table ``t`` (one shard ``-``, ``hash`` vindex).
Two gates serve it in the same run: ``Gate.open`` (the tablet inside the
gate's process, ``shardgate up``) and a gate with no tablet of its own that
reaches a ``shardgate tablet`` process over gRPC (``shardgate gate --topo``,
found through a SQLite topo store). Both run one client, sequentially, with
the same statements and keys.

    python bench/gate_hop.py [--seconds 3] [--smoke]

Prints ops/s of each and the ratio processes/in-process (the reference is
the in-process gate; the ratio is what the extra hop costs).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from shardgate.api.grpc.remote_gate import open_remote_gate
from shardgate.auth.identity import TRUSTED
from shardgate.cli.cluster import start_tablet, wait_for_tablets
from shardgate.gate import Gate
from shardgate.topo.local import open_topo

try:
    from bench._pg import drop_database, fresh_database, point_table
    from bench.gate_point_select import timed
except ImportError:  # run as a script
    from _pg import (  # type: ignore[no-redef]
        drop_database,
        fresh_database,
        point_table,
    )
    from gate_point_select import timed  # type: ignore[no-redef]

DB = "sg_bench_gate_hop"
ROWS = 10_000


async def main(seconds: float) -> None:
    url = fresh_database(DB)
    topology = point_table(url, ROWS)
    keys = [random.randrange(ROWS) for _ in range(4096)]
    tmp = Path(tempfile.mkdtemp(prefix="sg-gate-hop-"))
    topo_url = f"sqlite:///{tmp / 'topo.db'}"
    topo = await open_topo(url=topo_url)
    await topo.import_topology(topology)
    tablet = start_tablet(topo_url, "bench", "-", "bench-hop-1", log=subprocess.DEVNULL)
    local = Gate.open(topology, pool_size=1)
    try:
        await wait_for_tablets(topo.store, {"bench-hop-1"}, lease_holders={("bench", "-")})
        remote, fleet = await open_remote_gate(topo, owns_topo=False)
        gates = {"in-process": local, "processes": remote}

        def select(gate: Gate) -> Callable[[int], Awaitable[None]]:
            session = gate.session("bench", identity=TRUSTED)

            async def op(i: int) -> None:
                r = await gate.execute(session, "SELECT id, v FROM t WHERE id = :id",
                                       {"id": keys[i & 4095]})
                assert len(r.rows) == 1

            return op

        rates = {name: await timed(seconds, select(g)) for name, g in gates.items()}
        ratio = rates["processes"] / rates["in-process"]
        print(f"{'point select through':<32}{'ops/s':>10}")
        print(f"{'gate + in-process tablet (ref)':<32}{rates['in-process']:>10.0f}")
        print(f"{'gate -> tablet process (gRPC)':<32}{rates['processes']:>10.0f}")
        print(f"ratio processes/in-process: {ratio:.2f} "
              f"(extra hop {1e6 / rates['processes'] - 1e6 / rates['in-process']:.0f} us/op)")
        await remote.close()
        await fleet.close()
    finally:
        await local.close()
        tablet.kill()
        tablet.wait(10)
        await topo.close()
        drop_database(DB)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    asyncio.run(main(0.2 if args.smoke else args.seconds))
