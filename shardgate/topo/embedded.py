"""The default embedded cluster ``shardgate up`` creates: SQLite files, no server.

Keyspace ``commerce`` is sharded over 4 SQLite shards (``-40 40-80 80-c0 c0-``)
with a ``customer`` table (primary vindex ``hash`` on ``customer_id``, an
owned lookup on ``email``) and a ``corder`` table sharded by customer;
keyspace ``lookup`` is unsharded and holds the lookup table and the sequence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardgate.keys import KeyRange
from shardgate.topo.model import Topology

COMMERCE_VSCHEMA: dict[str, Any] = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "customer_email_idx": {
            "type": "lookup_unique",
            "owner": "customer",
            "params": {"table": "lookup.customer_email_idx", "from": "email",
                       "to": "keyspace_id"},
        },
    },
    "tables": {
        "customer": {
            "column_vindexes": [
                {"column": "customer_id", "name": "hash"},
                {"column": "email", "name": "customer_email_idx"},
            ],
            "auto_increment": {"column": "customer_id", "sequence": "customer_seq"},
        },
        "corder": {
            "column_vindexes": [{"column": "customer_id", "name": "hash"}],
            "auto_increment": {"column": "order_id", "sequence": "order_seq"},
        },
    },
}

LOOKUP_VSCHEMA: dict[str, Any] = {
    "sharded": False,
    "tables": {
        "customer_seq": {"type": "sequence"},
        "order_seq": {"type": "sequence"},
        "customer_email_idx": {},
    },
}

COMMERCE_DDL = [
    "CREATE TABLE IF NOT EXISTS customer (customer_id BIGINT PRIMARY KEY, "
    "email VARCHAR(128) NOT NULL, name VARCHAR(128))",
    "CREATE TABLE IF NOT EXISTS corder (order_id BIGINT PRIMARY KEY, customer_id BIGINT "
    "NOT NULL, sku VARCHAR(64), price BIGINT)",
]

LOOKUP_DDL = [
    "CREATE TABLE IF NOT EXISTS customer_seq (id INT PRIMARY KEY, next_id BIGINT, cache BIGINT)",
    "CREATE TABLE IF NOT EXISTS order_seq (id INT PRIMARY KEY, next_id BIGINT, cache BIGINT)",
    "CREATE TABLE IF NOT EXISTS customer_email_idx (email VARCHAR(128) PRIMARY KEY, "
    "keyspace_id VARBINARY(16) NOT NULL)",
]

SEQUENCE_ROWS = ["customer_seq", "order_seq"]


def embedded_topology(data_dir: Path, shards: int = 4) -> Topology:
    """The default cluster with its SQLite files under ``data_dir``."""
    data_dir = data_dir.resolve()
    commerce = {
        kr.name: f"sqlite:///{data_dir / f'commerce{kr.name}.db'}"
        for kr in KeyRange(b"", b"").split(shards)
    }
    return Topology.from_dict(
        {
            "default_keyspace": "commerce",
            "keyspaces": {
                "commerce": {"shards": commerce, "vschema": COMMERCE_VSCHEMA},
                "lookup": {
                    "shards": {"0": f"sqlite:///{data_dir / 'lookup.db'}"},
                    "vschema": LOOKUP_VSCHEMA,
                },
            },
        }
    )
