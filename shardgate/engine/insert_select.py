"""``INSERT INTO sharded_table (cols) SELECT ...``: each selected row routed by its vindex.

A shard cannot run the statement itself: its SELECT would read that shard's
rows only, and the rows it produced would have to land on the shards their
vindex values name. As in Vitess, the gate runs the SELECT first (planned on
its own, so it may scatter, aggregate or read another keyspace), then inserts
its rows as one multi-row :class:`Insert`, in the statement's session and
transaction: routing, lookup vindexes, sequences, ``IGNORE``, ``ON DUPLICATE
KEY UPDATE`` and duplicate keys (1062) behave exactly as for ``VALUES`` with
those rows. The SELECT's columns are matched to the insert's by position;
their count must agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.insert import Insert
from shardgate.engine.primitive import Primitive
from shardgate.errors import InvalidArgument
from shardgate.evalengine.values import Literal
from shardgate.result import Result


@dataclass(frozen=True)
class InsertSelect(Primitive):
    """Run ``source``, then ``insert`` (planned without rows) with its rows as literals."""

    source: Primitive
    insert: Insert

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        selected = await self.source.execute(vc, bind_vars)
        return await insert_rows(self.insert, selected.rows, vc, bind_vars)

    def describe(self) -> dict[str, Any]:
        return {
            "OperatorType": "Insert",
            "Variant": "Select",
            "Keyspace": {"Name": self.insert.keyspace, "Sharded": self.insert.sharded},
            "TableName": self.insert.table,
            "Inputs": [self.source.describe()],
        }


async def insert_rows(insert: Insert, rows: Sequence[Sequence[Any]], vc: ExecCursor,
                      bind_vars: Mapping[str, Any]) -> Result:
    """Run ``insert`` (planned without rows) with ``rows`` (values, in its column order)."""
    if not rows:
        return Result(rows_affected=0)
    return await with_rows(insert, rows).execute(vc, bind_vars)


def with_rows(insert: Insert, rows: Sequence[Sequence[Any]]) -> Insert:
    """``insert`` (planned without rows) with ``rows`` as its literal values."""
    width = len(insert.columns)
    literals = []
    for row in rows:
        if len(row) != width:
            raise InvalidArgument(
                f"INSERT ... SELECT into {insert.table}: the SELECT returns "
                f"{len(row)} columns for {width} insert columns"
            )
        literals.append(tuple(Literal(v) for v in row))
    return replace(insert, rows=tuple(literals))
