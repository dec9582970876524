"""Who may use the HTTP server: the gate's users, and the ACL's admins to change things.

* With a users file (``--users-file``) every request needs HTTP Basic
  credentials checked against it (401 with a ``WWW-Authenticate`` challenge
  otherwise); without one the server is only allowed on loopback addresses
  (the gate's listen rule) and every caller is anonymous.
* Reading (``GET``) needs only authentication. Changing (``POST``/``PUT``:
  saving a VSchema, queue actions, killing a query) needs the admin role of
  the table ACL (``--acl-file``) on what it changes; without an ACL every
  authenticated caller may change.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from shardgate.auth.identity import ANONYMOUS, Identity
from shardgate.auth.users import StaticUsers
from shardgate.errors import Unauthenticated

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

IDENTITY_KEY = web.RequestKey("sg_identity", Identity)
REALM = 'Basic realm="shardgate", charset="UTF-8"'


def identity_of(request: web.Request) -> Identity:
    """The authenticated caller of ``request`` (ANONYMOUS when no users are configured)."""
    found = request.get(IDENTITY_KEY)
    return found if isinstance(found, Identity) else ANONYMOUS


def basic_auth(users: StaticUsers | None) -> Middleware:
    """Middleware: authenticate every request against ``users`` (None: anonymous)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if users is None:
            request[IDENTITY_KEY] = ANONYMOUS
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        try:
            if scheme.lower() != "basic":
                raise Unauthenticated("send the gate's user and password (HTTP Basic)")
            try:
                user, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise Unauthenticated("malformed Basic credentials") from None
            if not sep:
                raise Unauthenticated("malformed Basic credentials")
            request[IDENTITY_KEY] = users.authenticate(user, password)
        except Unauthenticated as exc:
            return web.json_response({"code": exc.code.value, "message": exc.message},
                                     status=401, headers={"WWW-Authenticate": REALM})
        return await handler(request)

    return authenticate
