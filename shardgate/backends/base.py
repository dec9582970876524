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
* Two-phase commit (``supports_twopc``: PostgreSQL ``PREPARE TRANSACTION``,
  MariaDB XA): ``begin_twopc(xid)`` → statements → ``prepare(xid)`` →
  ``commit_prepared(xid)`` / ``rollback_prepared(xid)``, the last two from any
  connection to the same database once the preparing one is gone;
  ``list_prepared(prefix)`` sees only this database's prepared xids. SQLite
  refuses with ``FailedPrecondition``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any

from shardgate.backends.copytext import TextRows
from shardgate.errors import FailedPrecondition, InvalidArgument, ShardgateError, Unsupported
from shardgate.result import Result, ResultLimits, WireResult
from shardgate.sql.dialects import Dialect


class Connection(ABC):
    """One database session. Not safe for concurrent use; the pool serialises."""

    @abstractmethod
    async def execute(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> Result:
        """Run one statement and return its rows (if any) and counts.

        With ``limits``, rows are read in chunks and a result past them raises
        ``RESOURCE_EXHAUSTED`` (the statement is cancelled or its rows dropped
        unread; the connection may be marked broken).
        """

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

    #: whether :meth:`copy_in` bulk-loads (PostgreSQL's ``COPY ... FROM STDIN``)
    supports_copy_in = False

    async def copy_in(self, table: str, columns: Sequence[str],
                      rows: Sequence[Sequence[Any]]) -> int:
        """Append ``rows`` to ``table`` (quoted name) by the database's bulk load; rows written.

        Only where :attr:`supports_copy_in`; in the current transaction (or
        one of its own). A duplicate key fails the whole call (``ALREADY_EXISTS``).
        """
        raise FailedPrecondition(f"{type(self).__name__} has no bulk load (COPY)")

    #: whether the ``*_text`` copy methods work (PostgreSQL's COPY text format)
    supports_text_copy = False

    @property
    def text_copy_encoding(self) -> str | None:
        """The client encoding of COPY text (equal on both ends for text to move as is)."""
        return None

    async def text_copy_types(self, sql: str, params: Sequence[Any] = ()) -> list[int] | None:
        """The column type OIDs of the SELECT ``sql`` if every one is portable as COPY
        text (:data:`~shardgate.backends.copytext.PORTABLE_OIDS`), else None."""
        return None

    async def copy_out_text(self, sql: str, params: Sequence[Any], columns: Sequence[str],
                            oids: Sequence[int], order: Sequence[str]) -> TextRows:
        """The rows of the SELECT ``sql`` (``columns``, quoted, of types ``oids`` from
        :meth:`text_copy_types`, in the order of the quoted columns ``order``) as COPY
        text lines (:func:`~shardgate.backends.copytext.batch_sql`); in a transaction,
        its output settings are set for the rest of it
        (:data:`~shardgate.backends.copytext.SOURCE_SETTINGS`)."""
        raise FailedPrecondition(f"{type(self).__name__} has no COPY text format")

    async def copy_in_text(self, table: str, columns: Sequence[str], data: bytes) -> None:
        """Append COPY text ``data`` to ``table`` (quoted name); as :meth:`copy_in`."""
        raise FailedPrecondition(f"{type(self).__name__} has no COPY text format")

    # -- two-phase commit (only where ``Backend.supports_twopc``) --------------------

    async def begin_twopc(self, xid: str) -> None:
        """Open a transaction that can later be prepared under ``xid``.

        ``xid`` is printable ASCII, at most :data:`MAX_XID_LENGTH` characters and
        unique on the server. ``commit()`` / ``rollback()`` still end such a
        transaction in one phase (the backend's own form of it).
        """
        raise _no_twopc()

    async def prepare(self, xid: str) -> None:
        """Prepare the open ``begin_twopc(xid)`` transaction (phase one).

        Afterwards the transaction survives a lost connection or a server
        restart until ``commit_prepared`` or ``rollback_prepared``. Raises (and
        leaves nothing prepared) if the database refuses to prepare it.
        """
        raise _no_twopc()

    async def commit_prepared(self, xid: str) -> None:
        """Commit a prepared transaction of this database; ``NotFound`` if none is."""
        raise _no_twopc()

    async def rollback_prepared(self, xid: str) -> None:
        """Roll back a prepared transaction of this database; ``NotFound`` if none is."""
        raise _no_twopc()

    async def list_prepared(self, prefix: str) -> list[str]:
        """The xids starting with ``prefix`` prepared in this database (not others)."""
        raise _no_twopc()


#: Longest xid ``begin_twopc`` accepts (MariaDB's limit for an XA gtrid).
MAX_XID_LENGTH = 64


@contextlib.asynccontextmanager
async def transaction(conn: Connection) -> AsyncIterator[Connection]:
    """``begin()``; ``commit()`` when the block ends, ``rollback()`` if it raises.

    The block's exception is the one raised: a failing rollback (the connection
    is gone, say) is not allowed to hide it.
    """
    await conn.begin()
    try:
        yield conn
        await conn.commit()
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(ShardgateError):
                await conn.rollback()
        raise


def _no_twopc() -> ShardgateError:
    return FailedPrecondition(
        "this shard's database cannot prepare transactions (two-phase commit needs "
        "PostgreSQL or MariaDB shards): use transaction_mode 'best_effort'"
    )


def check_xid(xid: str) -> str:
    """``xid`` if it is a valid transaction id for ``begin_twopc``; else InvalidArgument."""
    if not xid or len(xid) > MAX_XID_LENGTH or not all(" " < c <= "~" for c in xid):
        raise InvalidArgument(
            f"bad two-phase commit xid {xid!r}: use 1 to {MAX_XID_LENGTH} printable "
            "ASCII characters without spaces"
        )
    return xid


class Backend(ABC):
    """A shard's database: its dialect and a pool of connections."""

    #: the database's SQL dialect (its value is sqlglot's name for it)
    dialect: Dialect
    #: positional placeholder the driver expects: "?" or "%s".
    placeholder: str = "?"
    #: the database's default collation, once a connection has read it (MariaDB,
    #: PostgreSQL; SQLite: None, its BINARY default)
    collation: str | None = None
    #: whether connections implement the two-phase commit methods.
    supports_twopc: bool = False

    def __init__(self, url: str) -> None:
        self.url = url

    @abstractmethod
    async def acquire(self) -> Connection:
        """A connection from the pool (opened if needed), in autocommit mode."""

    @abstractmethod
    async def release(self, conn: Connection) -> None:
        """Give a connection back; one left inside a transaction is rolled back first."""

    def can_lend_now(self) -> bool:
        """Whether :meth:`acquire` would lend a connection without waiting for another
        borrower to release one."""
        return True

    @abstractmethod
    async def close(self) -> None:
        """Close every pooled connection."""

    async def execute(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> Result:
        """Run one autocommit statement on a pooled connection."""
        conn = await self.acquire()
        try:
            return await conn.execute(sql, params, limits)
        finally:
            await self.release(conn)

    #: whether :meth:`execute_wire` answers (MariaDB/MySQL with its query pool)
    gives_wire = False

    async def execute_wire(
        self, sql: str, params: Sequence[Any] = (), limits: ResultLimits | None = None
    ) -> WireResult:
        """An autocommit read's answer as MySQL protocol packets, for a MySQL client to
        take as they are (only where :attr:`gives_wire`: ``UNIMPLEMENTED`` elsewhere)."""
        raise Unsupported(f"{type(self).__name__} does not answer with MySQL packets")

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
