"""The narrow interfaces the gate hands to the parts it composes.

The gate (:class:`shardgate.gate.Gate`) owns the queue router
(:mod:`shardgate.queues.router`), the change-stream merge
(:mod:`shardgate.streams.merge`) and serves the stores built on top of it
(:class:`~shardgate.queues.inbox.InboxStore`,
:class:`~shardgate.queues.segmented.SegmentedQueue`,
:class:`~shardgate.streams.cache.CachedReader`). Those live in lower layers and
must not import the gate, so they name what they need of it here, as
``typing.Protocol`` s the gate satisfies structurally:

* :class:`GateView` - the topology, the VSchema built from it and the tablet
  clients by ``(keyspace, shard)``; generic in what the caller needs of a
  tablet (:class:`SqlShard`, :class:`StreamShard`, the router's ``QueueShard``);
* :class:`SessionGate` - running SQL in gate sessions, inside transactions;
* :data:`TRUSTED` - the caller those sessions name (the gate's own work).

Sessions are the gate's own (:class:`shardgate.gate.Session`) and opaque here.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

if TYPE_CHECKING:  # annotations only: a client that names TRUSTED (through
    # shardgate.auth.identity) does not load the topology, VSchema and vindex modules
    from shardgate.backends.changes import LogItem
    from shardgate.result import ExecuteOptions, Result
    from shardgate.sql.dialects import Dialect
    from shardgate.topo.model import Topology
    from shardgate.vschema import VSchema


class Trusted(enum.Enum):
    """The gate's own work and trusted in-process code, as a session's caller.

    Statement rules (the deny-list) apply to it; table ACLs do not. Every
    session says who it runs for (:meth:`shardgate.gate.Gate.session` has no
    default): a front door passes the :class:`~shardgate.auth.identity.Identity`
    its transport
    authenticated, and only in-process code (workflows, the CLI's embedded
    commands, queue and stream helpers, the embedded DB-API driver) passes
    :data:`TRUSTED`. It lives here, below ``auth``, because the stores the gate
    composes (queues, streams) open sessions of their own with it;
    :mod:`shardgate.auth.identity` re-exports it. No module under ``shardgate/api/`` names it
    (``tests/unit/test_architecture.py`` holds that), so no transport can reach
    the gate on the trusted path.
    """

    TRUSTED = "trusted"

    def __repr__(self) -> str:
        return "TRUSTED"


#: The trusted caller (see :class:`Trusted`).
TRUSTED: Final = Trusted.TRUSTED


#: what the caller needs of one tablet client
T_co = TypeVar("T_co", covariant=True)


class GateView(Protocol[T_co]):
    """The cluster as the gate sees it: topology, VSchema and tablet clients."""

    @property
    def topology(self) -> Topology:
        """Keyspaces, shards and their databases."""
        ...

    @property
    def vschema(self) -> VSchema:
        """The VSchema built from :attr:`topology` (see :meth:`rebuild_vschema`)."""
        ...

    @property
    def tablets(self) -> Mapping[tuple[str, str], T_co]:
        """The tablet client of every ``(keyspace, shard)``."""
        ...

    def rebuild_vschema(self) -> None:
        """Rebuild :attr:`vschema` after a keyspace's VSchema changed (drops cached plans)."""
        ...


class SessionGate(Protocol):
    """Runs SQL in gate sessions, as the application does."""

    def session(self, keyspace: str | None = None, *, identity: Any) -> Any:
        """A new session whose unqualified tables resolve in ``keyspace``, for
        ``identity`` (the parts composed here pass :data:`TRUSTED`: the gate's work)."""
        ...

    async def execute(
        self,
        session: Any,
        sql: str,
        bind_vars: Mapping[str, Any] | None = None,
        *,
        options: ExecuteOptions | None = None,
    ) -> Result:
        """Run one statement in ``session``."""
        ...

    async def begin(self, session: Any) -> None:
        """Open a transaction in ``session``."""
        ...

    async def commit(self, session: Any) -> None:
        """Commit the transaction of ``session``."""
        ...

    async def rollback(self, session: Any) -> None:
        """Roll back the transaction of ``session``."""
        ...


class SqlShard(Protocol):
    """A tablet client that runs SQL on its shard outside any gate session."""

    @property
    def dialect(self) -> Dialect:
        """The shard database's SQL dialect (``sqlite``, ``postgres``, ``mysql``)."""
        ...

    async def execute(self, sql: str, params: Sequence[Any]) -> Result:
        """Run ``sql`` with positional ``params`` on the shard, outside any transaction."""
        ...


class StreamShard(Protocol):
    """A tablet client that serves its shard's change stream."""

    def update_stream(
        self,
        *,
        position: str | None = None,
        timestamp: float | None = None,
        heartbeat_s: float | None = None,
    ) -> AsyncIterator[LogItem]:
        """The shard's change stream from ``position`` or ``timestamp`` (default: now)."""
        ...
