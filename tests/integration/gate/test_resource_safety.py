"""Resource safety on real servers: nothing a client abandons strands a shard.

Covered (issue #16, items 5-7): abandoned gRPC clients' transactions are rolled
back by the transaction timeout and never block others; abandoned sessions do
not pile up; session ids are bound to their owner; pool waits end in
RESOURCE_EXHAUSTED; 20 concurrent two-phase commits on 4 PostgreSQL shards
finish while point selects keep answering; a tablet process SIGKILLed while
COMMIT runs gives "commit outcome unknown" (checked against the database);
tablets roll back transactions of a gate that went away; query timeouts cancel
the statement on the shard; Execute refuses a 10M-row result while the gate
process stays under 300 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.auth.identity import ANONYMOUS, TRUSTED, Identity
from shardgate.backends import open_backend
from shardgate.backends.urls import parse_url
from shardgate.errors import (
    COMMIT_OUTCOME_UNKNOWN,
    Aborted,
    Code,
    CommitOutcomeUnknown,
    DeadlineExceeded,
    NotFound,
    ResourceExhausted,
    ShardgateError,
)
from shardgate.gate import Gate
from shardgate.gate.limits import GateLimits
from shardgate.keys import KeyRange
from shardgate.result import ResultLimits
from shardgate.topo import Topology, write_cluster_file
from tests.conftest import _mysql_admin, _postgres_admin
from tests.ports import free_port

pg = pytest.mark.postgres
ROOT = Path(__file__).resolve().parents[3]


# -- helpers ------------------------------------------------------------------------------


def _unsharded(url: str) -> Topology:
    return Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": {"0": url}, "vschema": {"sharded": False, "tables": {"t": {}}}}}})


def _sharded(urls: dict[str, str]) -> Topology:
    return Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": urls,
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}}}})


def _pg_rows(url: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with _postgres_admin(parse_url(url).database) as conn:
        return list(conn.execute(sql, args).fetchall())


def _pg_sessions(url: str, where: str) -> int:
    """Server sessions of ``url``'s database matching ``where`` (pg_stat_activity)."""
    rows = _pg_rows(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                    + where, (parse_url(url).database,))
    return int(rows[0][0])


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for ``check()`` (polled), failing with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def _process(args: list[str], expect: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``shardgate`` CLI subprocess, running once it printed a line with ``expect``."""
    proc = subprocess.Popen([sys.executable, "-m", "shardgate.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline().decode()
            assert line, f"shardgate {args[0]} exited before printing {expect!r}"
            if expect in line:
                break
        yield proc
    finally:
        _end(proc)


@pytest.fixture
async def pg_gate(make_database: Callable[..., str]) -> AsyncIterator[tuple[Gate, str]]:
    url = make_database("postgres", "robust")
    gate = Gate.open(_unsharded(url), limits=GateLimits(transaction_timeout_s=2.0))
    await gate.execute(gate.session(identity=TRUSTED),
                       "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
    try:
        yield gate, url
    finally:
        await gate.close()


# -- sessions -----------------------------------------------------------------------------


_VANISHING_CLIENTS = textwrap.dedent("""
    import asyncio, sys
    from shardgate.api.grpc.client import GateClient

    async def one(target, i):
        client = GateClient(target, keyspace="app")
        await client.execute("BEGIN")
        await client.execute("INSERT INTO t (id, v) VALUES (:i, 'held')", {"i": i})
        print("held", i, flush=True)
        await asyncio.Event().wait()

    async def main():
        await asyncio.gather(*(one(sys.argv[1], i) for i in range(50)))

    asyncio.run(main())
""")


@pg
async def test_fifty_vanished_grpc_clients_do_not_strand_the_shard(
    pg_gate: tuple[Gate, str], tmp_path: Path
) -> None:
    """Autocommit statements are answered while abandoned transactions hold every slot;
    a transaction gets a slot once the transaction timeout has rolled them back.

    No wall-clock bound: the gate's timeout is held back until the autocommit statement
    is answered (so a statement waiting for a slot would wait for the tablet's own
    safety net, twice the timeout, and find fewer transactions open on the server), and
    the new transaction's slot must come from the timeout's rollbacks (before it, none
    is free; the pool would refuse after its 10 s wait)."""
    gate, url = pg_gate
    server, port = await serve(gate)
    target = f"grpc://127.0.0.1:{port}"
    script = tmp_path / "clients.py"
    script.write_text(_VANISHING_CLIENTS)
    # the gate's timeout rollbacks (SessionTable's end hook), held back until released
    released = asyncio.Event()
    expired: list[str] = []
    end_transaction = gate.sessions._end_transaction

    async def end_when_released(session: Any, reason: str) -> None:
        await released.wait()
        expired.append(reason)
        await end_transaction(session, reason)

    gate.sessions._end_transaction = end_when_released
    proc = subprocess.Popen([sys.executable, str(script), target], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        # Every transaction slot of the shard is taken by a client that will vanish.
        slots = gate.tablets[("app", "0")].tablet.max_transactions  # type: ignore[attr-defined]
        for _ in range(slots):
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.startswith(b"held"), line
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        async with GateClient(target, keyspace="app", timeout=30) as client:
            # Autocommit statements never wait behind transactions (a reserved connection):
            # answered while every abandoned transaction is still open on the server.
            assert (await client.execute("SELECT count(*) FROM t")).rows == [(0,)]
            assert _pg_sessions(url, "state = 'idle in transaction'") == slots
            assert not expired
            released.set()
            # A transaction waits for a slot until the abandoned ones time out.
            await client.execute("BEGIN")
            await client.execute("INSERT INTO t (id, v) VALUES (1000, 'normal')")
            assert expired, "a transaction got a slot no timeout had freed"
            await client.execute("COMMIT")
            rows = await client.execute("SELECT id FROM t")
        assert rows.rows == [(1000,)]  # the vanished clients' rows were rolled back
        await _until(lambda: len(expired) == slots, 30.0, "every abandoned transaction to end")
        assert all("transaction timeout" in reason for reason in expired), expired
        await _until(lambda: _pg_sessions(url, "state = 'idle in transaction'") == 0, 5.0,
                     "no session left idle in transaction")
    finally:
        released.set()
        _end(proc)
        await server.stop(None)


async def test_thirty_thousand_abandoned_sessions_are_reaped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'reap.db'}"
    gate = Gate.open(_unsharded(url), limits=GateLimits(session_idle_timeout_s=0.5))
    try:
        s = gate.session(identity=TRUSTED)
        await gate.execute(s, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        held = gate.session(identity=TRUSTED)
        await gate.execute(held, "BEGIN")
        await gate.execute(held, "SELECT count(*) FROM t")  # joins the shard
        ids = {gate.session(addressable=True, identity=ANONYMOUS).id for _ in range(30_000)}
        assert len(ids) == 30_000
        assert len(gate.sessions) >= 30_000
        for _ in range(1000):  # in-process sessions made per call are never kept
            await gate.execute(gate.session(identity=TRUSTED), "SELECT count(*) FROM t")
        await _until(lambda: len(gate.sessions) == 0, 15.0, "every idle session to be reaped")
        # The reaped transaction was rolled back, and its session says so once.
        with pytest.raises(Aborted, match="idled longer than"):
            await gate.execute(held, "SELECT 1 FROM t")
        assert (await gate.execute(held, "SELECT count(*) FROM t")).rows == [(0,)]
    finally:
        await gate.close()


async def test_a_session_id_is_useless_to_another_owner(tmp_path: Path) -> None:
    gate = Gate.open(_unsharded(f"sqlite:///{tmp_path / 'own.db'}"))
    try:
        alice = gate.session(owner="alice", addressable=True, identity=Identity("alice"))
        assert gate.find_session(alice.id, "alice") is alice
        # in-process only: not found by id at all
        local = gate.session(owner="alice", identity=Identity("alice"))
        with pytest.raises(NotFound):
            gate.find_session(local.id, "alice")
        for thief in ("mallory", None):
            with pytest.raises(NotFound, match="expired"):
                gate.find_session(alice.id, thief)
            await gate.close_session(alice.id, thief)  # not hers: nothing happens
        assert gate.find_session(alice.id, "alice") is alice
        ids = sorted(gate.session(identity=TRUSTED).id for _ in range(1000))
        assert ids[0] > 0 and ids[-1] < 2**64
        assert sum(b - a == 1 for a, b in itertools.pairwise(ids)) == 0
        assert ids[-1] > 2**48  # random over 64 bits, not a counter
    finally:
        await gate.close()


@pg
async def test_transaction_timeout_rolls_back_and_reports_once(pg_gate: tuple[Gate, str]) -> None:
    gate, url = pg_gate
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "INSERT INTO t (id, v) VALUES (1, 'x')")
    await _until(lambda: not s.in_transaction, 5.0, "the reaper to end the transaction")
    assert _pg_sessions(url, "state = 'idle in transaction'") == 0
    with pytest.raises(Aborted, match="transaction timeout") as info:
        await gate.execute(s, "COMMIT")
    assert info.value.code is Code.ABORTED
    assert (await gate.execute(s, "SELECT count(*) FROM t")).rows == [(0,)]


async def test_pool_wait_is_bounded(tmp_path: Path) -> None:
    backend = open_backend(f"sqlite:///{tmp_path / 'pool.db'}", pool_size=1, pool_timeout_s=0.3)
    try:
        held = await backend.acquire()
        start = time.monotonic()
        with pytest.raises(ResourceExhausted, match="no free connection") as info:
            await backend.acquire()
        assert 0.25 < time.monotonic() - start < 3.0
        assert info.value.code is Code.RESOURCE_EXHAUSTED
        await backend.release(held)
        await backend.release(await backend.acquire())  # the slot was given back
    finally:
        await backend.close()


# -- two-phase commit under load -----------------------------------------------------------


@pg
async def test_twenty_concurrent_twopc_commits_on_four_pg_shards(
    make_database: Callable[..., str],
) -> None:
    urls = {kr.name: make_database("postgres", f"robust_2pc{i}")
            for i, kr in enumerate(KeyRange(b"", b"").split(4))}
    gate = Gate.open(_sharded(urls), limits=GateLimits(pool_timeout_s=2.0))
    try:
        await gate.execute(gate.session(identity=TRUSTED),
                           "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        await gate.execute(gate.session(identity=TRUSTED),
                           "INSERT INTO t (id, v) VALUES (1, 'probe')")
        stop = asyncio.Event()
        slowest = 0.0
        retries = 0

        async def point_selects() -> int:
            nonlocal slowest
            s, n = gate.session(identity=TRUSTED), 0
            while not stop.is_set():
                start = time.monotonic()
                res = await gate.execute(s, "SELECT v FROM t WHERE id = 1")
                slowest = max(slowest, time.monotonic() - start)
                assert res.rows == [("probe",)]
                n += 1
                await asyncio.sleep(0.01)
            return n

        async def client(c: int) -> None:
            nonlocal retries
            s = gate.session(transaction_mode="twopc", identity=TRUSTED)
            ids = [c * 1000 + i for i in range(1, 9)]  # 8 rows: every shard
            values = ", ".join(f"({i}, 'c{c}')" for i in ids)
            for _ in range(50):
                try:
                    await gate.execute(s, "BEGIN")
                    await gate.execute(s, f"INSERT INTO t (id, v) VALUES {values}")
                    await gate.execute(s, "COMMIT")
                    return
                except ShardgateError as exc:  # too many transactions at once: retry
                    assert exc.code in (Code.RESOURCE_EXHAUSTED, Code.ABORTED), exc
                    retries += 1
                    if s.in_transaction:
                        await gate.execute(s, "ROLLBACK")
            pytest.fail(f"client {c} never committed")

        selects = asyncio.create_task(point_selects())
        await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(1, 21))), 240)
        stop.set()
        assert await selects > 0
        assert slowest < 3.0, f"a point select took {slowest:.2f}s"
        total = sum(int(_pg_rows(u, "SELECT count(*) FROM t")[0][0]) for u in urls.values())
        assert total == 20 * 8 + 1
        with _postgres_admin() as conn:
            left = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = ANY(%s)",
                                ([parse_url(u).database for u in urls.values()],)).fetchone()
        assert left == (0,)
        print(f"20 two-phase commits: {retries} retries, slowest point select {slowest:.3f}s")
    finally:
        await gate.close()


# -- commit outcome unknown ----------------------------------------------------------------


_SLOW_COMMIT_DDL = [
    "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)",
    "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$",
    "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED "
    "FOR EACH ROW WHEN (NEW.v = 'slow') EXECUTE FUNCTION slow_commit()",
]


@pg
async def test_tablet_killed_during_commit_gives_outcome_unknown(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    """A real ``shardgate tablet`` process is SIGKILLed while PostgreSQL runs its COMMIT
    (a deferred trigger makes the commit take 2 s); the commit then completes on the
    server, so "nothing was committed" would have been a lie."""
    url = make_database("postgres", "robust_commit")
    with _postgres_admin(parse_url(url).database) as conn:
        for ddl in _SLOW_COMMIT_DDL:
            conn.execute(ddl)
    cluster = tmp_path / "cluster.yaml"
    topo = _unsharded(url)
    write_cluster_file(topo, cluster)
    port = free_port()
    with _process(["tablet", "--no-auth", "--cluster", str(cluster), "--keyspace", "app",
                   "--shard", "0",
                   "--port", str(port)], "listening") as tablet_proc:
        remote = await GrpcTabletClient.connect(f"grpc://127.0.0.1:{port}")
        gate = Gate(topo, {("app", "0"): remote})
        try:
            s = gate.session(identity=TRUSTED)
            await gate.execute(s, "BEGIN")
            await gate.execute(s, "INSERT INTO t (id, v) VALUES (1, 'slow')")
            commit = asyncio.create_task(gate.execute(s, "COMMIT"))
            await _until(lambda: _pg_sessions(url, "state = 'active' AND query = 'COMMIT'") == 1,
                         10.0, "PostgreSQL to run the COMMIT")
            tablet_proc.send_signal(signal.SIGKILL)
            with pytest.raises(CommitOutcomeUnknown) as info:
                await commit
        finally:
            await gate.close()
    err = info.value
    assert err.code is Code.UNKNOWN
    assert err.message.startswith(COMMIT_OUTCOME_UNKNOWN)
    assert "app/0" in err.message and "nothing was committed" not in err.message
    # The server finished the commit after its client was gone.
    await _until(lambda: _pg_sessions(url, "query = 'COMMIT' AND state = 'active'") == 0, 10.0,
                 "the orphaned COMMIT to finish")
    assert _pg_rows(url, "SELECT id, v FROM t") == [(1, "slow")]


@pg
async def test_tablet_rolls_back_transactions_of_a_vanished_gate(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    url = make_database("postgres", "robust_idle")
    with _postgres_admin(parse_url(url).database) as conn:
        conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
    cluster = tmp_path / "cluster.yaml"
    write_cluster_file(_unsharded(url), cluster)
    port = free_port()
    with _process(["tablet", "--no-auth", "--cluster", str(cluster), "--keyspace", "app",
                   "--shard", "0",
                   "--port", str(port), "--idle-timeout", "1"], "listening"):
        remote = await GrpcTabletClient.connect(f"grpc://127.0.0.1:{port}")
        tid = await remote.begin()
        await remote.execute("INSERT INTO t (id, v) VALUES (%s, %s)", [1, "x"], tid)
        await remote.close()  # the gate is gone, its transaction is not
        assert _pg_sessions(url, "state = 'idle in transaction'") == 1
        await _until(lambda: _pg_sessions(url, "state = 'idle in transaction'") == 0, 4.0,
                     "the tablet to roll back the idle transaction")
        again = await GrpcTabletClient.connect(f"grpc://127.0.0.1:{port}")
        try:
            with pytest.raises(ShardgateError, match="idled longer than 1s"):
                await again.commit(tid)
        finally:
            await again.close()
    assert _pg_rows(url, "SELECT count(*) FROM t") == [(0,)]


# -- query timeouts -------------------------------------------------------------------------


_SLEEP = {
    "postgres": "SELECT pg_sleep(30)",
    "mysql": "SELECT SLEEP(30)",
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
              "SELECT count(*) FROM c",
}


def _still_sleeping(kind: str, url: str) -> bool:
    db = parse_url(url).database
    if kind == "postgres":
        return _pg_sessions(url, "query LIKE 'SELECT pg_sleep%%' AND state = 'active'") > 0
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM information_schema.processlist WHERE db = %s "
                        "AND info LIKE 'SELECT SLEEP%%'", (db,))
            row = cur.fetchone()
    finally:
        conn.close()
    return bool(row and row[0])


async def test_query_timeout_cancels_the_statement_on_the_shard(
    backend_kind: str, make_database: Callable[..., str]
) -> None:
    url = make_database(backend_kind, "robust_timeout")
    gate = Gate.open(_unsharded(url))
    try:
        s = gate.session(identity=TRUSTED)
        await gate.execute(s, "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        await gate.execute(s, "SET query_timeout_ms = 300")
        for in_tx in (False, True):
            if in_tx:
                await gate.execute(s, "BEGIN")
                await gate.execute(s, "INSERT INTO t (id, v) VALUES (1, 'x')")
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded, match="query_timeout_ms = 300") as info:
                await gate.execute(s, _SLEEP[backend_kind])
            assert info.value.code is Code.DEADLINE_EXCEEDED
            assert time.monotonic() - start < 5.0
            assert not s.in_transaction  # a timed-out statement ends its transaction
            if backend_kind != "sqlite":
                await _until(lambda: not _still_sleeping(backend_kind, url), 5.0,
                             "the shard to stop the statement")
        await gate.execute(s, "SET query_timeout_ms = 0")
        assert (await gate.execute(s, "SELECT count(*) FROM t")).rows == [(0,)]
    finally:
        await gate.close()


# -- result limits ---------------------------------------------------------------------------


async def test_backend_result_limits(backend_kind: str, make_database: Callable[..., str]) -> None:
    backend = open_backend(make_database(backend_kind, "robust_limits"))
    try:
        await backend.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        ph = backend.placeholder
        conn = await backend.acquire()
        try:
            await conn.executemany(f"INSERT INTO t (id, v) VALUES ({ph}, {ph})",
                                   [(i, "x" * 100) for i in range(3000)])
        finally:
            await backend.release(conn)
        limits = ResultLimits(max_rows=2500, max_bytes=1_000_000)
        res = await backend.execute("SELECT id FROM t ORDER BY id", (), ResultLimits(3000, 0))
        assert len(res.rows) == 3000 and res.fields == ["id"]
        with pytest.raises(ResourceExhausted, match=r"more than 2500 rows.*StreamExecute"):
            await backend.execute("SELECT id FROM t", (), limits)
        with pytest.raises(ResourceExhausted, match="more than 100000 bytes"):
            await backend.execute("SELECT v FROM t", (), ResultLimits(0, 100_000))
        empty = await backend.execute("SELECT id, v FROM t WHERE id < 0", (), limits)
        assert empty.rows == [] and empty.fields == ["id", "v"]
        # The pool still serves after a refused result.
        assert (await backend.execute("SELECT count(*) FROM t", (), limits)).rows == [(3000,)]
        written = await backend.execute(f"UPDATE t SET v = {ph} WHERE id < 10", ("y",), limits)
        assert written.rows_affected == 10
        into = {"postgres": "SELECT id INTO t_copy FROM t WHERE id < 5",
                "mysql": "SELECT count(*) INTO @n FROM t"}.get(backend_kind)
        if into is not None:  # a SELECT that is a command: no rows, no error
            assert (await backend.execute(into, (), limits)).rows == []
    finally:
        await backend.close()


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


@pg
async def test_execute_of_ten_million_rows_is_refused_in_bounded_memory(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    url = make_database("postgres", "robust_10m")
    cluster = tmp_path / "cluster.yaml"
    write_cluster_file(_unsharded(url), cluster)
    port = free_port()
    with _process(["up", "--http-port", "0", "--mysql-port", "0", "--cluster", str(cluster),
                   "--port", str(port)],
                  "listening") as gate_proc:
        async with GateClient(f"grpc://127.0.0.1:{port}", keyspace="app", timeout=120) as c:
            start = time.monotonic()
            with pytest.raises(ResourceExhausted, match="StreamExecute") as info:
                await c.execute("SELECT g, concat('row ', g) FROM generate_series(1, 10000000) g")
            refused_after = time.monotonic() - start
            peak_execute = _peak_rss_mb(gate_proc.pid)
            rows = 0
            async for chunk in c.stream_execute(
                "SELECT g, concat('row ', g) FROM generate_series(1, 1000000) g"
            ):
                rows += len(chunk.rows)
            peak_stream = _peak_rss_mb(gate_proc.pid)
    assert "more than 500000 rows" in info.value.message
    assert rows == 1_000_000
    print(f"10M-row Execute refused after {refused_after:.1f}s; gate peak RSS "
          f"{peak_execute:.0f} MB; after a 1M-row StreamExecute {peak_stream:.0f} MB")
    assert peak_execute < 300, peak_execute
    assert peak_stream < 300, peak_stream
