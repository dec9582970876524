"""The cost of result limits and timeouts on point selects (PostgreSQL, in-process gate).

With result limits on (the default), a tablet reads every query in chunks
(libpq's chunked mode) so that it can stop a result that is too large before
it is all in memory; with them off it reads the plain way (and psycopg
prepares the statement after five runs). The reference is the same gate with
every limit and timeout off; the other runs add result limits, then a
statement timeout as well. Rounds alternate, and the best round of each
counts (the machine is shared).

    python bench/result_limits.py [--seconds 2] [--rounds 3] [--smoke]

Prints ops/s of each and its ratio to the reference.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.gate.limits import GateLimits
from shardgate.result import ResultLimits

try:
    from bench._pg import drop_database, fresh_database, point_table
except ImportError:  # run as a script
    from _pg import (  # type: ignore[no-redef]
        drop_database,
        fresh_database,
        point_table,
    )

DB = "sg_bench_result_limits"
ROWS = 10_000

CONFIGS = {
    "no limits (reference)": GateLimits(result_limits=ResultLimits(0, 0)),
    "result limits": GateLimits(),
    "result limits + query timeout": GateLimits(query_timeout_ms=30_000),
}


async def ops_per_second(gate: Gate, seconds: float, keys: list[int]) -> float:
    session = gate.session("bench", identity=TRUSTED)
    sql = "SELECT id, v FROM t WHERE id = :id"
    for i in range(200):  # warm up: plan cache, prepared statements
        await gate.execute(session, sql, {"id": keys[i]})
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            r = await gate.execute(session, sql, {"id": keys[n & 4095]})
            assert len(r.rows) == 1
            n += 1
    return n / (time.perf_counter() - start)


async def main(seconds: float, rounds: int) -> None:
    url = fresh_database(DB)
    try:
        topo = point_table(url, ROWS)
        gates = {name: Gate.open(topo, pool_size=1, limits=limits)
                 for name, limits in CONFIGS.items()}
        keys = [random.randrange(ROWS) for _ in range(4096)]
        best = dict.fromkeys(CONFIGS, 0.0)
        try:
            for _ in range(rounds):
                for name, gate in gates.items():
                    best[name] = max(best[name], await ops_per_second(gate, seconds, keys))
        finally:
            for gate in gates.values():
                await gate.close()
        reference = best["no limits (reference)"]
        print(f"{'point select by primary vindex':<32}{'ops/s':>9}{'ratio':>8}")
        for name, value in best.items():
            print(f"{name:<32}{value:>9.0f}{value / reference:>8.2f}")
    finally:
        drop_database(DB)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    asyncio.run(main(0.2 if args.smoke else args.seconds, 1 if args.smoke else args.rounds))
