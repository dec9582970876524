"""The copy's batch placement (``shardgate.workflows.placing``) answers as the row-by-row
:meth:`MovingTable.owners` does, on its bulk path (hash over ints, 8-byte bounds) and
off it (other values, long bounds, other vindexes), and COPY text unescaping."""

from __future__ import annotations

import random

import pytest

from shardgate.backends.copytext import data, unescape
from shardgate.keys import KeyRange, parse_shard_name
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.workflows.placing import owners
from shardgate.workflows.rowsql import MovingTable


def _table(kind: str) -> MovingTable:
    vindex = create_vindex(kind, kind, {})
    assert isinstance(vindex, SingleColumn)
    return MovingTable("t", ("id", "v"), ("id",), "id", vindex)


TARGET_SETS = [
    [(n, parse_shard_name(n)) for n in ("-40", "40-80")],
    [(n, parse_shard_name(n)) for n in ("-80", "80-")],
    [(n, parse_shard_name(n)) for n in ("40-60", "-20", "a0-")],  # gaps, unsorted
    [("lo", KeyRange(b"", b"\x40\x00\x00\x00\x00\x00\x00\x00\x01")),  # a 9-byte bound
     ("hi", KeyRange(b"\x40\x00\x00\x00\x00\x00\x00\x00\x01", b""))],
    [("x", KeyRange(b"", b"\x80")), ("y", KeyRange(b"\x40", b""))],  # overlapping
]


@pytest.mark.parametrize("targets", TARGET_SETS)
@pytest.mark.parametrize("kind", ["hash", "xxhash", "numeric"])
def test_owners_matches_row_by_row(kind: str, targets: list[tuple[str, KeyRange]]) -> None:
    table = _table(kind)
    rnd = random.Random(7)
    ints = [rnd.randrange(0, 1 << 64) for _ in range(3000)] + list(range(-50, 50)) \
        + [-(1 << 63), (1 << 64) - 1]
    batches: list[list[object]] = [
        ints,
        [i for i in ints if i >= 0],
        [*ints, 1 << 64],  # out of range: no keyspace id
        [*ints[:100], None, "12", b"34", True, 1.5],
        [],
    ]
    for values in batches:
        expect = [(table.owners((v, "x"), targets) or [None])[0] for v in values]
        assert owners(table, values, targets) == expect


def test_unescape_and_data() -> None:
    assert unescape(b"\\N") is None
    assert unescape(b"a\\tb\\nc\\\\d\\re") == b"a\tb\nc\\d\re"
    assert unescape(b"\\x41\\101\\q") == b"AAq"
    assert unescape(b"plain") == b"plain"
    assert data([b"1\ta", b"2\tb"]) == b"1\ta\n2\tb\n"
    assert data([]) == b""
