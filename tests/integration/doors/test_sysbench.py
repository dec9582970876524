"""sysbench, unchanged, through the MySQL listener over a keyspace of 4 MariaDB shards.

The keyspace ``sbtest`` has no tables and ``auto_shard: {vindex: hash,
sequence_keyspace: sbseq}``: sysbench's own ``CREATE TABLE sbtest1 (id INTEGER
NOT NULL AUTO_INCREMENT, ...)`` makes sbtest1 a table with a ``hash`` vindex on
``id``, drawn from a sequence in the unsharded keyspace ``sbseq``, so its
prepare inserts rows without ids, as against one MySQL server. Then
``oltp_point_select``, ``oltp_read_only`` and ``oltp_read_write`` run for a few
seconds each with prepared statements (``--db-ps-mode=auto``: COM_STMT_PREPARE,
and executes without new-params-bound-flag) and with them off (``disable``),
both in sysbench's default ``--skip-trx=off`` (each transaction between BEGIN and
COMMIT), and prepared again with ``--skip-trx=on`` (every statement autocommits);
each must finish with transactions done, no error and no reconnect. sysbench is
a Debian package that ``make servers`` installs (scripts/install-system-deps.sh).
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator, Callable
from typing import Any

import pymysql
import pytest

from shardgate.api.mysql import serve_mysql
from shardgate.gate import Gate
from shardgate.topo import Topology

pytestmark = pytest.mark.mysql

TABLE_SIZE = 1000
#: (--db-ps-mode, --skip-trx, seconds per workload): sysbench's defaults the longest
RUNS = (("auto", "off", 3), ("disable", "off", 1), ("auto", "on", 1))
SYSBENCH_TIMEOUT_S = 120


@pytest.fixture
async def port(make_database: Callable[..., str]) -> AsyncIterator[int]:
    shards = [make_database("mysql", f"sb{i}") for i in range(4)]
    seq = make_database("mysql", "sbseq")
    gate = Gate.open(Topology.from_dict({"default_keyspace": "sbtest", "keyspaces": {
        "sbtest": {
            "shards": dict(zip(("-40", "40-80", "80-c0", "c0-"), shards, strict=True)),
            "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                        "auto_shard": {"vindex": "hash", "sequence_keyspace": "sbseq"},
                        "tables": {}},
        },
        "sbseq": {"shards": {"0": seq}, "vschema": {"sharded": False, "tables": {}}},
    }}))
    listener, bound = await serve_mysql(gate, "127.0.0.1", 0)
    try:
        yield bound
    finally:
        await listener.stop()
        await gate.close()


async def sysbench(port: int, workload: str, command: str, *args: str) -> str:
    """sysbench's output; the test fails on a non-zero exit or a FATAL line."""
    binary = shutil.which("sysbench")
    if binary is None:
        pytest.fail("sysbench is missing: run `make servers` (scripts/install-system-deps.sh)")
    proc = await asyncio.create_subprocess_exec(
        binary, workload, "--db-driver=mysql", "--mysql-host=127.0.0.1",
        f"--mysql-port={port}", "--mysql-user=root", "--mysql-db=sbtest", "--tables=1",
        f"--table-size={TABLE_SIZE}", *args, command,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), SYSBENCH_TIMEOUT_S)
    text = out.decode()
    assert proc.returncode == 0 and "FATAL" not in text, text
    return text


def counters(output: str) -> dict[str, float]:
    """sysbench's run summary: transactions, queries, ignored errors, reconnects."""
    found = {}
    for name in ("transactions", "queries", "ignored errors", "reconnects"):
        m = re.search(rf"^\s*{name}:\s+(\d+)", output, re.M)
        assert m is not None, output
        found[name] = float(m.group(1))
    return found


def through_gate(port: int, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", database="sbtest")
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


async def test_sysbench_oltp_workloads_through_the_listener(port: int) -> None:
    prepared = await sysbench(port, "oltp_read_write", "prepare")
    assert f"Inserting {TABLE_SIZE} records into 'sbtest1'" in prepared

    def placed() -> list[tuple[Any, ...]]:
        """Each id once, and each where its vindex routes it (a point read finds it)."""
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root", database="sbtest")
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT COUNT(*), COUNT(DISTINCT id), MIN(id), MAX(id) FROM sbtest1")
                rows = list(cur.fetchall())
                found = 0
                for i in range(1, TABLE_SIZE + 1):
                    found += cur.execute("SELECT id FROM sbtest1 WHERE id = %s", (i,))
                return [*rows, (found,)]
        finally:
            conn.close()

    assert await asyncio.to_thread(placed) == [(TABLE_SIZE, TABLE_SIZE, 1, TABLE_SIZE),
                                               (TABLE_SIZE,)]
    for mode, skip_trx, seconds in RUNS:
        for workload in ("oltp_point_select", "oltp_read_only", "oltp_read_write"):
            out = await sysbench(port, workload, "run", f"--time={seconds}",
                                 f"--db-ps-mode={mode}", f"--skip-trx={skip_trx}",
                                 "--threads=1")
            got = counters(out)
            assert got["transactions"] > 0 and got["queries"] >= got["transactions"], out
            assert got["ignored errors"] == 0 and got["reconnects"] == 0, out
    # DELETE + INSERT pairs leave as many rows, each where it belongs
    assert await asyncio.to_thread(placed) == [(TABLE_SIZE, TABLE_SIZE, 1, TABLE_SIZE),
                                               (TABLE_SIZE,)]
    await sysbench(port, "oltp_read_write", "cleanup")
    assert await asyncio.to_thread(through_gate, port, "SHOW VSCHEMA TABLES") == []
