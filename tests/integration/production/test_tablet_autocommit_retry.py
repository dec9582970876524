"""An autocommit statement that meets a lock conflict is run again by the tablet.

SQLite's busy database is the conflict here: a second connection holds the write
lock (``BEGIN IMMEDIATE``) longer than the shard's ``busy_timeout``. Before, the
statement failed with ``ABORTED`` at once (CI: a writer's single-row UPDATE
during a reshard's catch-up on a loaded machine); the statement was its own
transaction and rolled back whole, so the tablet runs it again, a few times,
and only then gives the error back. Inside a transaction nothing is run again:
the transaction's client decides.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from shardgate.backends import open_backend
from shardgate.errors import Aborted
from shardgate.tablet import metrics
from shardgate.tablet.tablet import AUTOCOMMIT_ATTEMPTS, Tablet

BUSY_MS = 100


async def _tablet(path: Path) -> Tablet:
    backend = open_backend(f"sqlite:///{path}?busy_timeout={BUSY_MS}")
    tablet = Tablet("ks", "-", backend)
    await tablet.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)", [])
    await tablet.execute("INSERT INTO t (id, v) VALUES (1, 0)", [])
    return tablet


def _retries() -> float:
    return metrics.RETRIES.labels("ks", "-")._value.get()  # type: ignore[no-any-return]


async def test_autocommit_statement_runs_again_after_a_busy_database(tmp_path: Path) -> None:
    path = tmp_path / "shard.db"
    tablet = await _tablet(path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the write lock, for longer than busy_timeout
        before = _retries()
        update = asyncio.create_task(tablet.execute("UPDATE t SET v = v + 1 WHERE id = 1", []))
        await asyncio.sleep(2.5 * BUSY_MS / 1000)
        assert not update.done()
        holder.execute("COMMIT")
        result = await asyncio.wait_for(update, 10)
        assert result.rows_affected == 1
        assert _retries() > before
        rows = (await tablet.execute("SELECT v FROM t WHERE id = 1", [])).rows
        assert [tuple(r) for r in rows] == [(1,)]  # ran once, not once per attempt
    finally:
        holder.close()
        await tablet.close()


async def test_conflict_outlasting_the_attempts_is_aborted(tmp_path: Path) -> None:
    path = tmp_path / "shard.db"
    tablet = await _tablet(path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        before = _retries()
        with pytest.raises(Aborted):
            await tablet.execute("UPDATE t SET v = v + 1 WHERE id = 1", [])
        assert _retries() - before == AUTOCOMMIT_ATTEMPTS - 1
        # a transaction's conflict goes back to its client at once (on SQLite its
        # BEGIN takes the write lock)
        before = _retries()
        with pytest.raises(Aborted):
            await tablet.begin()
        assert _retries() == before
        holder.execute("ROLLBACK")
        rows = (await tablet.execute("SELECT v FROM t WHERE id = 1", [])).rows
        assert [tuple(r) for r in rows] == [(0,)]
    finally:
        holder.close()
        await tablet.close()
