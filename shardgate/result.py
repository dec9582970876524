"""The result of one statement, as every layer (backend, tablet, gate, client) returns it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Row = tuple[Any, ...]


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

    @classmethod
    def of_rows(cls, fields: Sequence[str], rows: Sequence[Row]) -> Result:
        return cls(fields=list(fields), rows=list(rows))
