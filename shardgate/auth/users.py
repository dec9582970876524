"""The static users file, in Vitess's shape (``--mysql_auth_server_static_file``).

::

    {
      "alice": [{"Password": "s3cret", "UserData": "team-a"}],
      "bob":   [{"MysqlNativePassword": "*0D3CED9BEC10A777AEC23CCC353A8C08A633045E"},
                {"Password": "next-password"}]
    }

Each user has one entry or a list of entries; any of them authenticates the
user, which is how a password is rotated (add the new entry, move the clients,
remove the old one). ``Password`` is a plain password; ``MysqlNativePassword``
is MySQL's ``*`` + hex(SHA1(SHA1(password))), so the file need not hold the
password itself. ``UserData`` is carried in the :class:`Identity`.

In memory, every entry keeps SHA1(SHA1(password)) (what MySQL's
``mysql_native_password`` scramble check needs) and a salted SHA-256 of the
password for :meth:`StaticUsers.authenticate`; the plain text of ``Password``
entries is kept only because ``caching_sha2_password``'s fast path needs it
(:meth:`StaticUsers.plain_passwords`), and it is never in a ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardgate.auth.identity import Identity
from shardgate.auth.watch import DEFAULT_POLL_S, FileWatch
from shardgate.errors import InvalidArgument, Unauthenticated

log = logging.getLogger(__name__)

_NATIVE = re.compile(r"^\*[0-9A-Fa-f]{40}$")
_KNOWN_KEYS = frozenset(
    {"Password", "MysqlNativePassword", "UserData", "SourceHost", "Groups"}
)


def native_password_hash(password: str) -> bytes:
    """SHA1(SHA1(password)): what ``mysql_native_password`` stores and checks against."""
    return hashlib.sha1(hashlib.sha1(password.encode()).digest()).digest()


@dataclass(frozen=True)
class _Entry:
    user_data: str
    native: bytes
    salted: bytes | None  # SHA-256(salt + password) when the password is known
    plain: str | None = field(default=None, repr=False)


def _bad(path: str, where: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"users file {path}: {where}: {problem}")


def _entry(path: str, where: str, raw: Any, salt: bytes) -> _Entry:
    if not isinstance(raw, Mapping):
        raise _bad(path, where, "expected an object with Password or MysqlNativePassword")
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise _bad(path, where, f"unknown key(s) {', '.join(unknown)}")
    user_data = raw.get("UserData", "")
    if not isinstance(user_data, str):
        raise _bad(path, f"{where}.UserData", "expected a string")
    password = raw.get("Password")
    native = raw.get("MysqlNativePassword")
    if password is not None and native is not None:
        raise _bad(path, where, "give Password or MysqlNativePassword, not both")
    if password is not None:
        if not isinstance(password, str) or not password:
            raise _bad(path, f"{where}.Password", "expected a non-empty string")
        return _Entry(
            user_data,
            native_password_hash(password),
            hashlib.sha256(salt + password.encode()).digest(),
            password,
        )
    if native is not None:
        if not isinstance(native, str) or not _NATIVE.match(native):
            raise _bad(
                path, f"{where}.MysqlNativePassword",
                "expected '*' and 40 hex digits (MySQL's PASSWORD() / SHA1(SHA1(pw)))",
            )
        return _Entry(user_data, bytes.fromhex(native[1:]), None)
    raise _bad(path, where, "expected Password or MysqlNativePassword")


def parse_users(text: str, path: str, salt: bytes) -> dict[str, tuple[_Entry, ...]]:
    """The entries of a users file's text; InvalidArgument naming the JSON path at fault."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(path, f"line {exc.lineno} column {exc.colno}", f"not JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise _bad(path, "$", "expected an object of user name -> entries")
    users: dict[str, tuple[_Entry, ...]] = {}
    for name, entries in raw.items():
        where = f"$.{name}"
        if not name:
            raise _bad(path, where, "empty user name")
        if isinstance(entries, Mapping):
            entries = [entries]
        if not isinstance(entries, list) or not entries:
            raise _bad(path, where, "expected a non-empty list of entries")
        users[name] = tuple(_entry(path, f"{where}[{i}]", e, salt) for i, e in enumerate(entries))
    return users


class StaticUsers:
    """The users of a static users file, reloaded when the file changes.

    Invariants: ``_users`` is the last file content that parsed; a change that
    does not parse is logged and the previous users stay (a typo never locks
    everyone out, nor lets anyone in). The salt is random per process.
    """

    def __init__(
        self,
        users: dict[str, tuple[_Entry, ...]],
        *,
        salt: bytes,
        path: Path | None = None,
        poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        self._users = users
        self._salt = salt
        self.path = path
        self._watch = FileWatch(path, poll_s=poll_s) if path is not None else None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, *, poll_s: float = DEFAULT_POLL_S) -> StaticUsers:
        """Read a users file; InvalidArgument (naming the JSON path) when it is bad."""
        p = Path(path)
        salt = os.urandom(16)
        users = parse_users(_read(p), str(p), salt)
        return cls(users, salt=salt, path=p, poll_s=poll_s)

    @classmethod
    def from_mapping(cls, users: Mapping[str, Any]) -> StaticUsers:
        """Users from an in-memory mapping of the file's shape (tests, embedding)."""
        salt = os.urandom(16)
        return cls(parse_users(json.dumps(users), "<mapping>", salt), salt=salt)

    def _current(self) -> dict[str, tuple[_Entry, ...]]:
        if self._watch is not None and self._watch.changed():
            self.reload()
        return self._users

    def reload(self) -> None:
        """Read the file again now; a bad file is logged and the old users stay."""
        if self.path is None:
            return
        with self._lock:
            try:
                self._users = parse_users(_read(self.path), str(self.path), self._salt)
            except InvalidArgument as exc:
                log.error("users file not reloaded, keeping the previous users: %s", exc.message)
            else:
                log.info("users file %s reloaded (%d users)", self.path, len(self._users))

    def __contains__(self, user: object) -> bool:
        return user in self._current()

    def authenticate(self, user: str, password: str) -> Identity:
        """The identity of ``user`` if ``password`` matches one of its entries.

        Every entry of the user is compared, in constant time per entry;
        Unauthenticated (not saying whether the user exists) otherwise.
        """
        entries = self._current().get(user, ())
        raw = password.encode()
        salted = hashlib.sha256(self._salt + raw).digest()
        native: bytes | None = None
        match: _Entry | None = None
        for entry in entries:
            if entry.salted is not None:
                ok = hmac.compare_digest(entry.salted, salted)
            else:
                if native is None:
                    native = native_password_hash(password)
                ok = hmac.compare_digest(entry.native, native)
            if ok and match is None:
                match = entry
        if match is None:
            raise Unauthenticated(f"user {user!r}: wrong user name or password")
        return Identity(user, match.user_data, "password")

    def identity(self, user: str, entry_index: int = 0) -> Identity:
        """The identity of a user the caller authenticated itself (MySQL scramble checks)."""
        entries = self._current().get(user)
        if not entries:
            raise Unauthenticated(f"user {user!r}: wrong user name or password")
        return Identity(user, entries[min(entry_index, len(entries) - 1)].user_data, "password")

    def native_password_hashes(self, user: str) -> list[bytes]:
        """SHA1(SHA1(password)) of each entry of ``user`` (empty for an unknown user)."""
        return [e.native for e in self._current().get(user, ())]

    def plain_passwords(self, user: str) -> list[str]:
        """The plain passwords of ``user``'s ``Password`` entries (caching_sha2 full auth)."""
        return [e.plain for e in self._current().get(user, ()) if e.plain is not None]

    def __repr__(self) -> str:
        return f"StaticUsers(path={self.path}, users={sorted(self._current())})"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise InvalidArgument(f"users file {path}: cannot read it: {exc.strerror}") from None
