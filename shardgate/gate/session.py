"""Client sessions: default keyspace and the open transaction's per-shard ids.

Invariants: ``shard_txs`` is empty whenever ``in_transaction`` is False; a
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
