"""Client sessions: default keyspace and the open transaction's per-shard ids.

Invariants: ``shard_txs``, ``dtid`` and ``xids`` are empty whenever
``in_transaction`` is False; a
shard joins the transaction the first time a statement reaches it, and every
shard in ``shard_txs`` is committed or rolled back together at the end.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

_ids = itertools.count(1)


@dataclass
class Session:
    """One client's state at the gate."""

    keyspace: str | None = None
    in_transaction: bool = False
    #: (keyspace, shard) -> tablet transaction id, in the order shards joined
    shard_txs: dict[tuple[str, str], int] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_ids))
    #: True while the gate runs an implicit transaction for one statement
    implicit: bool = False
    #: user savepoints of the open transaction, oldest first
    savepoints: list[str] = field(default_factory=list)
    #: a shard of ``keyspace`` every statement goes to, unrouted (``USE `ks:-80```)
    target: str | None = None
    #: which tablets serve the session's reads outside transactions (``USE ks@replica``)
    tablet_type: str = "primary"
    #: shard calls made for this session so far (statistics read the difference)
    shard_calls: int = 0

    @property
    def plan_key(self) -> str | None:
        """The plan cache's second key: the default keyspace, and the target if any."""
        if self.target is None:
            return self.keyspace
        return f"{self.keyspace}:{self.target}"
    #: "best_effort" (default) or "twopc": how COMMIT ends a multi-shard transaction
    transaction_mode: str = "best_effort"
    #: twopc mode: the open transaction's distributed id (names its coordinator
    #: shard) and each participant's xid; reset with ``shard_txs``
    dtid: str | None = None
    xids: dict[tuple[str, str], str] = field(default_factory=dict)
    #: set on the gate's own sessions (lookup vindex queries run apart): what
    #: their SQL is for, so a failure names the gate's query, not the user's
    internal: str | None = None
