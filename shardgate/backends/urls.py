"""Shard database URLs: parsing, and redaction for every message that names one.

Accepted forms::

    sqlite:///relative/path.db        relative to the working directory
    sqlite:////absolute/path.db       (four slashes: the path starts with "/")
    sqlite:///:memory:                a private in-memory database (tests)
    postgresql://user:pw@host:port/db?sslmode=require&application_name=x
    mysql://user:pw@host:port/db      (``mariadb://`` is the same)

``postgres://`` is accepted as a spelling of ``postgresql://``. User names and
passwords are percent-decoded. Query options are kept as strings; each backend
validates its own (libpq keywords for PostgreSQL, a short list for the others).

Invariant: no error message, log line or repr in shardgate prints a URL
without passing it through :func:`redacted` first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from shardgate.errors import InvalidArgument

#: URL scheme -> canonical backend kind.
SCHEMES: dict[str, str] = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
}

_ACCEPTED = "sqlite:///path.db, postgresql://user@host:port/db, mysql://user:pw@host:port/db"

# "scheme://user:password@" -- the password is everything up to the first "@"
# (a literal "@" in a password must be percent-encoded, so this never leaks one).
_PASSWORD_IN_NETLOC = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):[^@]*@")
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***``; safe on malformed input."""
    url = _PASSWORD_IN_NETLOC.sub(r"\1:***@", url)
    return _PASSWORD_IN_QUERY.sub(r"\1***", url)


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed shard database URL.

    ``kind`` is the canonical backend ("sqlite", "postgresql" or "mysql").
    For SQLite, ``database`` is the file path (or ``:memory:``) and the
    network fields are None. ``options`` holds the query string.
    """

    kind: str
    database: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    host: str | None = None
    port: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    raw: str = field(default="", repr=False)

    @property
    def safe(self) -> str:
        """The URL as given, password hidden: what messages print."""
        return redacted(self.raw)

    @property
    def is_memory(self) -> bool:
        return self.kind == "sqlite" and self.database == ":memory:"


def _bad(url: str, problem: str) -> InvalidArgument:
    return InvalidArgument(
        f"bad shard database URL {redacted(url)!r}: {problem}; accepted forms: {_ACCEPTED}"
    )


def parse_url(url: str) -> DatabaseURL:
    """Parse a shard database URL; raise ``InvalidArgument`` naming it if it is bad."""
    if not isinstance(url, str) or "://" not in url:
        raise _bad(str(url), "expected scheme://...")
    scheme = url.split("://", 1)[0].lower()
    kind = SCHEMES.get(scheme)
    if kind is None:
        raise _bad(url, f"unknown scheme {scheme!r} (accepted: {', '.join(SCHEMES)})")
    try:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
        port = parts.port
    except ValueError as exc:
        raise _bad(url, str(exc)) from exc
    if parts.fragment:
        raise _bad(url, "a URL fragment ('#...') is not allowed")

    if kind == "sqlite":
        if parts.netloc:
            raise _bad(
                url, "a sqlite URL has no host: write sqlite:///relative.db or sqlite:////abs.db"
            )
        # "sqlite:///x.db" -> path "/x.db" -> "x.db"; "sqlite:////abs.db" -> "/abs.db".
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise _bad(url, "missing the database file path")
        return DatabaseURL(kind=kind, database=path, options=options, raw=url)

    if not parts.hostname:
        raise _bad(url, "missing the host")
    database = unquote(parts.path.lstrip("/"))
    if "/" in database:
        raise _bad(url, f"database name {database!r} contains '/'")
    return DatabaseURL(
        kind=kind,
        database=database,
        user=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        host=parts.hostname,
        port=port,
        options=options,
        raw=url,
    )
