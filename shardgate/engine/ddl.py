"""DDL: a statement run on every shard of a keyspace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.engine.primitive import Primitive
from shardgate.result import Result


@dataclass(frozen=True)
class DDL(Primitive):
    """A DDL statement run on every shard of a keyspace."""

    keyspace: str
    sharded: bool
    query: ShardQuery

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        smap = vc.shard_map(self.keyspace)
        # DDL is not transactional on MySQL: each shard applies it on its own.
        await vc.execute_shards(self.keyspace, smap.names, self.query, bind_vars, write=False)
        return Result()

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "DDL",
            "Keyspace": {"Name": self.keyspace, "Sharded": self.sharded},
            "Query": self.query.gate_sql,
        }
