"""Query splitting for map-reduce (Vitess's V3 design): one query, N disjoint parts.

``split_query(gate, sql, n)`` returns queries that together read every row of
the original exactly once: each is the original with ``keyrange(start, end)``
added, over a key range inside one shard. A shard gets ``ceil(n / shards)``
equal sub-ranges. Because the gate filters each part's rows by keyspace id, a
copy of a row that a shard still holds but no longer owns (left behind by
resharding) is skipped there; the row is read once, from its owner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlglot import exp

from shardgate.engine.primitive import Opcode
from shardgate.engine.route import Route
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.keys import KeyRange
from shardgate.sql.parse import GATE_DIALECT, parse


@dataclass(frozen=True)
class QuerySplit:
    """One part of a split query: gate SQL, and the shard and key range it reads."""

    sql: str
    keyspace: str
    shard: str
    key_range: KeyRange


def split_query(
    topology_shards: dict[str, list[tuple[str, KeyRange]]],
    route: Route,
    sql: str,
    n: int,
) -> list[QuerySplit]:
    """Split ``sql`` (already planned as ``route``) into about ``n`` parts."""
    if n < 1:
        raise InvalidArgument(f"split count must be at least 1, got {n}")
    stmt = parse(sql)
    if not isinstance(stmt, exp.Select) or route.write:
        raise InvalidArgument("split_query takes a SELECT")
    if route.key_range is not None:
        raise InvalidArgument("the query to split already has keyrange(...)")
    shards = topology_shards[route.keyspace]
    if route.opcode is Opcode.UNSHARDED or not route.sharded:
        name, kr = shards[0]
        return [QuerySplit(sql, route.keyspace, name, kr)]
    if route.opcode is not Opcode.SCATTER:
        raise Unsupported(
            f"split_query needs a query over the whole table (a scatter), got {route.opcode.value}"
        )
    per_shard = max(1, math.ceil(n / len(shards)))
    out = []
    for name, shard_range in shards:
        for part in shard_range.split(per_shard):
            cond = exp.Anonymous(this="keyrange", expressions=[
                exp.Literal.string(part.start.hex()), exp.Literal.string(part.end.hex())])
            split = stmt.copy().where(cond, append=True)
            out.append(QuerySplit(split.sql(dialect=GATE_DIALECT), route.keyspace, name, part))
    return out
