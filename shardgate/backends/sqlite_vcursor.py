"""A recording VCursor over one in-memory SQLite database, for unit tests.

:class:`SQLiteVCursor` is a :class:`~shardgate.vindexes.base.VCursor`: it runs the gate SQL
a lookup vindex sends (MySQL flavour, ``:name`` binds) after transpiling it to SQLite with
sqlglot, and records every call so tests can assert on the exact SQL, binds and
``autocommit`` flag. It is a unit-test fake, not a gate: no routing, one database, and
``autocommit=True`` statements share the connection (inside an open
:meth:`SQLiteVCursor.begin` block they join that transaction). It lives in backends because
it holds a database driver's connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from shardgate.errors import AlreadyExists, Internal, InvalidArgument
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
