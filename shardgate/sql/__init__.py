"""SQL text in and out: parsing gate SQL, generating per-shard dialect SQL (sqlglot)."""

from shardgate.sql.dialects.render import ShardSQL, render
from shardgate.sql.parse import GATE_DIALECT, parse

__all__ = ["GATE_DIALECT", "ShardSQL", "parse", "render"]
