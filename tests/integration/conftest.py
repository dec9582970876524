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


def _variant(item: pytest.Item) -> tuple[str | None, str | None, tuple[object, ...]]:
    """An item's ``tablets`` mode, its database kind (None when not parametrized over
    kinds) and what else identifies it (its function and its other parameters)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    kind = params.get("backend_kind", params.get("kind"))
    rest = tuple(sorted((k, repr(v)) for k, v in params.items()
                        if k not in ("tablets", "backend_kind", "kind")))
    return params.get("tablets"), kind, (item.nodeid.split("[")[0], rest)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Which ``tablets`` variants run (every test taking the ``tablets`` fixture, the
    :func:`cluster` fixtures' tests among them):

    * ``processes`` on PostgreSQL shards only (tests not parametrized over kinds count as
      PostgreSQL ones);
    * ``in-process`` on SQLite and MariaDB, and on PostgreSQL only for a test that has no
      SQLite or MariaDB in-process variant: the tablet process runs the same ``Tablet``
      on the same PostgreSQL backend, and the in-process gate's own path (the local
      tablet client) is the same on every kind, so the other kinds' variants cover it.
    """
    covered = {rest for tablets, kind, rest in map(_variant, items)
               if tablets == "in-process" and kind not in (None, "postgres")}
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        tablets, kind, rest = _variant(item)
        if tablets == "processes":
            drop = kind not in (None, "postgres")
        else:
            drop = tablets == "in-process" and kind == "postgres" and rest in covered
        (dropped if drop else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@contextlib.contextmanager
def module_databases() -> Iterator[Callable[..., str]]:
    """``make_database`` for module-scoped fixtures (PostgreSQL only): the databases
    are dropped when the block ends."""
    from tests.conftest import _drop_postgres_slots, _dropper, create_database

    made: list[str] = []

    def make(kind: str, hint: str = "") -> str:
        assert kind == "postgres", "tablet processes are tested on PostgreSQL shards"
        url, name = create_database(kind, hint, Path())
        assert name is not None
        made.append(name)
        return url

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


class TabletPool:
    """Tablet processes shared by one module's tests, one :class:`SharedTablets` per
    topology shape, each started on first use and stopped when the module ends."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._shared: dict[str, SharedTablets] = {}
        self._stack = contextlib.ExitStack()

    def get(self, shape: str, topology: Callable[[Callable[..., str]], Topology]) -> SharedTablets:
        """The processes serving ``topology(make_database)`` (PostgreSQL databases made
        once for the module), known by ``shape``."""
        if shape not in self._shared:
            self._shared[shape] = self._stack.enter_context(
                shared_tablets(topology, self.directory / shape))
        return self._shared[shape]

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def module_tablets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TabletPool]:
    """The module's :class:`TabletPool` (used through :func:`gate_for` / :func:`cluster_for`)."""
    pool = TabletPool(tmp_path_factory.mktemp("module-tablets"))
    try:
        yield pool
    finally:
        pool.close()


@contextlib.asynccontextmanager
async def gate_for(
    kind: str, tablets: str, topology: Callable[[Callable[..., str]], Topology],
    make_database: Callable[..., str], request: pytest.FixtureRequest, *, shape: str,
    **options: Any,
) -> AsyncIterator[Gate]:
    """A gate over ``topology(make_database)``: opened in this process
    (``tablets=in-process``), or reaching tablet processes that serve that topology's
    shape ``shape`` (``tablets=processes``, PostgreSQL), started once for the module and
    emptied between tests (see :class:`SharedTablets`). The one way a module that opens
    its own gates runs against tablet processes: take the ``tablets`` fixture and open
    the gate here (the collection rule in :func:`pytest_collection_modifyitems` picks
    the variants). ``options`` go to :meth:`Gate.open` (in-process only)."""
    if tablets == "in-process":
        gate = Gate.open(topology(make_database), **options)
        try:
            yield gate
        finally:
            await gate.close()
        return
    assert kind == "postgres", "tablet processes are tested on PostgreSQL shards"
    pool: TabletPool = request.getfixturevalue("module_tablets")
    procs = await pool.get(shape, topology).open()
    try:
        yield procs.gate
    finally:
        await procs.close()


async def cluster_for(kind: str, tablets: str, make_database: Callable[..., str],
                      request: pytest.FixtureRequest, shards: int = 4) -> Cluster:
    """:func:`open_cluster`, or for ``tablets=processes`` shared tablet processes: the
    run's :func:`commerce_tablets` (4 shards), the module's for another shard count."""
    if tablets == "in-process":
        return await open_cluster(kind, make_database, shards)
    if shards == 4:
        shared: SharedTablets = request.getfixturevalue("commerce_tablets")
    else:
        pool: TabletPool = request.getfixturevalue("module_tablets")
        shared = pool.get(f"commerce-{shards}",
                          lambda make: cluster_topology("postgres", make, shards))
    return await open_cluster_on(shared)


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
    tmp_path: Path,
) -> AsyncIterator[Cluster]:
    """``cluster``, whose shards' change capture (slots, triggers) is dropped at the end.

    Its ``tablets=processes`` variant starts tablet processes of its own (not the shared
    ones): a tablet keeps its shard's log reader (its position) from one test to the
    next, and the next test's capture, created anew, starts later than that position
    (``OUT_OF_RANGE`` was seen on a shared process)."""
    from shardgate.backends.changes.open import open_change_log

    c = await with_tablets(await open_cluster(backend_kind, make_database), tablets,
                           tmp_path / "tablets")
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
