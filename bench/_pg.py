"""Shared set-up for benchmarks on the machine's PostgreSQL."""

from __future__ import annotations

import os

import psycopg

from shardgate.keys import KeyRange
from shardgate.topo import Topology

ADMIN_URL = os.environ.get("SHARDGATE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def fresh_database(name: str) -> str:
    """Drop (:func:`drop_database`) and create database ``name``; return its URL."""
    drop_database(name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


def drop_database(name: str) -> None:
    """Drop database ``name`` and the idle replication slots change streams left on it."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     " WHERE database = %s AND NOT active", (name,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def app_keyspace(prefix: str, shards: int) -> tuple[Topology, list[str]]:
    """Keyspace ``app`` (sharded by ``hash``, no tables yet: queues add theirs) over
    ``shards`` fresh databases ``<prefix>_<i>``; the topology and the databases' names."""
    names = [f"{prefix}_{i}" for i in range(shards)]
    urls = {kr.name: fresh_database(name)
            for kr, name in zip(KeyRange(b"", b"").split(shards), names, strict=True)}
    topo = Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": urls,
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}}}}})
    return topo, names


def point_table(url: str, rows: int) -> Topology:
    """Table ``t (id, v)`` with ``rows`` rows in the database at ``url``, and a topology
    seeing it as keyspace ``bench``: one shard (``-``), a ``hash`` primary vindex."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s)",
                            [(i, f"value {i}") for i in range(rows)])
        conn.execute("ANALYZE t")
    return Topology.from_dict({"keyspaces": {"bench": {
        "shards": {"-": url},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}})
