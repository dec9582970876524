"""Letting PostgreSQL type-check a statement the gate finishes itself.

A scatter query's shards see a rewritten statement (aggregate partials, no
HAVING, ORDER BY or DISTINCT, constants moved out of GROUP BY), and a query
that targets no shard reaches none: the parts the gate computes are never
checked by the database. PostgreSQL rejects at analysis what MySQL and SQLite
accept (``SUM(varchar)``, ``text * integer``, ``HAVING int OR bool``,
``GROUP BY 'k'``, ``ORDER BY 'x'``), so there the statement as written, over
no rows (``WHERE 1 != 1 AND (...)``), runs on one shard first and its error,
if any, is the answer, as one database would give it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor, ShardQuery
from shardgate.engine.primitive import Primitive, dialect_of
from shardgate.engine.route import over_no_rows
from shardgate.result import Result
from shardgate.sql.dialects.render import strip_qualifiers


def _probe_of(tree: exp.Expr) -> exp.Expr:
    """``tree`` over no rows, without LIMIT or OFFSET (they cannot fail the check)."""
    probe = over_no_rows(tree)
    if isinstance(probe, exp.Select):
        probe.set("limit", None)
        probe.set("offset", None)
    return probe


@dataclass(frozen=True)
class TypeChecked(Primitive):
    """On PostgreSQL, run ``statement`` over no rows on one shard, then ``inner``."""

    inner: Primitive
    keyspace: str
    #: the statement as written (never mutated)
    statement: exp.Expr
    #: the probe, built on first use (planning stays as fast on other backends)
    _probe: list[ShardQuery] = field(default_factory=list, compare=False, repr=False)

    async def _check(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> None:
        if not dialect_of(vc, self.keyspace).strict_types:
            return
        if not self._probe:
            self._probe.append(ShardQuery(_probe_of(strip_qualifiers(self.statement))))
        first = vc.shard_map(self.keyspace).names[:1]
        await vc.execute_shards(self.keyspace, first, self._probe[0], bind_vars, write=False)

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        await self._check(vc, bind_vars)
        return await self.inner.execute(vc, bind_vars)

    async def stream(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> AsyncIterator[Result]:
        await self._check(vc, bind_vars)
        async for chunk in self.inner.stream(vc, bind_vars):
            yield chunk

    def describe(self) -> dict[str, Any]:
        # the probe is a check, not a step of the answer: EXPLAIN shows the plan
        return self.inner.describe()
