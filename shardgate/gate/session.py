"""Client sessions: default keyspace and the open transaction's per-shard ids.

Invariants: ``shard_txs``, ``dtid`` and ``xids`` are empty whenever
``in_transaction`` is False; a
shard joins the transaction the first time a statement reaches it, and every
shard in ``shard_txs`` is committed or rolled back together at the end.

Session ids are random non-zero 64-bit numbers (the wire type is ``uint64``):
not guessable, and never meaningful on their own, since the gate also checks
the session's ``owner`` (see :meth:`shardgate.gate.Gate.find_session`).

``tx_started`` is set from the moment a transaction holds a shard and
``busy`` while a call runs on the session; the gate's reaper
(:mod:`shardgate.gate.limits`) never touches a busy session. ``ended`` is set
when the gate ended the session's transaction on its own (timeout): the next
statement other than ROLLBACK fails with that reason, once, so a client never
mistakes the statements after it for part of the rolled-back transaction.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

from shardgate.auth.identity import Caller
from shardgate.planner.target import session_key
from shardgate.sql.statements import TabletType


def new_session_id() -> int:
    """A random, non-zero, 64-bit session id."""
    while True:
        value = secrets.randbits(64)
        if value:
            return value


@dataclass
class Session:
    """One client's state at the gate."""

    keyspace: str | None = None
    in_transaction: bool = False
    #: (keyspace, shard) -> tablet transaction id, in the order shards joined
    shard_txs: dict[tuple[str, str], int] = field(default_factory=dict)
    id: int = field(default_factory=new_session_id)
    #: True while the gate runs an implicit transaction for one statement
    implicit: bool = False
    #: user savepoints of the open transaction, oldest first
    savepoints: list[str] = field(default_factory=list)
    #: a shard of ``keyspace`` every statement goes to, unrouted (``USE `ks:-80```)
    target: str | None = None
    #: which tablets serve the session's reads outside transactions (``USE ks@replica``)
    tablet_type: TabletType = TabletType.PRIMARY
    #: shard calls made for this session so far (statistics read the difference)
    shard_calls: int = 0

    @property
    def plan_key(self) -> str | None:
        """The plan cache's second key: the default keyspace, and the target if any
        (``ks:shard``; :func:`~shardgate.planner.target.session_target` reads it back)."""
        if self.target is None:  # (inline: every statement asks)
            return self.keyspace
        return session_key(self.keyspace, self.target)
    #: "best_effort" (default) or "twopc": how COMMIT ends a multi-shard transaction
    transaction_mode: str = "best_effort"
    #: twopc mode: the open transaction's distributed id (names its coordinator
    #: shard) and each participant's xid; reset with ``shard_txs``
    dtid: str | None = None
    xids: dict[tuple[str, str], str] = field(default_factory=dict)
    #: set on the gate's own sessions (lookup vindex queries run apart): what
    #: their SQL is for, so a failure names the gate's query, not the user's
    internal: str | None = None
    #: who runs this session's statements (ACLs are checked against it): the
    #: transport's authenticated caller, or TRUSTED (the gate's own work and
    #: in-process callers); required, so no session is trusted by omission
    identity: Caller = field(kw_only=True)
    #: who may use this session by id (the authenticated user; None: anonymous)
    owner: str | None = None
    #: found by id (a transport's session): kept in the gate's table until closed
    #: or idle; other sessions are in the table only while they hold a shard
    addressable: bool = False
    #: ``SET query_timeout_ms``: this session's statement timeout (None: the gate's)
    query_timeout_ms: int | None = None
    #: monotonic time the last call on this session ended
    last_used: float = field(default_factory=time.monotonic)
    #: monotonic time the open transaction first held a shard (None: it holds none)
    tx_started: float | None = None
    #: calls running on the session now (the reaper skips busy sessions)
    busy: int = 0
    #: why the gate ended this session's transaction on its own, until reported
    ended: str | None = None
    #: serialises the calls of one remote client on this session (transports take it)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)
