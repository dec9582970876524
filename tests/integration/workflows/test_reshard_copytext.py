"""The copy's PostgreSQL-to-PostgreSQL path moves rows as COPY text lines
(``shardgate.backends.copytext``): every value arrives exactly, whatever the two
servers' output and input settings (date and interval styles, float digits); a type
whose text is not portable is refused (the copy reads typed rows); a batch meeting a
key the target has is upserted; and a split copies such a table exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardgate.backends import open_backend
from shardgate.backends.base import Backend, transaction
from shardgate.keys import parse_shard_name
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from shardgate.workflows.rowsql import MovingTable, RowWriter, select_after
from tests.integration.workflows.test_reshard import HASH

pytestmark = pytest.mark.postgres

DDL = ("CREATE TABLE k (id BIGINT PRIMARY KEY, s TEXT, c CHAR(3), b BYTEA, d DATE, "
       "ts TIMESTAMP, tz TIMESTAMPTZ, iv INTERVAL, f DOUBLE PRECISION, r REAL, "
       "nu NUMERIC(30, 10), j JSONB, u UUID, ok BOOLEAN)")
COLUMNS = ("id", "s", "c", "b", "d", "ts", "tz", "iv", "f", "r", "nu", "j", "u", "ok")
TRICKY = ["a\tb", "line\nnext", "cr\rhere", "back\\slash", "\\N", "\\.", "é✓",
          "", " ", "tab\t\\t"]


async def _fill(backend: Backend, n: int, shard: str = "-") -> None:
    """Table k with ``n`` rows whose keyspace ids are in ``shard``."""
    await backend.execute(DDL)
    kr = parse_shard_name(shard)
    for i in [i for i in range(4 * n) if kr.contains(HASH.map([i * 37 - 500])[0][0])][:n]:
        s = TRICKY[i % len(TRICKY)] + str(i) if i % 7 else None
        await backend.execute(
            "INSERT INTO k VALUES (%s, %s, %s, %s, DATE '2024-02-03' + %s, "
            "TIMESTAMP '2024-02-03 04:05:06.789' + %s * INTERVAL '1 hour', "
            "TIMESTAMPTZ '2024-02-03 04:05:06+05:30' + %s * INTERVAL '1 min', "
            "%s * INTERVAL '-1 day 2 hours 3.5 seconds', %s, %s, %s, %s, "
            "gen_random_uuid(), %s)",
            (i * 37 - 500, s, "x\ty"[: 1 + i % 3], bytes([0, 92, 9, 10, i % 256]),
             i, i, i, i, 0.1 * i + 1e-300, 1 / 3 + i, f"{i}.0123456789",
             f'{{"k": "v\\t{i}", "n": {i}}}', i % 2 == 0))


async def _rows(backend: Backend) -> list[tuple[Any, ...]]:
    """Every row, typed (read in ISO style: psycopg reads no other DateStyle)."""
    conn = await backend.acquire()
    try:
        async with transaction(conn):
            await conn.execute("SET LOCAL DateStyle = 'ISO'")
            await conn.execute("SET LOCAL IntervalStyle = 'postgres'")
            return [tuple(r) for r in (await conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM k ORDER BY id")).rows]
    finally:
        await backend.release(conn)


async def test_text_rows_move_exactly_across_server_settings(make_database: Any) -> None:
    src_url, dst_url = make_database("postgres", "txsrc"), make_database("postgres", "txdst")
    admin = open_backend(src_url)
    try:
        # settings that change COPY text on either side unless the source's are set
        for url, style in ((src_url, "SQL, DMY"), (dst_url, "German")):
            name = url.rsplit("/", 1)[1]
            await admin.execute(f'ALTER DATABASE "{name}" SET DateStyle = \'{style}\'')
            await admin.execute(f'ALTER DATABASE "{name}" SET IntervalStyle = \'sql_standard\'')
            await admin.execute(f'ALTER DATABASE "{name}" SET extra_float_digits = -10')
            await admin.execute(f'ALTER DATABASE "{name}" SET bytea_output = \'escape\'')
    finally:
        await admin.close()
    src, dst = open_backend(src_url), open_backend(dst_url)
    try:
        await _fill(src, 60)
        await dst.execute(DDL)
        table = MovingTable("k", COLUMNS, ("id",), "id", HASH)
        conn = await src.acquire()
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            sql, params = select_after("postgres", table, None, 0, "%s")
            oids = await conn.text_copy_types(sql, params)
            assert oids is not None
            quoted = [f'"{c}"' for c in COLUMNS]
            batch = await conn.copy_out_text(sql, params, quoted, oids, ['"id"'])
            assert len(batch) == 60
            typed = [tuple(r) for r in (await conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM k ORDER BY id")).rows]
            assert batch.rows() == typed
            assert batch.column(0) == [r[0] for r in typed]
            # keyset continuation after a key, as the copy's next batch reads
            sql2, params2 = select_after("postgres", table, (typed[29][0],), 10, "%s")
            part = await conn.copy_out_text(sql2, params2, quoted, oids, ['"id"'])
            assert part.rows() == typed[30:40]
            writer = RowWriter(dst, table)
            tconn = await dst.acquire()
            try:
                async with transaction(tconn):
                    assert await writer.write_text(tconn, conn, batch, list(range(0, 60, 2)))
                async with transaction(tconn):  # keys there already: upserted
                    assert not await writer.write_text(tconn, conn, batch, list(range(60)))
            finally:
                await dst.release(tconn)
            await conn.execute("ROLLBACK")
        finally:
            await src.release(conn)
        assert await _rows(dst) == await _rows(src)
        # a type whose text is not portable (money: the server's locale) is refused
        await src.execute("CREATE TABLE m (id BIGINT PRIMARY KEY, amount MONEY)")
        conn = await src.acquire()
        try:
            assert await conn.text_copy_types("SELECT id, amount FROM m") is None
        finally:
            await src.release(conn)
    finally:
        await src.close()
        await dst.close()


async def test_split_copies_tricky_values_exactly(make_database: Any, tmp_path: Path) -> None:
    shards = {"-80": make_database("postgres", "txa"), "80-": make_database("postgres", "txb")}
    targets = {"-40": make_database("postgres", "txc"), "40-80": make_database("postgres", "txd")}
    source = open_backend(shards["-80"])
    try:
        await _fill(source, 300, "-80")
        other = open_backend(shards["80-"])
        try:
            await other.execute(DDL)
        finally:
            await other.close()
        expect = await _rows(source)
    finally:
        await source.close()
    server = TopoServer(open_topo_store(f"sqlite:///{tmp_path / 'topo.db'}"))
    vschema = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
               "tables": {"k": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": vschema}}}))
    spec = ReshardSpec(keyspace="app", sources=("-80",), targets=tuple(targets),
                       target_urls=tuple(sorted(targets.items())))
    flow = ReshardWorkflow(server, spec, batch=17)
    try:
        await flow.create()
        status = await flow.status()
        assert status["rows_copied"] == len(expect)
        report = await flow.vdiff()
        assert report[0].clean, report[0].to_doc()
    finally:
        await flow.close()
        await server.close()
    found: list[tuple[Any, ...]] = []
    for name, url in targets.items():
        backend = open_backend(url)
        try:
            rows = await _rows(backend)
        finally:
            await backend.close()
        kr = parse_shard_name(name)
        assert all(kr.contains(HASH.map([r[0]])[0][0]) for r in rows), name
        found.extend(rows)
    assert sorted(found) == expect
