"""A pooled SQLite connection's cached schema does not answer DDL (found as a flake of
test_drop_queue_stops_it_and_frees_the_name: DROP QUEUE then CREATE QUEUE failed on
"index jobs_sg_next already exists" in 2 of 5 runs).

SQLite checks a CREATE's name against the schema the connection cached when it last
read, without comparing the schema cookie first. The backend refreshes the cache
before a DDL statement: the CREATE INDEX case fails without it, every time (SQLite
itself notices the stale cache for a table or a view; those cases guard the refresh).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardgate.backends.sqlite import DEFAULT_BUSY_TIMEOUT_MS, SQLiteConnection


async def _two(path: Path) -> tuple[SQLiteConnection, SQLiteConnection]:
    a = await SQLiteConnection.open(str(path), DEFAULT_BUSY_TIMEOUT_MS, "sqlite:///x.db")
    b = await SQLiteConnection.open(str(path), DEFAULT_BUSY_TIMEOUT_MS, "sqlite:///x.db")
    return a, b


@pytest.mark.parametrize("again", [
    "CREATE INDEX t_i ON t (v)",
    "CREATE TABLE t2 (id INTEGER PRIMARY KEY)",
    "CREATE VIEW w AS SELECT 1",
])
async def test_ddl_on_a_connection_that_cached_a_dropped_schema(tmp_path: Path,
                                                                again: str) -> None:
    a, b = await _two(tmp_path / "x.db")
    try:
        await a.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INT)")
        await a.execute("CREATE INDEX t_i ON t (v)")
        await a.execute("CREATE TABLE t2 (id INTEGER PRIMARY KEY)")
        await a.execute("CREATE VIEW w AS SELECT 1")
        assert (await b.execute("SELECT COUNT(*) FROM t")).rows == [(0,)]  # b caches it all
        for drop in ("DROP VIEW w", "DROP TABLE t2", "DROP TABLE t"):
            await a.execute(drop)
        await a.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INT)")
        await b.execute(again)  # "... already exists" from b's stale cache before the fix
        names = {r[0] for r in (await a.execute("SELECT name FROM sqlite_master")).rows}
        assert again.split()[2] in names
    finally:
        await a.close()
        await b.close()
