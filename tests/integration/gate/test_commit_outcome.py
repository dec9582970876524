"""A COMMIT whose answer is lost is UNKNOWN, never UNAVAILABLE (issue 30, item 11).

Production mode on PostgreSQL: a ``shardgate tablet`` process serves the shard,
and COMMIT is held at the database by a deferred constraint trigger that waits
for an advisory lock the test holds, so the test knows the COMMIT is in flight
(it sees the wait in ``pg_locks``) before it kills a process:

* the gate process (``shardgate gate``) SIGKILLed while a gRPC client's COMMIT
  runs: :class:`~shardgate.api.grpc.client.GateClient` (``COMMIT``,
  ``execute_batch(as_transaction=True)``, an INSERT outside a transaction,
  which commits on its own) raises ``CommitOutcomeUnknown`` (code
  ``UNKNOWN``) and the DB-API driver ``OutcomeUnknownError``, where it said
  UNAVAILABLE, which clients retry. A COMMIT sent to no gate at all stays
  UNAVAILABLE: nothing was sent.
* the tablet process SIGKILLed while a MySQL client's COMMIT runs through the
  gate's listener: the client gets error 1180 (ER_ERROR_DURING_COMMIT, "commit
  outcome unknown"), not 1105; once the lock is released the database finishes
  the COMMIT the dead tablet sent: the transaction did commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pymysql
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.mysql import serve_mysql
from shardgate.auth.identity import TRUSTED
from shardgate.client import dbapi
from shardgate.errors import Code, CommitOutcomeUnknown, ShardgateError, Unavailable
from shardgate.gate import Gate
from shardgate.topo import Topology
from tests.acceptance.test_cli import cli_env, free_port, wait_for_port
from tests.conftest import require_server
from tests.integration.tablet_procs import TabletProcesses, serve_with_processes

pytestmark = pytest.mark.postgres

#: the advisory lock the deferred trigger waits for at COMMIT
LOCK = 4242
#: seconds to wait for a condition the test polls (the COMMIT waiting, a row committed)
WAIT_S = 30.0
#: at COMMIT, a row with v = 'block' waits until the test releases LOCK
HOLD_COMMIT = [
    "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS "
    f"$$ BEGIN PERFORM pg_advisory_xact_lock({LOCK}); RETURN NULL; END $$",
    "CREATE CONSTRAINT TRIGGER w_hold AFTER INSERT ON w DEFERRABLE INITIALLY DEFERRED "
    "FOR EACH ROW WHEN (NEW.v = 'block') EXECUTE FUNCTION hold_commit()",
]


@dataclass
class Shard:
    """The tablet processes of keyspace ``app`` (one shard) and its database."""

    procs: TabletProcesses
    url: str


@pytest.fixture
async def shard(make_database: Callable[..., str], tmp_path: Path) -> AsyncIterator[Shard]:
    require_server("postgres")
    url = make_database("postgres", "outcome")
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {
        "app": {"shards": {"0": url}, "vschema": {"sharded": False, "tables": {"w": {}}}}}})
    setup = Gate.open(topo)
    try:
        await setup.execute(setup.session(identity=TRUSTED),
                            "CREATE TABLE w (id BIGINT PRIMARY KEY, v VARCHAR(32))")
    finally:
        await setup.close()
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in HOLD_COMMIT:
            conn.execute(sql)
    procs = await serve_with_processes(topo, tmp_path / "tablets")
    try:
        yield Shard(procs, url)
    finally:
        await procs.close()


@contextlib.contextmanager
def commits_held(url: str) -> Iterator[psycopg.Connection]:
    """Hold LOCK (COMMITs of 'block' rows wait) until the block ends or it is released."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        try:
            yield conn
        finally:
            conn.execute("SELECT pg_advisory_unlock_all()")


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {WAIT_S}s for {what}")
        await asyncio.sleep(0.02)


def commit_waiting(url: str) -> Callable[[], bool]:
    """Whether a COMMIT waits for LOCK (the trigger runs: COMMIT was sent)."""
    def check() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                               "AND objid = %s AND NOT granted", (LOCK,)).fetchone()
        return row is not None and row[0] > 0
    return check


def committed(url: str, row_id: int) -> Callable[[], bool]:
    def check() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM w WHERE id = %s", (row_id,)).fetchone() is not None
    return check


@contextlib.contextmanager
def gate_process(procs: TabletProcesses, port: int, tmp_path: Path) -> Iterator[int]:
    """``shardgate gate --topo`` over the tablets, serving gRPC on ``port``; its pid."""
    log = (tmp_path / f"gate-{port}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", "gate", "--topo", procs.topo_url, "--no-auth",
         "--port", str(port), "--mysql-port", "0", "--http-port", "0"],
        env=cli_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        wait_for_port(proc, port)
        yield proc.pid
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        log.close()


#: how each client sends the COMMIT that the gate's death cuts off (``autocommit``: an
#: INSERT outside a transaction, which commits on its own)
CLIENTS = ["execute", "batch", "autocommit", "dbapi"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_gate_killed_during_commit_is_unknown_not_unavailable(
    shard: Shard, tmp_path: Path, client: str
) -> None:
    port = free_port()
    target = f"grpc://127.0.0.1:{port}"
    with gate_process(shard.procs, port, tmp_path) as pid, commits_held(shard.url):
        if client == "dbapi":
            conn = dbapi.connect(target, keyspace="app", timeout=60)
            conn.cursor().execute("INSERT INTO w (id, v) VALUES (1, 'block')")
            pending = asyncio.ensure_future(asyncio.to_thread(conn.commit))
            await until(commit_waiting(shard.url), "the COMMIT to reach the database")
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(dbapi.Error) as caught:
                await asyncio.wait_for(pending, WAIT_S)
            assert type(caught.value) is dbapi.OutcomeUnknownError
            assert caught.value.code is Code.UNKNOWN
            assert not isinstance(caught.value, dbapi.OperationalError)  # what callers retry
            message = str(caught.value)
            with contextlib.suppress(dbapi.Error):
                conn.close()
        else:
            async with GateClient(target, keyspace="app", timeout=60) as gc:
                if client == "execute":
                    await gc.execute("BEGIN")
                    await gc.execute("INSERT INTO w (id, v) VALUES (1, 'block')")
                    call = gc.execute("COMMIT")
                elif client == "autocommit":
                    await gc.execute("SELECT COUNT(*) FROM w")  # the session exists
                    call = gc.execute("INSERT INTO w (id, v) VALUES (1, 'block')")
                else:
                    call = gc.execute_batch([("INSERT INTO w (id, v) VALUES (1, 'block')", None)],
                                            as_transaction=True)
                pending = asyncio.ensure_future(call)
                await until(commit_waiting(shard.url), "the COMMIT to reach the database")
                os.kill(pid, signal.SIGKILL)
                with pytest.raises(ShardgateError) as info:
                    await asyncio.wait_for(pending, WAIT_S)
            assert isinstance(info.value, CommitOutcomeUnknown), info.value
            assert info.value.code is Code.UNKNOWN
            message = info.value.message
        assert message.startswith("commit outcome unknown"), message
    # Released, the COMMIT ends one way or the other: it commits, unless the tablet, seeing
    # the dead gate's call go away, cancelled it first (a race): which is exactly why the
    # client cannot be told more than UNKNOWN. (The listener test below shows a commit.)
    await until(lambda: not commit_waiting(shard.url)(), "the held COMMIT to end")
    # a COMMIT that reached no gate was not sent: UNAVAILABLE, safe to retry
    async with GateClient(target, keyspace="app", timeout=10) as gc:
        with pytest.raises(Unavailable):
            await gc.execute("COMMIT")


async def test_tablet_killed_during_a_listener_commit_is_error_1180(shard: Shard) -> None:
    listener, port = await serve_mysql(shard.procs.gate, "127.0.0.1", 0)
    holder = shard.procs.holder("app", "0")
    # (the listener serves on this loop: the blocking client runs in worker threads)
    conn = await asyncio.to_thread(pymysql.connect, host="127.0.0.1", port=port, user="app",
                                   database="app", autocommit=False)
    try:
        with commits_held(shard.url):
            await asyncio.to_thread(conn.cursor().execute,
                                    "INSERT INTO w (id, v) VALUES (2, 'block')")
            pending = asyncio.ensure_future(asyncio.to_thread(conn.commit))
            await until(commit_waiting(shard.url), "the COMMIT to reach the database")
            shard.procs.kill(holder)
            with pytest.raises(pymysql.err.MySQLError) as info:
                await asyncio.wait_for(pending, WAIT_S)
        errno, message = info.value.args[0], str(info.value.args[1])
        assert errno == 1180, info.value.args  # ER_ERROR_DURING_COMMIT, not 1105
        assert message.startswith("commit outcome unknown"), message
        # the database finished the COMMIT the dead tablet had sent: it did commit
        await until(committed(shard.url, 2), "the held COMMIT to finish")
    finally:
        with contextlib.suppress(pymysql.err.Error):
            await asyncio.to_thread(conn.close)
        await listener.stop()
