"""gRPC transport security: who is calling (users file, client certificates),
TLS with certificate reload, and the client side that presents credentials.

Server side, :class:`ServerSecurity` is what a gate or tablet listener is
given; :class:`AuthInterceptor` authenticates every call before its handler
runs and makes the caller's :class:`~shardgate.auth.Identity` available to
the handler through :func:`caller`:

* metadata ``username`` / ``password`` (as Vitess's gRPC static auth) are
  checked against the users file;
* with required client certificates (the server has ``--tls-ca``), a call
  without a password is the certificate's subject common name (``via="mtls"``);
* with neither configured, every call is :data:`~shardgate.auth.ANONYMOUS`
  (allowed only on loopback, see :mod:`shardgate.auth.listen`);
* otherwise the call fails with ``UNAUTHENTICATED``. ``allowed_users``
  narrows who may call at all (tablets: only the gates' identities).

:func:`server_credentials` re-reads the certificate, key and CA files when
they change (checked at most once a second, at a new connection's handshake),
so certificates are rotated without a restart.

Client side, :class:`ClientSecurity` holds a user/password and TLS files;
:func:`open_channel` opens the channel with them (TLS when a CA is given or
the target is ``grpcs://``; the credentials go as call metadata).
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from shardgate.auth.identity import ANONYMOUS, Identity
from shardgate.auth.users import StaticUsers
from shardgate.auth.watch import DEFAULT_POLL_S, FileWatch
from shardgate.errors import InvalidArgument, Unauthenticated

log = logging.getLogger(__name__)

USER_KEY = "username"
PASSWORD_KEY = "password"

_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "shardgate_caller", default=None
)


def caller() -> Identity:
    """The identity of the gRPC call being handled (ANONYMOUS outside an authenticated call)."""
    return _CALLER.get() or ANONYMOUS


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the server's (or client's) certificate and key, and the CA that
    verifies the other side (on a server: required client certificates)."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument("give --tls-cert and --tls-key together")
        for p in (self.cert, self.key, self.ca):
            if p is not None and not Path(p).is_file():
                raise InvalidArgument(f"TLS file {p} does not exist")


@dataclass(frozen=True)
class ServerSecurity:
    """What a listener requires of its callers (see the module docstring)."""

    users: StaticUsers | None = None
    tls: TLSFiles | None = None
    #: only these users may call (None: anyone authenticated)
    allowed_users: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.tls is not None and self.tls.cert is None:
            raise InvalidArgument("a TLS listener needs --tls-cert and --tls-key")

    @property
    def client_certs(self) -> bool:
        """True when callers must present a certificate signed by the CA (mTLS)."""
        return self.tls is not None and self.tls.ca is not None

    @property
    def authenticates(self) -> bool:
        """True when callers must prove who they are (users file or client certificates)."""
        return self.users is not None or self.client_certs

    def identify(self, context: grpc.aio.ServicerContext) -> Identity:
        """The caller of ``context``'s call; Unauthenticated when it proves nothing."""
        identity = self._identify(context)
        allowed = self.allowed_users
        if allowed is not None and identity.user not in allowed:
            raise Unauthenticated(f"user {identity.user!r} may not call this server")
        return identity

    def _identify(self, context: grpc.aio.ServicerContext) -> Identity:
        user = password = None
        for key, value in context.invocation_metadata() or ():
            if key == USER_KEY:
                user = value
            elif key == PASSWORD_KEY:
                password = value
        if user is not None and self.users is not None:
            return self.users.authenticate(str(user), str(password or ""))
        if self.client_certs:
            names = context.auth_context().get("x509_common_name") or []
            if names:
                return Identity(names[0].decode(), via="mtls")
        if not self.authenticates:
            return ANONYMOUS
        raise Unauthenticated(
            "this server requires authentication: pass --user/--password "
            "(SHARDGATE_USER/SHARDGATE_PASSWORD) or a client certificate"
        )


NO_SECURITY = ServerSecurity()


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call before its handler runs (UNAUTHENTICATED if it fails)."""

    def __init__(self, security: ServerSecurity) -> None:
        self.security = security
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method
        found = self._wrapped.get(method)
        if found is not None:
            return found
        handler = await continuation(details)
        if handler is None:
            return None
        if handler.unary_unary is not None:
            wrapped = handler._replace(unary_unary=self._unary(handler.unary_unary))
        elif handler.unary_stream is not None:
            wrapped = handler._replace(unary_stream=self._stream(handler.unary_stream))
        elif handler.stream_stream is not None:  # a tablet's lanes: read/write, no generator
            wrapped = handler._replace(stream_stream=self._bidi(handler.stream_stream))
        else:  # no client-streaming RPCs today: refuse rather than serve unauthenticated
            raise InvalidArgument(f"{method}: streaming requests are not authenticated")
        self._wrapped[method] = wrapped
        return wrapped

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> Identity:
        try:
            return self.security.identify(context)
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            raise  # not reached: abort raises

    def _unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = _CALLER.set(await self._authenticate(context))
            try:
                return await behavior(request, context)
            finally:
                _CALLER.reset(token)

        return unary

    def _bidi(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def bidi(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                identity = self.security.identify(context)
            except Unauthenticated as exc:
                # Read the caller's first message before refusing: a client writes as the
                # call opens, and a write racing the refusal ends as INTERNAL, not as this.
                await context.read()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
                raise  # not reached: abort raises
            token = _CALLER.set(identity)
            try:
                return await behavior(requests, context)
            finally:
                _CALLER.reset(token)

        return bidi

    def _stream(self, behavior: Callable[..., AsyncIterator[Any]]
                ) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            _CALLER.set(await self._authenticate(context))
            async for item in behavior(request, context):
                yield item

        return stream


def _read(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def server_credentials(tls: TLSFiles, *, poll_s: float = DEFAULT_POLL_S) -> grpc.ServerCredentials:
    """TLS credentials that re-read ``tls``'s files when they change (no restart).

    A change that cannot be loaded (a half-written file) is logged and the
    previous certificate stays in use; it is tried again at the next change.
    """
    files = [p for p in (tls.cert, tls.key, tls.ca) if p is not None]
    watches = [FileWatch(p, poll_s=poll_s) for p in files]

    def config() -> Any:
        assert tls.cert is not None and tls.key is not None
        return grpc.ssl_server_certificate_configuration(
            [(_read(tls.key), _read(tls.cert))], root_certificates=_read(tls.ca))

    def fetch() -> Any:
        changed = [w.changed() for w in watches]
        if not any(changed):
            return None
        try:
            fresh = config()
        except Exception as exc:  # grpc raises plain errors for bad PEM
            log.error("TLS files not reloaded, keeping the previous ones: %s", exc)
            return None
        log.info("TLS certificate reloaded from %s", ", ".join(map(str, files)))
        return fresh

    return grpc.dynamic_ssl_server_credentials(
        config(), fetch, require_client_authentication=tls.ca is not None)


# -- client side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: a user and password, and TLS files.

    ``tls_ca`` verifies the server (None with TLS: the system's roots);
    ``tls_cert`` / ``tls_key`` are the client's certificate for servers that
    require one; ``server_name`` overrides the name checked in the server's
    certificate (default: the target's host).
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls, **given: Any) -> ClientSecurity:
        """``given`` (None values ignored) over ``SHARDGATE_USER``, ``SHARDGATE_PASSWORD``,
        ``SHARDGATE_TLS_CA``, ``SHARDGATE_TLS_CERT``, ``SHARDGATE_TLS_KEY``."""
        values: dict[str, Any] = {}
        for name in ("user", "password", "tls_ca", "tls_cert", "tls_key", "server_name"):
            value = given.get(name)
            if value is None:
                value = os.environ.get(f"SHARDGATE_{name.upper()}") or None
            if value is not None and name in ("tls_ca", "tls_cert", "tls_key"):
                value = Path(value)
            values[name] = value
        return cls(**values)

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        if self.user is None:
            return ()
        return ((USER_KEY, self.user), (PASSWORD_KEY, self.password or ""))


class _Metadata:
    """Adds the credentials to a call's metadata."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                          details.credentials, details.wait_for_ready)


# grpc.aio files an interceptor under its first matching kind only: one class per kind.
class _UnaryMetadata(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamMetadata(_Metadata, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


#: Largest message either side accepts (results are sent whole by Execute).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: the options of every gate server and every channel to a gate or tablet (here, not in
#: ``server``: a client that imported the server loaded the whole gate, 1.2 CPU-s)
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def open_channel(
    address: str, security: ClientSecurity | None, options: list[tuple[str, Any]],
    *, tls: bool = False,
) -> grpc.aio.Channel:
    """A channel to ``address`` (host:port) presenting ``security``; TLS when it has
    TLS files or ``tls`` (a ``grpcs://`` target)."""
    security = security or ClientSecurity()
    interceptors: list[Any] | None = None
    if security.user is not None:
        md = security.metadata()
        interceptors = [_UnaryMetadata(md), _StreamMetadata(md)]
    if not (tls or security.tls):
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(security.tls_ca), private_key=_read(security.tls_key),
        certificate_chain=_read(security.tls_cert))
    opts = list(options)
    if security.server_name:
        opts.append(("grpc.ssl_target_name_override", security.server_name))
    return grpc.aio.secure_channel(address, creds, options=opts, interceptors=interceptors)
