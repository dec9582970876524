"""The gate's session table: lookup by id and owner, and the reaper.

Invariants:

* every session a client can name by id (``addressable``: made for a
  transport) is in ``_by_id`` until closed or idle; a lookup whose owner
  differs from the session's, or of a session that is not addressable,
  answers ``NOT_FOUND`` exactly like an unknown id (an id is useless to
  anyone but its owner);
* an in-process session (not addressable) is in ``_by_id`` only while its
  transaction holds a shard, so the reaper can time it out; sessions made
  per call (queue stores, caches) never pile up;
* the reaper runs while sessions exist and only touches sessions that are not
  ``busy`` and whose lock is free: it ends explicit transactions older than
  the transaction timeout (``end_transaction``, which rolls them back and
  marks the session) and forgets sessions idle longer than the idle timeout
  (rolling back what they still hold), so abandoned sessions never pile up
  and never keep shard connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from shardgate.aio import cancel_and_wait
from shardgate.auth.identity import Caller, Identity, Trusted
from shardgate.errors import Aborted, NotFound
from shardgate.gate import twopc
from shardgate.gate.limits import GateLimits
from shardgate.gate.session import Session
from shardgate.sql.statements import Rollback
from shardgate.topo.model import Topology

log = logging.getLogger(__name__)

#: ends a session's transaction, with the reason to report on its next statement
EndTransaction = Callable[[Session, str], Awaitable[None]]


class SessionTable:
    """Sessions by id, with their timeouts enforced by one reaper task."""

    def __init__(self, limits: GateLimits, end_transaction: EndTransaction) -> None:
        self.limits = limits
        self._end_transaction = end_transaction
        self._by_id: dict[int, Session] = {}
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._by_id)

    def open(
        self,
        topology: Topology,
        keyspace: str | None,
        *,
        identity: Caller,
        transaction_mode: str,
        owner: str | None,
        addressable: bool,
    ) -> Session:
        """A new session whose unqualified tables resolve in ``keyspace`` (None: the
        ``topology``'s default keyspace; NOT_FOUND if it has no such keyspace).

        ``identity`` (required, no default) is who its statements are authorized
        for: the :class:`~shardgate.auth.identity.Identity` a front door
        authenticated, or :data:`~shardgate.auth.identity.TRUSTED` for the gate's
        own work and in-process code (statement rules apply, table ACLs do not;
        see :mod:`shardgate.auth.guard`). Front doors never pass TRUSTED.
        ``transaction_mode`` is ``"best_effort"`` or ``"twopc"`` (see
        :mod:`shardgate.gate.twopc`); ``SET transaction_mode = '...'`` changes it.
        ``addressable`` (transports, an Identity only) puts the session in the table,
        found by id with :meth:`find` by the same ``owner`` (the caller's identity)
        only, until it is closed or idles past the idle timeout. Any session is in
        the table while its transaction holds a shard, so the transaction timeout
        applies to in-process sessions too.
        """
        if not isinstance(identity, Identity | Trusted):
            raise TypeError(f"Gate.session(identity=...) takes the caller's Identity or "
                            f"TRUSTED (in-process code), not {identity!r}")
        if addressable and not isinstance(identity, Identity):
            raise TypeError("an addressable (transport) session needs the caller's Identity")
        ks = keyspace if keyspace is not None else topology.default_keyspace
        if ks is not None and ks not in topology.keyspaces:
            raise NotFound(
                f"keyspace {ks!r} does not exist; keyspaces: {sorted(topology.keyspaces)}"
            )
        session = Session(keyspace=ks, transaction_mode=twopc.check_mode(transaction_mode),
                          identity=identity, owner=owner, addressable=addressable)
        if addressable:
            self.add(session)
        return session

    def add(self, session: Session) -> None:
        """Register ``session`` (again); starts the reaper when a loop runs."""
        self._by_id[session.id] = session
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: started on a later add
            return
        reaper = self._reaper
        if reaper is None or reaper.done() or reaper.get_loop() is not loop:
            self._reaper = loop.create_task(self._reap(), name="sg-gate-session-reaper")

    def discard(self, session: Session) -> None:
        """Take ``session`` out of the table (nothing if it is not there)."""
        if self._by_id.get(session.id) is session:
            del self._by_id[session.id]

    def find(self, session_id: int, owner: str | None) -> Session:
        """The session ``session_id`` of ``owner``, or NOT_FOUND."""
        found = self._by_id.get(session_id)
        if found is None or not found.addressable or found.owner != owner:
            raise NotFound(f"session {session_id} expired, start a new one "
                           "(send session_id 0)")
        return found

    def pop(self, session_id: int, owner: str | None) -> Session | None:
        """Forget the session ``session_id`` of ``owner``; None if there is none."""
        found = self._by_id.get(session_id)
        if found is None or not found.addressable or found.owner != owner:
            return None
        del self._by_id[session_id]
        return found

    @contextlib.contextmanager
    def using(self, session: Session) -> Iterator[None]:
        """Mark ``session`` busy for one call (the reaper leaves it alone), then used: in
        the table while its transaction holds a shard, else only if addressable."""
        session.busy += 1
        try:
            yield
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()
            if session.shard_txs and session.internal is None:
                self.add(session)  # the transaction timeout watches it
            elif not session.addressable:
                self.discard(session)

    async def check_ended(self, session: Session, statement: object) -> None:
        """Report (once: ``ABORTED``) a transaction the gate ended on its own, unless
        ``statement`` is a ROLLBACK; end an overdue one first."""
        if session.ended is None and self.transaction_expired(session, time.monotonic()):
            await self._end_transaction(
                session, "the transaction ran longer than the transaction timeout "
                f"({self.limits.transaction_timeout_s:g}s)")
        if session.ended is not None:
            reason, session.ended = session.ended, None
            if not isinstance(statement, Rollback):
                raise Aborted(reason)

    def open_transactions(self) -> int:
        """How many sessions of the table have a transaction open."""
        return sum(1 for s in self._by_id.values() if s.in_transaction)

    async def end_transactions(self, reason: str) -> int:
        """End every open transaction of the table (a draining gate's timeout passed):
        each once the statement in flight on its session (if any) is answered; the
        session's next statement but ROLLBACK fails ``ABORTED`` with ``reason``. How
        many were ended."""
        ended = 0
        for session in list(self._by_id.values()):
            if not session.in_transaction:
                continue
            async with session.lock:
                if session.in_transaction:
                    await self._end_transaction(session, reason)
                    ended += 1
        return ended

    def transaction_expired(self, session: Session, now: float) -> bool:
        timeout = self.limits.transaction_timeout_s
        return (timeout is not None and session.in_transaction
                and session.tx_started is not None and now - session.tx_started > timeout)

    def _period(self) -> float:
        timeouts = [t for t in (self.limits.transaction_timeout_s,
                                self.limits.session_idle_timeout_s) if t is not None]
        return min(max(min(timeouts, default=1.0) / 8, 0.05), 1.0)

    async def _reap(self) -> None:
        period = self._period()
        idle = self.limits.session_idle_timeout_s
        while self._by_id:
            await asyncio.sleep(period)
            for session in list(self._by_id.values()):
                if session.busy or session.lock.locked():
                    continue
                now = time.monotonic()
                try:
                    if self.transaction_expired(session, now):
                        await self._end(session, "the transaction ran longer than the "
                                        f"transaction timeout "
                                        f"({self.limits.transaction_timeout_s:g}s)")
                    elif idle is not None and now - session.last_used > idle:
                        self.discard(session)
                        if session.in_transaction:
                            await self._end(session, f"the session idled longer than {idle:g}s")
                    if not session.addressable and not session.shard_txs:
                        self.discard(session)  # in-process: kept only while holding a shard
                except Exception:  # a reaper must outlive one bad rollback
                    log.exception("reaping session %d failed", session.id)

    async def _end(self, session: Session, reason: str) -> None:
        async with session.lock:
            if not session.busy and session.in_transaction:
                await self._end_transaction(session, reason)

    async def close(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.get_loop() is asyncio.get_running_loop():
            await cancel_and_wait([reaper])  # (one of a finished loop ended with it)
