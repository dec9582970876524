"""A scatter aggregate over 4 shards vs the same query on one database holding all rows.

Table ``orders(id, customer_id, region, amount)``, 1M rows (``--rows``), loaded
with COPY twice on the machine's PostgreSQL: split over 4 shard databases
(each row on the shard of its keyspace id, computed with the gate's own
``hash`` vindex on ``id`` and shard map) and whole into one single database.
The query::

    SELECT region, COUNT(*), SUM(amount), MIN(amount), MAX(amount), AVG(amount)
    FROM orders GROUP BY region

(50 groups) runs through the in-process gate on the 4-shard keyspace (the
shards aggregate in parallel, the gate combines the partial aggregates) and
directly with psycopg on the single database (where PostgreSQL may use its own
parallel workers). Runs alternate, after one warm-up each; the median of
``--repeat`` runs is reported, with the ratio single/gate: above 1 means the
gate is faster. The two results must be equal (numbers compared by value).

    python bench/scatter_aggregate.py [--rows 1000000] [--repeat 7] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any

import psycopg

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.keys import KeyRange, ShardMap
from shardgate.topo import Topology
from shardgate.vindexes import create_vindex

try:
    from bench._pg import drop_database, fresh_database
except ImportError:  # run as a script
    from _pg import drop_database, fresh_database  # type: ignore[no-redef]

SHARDS = 4
REGIONS = 50
PREFIX = "sg_bench_scatter"
DDL = ("CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL, "
       "region VARCHAR(8) NOT NULL, amount BIGINT NOT NULL)")
QUERY = ("SELECT region, COUNT(*), SUM(amount), MIN(amount), MAX(amount), AVG(amount) "
         "FROM orders GROUP BY region")
VSCHEMA = {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}},
    "tables": {"orders": {"column_vindexes": [{"column": "id", "name": "hash"}]}},
}

Row = tuple[int, int, str, int]


def generate(rows: int) -> list[Row]:
    """Reproducible rows: ids 1..rows, 50 regions, amounts in cents (some negative)."""
    rnd = random.Random(20261120)
    return [
        (i, rnd.randrange(1, rows // 10 + 2), f"r{rnd.randrange(REGIONS):02d}",
         rnd.randrange(-1_000, 100_000))
        for i in range(1, rows + 1)
    ]


def place(rows: Sequence[Row], names: Sequence[str]) -> dict[str, list[Row]]:
    """Split ``rows`` over the shards as the gate would route them (hash of ``id``)."""
    vindex = create_vindex("hash", "h", {})
    smap = ShardMap.from_names(names)
    ksids = vindex.map([r[0] for r in rows])  # type: ignore[attr-defined]
    out: dict[str, list[Row]] = {n: [] for n in names}
    for row, ks in zip(rows, ksids, strict=True):
        out[smap.find(ks[0])].append(row)
    return out


def copy_rows(url: str, rows: Sequence[Row]) -> None:
    """Create the table and COPY ``rows`` into it; then ANALYZE and VACUUM."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)
        buf = io.StringIO()
        for r in rows:
            buf.write(f"{r[0]}\t{r[1]}\t{r[2]}\t{r[3]}\n")
        with conn.cursor() as cur, cur.copy(
            "COPY orders (id, customer_id, region, amount) FROM STDIN"
        ) as copy:
            copy.write(buf.getvalue())
        conn.execute("VACUUM ANALYZE orders")


def normalised(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows sorted by group, numbers as ``Decimal(str(x))`` (representation only)."""
    return sorted(
        tuple(Decimal(str(v)) if isinstance(v, int | float | Decimal) else v for v in r)
        for r in rows
    )


async def timed(repeat: int, runs: Sequence[Callable[[], Awaitable[Any]]]) -> list[list[float]]:
    """Warm each run up once, then time them alternately ``repeat`` times (seconds)."""
    for run in runs:
        await run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for i, run in enumerate(runs):
            start = time.perf_counter()
            await run()
            times[i].append(time.perf_counter() - start)
    return times


async def main(rows: int, repeat: int) -> int:
    names = [kr.name for kr in KeyRange(b"", b"").split(SHARDS)]
    shard_dbs = {n: f"{PREFIX}_{i}" for i, n in enumerate(names)}
    single_db = f"{PREFIX}_single"
    data = generate(rows)
    placed = place(data, names)
    started = time.perf_counter()
    shard_urls = {n: fresh_database(db) for n, db in shard_dbs.items()}
    for n, url in shard_urls.items():
        copy_rows(url, placed[n])
    copy_rows(single_url := fresh_database(single_db), data)
    del data
    print(f"loaded {rows} rows twice (4 shards: "
          f"{', '.join(f'{n} {len(r)}' for n, r in placed.items())}) "
          f"in {time.perf_counter() - started:.1f} s")

    topo = Topology.from_dict({"keyspaces": {"bench": {"shards": shard_urls, "vschema": VSCHEMA}}})
    gate = Gate.open(topo, pool_size=1)
    session = gate.session("bench", identity=TRUSTED)
    direct = await psycopg.AsyncConnection.connect(single_url, autocommit=True)
    results: dict[str, list[tuple[Any, ...]]] = {}

    async def via_gate() -> None:
        results["gate"] = (await gate.execute(session, QUERY)).rows

    async def via_psycopg() -> None:
        cur = await direct.execute(QUERY)
        results["single"] = await cur.fetchall()

    try:
        single_t, gate_t = (statistics.median(t)
                            for t in await timed(repeat, (via_psycopg, via_gate)))
        g, s = normalised(results["gate"]), normalised(results["single"])
        equal = g == s
        print(f"query: {QUERY}")
        print(f"{len(s)} groups, median of {repeat} runs")
        print(f"{'single database (psycopg)':<30}{single_t * 1000:>10.1f} ms")
        print(f"{'gate, 4 shards':<30}{gate_t * 1000:>10.1f} ms")
        print(f"{'ratio single/gate':<30}{single_t / gate_t:>10.2f}")
        print(f"results equal: {equal}")
        if not equal:
            names = ("region", "count", "sum", "min", "max", "avg")
            cols = sorted({names[i] for a, b in zip(g, s, strict=False)
                           for i in range(len(names)) if a[i] != b[i]})
            print(f"columns that differ: {cols}; rows: {len(g)} (gate) vs {len(s)} (single)")
            diff = [(a, b) for a, b in zip(g, s, strict=False) if a != b][:2]
            print(f"first differences (gate, single): {diff}")
        return 0 if equal else 1
    finally:
        await direct.close()
        await gate.close()
        for db in (*shard_dbs.values(), single_db):
            drop_database(db)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="20k rows, 3 runs: for CI")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.repeat = 20_000, 3
    raise SystemExit(asyncio.run(main(args.rows, args.repeat)))
