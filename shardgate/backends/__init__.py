"""Database backends: the only package that imports a database driver.

``open_backend(url)`` picks the implementation from the URL's scheme:

=====================  ==========================  =========  ===========
scheme                 class                       dialect    placeholder
=====================  ==========================  =========  ===========
``sqlite``             ``SQLiteBackend``           sqlite     ``?``
``postgresql``         ``PostgresBackend``         postgres   ``%s``
``mysql``/``mariadb``  ``MySQLBackend``            mysql      ``%s``
=====================  ==========================  =========  ===========

See ``base.py`` for the contract every backend keeps, ``docs/backends.md``
for the user-facing summary.
"""

from __future__ import annotations

from shardgate.backends.base import Backend, Connection
from shardgate.backends.urls import DatabaseURL, parse_url, redacted
from shardgate.errors import InvalidArgument

__all__ = ["Backend", "Connection", "DatabaseURL", "open_backend", "parse_url", "redacted"]

DEFAULT_POOL_SIZE = 4


def open_backend(
    url: str, *, pool_size: int = DEFAULT_POOL_SIZE, pool_timeout_s: float | None = None
) -> Backend:
    """A backend for a shard database URL; no connection is opened yet.

    ``pool_timeout_s``: how long taking a pooled connection may wait before
    ``RESOURCE_EXHAUSTED`` (default ``_pool.DEFAULT_POOL_TIMEOUT_S``).

    Raises ``InvalidArgument`` (naming the URL, password hidden) if the URL or
    one of its options is bad.
    """
    backend = _open(url, pool_size)
    if pool_timeout_s is not None:
        from shardgate.backends._pool import PooledBackend

        if not pool_timeout_s > 0:
            raise InvalidArgument(f"pool_timeout_s must be > 0, not {pool_timeout_s!r}")
        if isinstance(backend, PooledBackend):
            backend.pool_timeout_s = pool_timeout_s
    return backend


def _open(url: str, pool_size: int) -> Backend:
    parsed = parse_url(url)
    match parsed.kind:
        case "sqlite":
            from shardgate.backends.sqlite import SQLiteBackend

            return SQLiteBackend(url, pool_size=pool_size)
        case "postgresql":
            from shardgate.backends.postgres import PostgresBackend

            return PostgresBackend(url, pool_size=pool_size)
        case "mysql":
            from shardgate.backends.mysql import MySQLBackend

            return MySQLBackend(url, pool_size=pool_size)
    raise AssertionError(f"parse_url returned unknown kind {parsed.kind!r}")  # pragma: no cover
