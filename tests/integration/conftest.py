"""A 4-shard cluster (plus an unsharded lookup keyspace) on one backend kind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

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


@dataclass
class Cluster:
    gate: Gate
    kind: str

    @property
    def topology(self) -> Topology:
        """The gate's topology now (VSchema changes such as CREATE QUEUE included)."""
        return self.gate.topology

    def shard_urls(self, keyspace: str) -> dict[str, str]:
        return {s.name: s.url for s in self.topology.keyspace(keyspace).shards}


async def open_cluster(kind: str, make_database: Callable[..., str], shards: int = 4) -> Cluster:
    commerce = {
        kr.name: make_database(kind, f"c{i}")
        for i, kr in enumerate(KeyRange(b"", b"").split(shards))
    }
    topo = Topology.from_dict(
        {
            "default_keyspace": "commerce",
            "keyspaces": {
                "commerce": {"shards": commerce, "vschema": COMMERCE_VSCHEMA},
                "lookup": {"shards": {"0": make_database(kind, "lk")}, "vschema": LOOKUP_VSCHEMA},
            },
        }
    )
    gate = Gate.open(topo)
    s = gate.session()
    for ddl in COMMERCE_DDL:
        await gate.execute(s, ddl)
    ls = gate.session("lookup")
    for ddl in LOOKUP_DDL:
        await gate.execute(ls, ddl)
    for seq in SEQUENCE_ROWS:
        await gate.execute(ls, f"INSERT INTO {seq} (id, next_id, cache) VALUES (0, 1, 50)")
    return Cluster(gate, kind)


@pytest.fixture
async def cluster(backend_kind: str, make_database: Callable[..., str]) -> AsyncIterator[Cluster]:
    c = await open_cluster(backend_kind, make_database)
    try:
        yield c
    finally:
        await c.gate.close()


@pytest.fixture
async def streams_cluster(
    backend_kind: str, make_database: Callable[..., str]
) -> AsyncIterator[Cluster]:
    """``cluster``, whose shards' change capture (slots, triggers) is dropped at the end."""
    from shardgate.backends.change_log import open_change_log

    c = await open_cluster(backend_kind, make_database)
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
        await c.gate.close()
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
