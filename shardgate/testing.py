"""In-package fakes for unit tests (as procrastinate's ``testing.InMemoryConnector``).

The VCursor over an in-memory SQLite database that lookup-vindex tests use is
:class:`shardgate.backends.sqlite_vcursor.SQLiteVCursor` (database drivers live in
:mod:`shardgate.backends` only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardgate.backends.sqlite_vcursor import SQLiteVCursor
from shardgate.evalengine.coerce import Kind
from shardgate.result import Result


class RecordingCursor:
    """A fake :class:`~shardgate.engine.cursor.ExecCursor` that logs every shard call.

    As Vitess's ``fake_vcursor_test.go``: each call becomes one line,
    ``"ExecuteShard commerce/-80: SELECT ... [args]"``, in :attr:`log`, and
    returns the canned :class:`Result` of :attr:`results` for that shard (an
    empty result otherwise); :attr:`column_types` stands for the shards' schema.
    Lookup vindexes use :attr:`lookup` (a :class:`SQLiteVCursor`); sequences
    count from :attr:`next_sequence`.
    """

    def __init__(
        self,
        shard_maps: Mapping[str, Any],
        *,
        dialect: str = "mysql",
        placeholder: str = "%s",
        lookup: SQLiteVCursor | None = None,
        collation: str | None = None,
    ) -> None:
        self.shard_maps = dict(shard_maps)
        self.dialect_name = dialect
        self.collation_name = collation
        self.placeholder = placeholder
        self.lookup = lookup or SQLiteVCursor()
        self.results: dict[str, Result] = {}
        self.log: list[str] = []
        self.next_sequence = 1
        #: table -> {column: kind} the shards' schema would give (empty: unknown)
        self.column_types: dict[str, dict[str, Kind]] = {}
        #: table -> its unique keys' columns (the primary key first), as the shards declare
        self.unique: dict[str, tuple[tuple[str, ...], ...]] = {}

    def shard_map(self, keyspace: str) -> Any:
        return self.shard_maps[keyspace]

    def lookup_cursor(self) -> SQLiteVCursor:
        return self.lookup

    def dialect(self, keyspace: str) -> str:
        return self.dialect_name

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        return self.column_types.get(table, {})

    async def unique_keys(self, keyspace: str, table: str) -> tuple[tuple[str, ...], ...]:
        return self.unique.get(table, ())

    def collation(self, keyspace: str) -> str | None:
        return self.collation_name

    async def next_sequence_values(self, sequence: str, count: int) -> int:
        first = self.next_sequence
        self.next_sequence += count
        self.log.append(f"NextSequence {sequence}: {count}")
        return first

    def _sql(self, shard: str, query: Any, bind_vars: Mapping[str, Any]) -> tuple[str, list[Any]]:
        if hasattr(query, "for_shard"):
            sql, args = query.for_shard(shard, self.dialect_name, self.placeholder, bind_vars)
            return sql, list(args)
        bound: tuple[str, list[Any]] = query.for_dialect(self.dialect_name, self.placeholder).bind(
            bind_vars
        )
        return bound

    async def execute_shards(
        self,
        keyspace: str,
        shards: Any,
        query: Any,
        bind_vars: Mapping[str, Any],
        *,
        write: bool,
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Result]:
        out = []
        for shard in shards:
            bv = {**bind_vars, **shard_vars[shard]} if shard_vars else bind_vars
            sql, args = self._sql(shard, query, bv)
            self.log.append(f"ExecuteShard {keyspace}/{shard}: {sql} {args}")
            canned = self.results.get(shard, Result())
            out.append(Result(list(canned.fields), list(canned.rows), canned.rows_affected,
                              canned.insert_id))
        return out

    async def stream_shards(
        self,
        keyspace: str,
        shards: Any,
        query: Any,
        bind_vars: Mapping[str, Any],
        shard_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Any:
        for shard in shards:
            bv = {**bind_vars, **shard_vars[shard]} if shard_vars else bind_vars
            sql, args = self._sql(shard, query, bv)
            self.log.append(f"StreamShard {keyspace}/{shard}: {sql} {args}")
            canned = self.results.get(shard, Result())
            yield shard, list(canned.fields), list(canned.rows)
