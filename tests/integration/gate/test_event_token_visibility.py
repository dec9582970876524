"""Exact event tokens on PostgreSQL only cover changes the read could see.

PostgreSQL's logical decoding hands a commit over once its WAL is flushed,
before the committing backend leaves the proc array (before new snapshots see
it). A read that took the stream's last token and then ran in a snapshot
missing such a commit got that token as "exact": a cache then held the older
value under the newer token and the change's invalidation skipped it (CI:
``test_cache_stays_consistent[postgres]`` ended with a stale value). The tablet
now runs an exact-token read in a REPEATABLE READ snapshot and checks it: every
decoded transaction visible, every transaction older than the reader's start
over. The second check is driven here with a transaction held open across the
reader's start (the first one needs the microsecond race; its rule has unit
tests in ``tests/unit/test_log_visibility.py``).

The check is the tablet's, so the test also runs against tablet processes (the
event-token request and the token travel over the gate-tablet hop). Its premise is
a reader that starts during the test: the shared tablet processes of the suite keep
the readers earlier tests started, so this test starts tablet processes of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psycopg
import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.changes.open import open_change_log
from shardgate.result import ExecuteOptions
from tests.integration.conftest import Cluster, close_cluster, open_cluster, with_tablets

pytestmark = pytest.mark.postgres

SQL = "SELECT price FROM corder WHERE customer_id = 7"


@pytest.fixture
async def fresh_cluster(
    tablets: str, make_database: Callable[..., str], tmp_path: Path,
) -> AsyncIterator[Cluster]:
    """A PostgreSQL cluster whose tablets (in the gate, or processes of its own) have
    not started a log reader yet; change capture set up, dropped at the end."""
    from tests.conftest import require_server

    require_server("postgres")
    c = await with_tablets(await open_cluster("postgres", make_database), tablets, tmp_path)
    shards = [(f"{ks.name}/{sh.name}", sh.url)
              for ks in c.topology.keyspaces.values() for sh in ks.shards]
    try:
        for name, url in shards:  # a slot waits for open transactions: before the test
            log = open_change_log(url, name)
            try:
                await log.prepare()
            finally:
                await log.close()
        yield c
    finally:
        await close_cluster(c)
        for name, url in shards:
            log = open_change_log(url, name)
            try:
                await log.drop()
            finally:
                await log.close()


async def test_transaction_open_at_reader_start_withholds_exact_tokens(
    fresh_cluster: Cluster,
) -> None:
    streams_cluster = fresh_cluster
    gate = streams_cluster.gate
    s = gate.session(identity=TRUSTED)
    await gate.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                          "VALUES (7, 7, 'x', 1)")
    # A transaction with an id, open on every shard database before any reader starts.
    held = []
    for url in streams_cluster.shard_urls("commerce").values():
        conn = await psycopg.AsyncConnection.connect(url.replace("postgres://", "postgresql://"))
        await conn.execute("SELECT pg_current_xact_id()")
        held.append(conn)
    token_opts = ExecuteOptions(include_event_token=True)
    try:
        res = await gate.execute(s, SQL, options=token_opts)  # starts the shard's reader
        assert res.rows == [(1,)]
        for _ in range(3):
            res = await gate.execute(s, SQL, options=token_opts)
            assert res.rows == [(1,)]
            assert res.event_token is None, "a transaction older than the reader is open"
    finally:
        for conn in held:
            await conn.commit()
            await conn.close()
    exact = None
    for _ in range(50):
        res = await gate.execute(s, SQL, options=token_opts)
        if res.event_token is not None:
            exact = res.event_token
            break
        await asyncio.sleep(0.05)
    assert exact is not None, "no exact token once every older transaction ended"
    assert res.rows == [(1,)]
