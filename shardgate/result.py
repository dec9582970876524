"""The result of one statement, as every layer (backend, tablet, gate, client) returns it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardgate.event_token import EventToken

Row = tuple[Any, ...]


@dataclass(frozen=True)
class ExecuteOptions:
    """Per-statement options (the Update Stream design's execute options).

    ``include_event_token``: return, in ``Result.event_token``, the shard's last
    seen event token, read just before the query ran (the data read is at least
    as fresh as it). ``compare_event_token``: set ``Result.fresher`` to whether
    the data read is known to be at least as fresh as this token.
    """

    include_event_token: bool = False
    compare_event_token: EventToken | None = None


@dataclass
class Result:
    """Column names, rows, and the counts a write reports.

    ``insert_id`` is the first auto-increment value a write generated (sequence
    values for sharded tables), or None.
    """

    fields: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    rows_affected: int = 0
    insert_id: int | None = None
    #: with ``include_event_token``: the token the data read is at least as fresh as
    #: (None when the statement reached more than one shard).
    event_token: EventToken | None = None
    #: with ``compare_event_token``: True when the data read is known to be at least as
    #: fresh as the given token (on every shard the statement reached).
    fresher: bool | None = None

    @classmethod
    def of_rows(cls, fields: Sequence[str], rows: Sequence[Row]) -> Result:
        return cls(fields=list(fields), rows=list(rows))
