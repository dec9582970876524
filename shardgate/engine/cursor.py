"""What execution needs from the gate: the :class:`ExecCursor` protocol, and the
:class:`ShardQuery` a primitive hands it to send to shards.

The gate implements the cursor (``shardgate.gate.cursor``, Vitess's vcursor_impl);
unit tests fake it (``shardgate.testing``). Primitives do all their I/O through it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from sqlglot import exp

from shardgate.evalengine.coerce import Kind
from shardgate.keys import ShardMap
from shardgate.result import Result, Row
from shardgate.sql.classify import WriteTarget, tree_write_target
from shardgate.sql.dialects import Dialect
from shardgate.sql.dialects.render import ShardSQL, render
from shardgate.vindexes import VCursor


class ExecCursor(Protocol):
    """What execution needs from the gate."""

    def shard_map(self, keyspace: str) -> ShardMap: ...

    def lookup_cursor(self) -> VCursor: ...

    def dialect(self, keyspace: str) -> str:
        """The SQL dialect of the keyspace's shards (its first shard's)."""
        ...

    def collation(self, keyspace: str) -> str | None:
        """The collation of the keyspace's strings; None: the dialect's default."""
        ...

    async def execute_shards(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
        *,
        write: bool,
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Result]:
        """Run ``query`` on each shard (in the session's transaction if any).

        ``shard_vars[shard]``, when given, is merged over ``bind_vars`` for
        that shard (IN lists split per shard).
        """
        ...

    def stream_shards(
        self,
        keyspace: str,
        shards: Sequence[str],
        query: ShardQuery,
        bind_vars: Mapping[str, Any],
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> AsyncIterator[tuple[str, list[str], list[Row]]]:
        """Yield ``(shard, fields, rows)`` batches from each shard."""
        ...

    async def next_sequence_values(self, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive values of ``sequence``; return the first."""
        ...

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        """The kind of each (lowercase) column of ``table``; empty when unknown."""
        ...

    async def unique_keys(self, keyspace: str, table: str) -> tuple[tuple[str, ...], ...]:
        """The columns of each unique key of ``table`` (the primary key first), as its
        shards' schema declares them; empty when unknown."""
        ...


class ShardQuery:
    """A query to send to shards: the gate AST plus its per-dialect renderings.

    Renderings are memoised per (dialect, placeholder); the AST is never mutated.
    ``build`` lets a primitive make the SQL from the bind variables (inserts).
    """

    __slots__ = ("_rendered", "_target", "tree")

    def __init__(self, tree: exp.Expr) -> None:
        self.tree = tree
        self._rendered: dict[tuple[str, str], ShardSQL] = {}
        self._target: WriteTarget | None = None

    @property
    def write_target(self) -> WriteTarget | None:
        """What the query writes, for the tablet (see :data:`~shardgate.sql.classify.WriteTarget`);
        read from the tree once."""
        found = self._target
        if found is None:
            found = self._target = tree_write_target(self.tree)
        return found

    def for_dialect(self, dialect: str, placeholder: str) -> ShardSQL:
        key = (dialect, placeholder)
        found = self._rendered.get(key)
        if found is None:
            found = self._rendered[key] = render(self.tree, Dialect(dialect), placeholder)
        return found

    @property
    def gate_sql(self) -> str:
        return self.tree.sql(dialect="mysql")

    def __repr__(self) -> str:
        return f"ShardQuery({self.gate_sql!r})"
