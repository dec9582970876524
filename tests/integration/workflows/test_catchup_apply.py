"""Catch-up's apply: a batch of source transactions in a few statements per target.

A MariaDB catch-up did not keep up with unpaced writes through a gate: writers that
insert a row and then update it made every change its own statement (an upsert run
ends where a key repeats) and every delete its own round trip, so applying cost about
one round trip per row change. Now a table whose only unique key is its primary key
gets each key's last image (or delete) alone, deletes in one statement and upserts in
one; a table with another unique key keeps the order of its writes (a row may take a
value another row gives up in the same batch). Checked on every backend: the rows
after the batch equal a model, and the number of statements the applier sent. On
MariaDB the applier also writes through a freeze that refuses every other session.
(``bench/reshard_mariadb_catchup.py`` measures the rate under load.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shardgate.backends import open_backend
from shardgate.backends.base import Backend
from shardgate.backends.changes import DELETE, INSERT, UPDATE, RowChange, Transaction
from shardgate.errors import ShardgateError
from shardgate.event_token import EventToken
from shardgate.keys import KeyRange
from shardgate.topo.model import WRITES_FROZEN
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.catchup import Applier
from shardgate.workflows.freeze import table_freeze_sql
from shardgate.workflows.rowsql import MovingTable

KINDS = [pytest.param("sqlite", id="sqlite"),
         pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
         pytest.param("mysql", marks=pytest.mark.mysql, id="mysql")]
HASH = create_vindex("hash", "hash", {})
assert isinstance(HASH, SingleColumn)
COLS = ("id", "v", "n")
TABLE = MovingTable("t", COLS, ("id",), "id", HASH, ("int", "text", "int"))


def _tx(seq: int, changes: list[RowChange]) -> Transaction:
    return Transaction(EventToken(float(seq), "-", str(seq)), changes)


def _row(i: int, v: str, n: int) -> dict[str, Any]:
    return {"id": i, "v": v, "n": n}


@contextmanager
def _counting(backend: Backend) -> Iterator[list[str]]:
    """The statements run on connections ``backend`` hands out meanwhile."""
    seen: list[str] = []
    acquire = backend.acquire

    async def counted() -> Any:
        conn = await acquire()
        execute, executemany = conn.execute, conn.executemany

        async def ex(sql: str, *a: Any, **k: Any) -> Any:
            seen.append(sql)
            return await execute(sql, *a, **k)

        async def exm(sql: str, rows: Any, *a: Any, **k: Any) -> Any:
            seen.extend([sql] * len(rows))
            return await executemany(sql, rows, *a, **k)

        conn.execute, conn.executemany = ex, exm  # type: ignore[method-assign]
        return conn

    backend.acquire = counted  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        backend.acquire = acquire  # type: ignore[method-assign]


async def _rows(backend: Backend) -> dict[int, tuple[Any, ...]]:
    res = await backend.execute("SELECT id, v, n FROM t")
    return {int(r[0]): (str(r[1]), int(r[2])) for r in res.rows}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_of_row_changes_is_a_few_statements(kind: str,
                                                           make_database: Any) -> None:
    backend = open_backend(make_database(kind, "apply"))
    try:
        await backend.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, "
                              "n INT NOT NULL)")
        await backend.execute("INSERT INTO t (id, v, n) VALUES (1, 'old', 0), (2, 'old', 0)")
        applier = Applier({"t": TABLE}, [("-", KeyRange())], {"-": backend})
        txs, model = [], {1: ("old", 0), 2: ("old", 0)}
        seq = 0
        for i in range(100, 400):  # as the gate's writers: insert, then update
            seq += 1
            txs.append(_tx(seq, [RowChange("t", INSERT, (i,), None, _row(i, "w", 0))]))
            seq += 1
            txs.append(_tx(seq, [RowChange("t", UPDATE, (i,), _row(i, "w", 0),
                                           _row(i, "w", 1))]))
            model[i] = ("w", 1)
            if i % 10 == 0:  # and some deletes, one of a row inserted again after
                seq += 1
                txs.append(_tx(seq, [RowChange("t", DELETE, (i,), _row(i, "w", 1), None)]))
                del model[i]
        txs.append(_tx(seq + 1, [RowChange("t", DELETE, (1,), _row(1, "old", 0), None)]))
        del model[1]
        txs.append(_tx(seq + 2, [RowChange("t", DELETE, (2,), _row(2, "old", 0), None),
                                 RowChange("t", INSERT, (2,), None, _row(2, "new", 7))]))
        model[2] = ("new", 7)
        with _counting(backend) as seen:
            await applier.apply(txs)
        assert await _rows(backend) == model
        writes = [s for s in seen if s.lstrip().upper().startswith(("INSERT", "DELETE"))]
        # 300 rows inserted, 300 updated, 32 deleted: one delete, one multi-row upsert
        assert len(writes) == 2, (len(writes), [w[:40] for w in writes[:6]])
    finally:
        await backend.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_table_with_another_unique_key_keeps_the_order_of_its_writes(
    kind: str, make_database: Any
) -> None:
    backend = open_backend(make_database(kind, "applyu"))
    try:
        await backend.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, "
                              "n INT NOT NULL, CONSTRAINT t_v UNIQUE (v))")
        await backend.execute("INSERT INTO t (id, v, n) VALUES (1, 'a', 0), (2, 'b', 0)")
        applier = Applier({"t": TABLE}, [("-", KeyRange())], {"-": backend})
        # rows 1 and 2 swap their values through 'x', and row 3 takes 'x' after: the
        # last images alone, written together, collide on v (PostgreSQL and SQLite
        # refuse; MariaDB's ON DUPLICATE KEY UPDATE would update the other row)
        txs = [_tx(1, [RowChange("t", UPDATE, (1,), _row(1, "a", 0), _row(1, "x", 0))]),
               _tx(2, [RowChange("t", UPDATE, (2,), _row(2, "b", 0), _row(2, "a", 0))]),
               _tx(3, [RowChange("t", UPDATE, (1,), _row(1, "x", 0), _row(1, "b", 0))]),
               _tx(4, [RowChange("t", INSERT, (3,), None, _row(3, "x", 5))])]
        await applier.apply(txs)
        assert await _rows(backend) == {1: ("b", 0), 2: ("a", 0), 3: ("x", 5)}
    finally:
        await backend.close()


@pytest.mark.mysql
async def test_the_applier_writes_through_a_mariadb_freeze_and_no_one_else(
    make_database: Any,
) -> None:
    """A frozen MariaDB table (the sources while the reverse stream runs, the targets
    after reverse-traffic) takes the applier's writes and refuses everyone else's, also
    on the applier's own connection after a failed applier transaction."""
    backend = open_backend(make_database("mysql", "applyfrozen"))
    try:
        await backend.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, "
                              "n INT NOT NULL)")
        await backend.execute("INSERT INTO t (id, v, n) VALUES (1, 'old', 0)")
        for sql in table_freeze_sql("mysql", "t", True):
            await backend.execute(sql)
        applier = Applier({"t": TABLE}, [("-", KeyRange())], {"-": backend})
        await applier.apply([_tx(1, [RowChange("t", UPDATE, (1,), _row(1, "old", 0),
                                               _row(1, "new", 1)),
                                     RowChange("t", INSERT, (2,), None, _row(2, "b", 2))])])
        assert await _rows(backend) == {1: ("new", 1), 2: ("b", 2)}
        with pytest.raises(ShardgateError, match=WRITES_FROZEN):
            await backend.execute("DELETE FROM t")
        # an applier transaction that fails after letting itself through (v NOT NULL):
        # its connection (the pool's only one) must not be lent again with the pass on
        with pytest.raises(ShardgateError):
            await applier.apply([_tx(2, [RowChange("t", INSERT, (3,), None,
                                                   {"id": 3, "v": None, "n": 0})])])
        with pytest.raises(ShardgateError, match=WRITES_FROZEN):
            await backend.execute("DELETE FROM t")
        assert await _rows(backend) == {1: ("new", 1), 2: ("b", 2)}
        for sql in table_freeze_sql("mysql", "t", False):
            await backend.execute(sql)
        await backend.execute("DELETE FROM t WHERE id = 2")
        assert await _rows(backend) == {1: ("new", 1)}
    finally:
        await backend.close()
