"""A session's transactions at the gate: begin, commit, rollback, savepoints.

As Vitess's ``tx_conn``: BEGIN opens a session transaction that shards join
lazily (:meth:`~shardgate.gate.cursor.SessionCursor.join`). COMMIT commits
the shards one after the other, in the order they joined (best effort: if a
later shard fails after an earlier one committed, the error says which
committed; a shard lost after COMMIT was sent gives ``CommitOutcomeUnknown``,
never "nothing was committed"), or through two-phase commit
(:mod:`shardgate.gate.twopc`) in that mode. A statement that fails inside a
transaction leaves nothing: a write runs under a statement savepoint on the
shards already in the transaction (shards it made join are rolled back whole
and leave), and a failed read rolls the whole transaction back and says so.
Outside a transaction, a write that may reach more than one shard
(multi-shard DML, multi-row insert, inserts maintaining lookup vindexes) runs
in an implicit transaction (:meth:`Transactions.run`).

Invariants: after :meth:`Transactions.commit` or :meth:`Transactions.rollback`
the session holds no shard (``shard_txs``, ``savepoints``, the twopc ids
empty; ``in_transaction`` and ``implicit`` False), whatever the shards
answered; user savepoints are sent to every shard in the transaction and
replayed on a shard that joins later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from shardgate.engine.dml import LookupDML
from shardgate.engine.insert import Insert
from shardgate.engine.insert_select import InsertSelect
from shardgate.engine.primitive import Primitive
from shardgate.engine.route import Route
from shardgate.engine.scalar import ScalarSubqueries
from shardgate.errors import (
    COMMIT_OUTCOME_UNKNOWN,
    Aborted,
    CommitOutcomeUnknown,
    FailedPrecondition,
    Internal,
    NotFound,
    ShardgateError,
)
from shardgate.gate import cutover, twopc
from shardgate.gate.create_select import CreateTableAsSelect
from shardgate.gate.cursor import CursorGate, SessionCursor
from shardgate.gate.failures import (
    execute,
    internal_failure,
    outcome_unknown,
    quiet_rollback,
    unexpected,
    with_note,
)
from shardgate.gate.session import Session
from shardgate.keys import ShardId
from shardgate.result import Result
from shardgate.sql.statements import ReleaseSavepoint, RollbackToSavepoint, Savepoint

_SAVEPOINT_VERBS = {Savepoint: "SAVEPOINT", RollbackToSavepoint: "ROLLBACK TO",
                   ReleaseSavepoint: "RELEASE SAVEPOINT"}


class TransactionGate(CursorGate, Protocol):
    """What :class:`Transactions` needs of the gate: the cursors' needs, and where
    statements held across a reshard's cut-over wait."""

    @property
    def hold(self) -> cutover.Hold: ...


class Transactions:
    """Begins, ends and guards the transactions of the gate's sessions (see the module)."""

    def __init__(self, gate: TransactionGate) -> None:
        self._gate = gate

    async def begin(self, session: Session) -> None:
        """Open a transaction; an open one is committed first (MySQL's BEGIN)."""
        if session.in_transaction:
            await self.commit(session)
        session.in_transaction = True

    async def commit(self, session: Session) -> None:
        """Commit every shard of the session's transaction, in the order they joined."""
        tablets = self._gate.tablets
        txs = list(session.shard_txs.items())
        xids, dtid = twopc.take(session)
        session.shard_txs = {}
        session.in_transaction = session.implicit = False
        session.savepoints = []
        session.tx_started = None
        if session.transaction_mode == twopc.TWOPC and len(txs) > 1:
            await twopc.commit(tablets, txs, xids, dtid)
            return
        done: list[str] = []
        for i, ((ks, shard), tid) in enumerate(txs):
            try:
                await tablets[(ks, shard)].commit(tid)
            except ShardgateError as exc:
                rest = txs[i + 1 :]
                for (rks, rshard), rtid in rest:
                    await quiet_rollback(tablets[(rks, rshard)], rtid)
                if outcome_unknown(exc):
                    raise CommitOutcomeUnknown(
                        f"{COMMIT_OUTCOME_UNKNOWN} on shard {ks}/{shard}: the shard was lost "
                        f"after COMMIT was sent ({exc.message}); it may or may not have "
                        f"committed. Committed before it: {done or 'none'}; rolled back: "
                        f"{[f'{k}/{s}' for (k, s), _ in rest] or 'none'}. Read the rows back "
                        "before retrying (see docs/operations.md, commit outcome unknown)"
                    ) from exc
                if not done:
                    raise Aborted(
                        f"commit failed on {ks}/{shard}: {exc.message}; "
                        "nothing was committed, retry the transaction"
                    ) from exc
                raise Internal(
                    f"commit failed on {ks}/{shard} after {done} committed: {exc.message}; "
                    f"{[f'{k}/{s}' for (k, s), _ in rest]} were rolled back. "
                    "Use the two-phase commit mode for atomic multi-shard commits"
                ) from exc
            done.append(str(ShardId(ks, shard)))

    async def rollback(self, session: Session) -> None:
        """Roll back every shard of the session's transaction (lost shards ignored)."""
        txs = list(session.shard_txs.items())
        twopc.take(session)
        session.shard_txs = {}
        session.in_transaction = session.implicit = False
        session.savepoints = []
        session.tx_started = None
        for (ks, shard), tid in txs:
            await quiet_rollback(self._gate.tablets[(ks, shard)], tid)

    async def expire(self, session: Session, reason: str) -> None:
        """End ``session``'s transaction on the gate's own initiative (a timeout): its
        next statement other than ROLLBACK fails with ``reason``, once."""
        session.ended = (f"the gate rolled back this session's transaction: {reason}; "
                         "nothing of it was committed, start it again")
        await self.rollback(session)

    async def resolve(self, grace_s: float) -> twopc.ResolveReport:
        """Commit or roll back the two-phase commits a dead gate left prepared."""
        return await twopc.resolve(self._gate.tablets, grace_s=grace_s)

    async def run(self, session: Session, prim: Primitive, bv: Mapping[str, Any],
                  cursor: SessionCursor) -> Result:
        """Execute a planned statement (not a point read outside a transaction: the
        gate runs those itself) with the session's transaction rules."""
        if isinstance(prim, CreateTableAsSelect):
            # Select and create, then insert the rows as a statement of its own (its
            # transaction rules); a failed insert is undone, then the table dropped.
            insert = await prim.create(cursor, bv)
            if insert is None:
                return Result()
            try:
                return await self.run(session, insert, bv, SessionCursor(self._gate, session))
            except ShardgateError:
                await prim.undo(SessionCursor(self._gate, session), bv)
                raise
        cursor.reads = not session.in_transaction and not writes(prim)
        if session.in_transaction and not session.implicit:
            if writes(prim):
                return await self._statement_savepoint(session, prim, bv)
            try:
                return await execute(prim, cursor, bv)
            except ShardgateError as exc:
                # A failed read may have aborted a shard's transaction (PostgreSQL).
                await self.rollback(session)
                raise with_note(exc, "the transaction was rolled back") from exc
        if session.in_transaction:  # an implicit transaction: its owner handles errors
            return await execute(prim, cursor, bv)
        if _one_statement_insert(prim):
            # Rows of one shard go in one autocommit statement (atomic by itself, no
            # BEGIN/COMMIT); rows of several shards open the implicit transaction
            # when they reach the shards (SessionCursor._each).
            cursor.may_open_implicit = True
            try:
                result = await execute(prim, cursor, bv)
            except BaseException:
                if session.in_transaction:
                    await self.rollback(session)
                raise
            if session.in_transaction:
                await self.commit(session)
            return result
        if _needs_implicit_tx(prim):
            session.in_transaction = session.implicit = True
            try:
                result = await execute(prim, cursor, bv)
            except BaseException:
                await self.rollback(session)
                raise
            await self.commit(session)
            return result
        try:  # (inline: the common path, a statement on its own)
            return await prim.execute(cursor, bv)
        except ShardgateError:
            raise
        except Exception as exc:
            raise unexpected(exc) from exc

    async def _statement_savepoint(
        self, session: Session, prim: Primitive, bind_vars: Mapping[str, Any]
    ) -> Result:
        """Run a write in an open transaction so that, if it fails, it leaves nothing.

        Shards already in the transaction get ``SAVEPOINT`` first and
        ``ROLLBACK TO`` on failure; shards that joined during the statement are
        rolled back whole and leave the transaction. The transaction stays open.
        """
        before = list(session.shard_txs.items())
        await self._broadcast(before, "SAVEPOINT sg_stmt")
        try:
            result = await execute(prim, SessionCursor(self._gate, session), bind_vars)
        except ShardgateError as exc:
            joined = [k for k in session.shard_txs if k not in dict(before)]
            for key in joined:
                await quiet_rollback(self._gate.tablets[key], session.shard_txs.pop(key))
            try:
                await self._broadcast(before, "ROLLBACK TO SAVEPOINT sg_stmt")
            except ShardgateError:
                await self.rollback(session)
                raise with_note(exc, "the transaction was rolled back") from exc
            raise with_note(exc, "the statement was undone; the transaction is still open") \
                from exc
        await self._broadcast(before, "RELEASE SAVEPOINT sg_stmt")
        return result

    async def _broadcast(self, txs: list[tuple[tuple[str, str], int]], sql: str) -> None:
        """Run the gate's own ``sql`` (savepoints) in each transaction of ``txs``."""
        if txs:
            await asyncio.gather(*(self._internal(k, tid, sql) for k, tid in txs))

    async def _internal(self, key: tuple[str, str], tid: int, sql: str) -> None:
        try:
            await self._gate.tablets[key].execute(sql, [], tid)
        except ShardgateError as exc:
            raise internal_failure(exc, f"{key[0]}/{key[1]}", sql) from exc

    async def savepoint(
        self, session: Session, stmt: Savepoint | RollbackToSavepoint | ReleaseSavepoint
    ) -> Result:
        """User savepoints: sent to every shard in the transaction and replayed on joiners."""
        name = stmt.name
        if not session.in_transaction:
            raise FailedPrecondition(
                f"{_SAVEPOINT_VERBS[type(stmt)]} {name} needs an open transaction (BEGIN)"
            )
        ident = f"sgu_{name}"
        txs = list(session.shard_txs.items())
        if isinstance(stmt, Savepoint):
            await self._broadcast(txs, f"SAVEPOINT {ident}")
            session.savepoints.append(name)
        else:
            if name not in session.savepoints:
                raise NotFound(f"savepoint {name} does not exist in this transaction")
            rollback_to = isinstance(stmt, RollbackToSavepoint)
            sql = "ROLLBACK TO SAVEPOINT " if rollback_to else "RELEASE SAVEPOINT "
            await self._broadcast(txs, sql + ident)
            keep = session.savepoints.index(name) + (1 if rollback_to else 0)
            session.savepoints = session.savepoints[:keep]
        return Result()

    async def execute_batch(
        self,
        session: Session,
        statements: Sequence[tuple[str, Mapping[str, Any] | None]],
        as_transaction: bool,
    ) -> list[Result | ShardgateError]:
        """Run several statements; each gets its result or its error (ExecuteBatch).

        With ``as_transaction`` they run in one transaction (opened and
        committed here unless the session already has one): the first error
        rolls it back, and the statements after it are not run (they get
        ``ABORTED``). Across a reshard's write cut-over a statement outside a
        transaction is held like ``Gate.execute`` holds it, and a transaction
        the batch opened itself is rolled back, held and replayed whole; in
        the caller's transaction the refused statement gets ``ABORTED``.
        """
        own = as_transaction and not session.in_transaction
        held_until = time.monotonic() + cutover.HOLD_S
        while True:
            out = await self._batch_once(session, statements, as_transaction, own)
            # A transaction the batch opened itself and a reshard's cut-over aborted
            # changed nothing: it is held and replayed whole, as execute holds a
            # statement. In the caller's transaction the ABORTED result stays.
            frozen = next((r for r in out if isinstance(r, ShardgateError)
                           and cutover.writes_frozen(r)), None)
            if not own or frozen is None:
                return out
            if not await self._gate.hold.wait(held_until):
                return out

    async def _batch_once(
        self,
        session: Session,
        statements: Sequence[tuple[str, Mapping[str, Any] | None]],
        as_transaction: bool,
        own: bool,
    ) -> list[Result | ShardgateError]:
        out: list[Result | ShardgateError] = []
        if own:
            await self.begin(session)
        for i, (sql, bv) in enumerate(statements):
            try:
                out.append(await self._gate.execute(session, sql, bv))
            except ShardgateError as exc:
                out.append(exc)
                if as_transaction:
                    if session.in_transaction:
                        await self.rollback(session)
                    out.extend(Aborted(f"not run: statement {i + 1} of the batch failed")
                               for _ in statements[i + 1 :])
                    return out
        if own:
            await self.commit(session)
        return out


def writes(prim: object) -> bool:
    """Whether the planned statement ``prim`` may write (it is then held across a
    cut-over, run under a statement savepoint in a transaction, sent to primaries)."""
    if isinstance(prim, InsertSelect):
        return True
    if isinstance(prim, ScalarSubqueries):
        return writes(prim.outer)
    if isinstance(prim, Insert | LookupDML):
        return True
    return isinstance(prim, Route) and prim.write


def _one_statement_insert(prim: object) -> bool:
    """An INSERT whose only shard call is the insert itself (no lookup rows, no
    sequence, no secondary vindex checks, not a reference table)."""
    return (isinstance(prim, Insert) and len(prim.rows) > 1 and not prim.owned_lookups
            and not prim.broadcast and not prim.secondary and prim.auto_increment is None)


def _needs_implicit_tx(prim: object) -> bool:
    if isinstance(prim, InsertSelect):
        return True  # its SELECT and its rows' inserts, as one statement
    if isinstance(prim, ScalarSubqueries):
        return _needs_implicit_tx(prim.outer)
    if isinstance(prim, Insert):
        return len(prim.rows) > 1 or bool(prim.owned_lookups) or prim.broadcast
    if isinstance(prim, Route):
        return prim.write and prim.opcode.value in (
            "Scatter", "IN", "MultiEqual", "Equal", "Reference", "ByDestination")
    return isinstance(prim, LookupDML)
