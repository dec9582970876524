"""The gate runs statements on shard databases itself (``shardgate.gate.direct``).

Keyspace ``app`` of 2 shards, 2 ``shardgate tablet`` processes a shard started
with ``--max-result-rows 40``, on PostgreSQL and on MariaDB. Two gates on the
same topo store: the default one (autocommit SELECTs and writes of plain tables
straight to the shard databases) and one with ``direct_statements=False``
(everything through the tablets, the path before). Checked: the same answers,
the same limit, timeout and ACL refusals, the direct path's metrics; chaos: the
database connections killed under load (reads answered, writes succeed or fail
``UNKNOWN``, never twice), a lease holder SIGKILLed while direct reads run (no
failed read), the shard database refusing connections (``UNAVAILABLE``, then
answers again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from prometheus_client import REGISTRY

from shardgate.api.grpc.remote_gate import open_remote_gate
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED, Identity
from shardgate.backends.urls import parse_url
from shardgate.errors import Code, OutcomeUnknown, ShardgateError
from shardgate.gate import Gate
from shardgate.gate.fleet import ShardTablets, TabletFleet
from shardgate.keys import KeyRange
from shardgate.topo import Topology
from tests.conftest import require_server
from tests.integration.tablet_procs import TabletProcesses, serve_with_processes

VSCHEMA = {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}},
    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}},
}
ROWS = 100
MAX_ROWS = 40
#: how long a statement waits for a lease holder in these tests
FAILOVER_S = 5.0

KINDS = [pytest.param("postgres", marks=pytest.mark.postgres),
         pytest.param("mysql", marks=pytest.mark.mysql)]


@dataclass
class Pair:
    """The tablet processes, the direct gate (theirs) and a gate through the tablets."""

    kind: str
    urls: dict[str, str]
    procs: TabletProcesses
    via: Gate
    via_fleet: TabletFleet
    identity: Any = field(default=TRUSTED)

    @property
    def direct(self) -> Gate:
        return self.procs.gate

    def shard_tablets(self) -> list[ShardTablets]:
        found = [t for t in self.direct.tablets.values() if isinstance(t, ShardTablets)]
        assert found and all(t.direct is not None for t in found)
        return found

    def direct_count(self) -> int:
        return sum(t.direct.answered for t in self.shard_tablets()  # type: ignore[union-attr]
                   if t.direct is not None)


@pytest.fixture
async def pair(request: pytest.FixtureRequest, make_database: Callable[..., str],
               tmp_path: Path) -> AsyncIterator[Pair]:
    kind = request.param
    require_server(kind)
    urls = {kr.name: make_database(kind, f"d{i}")
            for i, kr in enumerate(KeyRange(b"", b"").split(2))}
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {
        "app": {"shards": urls, "vschema": VSCHEMA}}})
    setup = Gate.open(topo)
    try:
        s = setup.session(identity=TRUSTED)
        await setup.execute(s, "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(32), n INT)")
        for i in range(ROWS):
            await setup.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, :v, :n)",
                                {"i": i, "v": f"v{i}", "n": i % 7})
    finally:
        await setup.close()
    procs = await serve_with_processes(topo, tmp_path / "tablets", per_shard=2,
                                       failover_timeout=FAILOVER_S,
                                       extra=("--max-result-rows", str(MAX_ROWS)))
    try:
        via, via_fleet = await open_remote_gate(procs.topo, owns_topo=False,
                                                failover_timeout=FAILOVER_S,
                                                direct_statements=False)
        try:
            for ks, shard in procs.shards:
                await via_fleet.wait_pick(ks, shard, time.monotonic() + 30)
            yield Pair(kind, urls, procs, via, via_fleet)
        finally:
            await via.close()
            await via_fleet.close()
    finally:
        await procs.close()


def _rows(result: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in result.rows]


async def _both(pair: Pair, sql: str, binds: dict[str, Any] | None = None,
                identity: Any = TRUSTED, setup: str | None = None,
                ) -> tuple[Any, Any]:
    """``sql``'s result (or error) through the direct gate and through the tablets."""
    out: list[Any] = []
    for gate in (pair.direct, pair.via):
        s = gate.session("app", identity=identity)
        if setup is not None:
            await gate.execute(s, setup)
        try:
            out.append(await gate.execute(s, sql, binds))
        except ShardgateError as exc:
            out.append(exc)
    return out[0], out[1]


QUERIES = [
    ("SELECT id, v, n FROM t WHERE id = :id", {"id": 7}),
    ("SELECT id, v, n FROM t WHERE id = :id", {"id": 10_000}),
    ("SELECT id, v FROM t WHERE id IN (1, 2, 3, 50, 99) ORDER BY id", None),
    ("SELECT id, v FROM t WHERE n = 3 ORDER BY id", None),
    ("SELECT n, COUNT(*), SUM(id), MIN(v) FROM t GROUP BY n ORDER BY n", None),
    ("SELECT COUNT(*) FROM t", None),
    ("SELECT id FROM t ORDER BY id DESC LIMIT 5", None),
]


@pytest.mark.parametrize("pair", KINDS, indirect=True)
async def test_reads_answer_as_through_the_tablets(pair: Pair) -> None:
    before = pair.direct_count()
    for sql, binds in QUERIES:
        direct, via = await _both(pair, sql, binds)
        assert not isinstance(direct, ShardgateError), (sql, direct)
        assert direct.fields == via.fields, sql
        assert _rows(direct) == _rows(via), sql
    assert pair.direct_count() - before >= len(QUERIES)
    assert all(t.direct is None for t in pair.via.tablets.values()
               if isinstance(t, ShardTablets))

    # the tablets' result limit (--max-result-rows 40; about 50 rows a shard)
    direct, via = await _both(pair, "SELECT id, v FROM t")
    assert isinstance(direct, ShardgateError) and isinstance(via, ShardgateError)
    assert direct.code == via.code == Code.RESOURCE_EXHAUSTED
    assert f"more than {MAX_ROWS} rows" in direct.message
    assert f"more than {MAX_ROWS} rows" in via.message

    # autocommit writes of a plain table: direct, and answered the same
    before = pair.direct_count()
    direct, via = await _both(pair, "UPDATE t SET v = 'u5' WHERE id = 5")
    assert direct.rows_affected == via.rows_affected == 1
    direct, via = await _both(pair, "INSERT INTO t (id, v, n) VALUES (5, 'dup', 0)")
    assert isinstance(direct, ShardgateError) and isinstance(via, ShardgateError)
    assert direct.code == via.code == Code.ALREADY_EXISTS
    assert pair.direct_count() - before == 1  # the refused INSERT is not counted
    direct, via = await _both(pair, "SELECT v FROM t WHERE id = 5")
    assert _rows(direct) == _rows(via) == [("u5",)]

    # the gate's ACL: the same refusal either way, before any shard is asked
    acl = Guard(TableACL.from_mapping({"table_groups": [
        {"name": "t", "table_names_or_prefixes": ["t"], "readers": ["alice"]}]}))
    pair.direct.guard = pair.via.guard = acl
    bob, alice = Identity("bob", {}, "password"), Identity("alice", {}, "password")
    direct, via = await _both(pair, "SELECT v FROM t WHERE id = 3", identity=bob)
    assert isinstance(direct, ShardgateError) and isinstance(via, ShardgateError)
    assert direct.code == via.code == Code.PERMISSION_DENIED
    assert direct.message == via.message
    direct, via = await _both(pair, "SELECT v FROM t WHERE id = 3", identity=alice)
    assert _rows(direct) == _rows(via) == [("v3",)]
    pair.direct.guard = pair.via.guard = Guard()


@pytest.mark.parametrize("pair", KINDS, indirect=True)
async def test_timeout_and_metrics_as_through_the_tablets(pair: Pair) -> None:
    shard = sorted(pair.urls)[0]
    url = pair.urls[shard]
    labels = {"operation": "Execute", "keyspace": "app", "shard": shard,
              "backend": "postgres" if pair.kind == "postgres" else "mysql"}
    count = REGISTRY.get_sample_value("shardgate_tablet_query_seconds_count", labels) or 0.0
    # point selects on that shard (ids stored in its database)
    ids = sorted(int(r[0]) for r in _select(pair.kind, url, "SELECT id FROM t"))[:3]
    for i in ids:
        r = await pair.direct.execute(pair.direct.session("app", identity=TRUSTED),
                                      "SELECT v FROM t WHERE id = :i", {"i": i})
        assert _rows(r) == [(f"v{i}",)]
    after = REGISTRY.get_sample_value("shardgate_tablet_query_seconds_count", labels)
    assert after is not None and after - count >= len(ids)

    # a read that waits on a table lock past the session's query timeout
    with _table_locked(pair.kind, url):
        direct, via = await _both(pair, "SELECT v FROM t WHERE id = :i", {"i": ids[0]},
                                  setup="SET query_timeout_ms = 300")
    assert isinstance(direct, ShardgateError) and isinstance(via, ShardgateError)
    assert direct.code == via.code == Code.DEADLINE_EXCEEDED
    assert direct.message == via.message
    # and the shard answers again once the lock is gone
    direct, via = await _both(pair, "SELECT v FROM t WHERE id = :i", {"i": ids[0]})
    assert _rows(direct) == _rows(via) == [(f"v{ids[0]}",)]


@contextlib.contextmanager
def _table_locked(kind: str, url: str) -> Iterator[None]:
    """Table ``t`` of the database at ``url`` locked against reads, by another session."""
    if kind == "postgres":
        with psycopg.connect(url.replace("postgresql://", "postgres://", 1)) as conn:
            conn.execute("BEGIN")
            conn.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            yield
            conn.execute("ROLLBACK")
        return
    conn = _mysql(url)
    try:
        with conn.cursor() as cur:
            cur.execute("LOCK TABLES t WRITE")
            yield
            cur.execute("UNLOCK TABLES")
    finally:
        conn.close()


def _mysql(url: str) -> pymysql.Connection[Any]:
    p = parse_url(url)
    return pymysql.connect(host=p.host, port=p.port or 3306, user=p.user,
                           password=p.password or "", database=p.database, autocommit=True)


def _kill_connections(kind: str, urls: list[str]) -> int:
    """Kill every session of the shard databases but the shard-lease holders'; how many."""
    killed = 0
    if kind == "postgres":
        for url in urls:
            with psycopg.connect(url.replace("postgresql://", "postgres://", 1),
                                 autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend' AND pid NOT IN "
                    "(SELECT pid FROM pg_locks WHERE locktype = 'advisory')").fetchall()
                killed += len(rows)
        return killed
    for url in urls:
        conn = _mysql(url)
        try:
            with conn.cursor() as cur:
                database = parse_url(url).database
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s "
                            "AND ID <> CONNECTION_ID()", [database])
                ids = [int(r[0]) for r in cur.fetchall()]
                cur.execute("SELECT IS_USED_LOCK('shardgate/app/-80/queues'), "
                            "IS_USED_LOCK('shardgate/app/80-/queues')")
                row = cur.fetchone()
                leases = {int(v) for v in (row or ()) if v is not None}
                for cid in ids:
                    if cid in leases:
                        continue
                    with contextlib.suppress(pymysql.MySQLError):
                        cur.execute(f"KILL CONNECTION {cid}")
                        killed += 1
        finally:
            conn.close()
    return killed


@dataclass
class Load:
    """Readers and writers through the direct gate, and what they saw."""

    gate: Gate
    reads: int = 0
    read_errors: list[str] = field(default_factory=list)
    ok: set[int] = field(default_factory=set)
    unknown: set[int] = field(default_factory=set)
    write_errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def reader(self, seed: int) -> None:
        s = self.gate.session("app", identity=TRUSTED)
        i = seed
        while not self.stop.is_set():
            i = (i + 7) % ROWS
            try:
                if i % 5 == 0:
                    r = await self.gate.execute(s, "SELECT COUNT(*) FROM t WHERE id < :m",
                                                {"m": ROWS})
                    assert _rows(r) == [(ROWS,)], _rows(r)
                else:
                    r = await self.gate.execute(s, "SELECT v FROM t WHERE id = :i", {"i": i})
                    assert _rows(r) == [(f"v{i}",)], _rows(r)
                self.reads += 1
            except ShardgateError as exc:
                self.read_errors.append(f"read {i}: {exc}")
            await asyncio.sleep(0)

    async def writer(self, first: int) -> None:
        s = self.gate.session("app", identity=TRUSTED)
        n = first
        while not self.stop.is_set():
            n += 1
            try:
                await self.gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, 'w', -1)",
                                        {"i": n})
                self.ok.add(n)
            except OutcomeUnknown:
                self.unknown.add(n)
            except ShardgateError as exc:
                self.write_errors.append(f"write {n}: {exc}")
            await asyncio.sleep(0.005)


async def _run_load(pair: Pair, during: Callable[[Load], Any], seconds: float) -> Load:
    load = Load(pair.direct)
    tasks = [asyncio.create_task(load.reader(k)) for k in range(4)]
    tasks += [asyncio.create_task(load.writer(first)) for first in (10_000, 20_000)]
    try:
        await during(load)
        await asyncio.sleep(seconds)
    finally:
        load.stop.set()
        await asyncio.gather(*tasks)
    return load


def _check_writes(pair: Pair, load: Load) -> None:
    written = {int(r[0]) for r in _select_all(pair, "SELECT id FROM t WHERE n = -1")}
    assert load.ok <= written, sorted(load.ok - written)[:5]
    assert written <= load.ok | load.unknown, sorted(written - load.ok - load.unknown)[:5]


def _select_all(pair: Pair, sql: str) -> list[tuple[Any, ...]]:
    return [row for url in pair.urls.values() for row in _select(pair.kind, url, sql)]


def _select(kind: str, url: str, sql: str) -> list[tuple[Any, ...]]:
    """``sql``'s rows, read from the database at ``url`` by a connection of the test's."""
    if kind == "postgres":
        with psycopg.connect(url.replace("postgresql://", "postgres://", 1)) as conn:
            return list(conn.execute(sql).fetchall())
    conn = _mysql(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("pair", KINDS, indirect=True)
async def test_connections_killed_under_load(pair: Pair) -> None:
    """Every session of the shard databases but the lease holders' killed every 0.2 s:
    reads are answered (sent again on a new connection), writes succeed or fail
    ``UNKNOWN``, and none is stored twice or without its answer saying it may be."""
    kills: list[int] = []
    before = pair.direct_count()

    async def killer(load: Load) -> None:
        async def run() -> None:
            while not load.stop.is_set():
                await asyncio.sleep(0.2)
                kills.append(await asyncio.to_thread(
                    _kill_connections, pair.kind, list(pair.urls.values())))

        asyncio.get_running_loop().create_task(run())

    load = await _run_load(pair, killer, 4.0)
    print(f"reads {load.reads}, direct {pair.direct_count() - before}, writes ok "
          f"{len(load.ok)} unknown {len(load.unknown)}, sessions killed {sum(kills)}")
    assert sum(kills) > 0
    assert load.reads > 0 and pair.direct_count() - before > 0
    assert load.read_errors == []
    assert load.write_errors == []
    assert load.ok
    _check_writes(pair, load)


@pytest.mark.parametrize("pair", KINDS, indirect=True)
async def test_lease_holder_killed_while_direct_reads_run(pair: Pair) -> None:
    before = pair.direct_count()
    holders: list[str] = []

    async def kill_holders(load: Load) -> None:
        await asyncio.sleep(0.5)
        for ks, shard in sorted(pair.procs.shards):
            holders.append(pair.procs.holder(ks, shard))
            pair.procs.kill(holders[-1])

    load = await _run_load(pair, kill_holders, 3.0)
    print(f"reads {load.reads}, direct {pair.direct_count() - before}, writes ok "
          f"{len(load.ok)} unknown {len(load.unknown)}, killed {holders}")
    assert len(holders) == 2
    assert load.read_errors == []
    assert load.reads > 0
    assert load.write_errors == []
    _check_writes(pair, load)


@pytest.mark.parametrize("pair", [KINDS[0]], indirect=True)
async def test_shard_database_refusing_connections(pair: Pair) -> None:
    """PostgreSQL's ``ALLOW_CONNECTIONS false`` and every session ended: the database is
    gone for everyone (this test cannot stop the shared server). Reads fail
    ``UNAVAILABLE`` through either gate; once it is back, they are answered again."""
    url = sorted(pair.urls.items())[0][1]
    name = parse_url(url).database
    admin = url.rsplit("/", 1)[0] + "/postgres"
    sql = "SELECT COUNT(*) FROM t"
    with psycopg.connect(admin.replace("postgresql://", "postgres://", 1),
                         autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s", [name])
            direct, via = await _both(pair, sql)
            assert isinstance(direct, ShardgateError), direct
            assert isinstance(via, ShardgateError), via
            assert direct.code == via.code == Code.UNAVAILABLE
        finally:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    deadline = time.monotonic() + 30
    while True:
        direct, via = await _both(pair, sql)
        if not isinstance(direct, ShardgateError) and not isinstance(via, ShardgateError):
            break
        assert time.monotonic() < deadline, (direct, via)
        await asyncio.sleep(0.2)
    assert _rows(direct) == _rows(via) == [(ROWS,)]


@pytest.mark.parametrize("pair", [KINDS[0]], indirect=True)
async def test_a_changed_database_url_is_followed(
        pair: Pair, make_database: Callable[..., str]) -> None:
    """The topo store names another database for shard -80: the gate's direct reads go
    there once it serves that topology, and the old pool is closed."""
    old_url = pair.urls["-80"]
    new_url = make_database("postgres", "moved")
    rows = _select("postgres", old_url, "SELECT id, v, n FROM t ORDER BY id")
    with psycopg.connect(new_url.replace("postgresql://", "postgres://", 1)) as conn:
        conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(32), n INT)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s)",
                            [(i, f"moved-{v}", n) for i, v, n in rows])
    old = pair.direct.tablets[("app", "-80")]
    assert isinstance(old, ShardTablets) and old.direct is not None
    moved = {**pair.urls, "-80": new_url}
    await pair.procs.topo.import_topology(Topology.from_dict(
        {"default_keyspace": "app", "keyspaces": {"app": {"shards": moved,
                                                          "vschema": VSCHEMA}}}),
        replace=True)
    deadline = time.monotonic() + 20
    while pair.direct.tablets.get(("app", "-80")) is old:
        assert time.monotonic() < deadline, "the gate did not serve the new topology"
        await asyncio.sleep(0.05)
    key, value = rows[0][0], rows[0][1]
    r = await pair.direct.execute(pair.direct.session("app", identity=TRUSTED),
                                  "SELECT v FROM t WHERE id = :i", {"i": key})
    assert _rows(r) == [(f"moved-{value}",)]
    new = pair.direct.tablets[("app", "-80")]
    assert isinstance(new, ShardTablets) and new.direct is not None
    assert new.direct.url == new_url and new.direct.answered >= 1
    await pair.direct._follower.retired()  # type: ignore[attr-defined]
    assert old.direct._closed
