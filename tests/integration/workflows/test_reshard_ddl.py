"""Reshard and MoveTables targets get the source tables' whole definition (issue 21):
a table with a default, a string default, a time default, a UNIQUE constraint, a
secondary two-column index and a CHECK is split 2 -> 4 while writers write through a
gate (SQLite, PostgreSQL, MariaDB to targets of the same kind, PostgreSQL -> MariaDB,
MariaDB -> PostgreSQL, SQLite -> PostgreSQL), or moved by MoveTables; then, through
the gate on the targets, an insert omitting the defaulted columns gets the defaults,
a duplicate of the unique column is refused (ALREADY_EXISTS), a CHECK violation is
refused; the indexes are in each target's catalog; a target of the source's kind has
the source's definition exactly. A foreign key is refused at ``create``, naming the
table and the construct, before anything is recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import AlreadyExists, ShardgateError, Unsupported
from shardgate.gate import Gate
from shardgate.keys import parse_shard_name
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.ddl import TableDef, source_table
from shardgate.workflows.movetables import MoveTablesWorkflow, movetables_spec
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows.test_reshard import (
    HASH,
    ROWS,
    VSCHEMA,
    Model,
    Writers,
    _reshard,
    _wait,
    check_placement,
)

COLUMNS = ("id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, n INT NOT NULL CHECK (n >= 0), "
           "d INT NOT NULL DEFAULT 42, s VARCHAR(16) NOT NULL DEFAULT 'new', ")
SOURCE_DDL = {
    "sqlite": [f"CREATE TABLE t ({COLUMNS}at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, "
               "CONSTRAINT t_v_key UNIQUE (v))", "CREATE INDEX t_nd ON t (n, d)"],
    "postgres": [f"CREATE TABLE t ({COLUMNS}at TIMESTAMP DEFAULT now(), "
                 "CONSTRAINT t_v_key UNIQUE (v))", "CREATE INDEX t_nd ON t (n, d)"],
    "mysql": [f"CREATE TABLE t ({COLUMNS}at TIMESTAMP NULL DEFAULT CURRENT_TIMESTAMP, "
              "UNIQUE KEY t_v_key (v), KEY t_nd (n, d))"],
}
MARKS = {"postgres": pytest.mark.postgres, "mysql": pytest.mark.mysql}
KINDS = [("sqlite", "sqlite"), ("postgres", "postgres"), ("mysql", "mysql"),
         ("postgres", "mysql"), ("mysql", "postgres"), ("sqlite", "postgres")]


def _marked(pairs: list[tuple[str, str]]) -> list[Any]:
    out = []
    for pair in pairs:
        marks = [MARKS[k] for k in sorted(set(pair)) if k in MARKS]
        out.append(pytest.param(*pair, marks=marks, id=f"{pair[0]}-to-{pair[1]}"))
    return out


async def _run(url: str, sqls: list[str]) -> None:
    backend = open_backend(url)
    try:
        for sql in sqls:
            await backend.execute(sql)
    finally:
        await backend.close()


async def _definition(url: str) -> TableDef:
    backend = open_backend(url)
    conn = await backend.acquire()
    try:
        return await source_table(conn, backend.dialect, "t")
    finally:
        await backend.release(conn)
        await backend.close()


async def _indexes(url: str) -> set[tuple[bool, tuple[str, ...]]]:
    """(unique, columns) of ``t``'s indexes other than its primary key, from the catalog."""
    backend = open_backend(url)
    try:
        match backend.dialect:
            case "sqlite":
                out = set()
                for name, unique, origin in (await backend.execute(
                        "SELECT name, \"unique\", origin FROM pragma_index_list('t')")).rows:
                    if origin == "pk":
                        continue
                    cols = (await backend.execute(
                        "SELECT name FROM pragma_index_info(?) ORDER BY seqno", (name,))).rows
                    out.add((bool(unique), tuple(str(c[0]) for c in cols)))
                return out
            case "postgres":
                rows = (await backend.execute(
                    "SELECT i.indisunique, ARRAY(SELECT a.attname::text FROM unnest(i.indkey) "
                    "WITH ORDINALITY k(n, o) JOIN pg_attribute a ON a.attrelid = i.indrelid "
                    "AND a.attnum = k.n ORDER BY k.o) FROM pg_index i WHERE i.indrelid = "
                    "'t'::regclass AND NOT i.indisprimary")).rows
                return {(bool(u), tuple(c)) for u, c in rows}
            case _:
                keys: dict[str, tuple[bool, list[str]]] = {}
                for name, non_unique, col in (await backend.execute(
                        "SELECT index_name, non_unique, column_name FROM "
                        "information_schema.statistics WHERE table_schema = DATABASE() AND "
                        "table_name = 't' AND index_name <> 'PRIMARY' "
                        "ORDER BY index_name, seq_in_index")).rows:
                    keys.setdefault(str(name), (not int(non_unique), []))[1].append(str(col))
                return {(u, tuple(c)) for u, c in keys.values()}
    finally:
        await backend.close()


def _id_on(shard: str, avoid: set[int], start: int) -> int:
    kr = parse_shard_name(shard)
    return next(i for i in range(start, start + 100_000)
                if i not in avoid and kr.contains(HASH.map([i])[0][0]))


async def check_targets(gate: Gate, keyspace: str, targets: dict[str, str], same_kind: bool,
                        model: Model, source_def: TableDef) -> None:
    """Defaults, unique, check and indexes on the targets, through ``gate``."""
    s = gate.session(keyspace, identity=TRUSTED)
    for name, url in targets.items():
        assert await _indexes(url) == {(True, ("v",)), (False, ("n", "d"))}, name
        if same_kind:
            got = await _definition(url)
            assert (got.create, [i.sql for i in got.indexes]) == (
                source_def.create, [i.sql for i in source_def.indexes]), name
        # an insert omitting the defaulted columns gets the defaults
        i = _id_on(name, set(model), 50_000_000)
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, :v, 1)",
                           {"i": i, "v": f"dflt{i}"})
        row = (await gate.execute(s, "SELECT d, s, at FROM t WHERE id = :i", {"i": i})).rows
        assert len(row) == 1 and (row[0][0], row[0][1]) == (42, "new"), row
        assert row[0][2] is not None, row
        # a duplicate of the unique column (on the same shard) is refused
        j = _id_on(name, set(model) | {i}, i + 1)
        with pytest.raises(AlreadyExists):
            await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:j, :v, 1)",
                               {"j": j, "v": f"dflt{i}"})
        # a CHECK violation is refused
        with pytest.raises(ShardgateError) as refused:
            await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:j, :v, -1)",
                               {"j": j, "v": f"neg{j}"})
        assert not isinstance(refused.value, AlreadyExists)
        assert (await gate.execute(s, "SELECT COUNT(*) FROM t WHERE id = :j",
                                   {"j": j})).rows[0][0] == 0


async def _cluster(make_database: Any, tmp_path: Path, kind: str
                   ) -> tuple[str, Gate, dict[str, str], Model]:
    shards = {name: make_database(kind, f"ddl{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}))
    await server.close()
    for url in shards.values():
        await _run(url, SOURCE_DDL[kind])
    gate = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    s = gate.session("app", identity=TRUSTED)
    model: Model = {}
    for start in range(1, ROWS + 1, 250):
        ids = range(start, min(start + 250, ROWS + 1))
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                           + ", ".join(f"({i}, 'v{i}', 0)" for i in ids))
        model.update({i: (f"v{i}", 0) for i in ids})
    return topo, gate, shards, model


@pytest.mark.parametrize(("source", "target"), _marked(KINDS))
async def test_split_carries_defaults_unique_indexes_and_checks(
    make_database: Any, tmp_path: Path, source: str, target: str
) -> None:
    topo, gate, shards, model = await _cluster(make_database, tmp_path, source)
    source_def = await _definition(shards["-80"])
    four = {n: make_database(target, f"ddlfour{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    writers = Writers(gate, model)
    writers.start()
    try:
        await _reshard(topo, writers, gate, ["-80", "80-"], four)
    finally:
        await writers.halt()
    try:
        await check_placement(four, model)
        await check_targets(gate, "app", four, source == target, model, source_def)
    finally:
        await gate.close()


@pytest.mark.parametrize(("source", "target"), _marked(
    [("sqlite", "sqlite"), ("postgres", "postgres"), ("mysql", "postgres")]))
async def test_movetables_carries_defaults_unique_indexes_and_checks(
    make_database: Any, tmp_path: Path, source: str, target: str
) -> None:
    src = make_database(source, "ddlmtsrc")
    dst = {name: make_database(target, f"ddlmtdst{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict({"keyspaces": {
        "src": {"shards": {"0": src}, "vschema": {"sharded": False}},
        "dst": {"shards": dst, "vschema": {"sharded": True,
                                           "vindexes": {"hash": {"type": "hash"}},
                                           "tables": {}}}}}))
    await _run(src, SOURCE_DDL[source])
    gate = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    model: Model = {}
    s = gate.session("src", identity=TRUSTED)
    await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                       + ", ".join(f"({i}, 'v{i}', 0)" for i in range(1, 301)))
    model.update({i: (f"v{i}", 0) for i in range(1, 301)})
    source_def = await _definition(src)
    spec = await movetables_spec(server, source_keyspace="src", target_keyspace="dst",
                                 tables=("t",), workflow="wf")
    flow = MoveTablesWorkflow(server, spec, batch=100, vschema={"tables": {"t": {
        "column_vindexes": [{"column": "id", "name": "hash"}]}}})
    try:
        await flow.create()
        await flow.switch_reads()
        await flow.switch_writes()
        await flow.complete()
    finally:
        await flow.close()
        await server.close()
    try:
        await _wait(lambda: "t" in gate.vschema.keyspace("dst").tables
                    and not gate.vschema.routing_rules, "complete did not reach the gate")
        await check_placement(dst, model)
        await check_targets(gate, "dst", dst, source == target, model, source_def)
    finally:
        await gate.close()


REFUSED = [
    pytest.param("postgres", ["CREATE TABLE p (id BIGINT PRIMARY KEY)",
                              "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, "
                              "n INT NOT NULL, CONSTRAINT t_n_fk FOREIGN KEY (n) "
                              "REFERENCES p (id))"],
                 r"table t: foreign key t_n_fk", marks=pytest.mark.postgres, id="pg-fk"),
    pytest.param("mysql", ["CREATE TABLE p (id BIGINT PRIMARY KEY)",
                           "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, "
                           "n BIGINT NOT NULL, CONSTRAINT t_n_fk FOREIGN KEY (n) "
                           "REFERENCES p (id))"],
                 r"table t: foreign key t_n_fk", marks=pytest.mark.mysql, id="mariadb-fk"),
    pytest.param("sqlite", ["CREATE TABLE p (id BIGINT PRIMARY KEY)",
                            "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, "
                            "n INT NOT NULL, w INT GENERATED ALWAYS AS (n * 2) STORED)"],
                 r"table t: generated column\(s\) w", id="sqlite-generated"),
]


@pytest.mark.parametrize(("kind", "ddl", "match"), REFUSED)
async def test_what_no_target_gets_is_refused_at_create(
    make_database: Any, tmp_path: Path, kind: str, ddl: list[str], match: str
) -> None:
    """Refused naming the table and the construct, before anything is recorded or made."""
    await _refused(make_database, tmp_path, kind, kind, ddl, match)


@pytest.mark.postgres
@pytest.mark.mysql
async def test_untranslatable_index_is_refused_at_create(
    make_database: Any, tmp_path: Path
) -> None:
    """An expression index of a PostgreSQL source cannot be made on MariaDB targets;
    PostgreSQL targets take it (and its definition is theirs exactly)."""
    ddl = ["CREATE TABLE p (id BIGINT PRIMARY KEY)",
           "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL, n INT NOT NULL)",
           "CREATE INDEX t_lower_v ON t (lower(v))"]
    await _refused(make_database, tmp_path, "postgres", "mysql", ddl,
                   r"table t: index t_lower_v is an expression index")
    src = make_database("postgres", "exprsrc")
    dst = make_database("postgres", "exprdst")
    await _run(src, ddl[1:])
    want = await _definition(src)
    backend = open_backend(dst)
    conn = await backend.acquire()
    try:
        for sql in want.statements("postgres", "target x"):
            await conn.execute(sql)
    finally:
        await backend.release(conn)
        await backend.close()
    got = await _definition(dst)
    assert (got.create, got.indexes) == (want.create, want.indexes)
    assert "lower" in str(got.indexes[0].sql)


async def _refused(make_database: Any, tmp_path: Path, kind: str, target: str,
                   ddl: list[str], match: str) -> None:
    shards = {name: make_database(kind, f"no{i}") for i, name in enumerate(("-80", "80-"))}
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    vschema = {**VSCHEMA, "tables": {**VSCHEMA["tables"],  # type: ignore[dict-item]
                                     "p": {"type": "reference"}}}
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": vschema}}}))
    for url in shards.values():
        await _run(url, ddl)
    four = {n: make_database(target, f"nofour{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())), workflow="wf")
    flow = ReshardWorkflow(server, spec)
    try:
        with pytest.raises(Unsupported, match=match):
            await flow.create()
        # refused before anything was recorded or created
        assert await server.get_workflow(spec.record) is None
        for url in four.values():
            backend = open_backend(url)
            try:
                with pytest.raises(ShardgateError):
                    await backend.execute("SELECT COUNT(*) FROM t")
                with pytest.raises(ShardgateError):
                    await backend.execute("SELECT COUNT(*) FROM p")
            finally:
                await backend.close()
    finally:
        await flow.close()
        await server.close()
