"""A 4-shard cluster (plus an unsharded lookup keyspace) on one backend kind."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology
from shardgate.topo.embedded import (
    COMMERCE_DDL,
    COMMERCE_VSCHEMA,
    LOOKUP_DDL,
    LOOKUP_VSCHEMA,
    SEQUENCE_ROWS,
)
from tests.integration.tablet_procs import SharedTablets, TabletProcesses, serve_with_processes


@dataclass
class Cluster:
    gate: Gate
    kind: str
    #: set when the shards are served by tablet processes (``tablets="processes"``)
    processes: TabletProcesses | None = None

    @property
    def topology(self) -> Topology:
        """The gate's topology now (VSchema changes such as CREATE QUEUE included)."""
        return self.gate.topology

    def shard_urls(self, keyspace: str) -> dict[str, str]:
        return {s.name: s.url for s in self.topology.keyspace(keyspace).shards}


def cluster_topology(kind: str, make_database: Callable[..., str], shards: int = 4) -> Topology:
    """``commerce`` on ``shards`` new databases and ``lookup`` on one."""
    commerce = {
        kr.name: make_database(kind, f"c{i}")
        for i, kr in enumerate(KeyRange(b"", b"").split(shards))
    }
    return Topology.from_dict(
        {
            "default_keyspace": "commerce",
            "keyspaces": {
                "commerce": {"shards": commerce, "vschema": COMMERCE_VSCHEMA},
                "lookup": {"shards": {"0": make_database(kind, "lk")}, "vschema": LOOKUP_VSCHEMA},
            },
        }
    )


async def create_schema(gate: Gate) -> None:
    """The commerce and lookup tables and the sequences' first rows."""
    s = gate.session(identity=TRUSTED)
    for ddl in COMMERCE_DDL:
        await gate.execute(s, ddl)
    ls = gate.session("lookup", identity=TRUSTED)
    for ddl in LOOKUP_DDL:
        await gate.execute(ls, ddl)
    for seq in SEQUENCE_ROWS:
        await gate.execute(ls, f"INSERT INTO {seq} (id, next_id, cache) VALUES (0, 1, 50)")


async def open_cluster(kind: str, make_database: Callable[..., str], shards: int = 4) -> Cluster:
    gate = Gate.open(cluster_topology(kind, make_database, shards))
    try:
        await create_schema(gate)
    except BaseException:
        await gate.close()
        raise
    return Cluster(gate, kind)


#: how a cluster's shards are served: tablets inside the gate's process, or
#: ``shardgate tablet`` processes reached over gRPC (PostgreSQL shards only)
TABLETS = ["in-process", pytest.param("processes", marks=pytest.mark.postgres)]


@pytest.fixture(params=TABLETS)
def tablets(request: pytest.FixtureRequest) -> str:
    """``in-process`` or ``processes`` (see :data:`TABLETS`)."""
    mode: str = request.param
    return mode


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start Spark's JVM before any test runs when a selected test needs it.

    PySpark launches its JVM with ``subprocess`` and a ``preexec_fn``, so with a fork;
    a fork while gRPC threads of earlier tests run in this process skips gRPC's fork
    handlers, and the JVM was seen to exit before reporting its port (CI:
    ``JAVA_GATEWAY_EXITED`` for every Spark test of one worker). Before the first
    test no gRPC thread exists yet.
    """
    if any("spark" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.integration.spark_session import start_spark

        with contextlib.suppress(pytest.skip.Exception):  # no Spark: each test skips
            start_spark()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``tablets=processes`` variant runs for tests marked ``tablet_processes`` (whole
    modules: the gate, change-stream, queue and two-phase commit ones, on tablet
    processes started once per run or module, see :class:`SharedTablets`), on PostgreSQL shards
    only; the other variants are deselected."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kind = params.get("backend_kind", params.get("kind", "postgres"))
        marked = item.get_closest_marker("tablet_processes") is not None
        if params.get("tablets") == "processes" and (kind != "postgres" or not marked):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@contextlib.contextmanager
def module_databases() -> Iterator[Callable[..., str]]:
    """``make_database`` for module-scoped fixtures (PostgreSQL only): the databases
    are dropped when the block ends."""
    from tests.conftest import (
        POSTGRES_ADMIN_URL,
        _database_name,
        _drop_postgres_slots,
        _dropper,
        _postgres_admin,
        _with_database,
        require_server,
    )

    made: list[str] = []

    def make(kind: str, hint: str = "") -> str:
        assert kind == "postgres", "tablet processes are tested on PostgreSQL shards"
        require_server(kind)
        name = _database_name(hint)
        with _postgres_admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return _with_database(POSTGRES_ADMIN_URL, name)

    try:
        yield make
    finally:
        for name in made:  # slots now, the database in the background (see ``_Dropper``)
            _drop_postgres_slots(name)
            _dropper.drop("postgres", name, "module_databases")


@contextlib.contextmanager
def shared_tablets(topology: Callable[[Callable[..., str]], Topology],
                   directory: Path) -> Iterator[SharedTablets]:
    """Tablet processes for a module's tests on ``topology(make_database)``."""
    with module_databases() as make:
        shared = SharedTablets.start(topology(make), directory)
        try:
            yield shared
        finally:
            shared.stop()


@pytest.fixture(scope="session")
def commerce_tablets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedTablets]:
    """The :func:`open_cluster` shape on PostgreSQL, served by tablet processes started
    once for the run, on first use (see :class:`SharedTablets`): the gate, change-stream,
    gRPC queue, two-phase commit and Spark production modules share them."""
    with shared_tablets(lambda make: cluster_topology("postgres", make),
                        tmp_path_factory.mktemp("tablets")) as shared:
        yield shared


async def open_cluster_on(shared: SharedTablets) -> Cluster:
    """A cluster on shared tablet processes: a new gate, the schema created through it."""
    procs = await shared.open()
    try:
        await create_schema(procs.gate)
    except BaseException:
        await procs.close()
        raise
    return Cluster(procs.gate, "postgres", procs)


async def cluster_for(kind: str, tablets: str, make_database: Callable[..., str],
                      request: pytest.FixtureRequest) -> Cluster:
    """:func:`open_cluster`, or for ``tablets=processes`` the module's shared tablets."""
    if tablets == "processes":
        shared: SharedTablets = request.getfixturevalue("commerce_tablets")
        return await open_cluster_on(shared)
    return await open_cluster(kind, make_database)


async def with_tablets(c: Cluster, tablets: str, directory: Path) -> Cluster:
    """``c`` as is, or with its in-process gate replaced by one reaching tablet processes."""
    if tablets == "in-process":
        return c
    await c.gate.close()  # its tablets would hold the shard leases
    procs = await serve_with_processes(c.topology, directory)
    return Cluster(procs.gate, c.kind, procs)


async def close_cluster(c: Cluster) -> None:
    if c.processes is not None:
        await c.processes.close()
    else:
        await c.gate.close()


@pytest.fixture
async def cluster(
    backend_kind: str, tablets: str, make_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> AsyncIterator[Cluster]:
    c = await cluster_for(backend_kind, tablets, make_database, request)
    try:
        yield c
    finally:
        await close_cluster(c)


@pytest.fixture
async def streams_cluster(
    backend_kind: str, tablets: str, make_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> AsyncIterator[Cluster]:
    """``cluster``, whose shards' change capture (slots, triggers) is dropped at the end."""
    from shardgate.backends.changes.open import open_change_log

    c = await cluster_for(backend_kind, tablets, make_database, request)
    try:
        # Capture is set up before the test's timed waits: a PostgreSQL slot is created
        # only once every transaction open on the server has ended (the log names them).
        for ks in c.topology.keyspaces.values():
            for shard in ks.shards:
                log = open_change_log(shard.url, f"{ks.name}/{shard.name}")
                try:
                    await log.prepare()
                finally:
                    await log.close()
        yield c
    finally:
        await close_cluster(c)
        for ks in c.topology.keyspaces.values():
            for shard in ks.shards:
                log = open_change_log(shard.url, f"{ks.name}/{shard.name}")
                try:
                    await log.drop()
                finally:
                    await log.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the whole run (``tests/integration/test_spark_*.py``).

    ``local[2,2]``: two cores, and a failed task is tried once more (the
    writer's retry test needs that; plain ``local[2]`` never retries). Missing
    PySpark or Java is a skip on a laptop and a failure with ``CI=true``.
    """
    from tests.integration.spark_session import start_spark

    session = start_spark()
    try:
        yield session
    finally:
        session.stop()
