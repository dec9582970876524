"""The statements the gate answers itself: session control and ``SHOW VITESS_*``.

``BEGIN`` / ``COMMIT`` / ``ROLLBACK`` and savepoints go to the session's
:class:`~shardgate.gate.transactions.Transactions`; ``USE``, ``SET
transaction_mode`` and ``SET query_timeout_ms`` change the session (``USE``
was resolved against the topology when it was planned); ``SHOW
VITESS_SHARDS / TABLETS / KEYSPACES`` and ``SHOW SHARDGATE_WORKER`` are
answered from the served topology and this process.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardgate.errors import FailedPrecondition, Internal
from shardgate.gate import worker
from shardgate.gate.session import Session
from shardgate.gate.transactions import Transactions
from shardgate.result import Result
from shardgate.sql.statements import (
    Begin,
    Commit,
    GateStatement,
    ReleaseSavepoint,
    Rollback,
    RollbackToSavepoint,
    Savepoint,
    SetQueryTimeout,
    SetTransactionMode,
    ShowShardgateWorker,
    ShowVitessKeyspaces,
    ShowVitessShards,
    ShowVitessTablets,
    TabletType,
    Use,
    like_match,
)
from shardgate.topo.model import Topology


async def control(tx: Transactions, topology: Topology, session: Session,
                  stmt: GateStatement) -> Result:
    """Run ``stmt``, a statement the gate answers itself, in ``session``."""
    match stmt:
        case Begin():
            await tx.begin(session)
        case Commit():
            await tx.commit(session)
        case Rollback():
            await tx.rollback(session)
        case Use(keyspace=keyspace, shard=shard, tablet_type=tablet_type):
            session.keyspace, session.target = keyspace, shard
            session.tablet_type = tablet_type or TabletType.PRIMARY
        case SetTransactionMode(mode=mode):
            if session.shard_txs:
                raise FailedPrecondition(
                    "SET transaction_mode inside a transaction: commit or roll back first"
                )
            session.transaction_mode = mode
        case SetQueryTimeout(ms=ms):
            session.query_timeout_ms = ms
        case Savepoint() | RollbackToSavepoint() | ReleaseSavepoint():
            return await tx.savepoint(session, stmt)
        case ShowVitessShards(like=like):
            shards = [f"{ks.name}/{shard.name}" for ks in topology.keyspaces.values()
                      for shard in ks.shards]
            return Result.of_rows(["Shards"], [(n,) for n in _like(shards, like)])
        case ShowVitessTablets(like=like):
            rows = [("local", ks.name, shard.name, "PRIMARY", "SERVING",
                     f"local-{ks.name}-{shard.name}", "localhost", "")
                    for ks in topology.keyspaces.values() for shard in ks.shards]
            return Result.of_rows(
                ["Cell", "Keyspace", "Shard", "TabletType", "State", "Alias", "Hostname",
                 "PrimaryTermStartTime"],
                [r for r in rows if like is None or like_match(r[5], like)])
        case ShowVitessKeyspaces(like=like):
            names = sorted(topology.keyspaces)
            return Result.of_rows(["Database"], [(n,) for n in _like(names, like)])
        case ShowShardgateWorker():
            me = worker.current()
            return Result.of_rows(["Worker", "Workers", "Pid"],
                                  [(me.index, me.count, me.pid)])
        case _:
            raise Internal(f"the gate cannot run {stmt.query_type} statements here")
    return Result()


def _like(names: Sequence[str], pattern: str | None) -> list[str]:
    """``names`` matching a MySQL LIKE ``pattern`` (``%``, ``_``; case-insensitive)."""
    if pattern is None:
        return list(names)
    return [n for n in names if like_match(n, pattern)]
