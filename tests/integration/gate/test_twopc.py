"""Two-phase commit (``transaction_mode = 'twopc'``) on PostgreSQL and MariaDB.

The crash tests run a gate in a subprocess (``twopc_worker.py``) that dies at a
named point of the commit (``SHARDGATE_TWOPC_FAULT``), then resolve from this
process and check every shard database directly: all participants committed
or all rolled back, matching the recorded decision, and nothing left prepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pymysql
import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.urls import parse_url
from shardgate.errors import Code, FailedPrecondition, InvalidArgument, ShardgateError
from shardgate.gate import twopc
from shardgate.topo import write_cluster_file
from shardgate.vindexes.hash import Hash
from tests.conftest import _mysql_admin, _postgres_admin
from tests.integration.conftest import Cluster, close_cluster, cluster_for, open_cluster

WORKER = Path(__file__).parents[1] / "twopc_worker.py"
ROWS = 8  # customers per transaction: rows on every commerce shard, plus lookup rows

server_kind = pytest.mark.parametrize(
    "kind",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)


# -- direct access to the shard databases --------------------------------------------


def _db(url: str) -> str:
    return parse_url(url).database


def _query(kind: str, url: str, sql: str) -> list[tuple[Any, ...]]:
    if kind == "postgres":
        with _postgres_admin(_db(url)) as conn:
            return list(conn.execute(sql).fetchall())
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"USE `{_db(url)}`")
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _prepared(kind: str, urls: list[str]) -> list[str]:
    """Xids prepared in these databases, straight from the server."""
    names = {_db(u) for u in urls}
    if kind == "postgres":
        with _postgres_admin() as conn:
            rows = conn.execute("SELECT gid, database FROM pg_prepared_xacts").fetchall()
        return sorted(str(gid) for gid, db in rows if db in names)
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            cur.execute("XA RECOVER")
            rows = cur.fetchall()
    finally:
        conn.close()
    found = []
    for _fmt, glen, blen, data in rows:
        raw = bytes(data)
        if raw[glen : glen + blen].decode() in names:
            found.append(raw[:glen].decode())
    return sorted(found)


def _clear_prepared(kind: str, urls: list[str]) -> None:
    """Roll back whatever a test left prepared (it would block DROP DATABASE)."""
    names = {_db(u) for u in urls}
    if kind == "postgres":
        with _postgres_admin() as conn:
            rows = conn.execute("SELECT gid, database FROM pg_prepared_xacts").fetchall()
        for gid, db in rows:
            if db in names:
                with _postgres_admin(db) as conn, contextlib.suppress(Exception):
                    conn.execute(f"ROLLBACK PREPARED '{gid}'")
        return
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            cur.execute("XA RECOVER")
            for _fmt, glen, blen, data in cur.fetchall():
                raw = bytes(data)
                if raw[glen : glen + blen].decode() in names:
                    with contextlib.suppress(pymysql.err.MySQLError):
                        cur.execute(
                            f"XA ROLLBACK X'{raw[:glen].hex()}',X'{raw[glen : glen + blen].hex()}'"
                        )
    finally:
        conn.close()


def _all_urls(cluster: Cluster) -> list[str]:
    return [s.url for ks in cluster.topology.keyspaces.values() for s in ks.shards]


def _customers_by_shard(cluster: Cluster) -> dict[str, list[int]]:
    return {
        name: sorted(
            int(r[0]) for r in _query(cluster.kind, url, "SELECT customer_id FROM customer")
        )
        for name, url in cluster.shard_urls("commerce").items()
    }


def _lookup_rows(cluster: Cluster, ids: range) -> int:
    url = cluster.shard_urls("lookup")["0"]
    emails = {f"c{i}@example.com" for i in ids}
    return sum(
        1
        for (e,) in _query(cluster.kind, url, "SELECT email FROM customer_email_idx")
        if e in emails
    )


def _dt_records(cluster: Cluster) -> int:
    total = 0
    for url in _all_urls(cluster):
        with contextlib.suppress(Exception):  # no table: never coordinated anything
            total += int(_query(cluster.kind, url, f"SELECT count(*) FROM {twopc.DT_TABLE}")[0][0])
    return total


def _shard_of(cluster: Cluster, customer_id: int) -> str:
    ksid = Hash("hash", {}).hash_value(customer_id)
    assert ksid is not None
    return cluster.topology.keyspace("commerce").shard_map.find(ksid)


def _assert_all_or_nothing(cluster: Cluster, ids: range, committed: bool) -> None:
    by_shard = {k: [i for i in v if i in ids] for k, v in _customers_by_shard(cluster).items()}
    got = sorted(i for rows in by_shard.values() for i in rows)
    if committed:
        assert got == list(ids)
        assert sum(1 for rows in by_shard.values() if rows) >= 2  # really multi-shard
        assert _lookup_rows(cluster, ids) == len(ids)
    else:
        assert got == []
        assert _lookup_rows(cluster, ids) == 0
    assert _prepared(cluster.kind, _all_urls(cluster)) == []
    assert _dt_records(cluster) == 0


@pytest.fixture
async def cluster(
    kind: str, tablets: str, make_database: Callable[..., str], request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    c = await cluster_for(kind, tablets, make_database, request)
    try:
        yield c
    finally:
        await close_cluster(c)
        _clear_prepared(kind, _all_urls(c))


async def _insert_customers(cluster: Cluster, session: Any, ids: range) -> None:
    for cid in ids:
        await cluster.gate.execute(
            session,
            "INSERT INTO customer (customer_id, email, name) VALUES (:id, :email, 'n')",
            {"id": cid, "email": f"c{cid}@example.com"},
        )


# -- happy path, modes ----------------------------------------------------------------


@server_kind
async def test_twopc_commit_is_atomic_and_best_effort_is_unchanged(cluster: Cluster) -> None:
    gate = cluster.gate
    # best effort, the default: no ids, no record, no decision table
    be = gate.session("commerce", identity=TRUSTED)
    assert be.transaction_mode == "best_effort"
    await gate.execute(be, "BEGIN")
    await _insert_customers(cluster, be, range(101, 101 + ROWS))
    assert be.dtid is None and not be.xids
    await gate.execute(be, "COMMIT")
    assert sum(len(v) for v in _customers_by_shard(cluster).values()) == ROWS
    for url in _all_urls(cluster):
        with pytest.raises(Exception):  # noqa: B017 - a driver error: no such table
            _query(cluster.kind, url, f"SELECT count(*) FROM {twopc.DT_TABLE}")

    s = gate.session("commerce", transaction_mode="twopc", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await _insert_customers(cluster, s, range(1, ROWS + 1))
    assert len(s.shard_txs) >= 3 and s.dtid is not None
    await gate.execute(s, "COMMIT")
    assert not s.shard_txs and s.dtid is None and not s.xids
    _assert_all_or_nothing(cluster, range(1, ROWS + 1), committed=True)

    # one shard in twopc mode: a one-phase commit (MariaDB: XA COMMIT ... ONE PHASE)
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "UPDATE customer SET name = 'one' WHERE customer_id = 1")
    await gate.execute(s, "COMMIT")
    # an implicit multi-shard write in twopc mode, and a rollback
    await gate.execute(s, "UPDATE customer SET name = 'all' WHERE customer_id IN (1, 2, 3, 4, 5)")
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "DELETE FROM customer WHERE customer_id IN (6, 7, 8)")
    await gate.execute(s, "ROLLBACK")
    names = await gate.execute(s, "SELECT name FROM customer WHERE customer_id IN (1, 2, 3, 4, 5)")
    assert sorted(r[0] for r in names.rows) == ["all"] * 5
    left = await gate.execute(s, "SELECT count(*) FROM customer WHERE customer_id IN (6, 7, 8)")
    assert int(left.rows[0][0]) == 3
    assert _prepared(cluster.kind, _all_urls(cluster)) == []
    assert _dt_records(cluster) == 0


# -- prepare failures -----------------------------------------------------------------


@server_kind
async def test_killed_participant_rolls_back_every_shard(cluster: Cluster) -> None:
    gate = cluster.gate
    ids = range(1, ROWS + 1)
    coordinator = _shard_of(cluster, ids[0])
    victim = next(_shard_of(cluster, i) for i in ids if _shard_of(cluster, i) != coordinator)
    s = gate.session("commerce", transaction_mode="twopc", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await _insert_customers(cluster, s, ids)
    _kill_sessions(cluster.kind, cluster.shard_urls("commerce")[victim])
    with pytest.raises(ShardgateError) as err:
        await gate.execute(s, "COMMIT")
    assert err.value.code is Code.UNAVAILABLE
    assert "rolled back on every shard" in err.value.message
    _assert_all_or_nothing(cluster, ids, committed=False)


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["postgres"])
async def test_deferred_constraint_fails_prepare_and_rolls_back(cluster: Cluster) -> None:
    gate = cluster.gate
    ids = range(1, ROWS + 1)
    coordinator = _shard_of(cluster, ids[0])
    others = [i for i in ids if _shard_of(cluster, i) != coordinator]
    victim = _shard_of(cluster, others[0])
    twins = [i for i in ids if _shard_of(cluster, i) == victim]
    url = cluster.shard_urls("commerce")[victim]
    with _postgres_admin(_db(url)) as conn:
        conn.execute(
            "ALTER TABLE corder ADD CONSTRAINT one_sku UNIQUE (sku) DEFERRABLE INITIALLY DEFERRED"
        )
    s = gate.session("commerce", transaction_mode="twopc", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await _insert_customers(cluster, s, ids)
    for n, cid in enumerate([twins[0], twins[0]]):  # same sku twice on the victim shard
        await gate.execute(
            s,
            "INSERT INTO corder (order_id, customer_id, sku) VALUES (:o, :c, 'dup')",
            {"o": 100 + n, "c": cid},
        )
    with pytest.raises(ShardgateError) as err:
        await gate.execute(s, "COMMIT")
    assert err.value.code is Code.ALREADY_EXISTS
    assert f"prepare failed on commerce/{victim}" in err.value.message
    _assert_all_or_nothing(cluster, ids, committed=False)


def _kill_sessions(kind: str, url: str) -> None:
    db = _db(url)
    if kind == "postgres":
        with _postgres_admin() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (db,),
            )
        return
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM information_schema.processlist WHERE db = %s", (db,))
            for (sid,) in cur.fetchall():
                with contextlib.suppress(pymysql.err.OperationalError):
                    cur.execute(f"KILL {int(sid)}")
    finally:
        conn.close()


# -- crash and recovery ---------------------------------------------------------------


async def _run_worker(cluster: Cluster, tmp_path: Path, fault: str, ids: range) -> tuple[int, str]:
    doc = tmp_path / "cluster.json"
    doc.write_text(json.dumps(cluster.topology.to_dict()))
    env = dict(os.environ)
    env[twopc.FAULT_ENV] = fault
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), str(doc), str(ids[0]), str(len(ids)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, (out + err).decode()


CRASHES = [
    # (fault point, prepared xids it leaves behind, committed after resolve)
    ("after_first_prepare", "one", False),
    ("after_prepare", "all", False),
    ("after_decision", "all", True),
    ("after_first_commit", "all_but_one", True),
]


@server_kind
async def test_gate_killed_mid_commit_is_resolved_consistently(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Each crash point in turn on one cluster (rows 1-8, 11-18, ...), resolved in-process;
    then the same crash resolved by the ``shardgate twopc resolve`` command."""
    urls = _all_urls(cluster)
    for n, (fault, left, committed) in enumerate(CRASHES):
        ids = range(10 * n + 1, 10 * n + 1 + ROWS)
        code, output = await _run_worker(cluster, tmp_path, fault, ids)
        assert code == twopc.FAULT_EXIT_CODE, (fault, output)
        stuck = _prepared(cluster.kind, urls)
        participants = len({_shard_of(cluster, i) for i in ids}) + 1  # + lookup/0
        expected = {"one": 1, "all": participants, "all_but_one": participants - 1}[left]
        assert len(stuck) == expected, (fault, stuck)
        assert len({twopc.dtid_of(x) for x in stuck}) == 1

        # A resolver with a long grace period leaves a fresh transaction alone.
        waiting = await cluster.gate.resolve_transactions(grace_s=3600)
        assert not (waiting.committed or waiting.rolled_back) and waiting.skipped, fault
        assert _prepared(cluster.kind, urls) == stuck

        report = await cluster.gate.resolve_transactions(grace_s=0)
        assert not report.errors, (fault, report)
        assert sorted(report.committed if committed else report.rolled_back) == stuck, fault
        _assert_all_or_nothing(cluster, ids, committed)

        again = await cluster.gate.resolve_transactions(grace_s=0)  # idempotent
        assert not (again.committed or again.rolled_back or again.removed or again.errors)

    # The command line does the same: on the shard databases, or through the tablet
    # processes registered in the topo store (``--topo``).
    ids = range(101, 101 + ROWS)
    code, output = await _run_worker(cluster, tmp_path, "after_decision", ids)
    assert code == twopc.FAULT_EXIT_CODE, output
    if cluster.processes is not None:
        where = ["--topo", cluster.processes.topo_url]
    else:
        cluster_file = tmp_path / "cluster.yaml"
        write_cluster_file(cluster.topology, cluster_file)
        where = ["--cluster", str(cluster_file)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shardgate.cli", "twopc", "resolve", *where, "--grace", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, (out + err).decode()
    assert out.decode().startswith("committed "), out.decode()
    _assert_all_or_nothing(cluster, ids, committed=True)


# -- SQLite cannot take part ----------------------------------------------------------


async def test_sqlite_multi_shard_twopc_is_refused(make_database: Callable[..., str]) -> None:
    cluster = await open_cluster("sqlite", make_database)
    try:
        gate = cluster.gate
        s = gate.session("commerce", transaction_mode="twopc", identity=TRUSTED)
        await gate.execute(s, "BEGIN")  # one shard alone: an ordinary commit
        await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku) VALUES (1, 1, 'a')")
        await gate.execute(s, "COMMIT")
        await gate.execute(s, "BEGIN")
        await _insert_customers(cluster, s, range(10, 10 + ROWS))
        with pytest.raises(FailedPrecondition, match="cannot prepare transactions"):
            await gate.execute(s, "COMMIT")
        found = await gate.execute(gate.session("commerce", identity=TRUSTED),
                                   "SELECT count(*) FROM customer")
        assert int(found.rows[0][0]) == 0
        orders = await gate.execute(gate.session("commerce", identity=TRUSTED),
                                    "SELECT count(*) FROM corder")
        assert int(orders.rows[0][0]) == 1
        report = await gate.resolve_transactions(grace_s=0)  # no capable shard: nothing to do
        assert not (report.committed or report.rolled_back or report.errors)
    finally:
        await cluster.gate.close()


async def test_set_transaction_mode(make_database: Callable[..., str]) -> None:
    cluster = await open_cluster("sqlite", make_database)
    try:
        gate = cluster.gate
        s = gate.session("commerce", identity=TRUSTED)
        await gate.execute(s, "SET transaction_mode = 'twopc'")
        assert s.transaction_mode == "twopc"
        await gate.execute(s, "set session transaction_mode = 'BEST_EFFORT'")
        assert s.transaction_mode == "best_effort"
        with pytest.raises(InvalidArgument):
            await gate.execute(s, "SET transaction_mode = 'single'")
        with pytest.raises(InvalidArgument):
            gate.session(transaction_mode="xa", identity=TRUSTED)
        await gate.execute(s, "BEGIN")
        await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku) VALUES (1, 1, 'a')")
        with pytest.raises(FailedPrecondition):
            await gate.execute(s, "SET transaction_mode = 'twopc'")
        await gate.rollback(s)
        assert s.transaction_mode == "best_effort"
    finally:
        await cluster.gate.close()
