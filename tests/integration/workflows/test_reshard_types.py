"""Type fidelity across backends (issue 21: any backend per target shard).

A table holding a time zone-aware timestamp, a naive timestamp, a date, a time, a
``numeric(12,3)``, a double, a boolean, a binary string, two JSON columns, a UUID
and a Unicode ``varchar`` (plus rows with NULL in every column) is resharded from
one source shard onto two targets of another kind: PostgreSQL -> MariaDB,
PostgreSQL -> SQLite, MariaDB -> PostgreSQL. Rows are both copied (written before
``create``) and replayed by catch-up (inserts, updates, updates to and from NULL,
deletes written after the copy). VDiff must be clean, and every target row must
equal the source's after the per-type normalisation that docs/resharding.md
documents ("Column types across backends"), which this module implements on its
own (:func:`_normal`) rather than reuse the workflow's. A type that cannot be
carried (PostgreSQL ``interval``, arrays) is refused at ``create`` with
UNIMPLEMENTED naming the table and the column, before anything is recorded.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from shardgate.backends import open_backend
from shardgate.errors import Unsupported
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow

VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}
COLUMNS = ("id", "tz", "ts", "d", "tm", "num", "dbl", "b", "bin", "j", "jb", "u", "s")
SOURCE_DDL = {
    "postgres": "CREATE TABLE t (id BIGINT PRIMARY KEY, tz TIMESTAMPTZ, ts TIMESTAMP, "
                "d DATE, tm TIME, num NUMERIC(12,3), dbl DOUBLE PRECISION, b BOOLEAN, "
                "bin BYTEA, j JSON, jb JSONB, u UUID, s VARCHAR(64))",
    "mysql": "CREATE TABLE t (id BIGINT PRIMARY KEY, tz TIMESTAMP(6) NULL DEFAULT NULL, "
             "ts DATETIME(6), d DATE, tm TIME(6), num DECIMAL(12,3), dbl DOUBLE, b BOOLEAN, "
             "bin BLOB, j JSON, jb JSON, u UUID, s VARCHAR(64))",
}
PAIRS = [pytest.param("postgres", "mysql", marks=[pytest.mark.postgres, pytest.mark.mysql],
                      id="postgres-to-mysql"),
         pytest.param("postgres", "sqlite", marks=[pytest.mark.postgres],
                      id="postgres-to-sqlite"),
         pytest.param("mysql", "postgres", marks=[pytest.mark.postgres, pytest.mark.mysql],
                      id="mysql-to-postgres")]
NULLS = {5, 17, 29}  # ids holding NULL in every column but the key


def _row(i: int, kind: str, gen: int = 0) -> tuple[Any, ...]:
    """Row ``i`` of generation ``gen`` (an update writes the next one) for a ``kind``
    source: every column set (NULL ones for ``NULLS`` in generation 0)."""
    if i in NULLS and gen == 0:
        return (i,) + (None,) * (len(COLUMNS) - 1)
    k = i + 1000 * gen
    offset = dt.timezone(dt.timedelta(hours=(k % 7) - 3, minutes=30 * (k % 2)))
    tz = dt.datetime(2026, 11, 27, 10, k % 60, 7, 123456 + k, tzinfo=offset)
    if kind == "mysql":  # TIMESTAMP takes a UTC time (the connections' zone is UTC)
        tz = tz.astimezone(dt.UTC).replace(tzinfo=None)
    doc = json.dumps({"k": k, "name": f"é{k}", "list": [1, 2.5, None, True], "nested": {"x": ""}})
    return (i, tz, dt.datetime(1999, 12, 31, 23, 59, 58, k % 1_000_000),
            dt.date(1970 + k % 80, 1 + k % 12, 28), dt.time(k % 24, 30, 15, 250_000 + k),
            Decimal(f"{'-' if k % 3 == 0 else ''}{k * 7 % 1_000_000_000}.{k % 1000:03d}"),
            k / 3.0, k % 2 == 0, bytes([k % 256, 0, 255, 39, 92]) + b"\x00" * (k % 5),
            doc, json.dumps({"b": k, "a": [k, "ü"]}), str(uuid.UUID(int=k * 2**70 + k)),
            f"h\u00e9llo \u2713 \u65e5\u672c \U0001F389 {k} 'q\"")


# -- the documented normalisation (docs/resharding.md), written independently -------

def _normal(column: str, v: Any) -> Any:
    if v is None:
        return None
    match column:
        case "tz" | "ts":
            if isinstance(v, str):
                v = dt.datetime.fromisoformat(v)
            if v.tzinfo is not None:
                v = v.astimezone(dt.UTC).replace(tzinfo=None)
            return v
        case "d":
            return dt.date.fromisoformat(v) if isinstance(v, str) else v
        case "tm":
            if isinstance(v, dt.timedelta):
                return (dt.datetime.min + v).time()
            return dt.time.fromisoformat(v) if isinstance(v, str) else v
        case "num":
            return Decimal(str(v))
        case "dbl":
            return float(v)
        case "b":
            return bool(v)
        case "bin":
            return bytes(v)
        case "j" | "jb":
            return json.loads(v) if isinstance(v, str | bytes) else v
        case "u":
            return uuid.UUID(bytes=bytes(v)) if isinstance(v, bytes) else uuid.UUID(str(v))
        case _:
            return v


async def _insert(url: str, rows: list[tuple[Any, ...]]) -> None:
    backend = open_backend(url)
    try:
        m = backend.placeholder
        marks = ", ".join([f"({', '.join([m] * len(COLUMNS))})"] * len(rows))
        await backend.execute(f"INSERT INTO t ({', '.join(COLUMNS)}) VALUES {marks}",
                              [v for r in rows for v in r])
    finally:
        await backend.close()


async def _run(url: str, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> None:
    backend = open_backend(url)
    try:
        await backend.execute(sql, params)
    finally:
        await backend.close()


async def _normal_rows(url: str) -> dict[int, tuple[Any, ...]]:
    backend = open_backend(url)
    try:
        rows = (await backend.execute(f"SELECT {', '.join(COLUMNS)} FROM t")).rows
    finally:
        await backend.close()
    return {int(r[0]): tuple(_normal(c, v) for c, v in zip(COLUMNS, r, strict=True))
            for r in rows}


async def _topology(make_database: Any, tmp_path: Path, source: str) -> tuple[str, str]:
    url = make_database(source, "types")
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    try:
        await server.import_topology(Topology.from_dict(
            {"keyspaces": {"app": {"shards": {"-": url}, "vschema": VSCHEMA}}}))
    finally:
        await server.close()
    return topo, url


@pytest.mark.parametrize(("source", "target"), PAIRS)
async def test_types_survive_copy_and_catch_up_across_backends(
    source: str, target: str, make_database: Any, tmp_path: Path
) -> None:
    topo, src = await _topology(make_database, tmp_path, source)
    await _run(src, SOURCE_DDL[source])
    await _insert(src, [_row(i, source) for i in range(1, 41)])  # copied
    targets = {n: make_database(target, f"ty{i}") for i, n in enumerate(("-80", "80-"))}
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=("-",), targets=tuple(targets),
                       target_urls=tuple(sorted(targets.items())), workflow="types")
    flow = ReshardWorkflow(server, spec, batch=7)
    try:
        await flow.create()
        assert flow.state == "running"
        # replayed by catch-up: inserts, updates (to and from NULL), deletes
        await _insert(src, [_row(i, source) for i in range(41, 61)])
        m = "%s"
        sets = ", ".join(f"{c} = {m}" for c in COLUMNS[1:])
        for i in (*range(3, 40, 4), 5, 17, 45, 50):
            await _run(src, f"UPDATE t SET {sets} WHERE id = {m}", [*_row(i, source, 1)[1:], i])
        await _run(src, f"UPDATE t SET {sets} WHERE id IN (8, 44)", [None] * (len(COLUMNS) - 1))
        await _run(src, "DELETE FROM t WHERE id IN (2, 6, 29, 42, 57)")

        reports = await flow.vdiff()
        assert [r.table for r in reports] == ["t"]
        assert reports[0].clean, reports[0].to_doc()
        assert reports[0].matching == 55
        assert await flow.catch_up()

        want = await _normal_rows(src)
        got: dict[int, tuple[Any, ...]] = {}
        for url in targets.values():
            part = await _normal_rows(url)
            assert not set(part) & set(got)
            got.update(part)
        assert len(want) == 55 and got.keys() == want.keys()
        for i, row in want.items():
            assert got[i] == row, (i, got[i], row)
        assert want[8] == (8,) + (None,) * (len(COLUMNS) - 1)
        assert want[5] != (5,) + (None,) * (len(COLUMNS) - 1)
    finally:
        await flow.close()
        await server.close()


@pytest.mark.postgres
@pytest.mark.parametrize(("column", "target"), [
    pytest.param("iv INTERVAL", "mysql", marks=pytest.mark.mysql, id="interval-to-mysql"),
    pytest.param("arr INTEGER[]", "sqlite", id="array-to-sqlite"),
    pytest.param("arr INTEGER[]", "mysql", marks=pytest.mark.mysql, id="array-to-mysql"),
])
async def test_a_type_that_cannot_be_carried_is_refused_at_create(
    column: str, target: str, make_database: Any, tmp_path: Path
) -> None:
    topo, src = await _topology(make_database, tmp_path, "postgres")
    await _run(src, f"CREATE TABLE t (id BIGINT PRIMARY KEY, tz TIMESTAMPTZ, {column})")
    targets = {n: make_database(target, f"tr{i}") for i, n in enumerate(("-80", "80-"))}
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=("-",), targets=tuple(targets),
                       target_urls=tuple(sorted(targets.items())), workflow="refused")
    flow = ReshardWorkflow(server, spec)
    try:
        with pytest.raises(Unsupported) as err:
            await flow.create()
        assert err.value.code.value == "UNIMPLEMENTED"
        name = column.split()[0]
        assert "table t" in str(err.value) and f"column {name}" in str(err.value), err.value
        assert await server.get_workflow(spec.record) is None
    finally:
        await flow.close()
        await server.close()
