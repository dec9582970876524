"""The MySQL-protocol listener of the gate (mysql-mimic over asyncio): transport only.

:func:`serve_mysql` starts it; each accepted connection gets a
:class:`~shardgate.api.mysql.connection.GateConnection` over a
:class:`~shardgate.api.mysql.session.GateSession` (one gate session). A
connection that fails (bad packet, client gone mid-result) is logged and
closed; the others are not affected.

Security rules, checked here before a socket is opened:

* without a users file (``users=None``) the listener serves only a loopback
  address (127.0.0.0/8, ::1, localhost): anything else is refused;
* ``require_tls`` needs a certificate and key, and refuses clients that do not
  switch to TLS during the handshake (error 3159, before the password).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from dataclasses import dataclass
from typing import Any

from mysql_mimic import MysqlServer
from mysql_mimic.constants import DEFAULT_SERVER_CAPABILITIES
from mysql_mimic.control import TooManyConnections
from mysql_mimic.types import Capabilities

from shardgate.api.mysql.auth import NoAuthProvider, UsersProvider
from shardgate.api.mysql.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    GateConnection,
    GateStream,
)
from shardgate.api.mysql.errors import TOO_MANY_CONNECTIONS
from shardgate.api.mysql.session import GateSession
from shardgate.auth.users import StaticUsers
from shardgate.errors import FailedPrecondition, InvalidArgument, Unavailable
from shardgate.gate import Gate

log = logging.getLogger(__name__)

#: What the listener offers: mysql-mimic's set, with classic EOF packets (MariaDB
#: Connector/J 2.x misreads mysql-mimic's OK-terminated result sets) and transactions.
CAPABILITIES = (DEFAULT_SERVER_CAPABILITIES & ~Capabilities.CLIENT_DEPRECATE_EOF) \
    | Capabilities.CLIENT_TRANSACTIONS

#: The MySQL listener's port unless told otherwise (Vitess's vtgate default).
DEFAULT_MYSQL_PORT = 15306


@dataclass(frozen=True)
class TlsConfig:
    """A certificate and key to offer TLS with; ``required``: refuse clients without it."""

    cert: str
    key: str
    required: bool = False

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgument(f"TLS certificate {self.cert} / key {self.key}: {exc}") from exc
        return ctx


def is_loopback(host: str) -> bool:
    """True for a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class MysqlListener(MysqlServer):
    """mysql-mimic's server with shardgate's connection, session and auth."""

    def __init__(self, gate: Gate, *, users: StaticUsers | None = None,
                 tls: TlsConfig | None = None,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.gate = gate
        self.connect_timeout_s = connect_timeout_s
        self.provider: UsersProvider | NoAuthProvider = (
            UsersProvider(users) if users is not None else NoAuthProvider())
        self.tls = tls
        #: the tasks serving open connections (cancelled by :meth:`stop`)
        self.tasks: set[asyncio.Task[Any]] = set()
        #: set by :meth:`stop`: a connection whose task starts later closes at once
        self.stopping = False
        super().__init__(identity_provider=self.provider, capabilities=CAPABILITIES,
                         ssl=tls.context() if tls is not None else None)

    async def stop(self) -> None:
        """Stop listening, close every open connection (their transactions roll back)."""
        self.close()
        self.stopping = True
        # A connection accepted just before close() starts its task after this point; it
        # sees ``stopping`` and closes itself. One that registered meanwhile is cancelled
        # in the next round: no transport outlives the listener (or its event loop).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while self.tasks and loop.time() < deadline:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.wait(list(self.tasks), timeout=deadline - loop.time())
        await self.wait_closed()

    def _session(self) -> GateSession:
        return GateSession(self.gate, self.provider.identity)

    async def _client_connected_cb(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.stopping:
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        stream = GateStream(reader, writer)
        connection = GateConnection(
            stream=stream, session=self._session(), control=self.control,
            server_capabilities=self.capabilities, identity_provider=self.identity_provider,
            ssl=self.ssl)
        connection.require_tls = self.tls is not None and self.tls.required
        connection.connect_timeout_s = self.connect_timeout_s
        try:
            connection.connection_id = await self.control.add(connection)
        except TooManyConnections:
            await stream.write(connection.error(msg="Too many connections",
                                                code=TOO_MANY_CONNECTIONS.errno))
            writer.close()
            return
        try:
            await connection.start()
        except (ConnectionError, asyncio.IncompleteReadError, EOFError) as exc:
            log.info("mysql connection %s closed: %s", connection.connection_id, exc)
        except asyncio.CancelledError:  # the listener stops: end quietly
            log.info("mysql connection %s closed by the listener", connection.connection_id)
        except Exception:
            log.warning("mysql connection %s failed", connection.connection_id, exc_info=True)
        finally:
            writer.close()
            await self.control.remove(connection.connection_id)


async def serve_mysql(
    gate: Gate,
    host: str = "127.0.0.1",
    port: int = DEFAULT_MYSQL_PORT,
    *,
    users: StaticUsers | None = None,
    tls: TlsConfig | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    **kwargs: Any,
) -> tuple[MysqlListener, int]:
    """Start the MySQL listener on ``host:port`` (0: a free port); the listener and its port.

    Without ``users`` only a loopback ``host`` is allowed (``FAILED_PRECONDITION``
    otherwise). The caller stops it: ``await listener.stop()``.
    """
    if users is None and not is_loopback(host):
        raise FailedPrecondition(
            f"the MySQL listener on {host} would accept anyone: give it a users file "
            "(--users-file) or listen on a loopback address")
    if tls is not None and tls.required and not tls.cert:
        raise InvalidArgument("requiring TLS needs --mysql-tls-cert and --mysql-tls-key")
    listener = MysqlListener(gate, users=users, tls=tls, connect_timeout_s=connect_timeout_s)
    try:
        await listener.start_server(host=host, port=port, **kwargs)
    except OSError as exc:
        raise Unavailable(
            f"cannot listen for MySQL clients on {host}:{port}: {exc.strerror or exc}; "
            "another process holds the port: stop it or pass --mysql-port N (0: off)") from None
    bound = int(listener.sockets()[0].getsockname()[1])
    return listener, bound
