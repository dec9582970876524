"""Resharding a keyspace whose owned lookup vindex keeps its lookup table in the same
keyspace (issue 21): ``user`` (primary vindex ``hash`` on ``id``, owned
``lookup_unique`` on ``email``) and its lookup table ``user_email_lookup``
(primary vindex ``unicode_loose_md5`` on ``email``) are split 2 -> 4 while writers
insert users, change their emails and delete them through a gate. Checked: VDiff clean
for both tables; after the switch every row of each table exactly once, on the shard
its OWN primary vindex names (read from the shard databases); exactly one lookup row
per user, mapping to the user's keyspace id; a lookup by email through the gate
(routed by the lookup vindex, one shard) finds the user; the writers saw no error.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import Aborted, Unsupported
from shardgate.gate import Gate
from shardgate.keys import parse_shard_name
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.freeze import SQLITE_MARK_DDL, sqlite_deny_trigger
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.integration.workflows.test_reshard import _shards_in, _wait

USERS = 600
#: writers per backend: SQLite locks a whole shard database per transaction, so two
#: writers whose transactions join the same two shards in opposite orders deadlock until
#: ``busy_timeout`` (ABORTED, with or without a reshard); PostgreSQL locks rows
WRITERS = {"sqlite": 1, "postgres": 2}
VSCHEMA = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "md5": {"type": "unicode_loose_md5"},
        "user_email": {"type": "lookup_unique", "owner": "user",
                       "params": {"table": "user_email_lookup", "from": "email",
                                  "to": "keyspace_id"}},
        "user_tag": {"type": "lookup", "owner": "user",
                     "params": {"table": "user_tag_lookup", "from": "tag",
                                "to": "keyspace_id"}},
    },
    "tables": {
        "user": {"column_vindexes": [{"column": "id", "name": "hash"},
                                     {"column": "email", "name": "user_email"},
                                     {"column": "tag", "name": "user_tag"}]},
        "user_email_lookup": {"column_vindexes": [{"column": "email", "name": "md5"}]},
        "user_tag_lookup": {"column_vindexes": [{"column": "tag", "name": "md5"}]},
    },
}
DDL = [
    "CREATE TABLE `user` (id BIGINT PRIMARY KEY, email VARCHAR(64) NOT NULL, "
    "tag VARCHAR(16) NOT NULL, n INT NOT NULL)",
    "CREATE TABLE user_email_lookup (email VARCHAR(64) PRIMARY KEY, "
    "keyspace_id VARBINARY(8) NOT NULL)",
    # a non-unique lookup's table: its primary key holds the (binary) keyspace id
    "CREATE TABLE user_tag_lookup (tag VARCHAR(16) NOT NULL, keyspace_id VARBINARY(8) "
    "NOT NULL, PRIMARY KEY (tag, keyspace_id))",
]
TABLES = ["user", "user_email_lookup", "user_tag_lookup"]
TAGS = 40
HASH = create_vindex("hash", "hash", {})
MD5 = create_vindex("unicode_loose_md5", "md5", {})
assert isinstance(HASH, SingleColumn) and isinstance(MD5, SingleColumn)

Model = dict[int, tuple[str, str, int]]  # id -> (email, tag, n)


class Writers:
    """Writers through the gate on their own ids (id % count): insert a user, change
    a user's email and tag (their lookup rows move, often to other shards), delete a
    user. Each statement touches the owner's shard and up to four lookup shards in
    one implicit transaction. An exact model of what committed; any error fails the test."""

    def __init__(self, gate: Gate, model: Model, count: int) -> None:
        self.gate, self.model, self.count = gate, model, count
        self.stop = asyncio.Event()
        self.counts = {"insert": 0, "email": 0, "delete": 0}
        self.slowest = 0.0
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._run(k)) for k in range(self.count)]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    async def _run(self, k: int) -> None:
        rnd = random.Random(k)
        s = self.gate.session("app", identity=TRUSTED)
        next_id = 10_000_000 * (k + 1)
        serial = 0
        while not self.stop.is_set():
            mine = [i for i in self.model if i % self.count == k]
            op = rnd.random()
            start = time.monotonic()
            serial += 1
            if op < 0.4 or not mine:
                next_id += self.count
                email, tag = f"w{k}.{next_id}@example.com", f"t{next_id % TAGS}"
                await self.gate.execute(
                    s, "INSERT INTO `user` (id, email, tag, n) VALUES (:i, :e, :t, 0)",
                    {"i": next_id, "e": email, "t": tag})
                self.model[next_id] = (email, tag, 0)
                self.counts["insert"] += 1
            elif op < 0.8:
                i = rnd.choice(mine)
                _, _, n = self.model[i]
                email, tag = f"w{k}.{i}.{serial}@example.com", f"t{serial % TAGS}"
                res = await self.gate.execute(
                    s, "UPDATE `user` SET email = :e, tag = :t, n = :n WHERE id = :i",
                    {"i": i, "e": email, "t": tag, "n": n + 1})
                assert res.rows_affected == 1
                self.model[i] = (email, tag, n + 1)
                self.counts["email"] += 1
            else:
                i = rnd.choice(mine)
                res = await self.gate.execute(s, "DELETE FROM `user` WHERE id = :i", {"i": i})
                assert res.rows_affected == 1
                del self.model[i]
                self.counts["delete"] += 1
            self.slowest = max(self.slowest, time.monotonic() - start)
            await asyncio.sleep(0.002)


async def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    backend = open_backend(url)
    try:
        return [tuple(bytes(v) if isinstance(v, memoryview | bytearray) else v for v in r)
                for r in (await backend.execute(sql)).rows]
    finally:
        await backend.close()


async def check_placement(shards: dict[str, str], model: Model) -> None:
    """Every user and every lookup row exactly once, on the shard its own primary vindex
    names; exactly one row per user in each lookup table, mapping its email (tag) to
    the user's keyspace id."""
    users: dict[int, tuple[str, str, int]] = {}
    lookup: dict[str, bytes] = {}
    tags: dict[tuple[str, bytes], None] = {}
    for name, url in shards.items():
        kr = parse_shard_name(name)
        user = "`user`" if url.startswith("mysql") else '"user"'  # a reserved word
        for i, email, tag, n in await _rows(url, f"SELECT id, email, tag, n FROM {user}"):
            ksid = HASH.map([i])[0][0]
            assert kr.contains(ksid), f"user {i} is on {name}, its keyspace id is {ksid.hex()}"
            assert i not in users, f"user {i} is on two shards"
            users[int(i)] = (str(email), str(tag), int(n))
        for tag, ksid in await _rows(url, "SELECT tag, keyspace_id FROM user_tag_lookup"):
            assert kr.contains(MD5.map([tag])[0][0]), f"lookup row {tag} is on {name}"
            assert (tag, bytes(ksid)) not in tags, f"lookup row {tag} is on two shards"
            tags[(str(tag), bytes(ksid))] = None
        for email, ksid in await _rows(url, "SELECT email, keyspace_id FROM user_email_lookup"):
            own = MD5.map([email])[0][0]
            assert kr.contains(own), f"lookup row {email} is on {name}, its keyspace id is " \
                f"{own.hex()}"
            assert email not in lookup, f"lookup row {email} is on two shards"
            lookup[str(email)] = bytes(ksid)
    assert users == model
    assert lookup == {email: HASH.map([i])[0][0] for i, (email, _, _) in model.items()}
    assert set(tags) == {(tag, HASH.map([i])[0][0]) for i, (_, tag, _) in model.items()}


async def _cluster(make_database: Any, tmp_path: Path, kind: str, users: int = USERS
                   ) -> tuple[str, Gate, Model]:
    shards = {name: make_database(kind, f"rl{i}") for i, name in enumerate(("-80", "80-"))}
    tmp_path.mkdir(parents=True, exist_ok=True)
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict(
        {"keyspaces": {"app": {"shards": shards, "vschema": VSCHEMA}}}))
    await server.close()
    gate = await Gate.from_topo(TopoServer(open_topo_store(topo)))
    s = gate.session("app", identity=TRUSTED)
    for sql in DDL:
        await gate.execute(s, sql)
    model: Model = {}
    for i in range(1, users + 1):
        email, tag = f"u{i}@example.com", f"t{i % TAGS}"
        await gate.execute(s, "INSERT INTO `user` (id, email, tag, n) VALUES (:i, :e, :t, 0)",
                           {"i": i, "e": email, "t": tag})
        model[i] = (email, tag, 0)
    return topo, gate, model


async def _split(make_database: Any, tmp_path: Path, kind: str) -> None:
    topo, gate, model = await _cluster(make_database, tmp_path, kind)
    four = {n: make_database(kind, f"rlf{i}")
            for i, n in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    server = TopoServer(open_topo_store(topo))
    spec = ReshardSpec(keyspace="app", sources=("-80", "80-"), targets=tuple(four),
                       target_urls=tuple(sorted(four.items())), workflow="wf")
    flow = ReshardWorkflow(server, spec, batch=100)
    writers = Writers(gate, model, WRITERS[kind])
    writers.start()
    try:
        await flow.create()
        assert flow.state == "running"
        assert flow.doc["tables"] == TABLES
        reports = await flow.vdiff()
        assert [r.table for r in reports] == TABLES
        for r in reports:
            assert r.clean and r.matching > USERS // 2, r.to_doc()
        await flow.switch_reads()
        before = dict(writers.counts)
        out = await flow.switch_writes()
        assert flow.state == "switched", out
        await _wait(lambda: set(four) <= {s.name for s in gate.topology.keyspace("app").shards},
                    "writes did not switch")
        await _wait(lambda: all(writers.counts[k] > before[k] + 3 for k in before),
                    "writers stalled after the switch", timeout=20)
        await flow.complete()
    finally:
        await writers.halt()
        await flow.close()
        await server.close()
    try:
        assert min(writers.counts.values()) > 0, writers.counts
        assert writers.slowest < 5.0
        await check_placement(four, model)
        # lookups through the gate: the lookup vindexes route them to the owners' shards
        s = gate.session("app", identity=TRUSTED)
        by_email = "SELECT id, n FROM `user` WHERE email = :e"
        for i, (email, _, n) in random.Random(5).sample(sorted(model.items()), 40):
            plan = await gate.explain_shards(
                f"SELECT id, n FROM `user` WHERE email = '{email}'", "app", identity=TRUSTED)
            assert len(set(_shards_in(plan))) == 1, plan  # the lookup's shard aside
            found = await gate.execute(s, by_email, {"e": email})
            assert found.rows == [(i, n)], (email, found.rows)
        assert (await gate.execute(s, by_email, {"e": "nobody@example.com"})).rows == []
        by_tag = "SELECT id FROM `user` WHERE tag = :t"
        for tag in ("t0", "t7", f"t{TAGS - 1}"):
            found = await gate.execute(s, by_tag, {"t": tag})
            assert sorted(r[0] for r in found.rows) == sorted(
                i for i, (_, t, _) in model.items() if t == tag), tag
    finally:
        await gate.close()


async def test_split_moves_lookup_table_with_its_owner(make_database: Any,
                                                      tmp_path: Path) -> None:
    await _split(make_database, tmp_path, "sqlite")


@pytest.mark.postgres
async def test_split_moves_lookup_table_with_its_owner_on_postgres(
    make_database: Any, tmp_path: Path
) -> None:
    await _split(make_database, tmp_path, "postgres")


def _on(shard: str, vindex: SingleColumn, values: Any) -> Any:
    kr = parse_shard_name(shard)
    return next(v for v in values if kr.contains(vindex.map([v])[0][0]))


async def test_write_across_a_frozen_and_a_serving_shard_is_held_whole(
    make_database: Any, tmp_path: Path
) -> None:
    """Mid cut-over one source is frozen and the other is not yet: a write whose owner
    row is on the serving shard and whose lookup row is on the frozen one is held (not
    half-applied: nothing of it is on either shard meanwhile), then runs whole; in an
    explicit transaction it is ABORTED and leaves nothing."""
    _, gate, model = await _cluster(make_database, tmp_path, "sqlite", users=20)
    frozen, serving = "-80", "80-"
    urls = {s.name: s.url for s in gate.topology.keyspace("app").shards}
    backend = open_backend(urls[frozen])
    triggers = [sqlite_deny_trigger(f"_sg_deny_{op.lower()}_{t}", op, t)
                for t in TABLES for op in ("INSERT", "UPDATE", "DELETE")]

    async def freeze() -> None:
        await backend.execute(SQLITE_MARK_DDL)
        for sql in triggers:
            await backend.execute(sql.replace(" user ", ' "user" '))

    async def thaw_later() -> None:
        await asyncio.sleep(0.4)
        for t in TABLES:
            for op in ("insert", "update", "delete"):
                await backend.execute(f"DROP TRIGGER _sg_deny_{op}_{t}")

    async def on_shards(sql: str, *params: Any) -> dict[str, list[tuple[Any, ...]]]:
        out = {}
        for name, url in urls.items():
            b = open_backend(url)
            try:
                out[name] = [tuple(r) for r in (await b.execute(sql, params)).rows]
            finally:
                await b.close()
        return out

    new_id = _on(serving, HASH, range(1000, 100_000))
    email = _on(frozen, MD5, (f"held{j}@example.com" for j in range(1000)))
    tag = _on(serving, MD5, (f"h{j}" for j in range(1000)))
    insert = "INSERT INTO `user` (id, email, tag, n) VALUES (:i, :e, :t, 0)"
    s = gate.session("app", identity=TRUSTED)
    try:
        await freeze()
        await gate.execute(s, "BEGIN")
        with pytest.raises(Aborted, match="reshard"):
            await gate.execute(s, insert, {"i": new_id, "e": email, "t": tag})
        assert not s.in_transaction

        thawing = asyncio.create_task(thaw_later())
        start = time.monotonic()
        held = asyncio.create_task(gate.execute(s, insert, {"i": new_id, "e": email, "t": tag}))
        await asyncio.sleep(0.2)
        assert not held.done()
        assert await on_shards('SELECT id FROM "user" WHERE id = ?', new_id) \
            == {frozen: [], serving: []}
        assert await on_shards("SELECT tag FROM user_tag_lookup WHERE tag = ?", tag) \
            == {frozen: [], serving: []}
        await held
        await thawing
        assert 0.4 <= time.monotonic() - start < 3.0
        ksid = HASH.map([new_id])[0][0]
        assert await on_shards('SELECT id, email FROM "user" WHERE id = ?', new_id) \
            == {frozen: [], serving: [(new_id, email)]}
        assert await on_shards("SELECT keyspace_id FROM user_email_lookup WHERE email = ?",
                               email) == {frozen: [(ksid,)], serving: []}
        assert await on_shards("SELECT keyspace_id FROM user_tag_lookup WHERE tag = ?",
                               tag) == {frozen: [], serving: [(ksid,)]}
        found = await gate.execute(s, "SELECT id FROM `user` WHERE email = :e", {"e": email})
        assert found.rows == [(new_id,)]
    finally:
        await backend.close()
        await gate.close()
    assert len(model) == 20


async def test_create_refuses_lookup_tables_it_cannot_place(
    make_database: Any, tmp_path: Path
) -> None:
    """A lookup table of the keyspace without a primary vindex, or a table whose primary
    vindex is a lookup, is refused at create with UNIMPLEMENTED naming it and why."""
    for case, (tables, match) in enumerate((
        ({"user_tag_lookup": {"pinned": "00"}}, "user_tag_lookup.* is the lookup table of vindex "
                                  "app.user_tag but has no primary vindex"),
        ({"user_tag_lookup": None}, "user_tag_lookup.* is the lookup table of vindex "
                                    "app.user_tag but has no primary vindex"),
        ({"user_tag_lookup": {"column_vindexes": [{"column": "tag",
                                                   "name": "user_email"}]}},
         "app.user_tag_lookup: its primary vindex 'user_email' is a lookup vindex"),
    )):
        topo, gate, _ = await _cluster(make_database, tmp_path / str(case), "sqlite",
                                       users=3)
        await gate.close()
        server = TopoServer(open_topo_store(topo))

        def change(doc: dict[str, Any], tables: dict[str, Any] = tables) -> dict[str, Any]:
            for name, entry in tables.items():
                if entry is None:
                    del doc["tables"][name]
                else:
                    doc["tables"][name] = entry
            return doc

        targets = {n: make_database("sqlite", "rlx") for n in ("-40", "40-80", "80-c0", "c0-")}
        flow = ReshardWorkflow(server, ReshardSpec(
            keyspace="app", sources=("-80", "80-"), targets=tuple(targets),
            target_urls=tuple(sorted(targets.items()))))
        try:
            await server.update_vschema("app", change)
            with pytest.raises(Unsupported, match=match):
                await flow.create()
            assert await server.get_workflow(flow.spec.record) is None
        finally:
            await flow.close()
            await server.close()
