"""The result of one statement, as every layer (backend, tablet, gate, client) returns it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardgate.errors import ResourceExhausted
from shardgate.event_token import EventToken

Row = tuple[Any, ...]

#: Default largest result ``Execute`` returns whole (rows, estimated bytes).
DEFAULT_MAX_RESULT_ROWS = 500_000
DEFAULT_MAX_RESULT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ResultLimits:
    """The largest result a statement may build in memory (0: no limit).

    Enforced while rows arrive from the database (every backend reads big
    results in chunks when limits are given), so a result that is too large
    fails after about ``max_rows`` rows, not after all of them were loaded.
    Bytes are estimated: the length of strings and bytes, 8 for other values.
    """

    max_rows: int = DEFAULT_MAX_RESULT_ROWS
    max_bytes: int = DEFAULT_MAX_RESULT_BYTES

    @property
    def active(self) -> bool:
        """Whether any limit is set (else results are read the plain way)."""
        return bool(self.max_rows or self.max_bytes)

    def check(self, rows: int, size: int, where: str) -> None:
        """Raise RESOURCE_EXHAUSTED if ``rows`` rows of ``size`` bytes exceed a limit."""
        if self.max_rows and rows > self.max_rows:
            what = f"more than {self.max_rows} rows"
        elif self.max_bytes and size > self.max_bytes:
            what = f"more than {self.max_bytes} bytes"
        else:
            return
        raise ResourceExhausted(
            f"the result from {where} has {what} (the result limit of Execute); read it "
            "with StreamExecute (stream_execute), which sends it in chunks with bounded "
            "memory, or narrow the query (WHERE, LIMIT)"
        )


def rows_size(rows: Sequence[Row]) -> int:
    """Estimated bytes of ``rows``: string and bytes lengths, 8 for any other value."""
    size = 0
    for row in rows:
        for v in row:
            size += len(v) if isinstance(v, str | bytes | bytearray) else 8
    return size


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

    ``insert_id`` is the first auto-increment value a write generated, or None: for
    a sharded table only a value the gate drew from the table's sequence (a table
    without ``auto_increment`` has none), for an unsharded keyspace its database's.
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


@dataclass(slots=True)
class WireResult:
    """A MySQL-family shard's answer to a read as the MySQL text protocol carries it.

    ``columns`` are the payloads of its column definition packets (the shard's
    own types, flags and character sets; their schema is the shard database's
    name), ``rows`` those of its row packets, in order. Made for a client
    speaking the MySQL protocol, which takes them as they are (the gate's MySQL
    listener); ``size`` is the bytes of the rows (for the result limits).
    """

    columns: list[bytes]
    rows: list[bytes]
    size: int = 0
