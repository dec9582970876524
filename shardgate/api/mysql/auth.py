"""Authentication on the MySQL listener: the static users file, or none (loopback only).

* :class:`UsersProvider` checks clients against a
  :class:`~shardgate.auth.users.StaticUsers` (Vitess's static auth file) with
  ``mysql_native_password``: the scramble is checked against each entry's
  SHA1(SHA1(password)), so ``MysqlNativePassword`` hashes work and a password
  can be rotated. ``caching_sha2_password`` is not offered: mysql-mimic's
  authentication loop cannot send its "fast auth succeeded" packet followed by
  OK without a client round trip; clients that default to it (MySQL 8
  connectors) switch to ``mysql_native_password`` when the server asks.
* :class:`NoAuthProvider` accepts any user name without a password; the
  listener refuses to use it on an address other than loopback.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from mysql_mimic import IdentityProvider, NativePasswordAuthPlugin, User
from mysql_mimic.auth import AuthPlugin

from shardgate.auth.identity import ANONYMOUS, Identity
from shardgate.auth.users import StaticUsers
from shardgate.errors import Unauthenticated

NATIVE = "mysql_native_password"


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=False))


class _NativePassword(NativePasswordAuthPlugin):
    """``mysql_native_password`` against every entry of the user (password rotation)."""

    def __init__(self, users: StaticUsers) -> None:
        self.users = users

    def password_matches(self, user: User, scramble: bytes, nonce: bytes) -> bool:
        if len(scramble) != 20:
            return False
        for stored in self.users.native_password_hashes(user.name):
            candidate = _xor(scramble, hashlib.sha1(nonce + stored).digest())
            if hmac.compare_digest(hashlib.sha1(candidate).digest(), stored):
                return True
        return False


class UsersProvider(IdentityProvider):
    """Users of a static users file, checked with ``mysql_native_password``."""

    def __init__(self, users: StaticUsers) -> None:
        self.users = users
        self._plugins: Sequence[AuthPlugin] = (_NativePassword(users),)

    def get_plugins(self) -> Sequence[AuthPlugin]:
        return self._plugins

    async def get_user(self, username: str) -> User | None:
        # An unknown user still goes through a scramble check (that fails), so the
        # answer does not say whether the user exists.
        return User(name=username, auth_string="-", auth_plugin=NATIVE)

    def identity(self, username: str) -> Identity | None:
        """The identity of an authenticated user."""
        try:
            return self.users.identity(username)
        except Unauthenticated:
            return None


class NoAuthProvider(IdentityProvider):
    """Any user name, no password (``shardgate up`` or ``gate --no-auth``, on loopback)."""

    def get_plugins(self) -> Sequence[AuthPlugin]:
        return (_AnyPassword(),)

    async def get_user(self, username: str) -> User | None:
        return User(name=username, auth_plugin=NATIVE)

    def identity(self, username: str) -> Identity | None:
        return ANONYMOUS


class _AnyPassword(NativePasswordAuthPlugin):
    def password_matches(self, user: User, scramble: bytes, nonce: bytes) -> bool:
        return True
