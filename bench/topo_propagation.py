"""VSchema change propagation between two gates, and the lookup vindex backfill rate.

1. Two gates follow one topo store (a PostgreSQL database; ``--topo-sqlite`` for a
   SQLite file): gate A runs ``ALTER VSCHEMA`` (add / drop a column vindex, in turn),
   the benchmark measures how long until gate B serves it. Reference: the watcher's
   poll interval (200 ms) -- the ratio says how many intervals a change takes.
2. The backfill workflow copies N owner rows on 4 PostgreSQL shards into a lookup
   table (in-process, no settle wait, no writers). Reference: a plain
   ``INSERT INTO lookup SELECT ...`` of the same N rows on one database.

    python bench/topo_propagation.py [--smoke] [--changes 50] [--rows 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pg import drop_database, fresh_database

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.topo.watch import DEFAULT_INTERVAL
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.lookup_vindex import LookupVindexSpec, LookupVindexWorkflow

PREFIX = "sg_bench_topo"


def topology(shards: list[str], lookup: str) -> Topology:
    urls = {kr.name: url for kr, url in zip(KeyRange(b"", b"").split(len(shards)), shards,
                                            strict=True)}
    return Topology.from_dict({"keyspaces": {
        "app": {"shards": urls, "vschema": {
            "sharded": True, "vindexes": {"hash": {"type": "hash"}},
            "tables": {"owner": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}},
        "lk": {"shards": {"0": lookup}, "vschema": {"sharded": False}}}})


async def propagation(topo_url: str, topo: Topology, changes: int) -> list[float]:
    server_a = TopoServer(open_topo_store(topo_url))
    await server_a.import_topology(topo, replace=True)
    a = await Gate.from_topo(server_a, watch=False)
    b = await Gate.from_topo(TopoServer(open_topo_store(topo_url)))
    s = a.session("app", identity=TRUSTED)
    times: list[float] = []
    try:
        for i in range(changes):
            add = i % 2 == 0
            sql = ("ALTER VSCHEMA ON owner ADD VINDEX xx(n) USING xxhash" if add
                   else "ALTER VSCHEMA ON owner DROP VINDEX xx")
            await a.execute(s, sql)
            start = time.perf_counter()
            while ("xx" in b.vschema.keyspace("app").vindexes) != add:
                if time.perf_counter() - start > 10:
                    raise RuntimeError("a change did not reach gate B within 10 s")
                await asyncio.sleep(0.002)
            times.append(time.perf_counter() - start)
    finally:
        await a.close()
        await b.close()
        await server_a.close()
    return times


def load(gate: Gate, rows: int) -> None:
    """The owner rows, COPied straight into the shard ``hash`` places each on."""
    ks = gate.topology.keyspace("app")
    vindex = create_vindex("hash", "hash", {})
    assert isinstance(vindex, SingleColumn)
    ids = list(range(1, rows + 1))
    per_shard: dict[str, list[int]] = {s.name: [] for s in ks.shards}
    for i, ksids in zip(ids, vindex.map(ids), strict=True):
        per_shard[ks.shard_map.find(ksids[0])].append(i)
    for shard in ks.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn, conn.cursor() as cur, \
                cur.copy("COPY owner (id, email, n) FROM STDIN") as copy:
            for i in per_shard[shard.name]:
                copy.write_row((i, f"e{i}@x", 0))


async def backfill(topo_url: str, topo: Topology, rows: int) -> float:
    server = TopoServer(open_topo_store(topo_url))
    await server.import_topology(topo, replace=True)
    gate = await Gate.from_topo(server, watch=False)
    s = gate.session("app", identity=TRUSTED)
    try:
        await gate.execute(s, "CREATE TABLE owner (id BIGINT PRIMARY KEY, "
                              "email VARCHAR(64) NOT NULL, n INT)")
        load(gate, rows)
        spec = LookupVindexSpec(keyspace="app", table="owner", columns=("email",),
                                vindex_type="consistent_lookup_unique",
                                lookup_table="lk.owner_email_lookup")
        flow = LookupVindexWorkflow(gate, server, spec, batch=1000, settle_s=0.0)
        t0 = time.perf_counter()
        await flow.create()
        return time.perf_counter() - t0
    finally:
        await gate.close()


def insert_select(url: str, rows: int) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE owner (id BIGINT PRIMARY KEY, email VARCHAR(64) NOT NULL, "
                     "n INT)")
        conn.execute("INSERT INTO owner SELECT i, 'e' || i || '@x', 0 "
                     "FROM generate_series(1, %s) i", (rows,))
        conn.execute("CREATE TABLE lookup (email VARCHAR(255) PRIMARY KEY, "
                     "keyspace_id BYTEA NOT NULL)")
        t0 = time.perf_counter()
        conn.execute("INSERT INTO lookup SELECT email, int8send(id) FROM owner")
        return time.perf_counter() - t0


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few seconds")
    p.add_argument("--changes", type=int, default=50)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--topo-sqlite", action="store_true", help="a SQLite topo store")
    args = p.parse_args()
    changes, rows = (6, 4000) if args.smoke else (args.changes, args.rows)
    names = [f"{PREFIX}_{i}" for i in range(4)] + [f"{PREFIX}_lk", f"{PREFIX}_store",
                                                   f"{PREFIX}_ref"]
    try:
        shards = [fresh_database(n) for n in names[:4]]
        lookup = fresh_database(names[4])
        store = fresh_database(names[5])
        if args.topo_sqlite:
            store_path = Path(f"/tmp/{PREFIX}.topo.db")
            store_path.unlink(missing_ok=True)
            store = f"sqlite:///{store_path}"
        topo = topology(shards, lookup)

        times = await propagation(store, topo, changes)
        median, worst = statistics.median(times), max(times)
        print(f"propagation over {changes} changes ({store.split(':')[0]} store): "
              f"median {median * 1000:.0f} ms, max {worst * 1000:.0f} ms")
        print(f"  reference: the watcher's poll interval {DEFAULT_INTERVAL * 1000:.0f} ms; "
              f"ratio median/interval {median / DEFAULT_INTERVAL:.2f}, "
              f"max/interval {worst / DEFAULT_INTERVAL:.2f}")

        took = await backfill(store, topo, rows)
        ref = insert_select(fresh_database(names[6]), rows)
        print(f"backfill of {rows} rows from 4 PostgreSQL shards: {took:.2f} s, "
              f"{rows / took:,.0f} rows/s (copy, verify, workflow records)")
        print(f"  reference: INSERT ... SELECT of the same rows on one database: {ref:.2f} s, "
              f"{rows / ref:,.0f} rows/s; ratio backfill/reference {ref / took:.3f}")
    finally:
        for n in names:
            drop_database(n)


if __name__ == "__main__":
    asyncio.run(main())
