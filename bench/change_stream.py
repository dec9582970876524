"""Change streams: row events/s to a gate stream client vs the raw log decoder, and latency.

For PostgreSQL (pgoutput) and MariaDB (binlog), on the same data in one run:

1. a backlog of ``--rows`` row changes (inserts in transactions of 100 rows,
   then updates of the same rows) is written to a one-shard keyspace;
2. **raw**: the backend's decoder alone reads the backlog in one thread
   (psycopg2 replication + our pgoutput decoder; ``mysql-replication``), no
   asyncio hand-off;
3. **gate**: an in-process gate's ``update_stream`` client reads the same
   backlog from the saved start position (log reader thread -> tablet stream
   -> gate merge -> client), counting row events;
4. **floor** (PostgreSQL): the server's own decoding of the same backlog with
   ``pgoutput`` (``pg_logical_slot_peek_binary_changes`` on a slot created
   before the backlog, counting the row messages), no client at all: the
   physical limit any reader of the log meets;
5. **latency**: a live gate stream while a writer commits single-row
   transactions at ``--rate`` per second; commit-to-client latency is the
   client's receive time minus the time the writer sent the COMMIT.

Rates are counted from the first row delivered to the last (steady state; the
time to the first row, connection and slot set-up included, is printed
apart), medians of ``--rounds`` interleaved floor/raw/gate rounds. Prints
events/s, the gate/raw ratio (goals: PostgreSQL >= 0.5, MariaDB >= 0.8), the
gate and raw rates against PostgreSQL's own decoding, and latency p50/p99 (goal:
PostgreSQL p99 < 100 ms).

    python bench/change_stream.py [--rows 100000] [--rate 200] [--seconds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

import psycopg
import pymysql

from shardgate.auth.identity import TRUSTED
from shardgate.backends.changes.open import open_change_log
from shardgate.event_token import EventToken
from shardgate.gate import Gate
from shardgate.streams.merge import StreamPosition
from shardgate.topo import Topology

try:
    from bench._pg import ADMIN_URL, drop_database, fresh_database
except ImportError:  # run as a script
    from _pg import ADMIN_URL, drop_database, fresh_database  # type: ignore[no-redef]

PG_DB = "sg_bench_changes"
MY_DB = "sg_bench_changes"
MY_ADMIN = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
KS = "bench"


def _fresh_mysql() -> str:
    conn = pymysql.connect(autocommit=True, **MY_ADMIN)  # type: ignore[arg-type]
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{MY_DB}`")
        cur.execute(f"CREATE DATABASE `{MY_DB}`")
    conn.close()
    return f"mysql://root@127.0.0.1:3306/{MY_DB}"


def _drop_mysql() -> None:
    conn = pymysql.connect(autocommit=True, **MY_ADMIN)  # type: ignore[arg-type]
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{MY_DB}`")
    conn.close()


def _gate(url: str) -> Gate:
    return Gate.open(
        Topology.from_dict(
            {"keyspaces": {KS: {"shards": {"0": url}, "vschema": {"sharded": False}}}}
        )
    )


async def _backlog(gate: Gate, rows: int) -> None:
    tablet = gate.tablets[(KS, "0")]
    ph = tablet.placeholder
    per_tx = 100
    values = ", ".join([f"({ph}, {ph}, {ph})"] * per_tx)
    for base in range(0, rows // 2, per_tx):
        params: list[Any] = []
        for i in range(base, base + per_tx):
            params += [i, f"name-{i}", i]
        await tablet.execute(f"INSERT INTO t (id, v, n) VALUES {values}", params)
    for base in range(0, rows // 2, per_tx):
        await tablet.execute(
            f"UPDATE t SET n = n + 1 WHERE id >= {ph} AND id < {ph}", [base, base + per_tx]
        )


FLOOR_SLOT = "sg_bench_changes_floor"
FLOOR_PUB = "sg_bench_changes_floor"
#: pgoutput row messages: Insert, Update, Delete
FLOOR_SQL = (f"SELECT count(*) FROM pg_logical_slot_peek_binary_changes('{FLOOR_SLOT}', NULL,"
             f" NULL, 'proto_version', '1', 'publication_names', '{FLOOR_PUB}')"
             " WHERE get_byte(data, 0) IN (73, 85, 68)")


def _floor_setup(url: str) -> None:
    """A pgoutput slot (and a publication of ``t``) from before the backlog."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {FLOOR_PUB} FOR TABLE t")
        conn.execute(f"SELECT pg_create_logical_replication_slot('{FLOOR_SLOT}', 'pgoutput')")


def _floor_rate(url: str) -> tuple[float, int]:
    """PostgreSQL's own pgoutput decoding of the backlog: (row messages/s, rows)."""
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        row = conn.execute(FLOOR_SQL).fetchone()
        n = int(row[0]) if row else 0
        return n / (time.perf_counter() - t0), n


def _floor_drop(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     " WHERE slot_name = %s", [FLOOR_SLOT])


async def _gate_rate(gate: Gate, start: str, expected: int) -> tuple[float, float]:
    """(rows/s from the first row to the last, seconds from the call to the first row)."""
    pos = StreamPosition({f"{KS}/0": EventToken(0.0, f"{KS}/0", start)})
    events = gate.update_stream(KS, start=pos, heartbeat_s=0.5, identity=TRUSTED)
    t0 = time.perf_counter()
    first = 0.0
    n = 0
    try:
        async for ev in events:
            for _row in ev.rows():
                n += 1
            if n and not first:
                first = time.perf_counter()
            if n >= expected:
                break
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return n / (time.perf_counter() - first), first - t0


async def _latency(gate: Gate, rate: float, seconds: float) -> tuple[float, float, int]:
    tablet = gate.tablets[(KS, "0")]
    ph = tablet.placeholder
    sent: dict[int, float] = {}
    lat: list[float] = []
    events = gate.update_stream(KS, heartbeat_s=0.2, identity=TRUSTED)
    await events.__anext__()  # the stream is reading (a heartbeat) before the writes start

    async def consume() -> None:
        async for ev in events:
            now = time.perf_counter()
            for c in ev.changes:
                if c.after is not None and int(c.after["id"]) in sent:
                    lat.append(now - sent[int(c.after["id"])])

    async def write() -> None:
        i = 10_000_000
        interval = 1.0 / rate
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sent[i] = time.perf_counter()
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'x', 0)", [i])
            i += 1
            await asyncio.sleep(interval)

    consumer = asyncio.ensure_future(consume())
    try:
        await write()
        await asyncio.sleep(0.5)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await events.aclose()  # type: ignore[attr-defined]
    lat.sort()
    if not lat:
        return float("nan"), float("nan"), 0
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return statistics.median(lat) * 1000, p99 * 1000, len(lat)


async def run_backend(
    kind: str, rows: int, rate_per_s: float, seconds: float, rounds: int
) -> dict[str, float]:
    url = fresh_database(PG_DB) if kind == "postgres" else _fresh_mysql()
    gate = _gate(url)
    log = open_change_log(url, f"{KS}/0")
    try:
        tablet = gate.tablets[(KS, "0")]
        await tablet.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64), n BIGINT)", [])
        if kind == "postgres":
            _floor_setup(url)
        await log.prepare()
        start = await log.current_position()
        await _backlog(gate, rows)
        end = await log.current_position()
        expected = rows  # inserts + updates

        if kind == "postgres":
            from shardgate.backends.changes.postgres import raw_decode
        else:
            from shardgate.backends.changes.mysql import raw_decode  # type: ignore[assignment]
        raws: list[float] = []
        gates: list[float] = []
        raw_starts: list[float] = []
        gate_starts: list[float] = []
        floors: list[float] = []
        raw_rows = floor_rows = 0
        for _ in range(rounds):  # interleaved, so load from elsewhere hits all alike
            if kind == "postgres":
                rate, floor_rows = await asyncio.to_thread(_floor_rate, url)
                floors.append(rate)
            t0 = time.perf_counter()
            raw_rows, first = await asyncio.to_thread(raw_decode, log, start, end)  # type: ignore[arg-type]
            raws.append(raw_rows / (time.perf_counter() - first))
            raw_starts.append(first - t0)
            rate, started = await _gate_rate(gate, start, expected)
            gates.append(rate)
            gate_starts.append(started)
        raw, via_gate = statistics.median(raws), statistics.median(gates)
        p50, p99, n = await _latency(gate, rate_per_s, seconds)
        floor = statistics.median(floors) if floors else float("nan")
        return {"raw": raw, "gate": via_gate, "ratio": via_gate / raw, "p50": p50,
                "floor": floor, "floor_rows": floor_rows,
                "p99": p99, "samples": n, "raw_rows": raw_rows,
                "raw_start": statistics.median(raw_starts),
                "gate_start": statistics.median(gate_starts)}
    finally:
        await gate.close()
        await log.drop()
        await log.close()
        if kind == "postgres":
            _floor_drop(url)
            drop_database(PG_DB)
        else:
            _drop_mysql()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=200.0, help="latency writer commits/s")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=["postgres", "mysql"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved raw/gate rounds")
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks it works")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.seconds, args.rate, args.rounds = 2_000, 1.0, 100.0, 1
    goals = {"postgres": 0.5, "mysql": 0.8}
    for kind in ("postgres", "mysql"):
        if args.only and kind != args.only:
            continue
        r = await run_backend(kind, args.rows, args.rate, args.seconds, args.rounds)
        print(
            f"{kind:9s} raw decoder {r['raw']:>10,.0f} rows/s   gate client {r['gate']:>10,.0f}"
            f" rows/s   ratio {r['ratio']:.2f} (goal >= {goals[kind]})   latency p50 "
            f"{r['p50']:.1f} ms p99 {r['p99']:.1f} ms ({int(r['samples'])} commits at "
            f"{args.rate:g}/s); first row after {r['raw_start'] * 1000:.0f} ms (raw) "
            f"{r['gate_start'] * 1000:.0f} ms (gate)",
            flush=True,
        )
        if kind == "postgres":
            print(f"{'':9s} floor: PostgreSQL's own pgoutput decoding "
                  f"(pg_logical_slot_peek_binary_changes, {int(r['floor_rows'])} row messages)"
                  f" {r['floor']:>10,.0f} rows/s; raw decoder / floor {r['raw'] / r['floor']:.2f},"
                  f" gate client / floor {r['gate'] / r['floor']:.2f}", flush=True)
    _ = ADMIN_URL


if __name__ == "__main__":
    asyncio.run(main())
