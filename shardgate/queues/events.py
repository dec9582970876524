"""What receivers get: fired events in batches, each carrying what routes its ack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Columns every queue table has, in this order, before the user's columns.
MANDATORY_COLUMNS = (
    "id", "time_scheduled", "time_next", "epoch", "state", "time_acked", "priority",
)
#: The columns a receiver gets before the user's columns.
EVENT_COLUMNS = ("id", "priority", "time_scheduled", "epoch")

TO_BE_FIRED = "to_be_fired"
FIRED = "fired"
ACKED = "acked"
FAILED = "failed"
STATES = (TO_BE_FIRED, FIRED, ACKED, FAILED)


@dataclass(slots=True)
class QueueEvent:
    """One fired event as a receiver sees it.

    ``shard`` names the shard that holds it: the gate routes the ack there
    without a scatter. ``epoch`` is how many times it has been fired,
    including this time; ``values`` are the user's columns in ``fields`` order.
    """

    id: int
    shard: str
    epoch: int
    time_scheduled: int
    priority: int
    values: tuple[Any, ...] = ()


@dataclass(slots=True)
class QueueBatch:
    """A batch of events of one queue; ``fields`` names the user's columns."""

    keyspace: str
    queue: str
    fields: list[str] = field(default_factory=list)
    events: list[QueueEvent] = field(default_factory=list)
