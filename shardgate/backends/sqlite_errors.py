"""SQLite errors to shardgate errors: the one place this happens.

Shared by the SQLite backend (:mod:`shardgate.backends.sqlite`) and its change
capture (:mod:`shardgate.backends.changes.sqlite`), which both talk to SQLite.
"""

from __future__ import annotations

import sqlite3

from shardgate.backends._pool import WorkerStopped
from shardgate.backends.missing import missing
from shardgate.errors import (
    Aborted,
    AlreadyExists,
    Code,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ShardgateError,
    Unavailable,
)

# Extended and primary result codes (sqlite3.h).
_SQLITE_ERROR = 1
_SQLITE_PERM = 3
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_INTERRUPT = 9
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_TOOBIG = 18
_SQLITE_CONSTRAINT = 19
_SQLITE_MISMATCH = 20
_SQLITE_RANGE = 25
_SQLITE_CONSTRAINT_CHECK = 275
_SQLITE_CONSTRAINT_FOREIGNKEY = 787
_SQLITE_CONSTRAINT_NOTNULL = 1299
_SQLITE_CONSTRAINT_PRIMARYKEY = 1555
_SQLITE_CONSTRAINT_UNIQUE = 2067


def translate(exc: BaseException, safe_url: str) -> ShardgateError:
    """Map a sqlite3 exception to a shardgate error (the one place this happens)."""
    text = str(exc)
    where = f"shard database {safe_url}: {text}"
    if isinstance(exc, sqlite3.Error):
        ext = getattr(exc, "sqlite_errorcode", None)
        if ext is None:
            # Raised by the sqlite3 module itself, not by SQLite.
            if "closed" in text:
                return Unavailable(f"connection closed, {where}")
            return InvalidArgument(f"bad statement or parameters for {where}")
        primary = ext & 0xFF
        if primary == _SQLITE_CONSTRAINT:
            if ext in (_SQLITE_CONSTRAINT_UNIQUE, _SQLITE_CONSTRAINT_PRIMARYKEY):
                return AlreadyExists(f"duplicate key in {where}")
            if ext in (_SQLITE_CONSTRAINT_NOTNULL, _SQLITE_CONSTRAINT_CHECK):
                return InvalidArgument(f"constraint violated in {where}")
            if ext == _SQLITE_CONSTRAINT_FOREIGNKEY:
                return FailedPrecondition(f"foreign key violated in {where}")
            return FailedPrecondition(f"constraint violated in {where}")
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return Aborted(f"locked by another writer, {where}; retry the transaction")
        if primary in (_SQLITE_CANTOPEN, _SQLITE_IOERR):
            return Unavailable(
                f"shard database {safe_url} is unreachable: {text}; "
                "check the file and its directory"
            )
        if primary == _SQLITE_FULL:
            return ShardgateError(f"disk full, {where}", code=Code.RESOURCE_EXHAUSTED)
        if primary in (_SQLITE_PERM, _SQLITE_READONLY):
            return ShardgateError(f"not permitted by {where}", code=Code.PERMISSION_DENIED)
        if primary == _SQLITE_INTERRUPT:
            return ShardgateError(f"interrupted, {where}", code=Code.CANCELED)
        if primary in (_SQLITE_TOOBIG, _SQLITE_MISMATCH, _SQLITE_RANGE):
            return InvalidArgument(f"bad value for {where}")
        if primary == _SQLITE_ERROR:
            lowered = text.lower()
            if lowered.startswith("no such "):  # table, column, index, function...
                return missing(text, safe_url)
            if "already exists" in lowered:
                return AlreadyExists(f"already exists in {where}")
            return InvalidArgument(f"bad statement for {where}")
        return Internal(f"unexpected SQLite error from {where}")
    if isinstance(exc, WorkerStopped):
        return Unavailable(f"connection closed, {where}")
    if isinstance(exc, OSError):  # creating the file's directory
        return Unavailable(
            f"shard database {safe_url} is unreachable: {text}; check the file and its directory"
        )
    if isinstance(exc, OverflowError | TypeError | ValueError):
        return InvalidArgument(f"bad parameter for {where}")
    return Internal(f"unexpected error from {where}")
