"""The one narrow seam between shardgate and a database.

Nothing above ``shardgate.backends`` imports a database driver. A backend is
created from a shard's database URL (:func:`shardgate.backends.open_backend`)
and hands out :class:`Connection` objects from a small pool.

Contracts:

* SQL given to a connection is already in the backend's dialect
  (``Backend.dialect`` is the sqlglot dialect name) and uses the backend's
  positional placeholder (``Backend.placeholder``: ``?`` or ``%s``); ``params``
  is a sequence matched by position. With ``%s`` backends a literal ``%`` in the
  SQL must already be doubled by the caller.
* Every driver exception is translated exactly once, here, into a
  :class:`shardgate.errors.ShardgateError`: unique violations ->
  ``AlreadyExists``, syntax errors -> ``InvalidArgument``, unknown table or
  column -> ``NotFound``, deadlock / serialization failure -> ``Aborted``,
  connection refused or lost -> ``Unavailable``, anything else -> ``Internal``.
  The original exception is chained (``raise ... from exc``).
* A connection starts in autocommit mode. ``begin()`` opens a transaction that
  lasts until ``commit()`` or ``rollback()``. A connection whose transaction
  failed with ``Unavailable`` is discarded by the pool, not reused.
* ``stream`` yields batches of rows without holding the whole result in memory
  (server-side cursor on PostgreSQL and MariaDB).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any

from shardgate.result import Result


class Connection(ABC):
    """One database session. Not safe for concurrent use; the pool serialises."""

    @abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        """Run one statement and return its rows (if any) and counts."""

    @abstractmethod
    async def executemany(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> int:
        """Run one statement for many parameter rows; return rows affected.

        Atomic: outside a transaction it runs inside one of its own.
        """

    @abstractmethod
    def stream(
        self, sql: str, params: Sequence[Any] = (), batch_size: int = 1000
    ) -> AsyncIterator[tuple[list[str], list[tuple[Any, ...]]]]:
        """Yield ``(fields, rows)`` batches of a SELECT without buffering it whole."""

    @abstractmethod
    async def begin(self) -> None: ...

    @abstractmethod
    async def commit(self) -> None: ...

    @abstractmethod
    async def rollback(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @property
    @abstractmethod
    def in_transaction(self) -> bool: ...


class Backend(ABC):
    """A shard's database: its dialect and a pool of connections."""

    #: sqlglot dialect name: "sqlite", "postgres" or "mysql".
    dialect: str = ""
    #: positional placeholder the driver expects: "?" or "%s".
    placeholder: str = "?"

    def __init__(self, url: str) -> None:
        self.url = url

    @abstractmethod
    async def acquire(self) -> Connection:
        """A connection from the pool (opened if needed), in autocommit mode."""

    @abstractmethod
    async def release(self, conn: Connection) -> None:
        """Give a connection back; one left inside a transaction is rolled back first."""

    @abstractmethod
    async def close(self) -> None:
        """Close every pooled connection."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        """Run one autocommit statement on a pooled connection."""
        conn = await self.acquire()
        try:
            return await conn.execute(sql, params)
        finally:
            await self.release(conn)

    @abstractmethod
    async def ping(self) -> None:
        """Raise ``Unavailable`` if the database cannot be reached."""

    async def try_lease(self, name: str) -> LeaseHandle | None:
        """Take the database-level exclusive lock ``name`` on a dedicated connection.

        None if another session holds it. The lock lives as long as the
        returned handle's connection (PostgreSQL advisory lock, MariaDB
        ``GET_LOCK``) or the open lock file (SQLite), so a crashed holder
        releases it. Backends without a lease primitive raise ``Unimplemented``.
        """
        from shardgate.errors import Unsupported

        raise Unsupported(f"{type(self).__name__} has no lease primitive")


class LeaseHandle(ABC):
    """A held lease: its dedicated connection (not pooled) and how to check it.

    Writes that must stop when the lease is lost run on ``conn``: if the
    connection dies, the lock dies with it and so does the write.
    """

    conn: Connection

    @abstractmethod
    async def check(self) -> bool:
        """True if the lock is still held (one round trip on ``conn``)."""

    @abstractmethod
    async def release(self) -> None:
        """Release the lock and close the connection; never raises."""
