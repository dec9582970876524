"""In-package fakes for unit tests (as procrastinate's ``testing.InMemoryConnector``).

:class:`SQLiteVCursor` is a :class:`~shardgate.vindexes.base.VCursor` over one
in-memory SQLite database: it runs the gate SQL a lookup vindex sends
(MySQL flavour, ``:name`` binds) after transpiling it to SQLite with sqlglot,
and records every call so tests can assert on the exact SQL, binds and
``autocommit`` flag. It is a unit-test fake, not a gate: no routing, one
database, and ``autocommit=True`` statements share the connection (inside an
open :meth:`SQLiteVCursor.begin` block they join that transaction).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from shardgate.errors import AlreadyExists, Internal, InvalidArgument
from shardgate.evalengine.coerce import Kind
from shardgate.result import Result


@dataclass(frozen=True)
class Call:
    """One recorded :meth:`SQLiteVCursor.execute`."""

    sql: str
    bind_vars: dict[str, Any]
    autocommit: bool


class SQLiteVCursor:
    """A recording VCursor backed by a real ``sqlite3`` in-memory database.

    Table names lose their keyspace qualifier (``lookup.t`` runs as ``t``);
    locking clauses (``for update``, ``lock in share mode``) are dropped.
    ``UNIQUE``/``PRIMARY KEY`` violations raise :class:`AlreadyExists`, as the
    gate's backends do; other SQLite errors raise :class:`Internal`.
    """

    def __init__(self, connection: sqlite3.Connection | None = None) -> None:
        self.connection = connection or sqlite3.connect(":memory:", isolation_level=None)
        self.calls: list[Call] = []
        self._sqlite_cache: dict[str, str] = {}

    def script(self, sql: str) -> None:
        """Run SQLite statements directly (schema and fixtures), unrecorded."""
        self.connection.executescript(sql)

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a SQLite query directly, unrecorded (for test assertions)."""
        return list(self.connection.execute(sql, dict(params or {})).fetchall())

    def begin(self) -> None:
        """Open a transaction for the ``autocommit=False`` statements."""
        self.connection.execute("begin")

    def commit(self) -> None:
        """Commit the open transaction."""
        self.connection.execute("commit")

    def rollback(self) -> None:
        """Roll the open transaction back."""
        self.connection.execute("rollback")

    def to_sqlite(self, sql: str) -> str:
        """The SQLite text run for gate SQL ``sql``."""
        cached = self._sqlite_cache.get(sql)
        if cached is not None:
            return cached
        try:
            tree = sqlglot.parse_one(sql, read="mysql")
        except sqlglot.errors.ParseError as exc:
            raise InvalidArgument(f"cannot parse gate SQL {sql!r}: {exc}") from exc
        for table in tree.find_all(exp.Table):
            table.set("db", None)
            table.set("catalog", None)
        tree.set("locks", None)
        text = tree.sql(dialect="sqlite")
        self._sqlite_cache[sql] = text
        return text

    async def execute(
        self, sql: str, bind_vars: Mapping[str, Any], *, autocommit: bool = False
    ) -> Result:
        """Record the call, then run it on SQLite."""
        self.calls.append(Call(sql, dict(bind_vars), autocommit))
        try:
            cur = self.connection.execute(self.to_sqlite(sql), dict(bind_vars))
        except sqlite3.IntegrityError as exc:
            if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
                raise AlreadyExists(f"duplicate entry: {exc}") from exc
            raise Internal(f"sqlite: {exc} in {sql!r}") from exc
        except sqlite3.Error as exc:
            raise Internal(f"sqlite: {exc} in {sql!r}") from exc
        if cur.description is None:
            return Result(rows_affected=max(cur.rowcount, 0))
        fields = [d[0] for d in cur.description]
        return Result.of_rows(fields, [tuple(r) for r in cur.fetchall()])


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

    def shard_map(self, keyspace: str) -> Any:
        return self.shard_maps[keyspace]

    def lookup_cursor(self) -> SQLiteVCursor:
        return self.lookup

    def dialect(self, keyspace: str) -> str:
        return self.dialect_name

    async def column_kinds(self, keyspace: str, table: str) -> Mapping[str, Kind]:
        return self.column_types.get(table, {})

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
