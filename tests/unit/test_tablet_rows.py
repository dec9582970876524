"""Rows between a tablet and a gate: packed in one buffer (shardgate.api.grpc.convert.pack_rows).

The encoding is pinned here: what a tablet writes must stay readable by a gate
of another version (marshal format 4, escapes as ("V", Value) and ("(", tuple)).
"""

from __future__ import annotations

import datetime
import decimal
import marshal
import math
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardgate.api.grpc import convert
from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.errors import InvalidArgument
from shardgate.event_token import EventToken
from shardgate.result import Result

NATIVE = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**70, 1.5, -0.0,
          math.inf, -math.inf, "", "héllo ✓", "\x00", b"", b"\x00\xff\x80binary"]
TYPED = [
    decimal.Decimal("12345678901234567890.000000001"),
    decimal.Decimal("-0.00"),
    datetime.date(2024, 2, 29),
    datetime.time(23, 59, 59, 999999),
    datetime.datetime(2024, 2, 29, 12, 0, 0, 1),
    datetime.datetime(2024, 2, 29, 12, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
]


def roundtrip(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    data, escaped = convert.pack_rows(rows)
    return convert.unpack_rows(data, escaped)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type (NaN equal to NaN, -0.0 told from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                     == math.copysign(1, b))
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_the_packed_bytes_are_pinned() -> None:
    # a point select's row in marshal format 4 (list, small tuple, int, short ASCII
    # str), with or without marshal's reference flags (0x80, set by reference counts)
    pinned = (b"[\x01\x00\x00\x00)\x02\xe9\xd2\x04\x00\x00\xfa\nvalue 1234",
              b"\xdb\x01\x00\x00\x00\xa9\x02\xe9\xd2\x04\x00\x00\xfa\nvalue 1234")
    for data in pinned:
        assert same(convert.unpack_rows(data, False), [(1234, "value 1234")])
    data, escaped = convert.pack_rows([(1234, "value 1234")])
    assert not escaped
    assert data[0] & 0x7F == ord("[") and same(marshal.loads(data), [(1234, "value 1234")])
    # an escaped cell: ("V", the typed Value serialized)
    data, escaped = convert.pack_rows([(decimal.Decimal("1.5"),)])
    assert escaped
    value = pb.Value(decimal_value="1.5").SerializeToString()
    assert marshal.loads(data) == [(("V", value),)]


@pytest.mark.parametrize("value", NATIVE + TYPED, ids=repr)
def test_every_type_round_trips_exactly(value: Any) -> None:
    for row in [(value,), (value, None, 1, "x"), (None, value)]:
        assert same(roundtrip([row]), [row])


def test_nan_round_trips() -> None:
    (got,) = roundtrip([(math.nan,)])[0]
    assert isinstance(got, float) and math.isnan(got)


def test_rows_mixing_native_typed_and_tuple_cells() -> None:
    rows = [tuple(NATIVE + TYPED + [(1, "a"), [1, "b"], {"k": 1}])] * 3
    data, escaped = convert.pack_rows(rows)
    assert escaped
    assert same(convert.unpack_rows(data, escaped), rows)
    # without a typed cell a tuple cell goes as it is, unescaped
    rows = [((1, "a"), ("(", 2), ("V", b"x"))]
    data, escaped = convert.pack_rows(rows)
    assert not escaped
    assert same(convert.unpack_rows(data, escaped), rows)
    # with one, a tuple cell that looks like an escape still comes back as itself
    rows = [(("V", b"x"), ("(", 2), decimal.Decimal(1))]
    assert same(roundtrip(rows), rows)


def test_empty_results_and_rows() -> None:
    assert marshal.loads(convert.pack_rows([])[0]) == []
    assert roundtrip([]) == []
    assert convert.unpack_rows(b"", False) == []
    assert same(roundtrip([(), ()]), [(), ()])


def test_rows_come_back_as_tuples() -> None:
    rows: list[Any] = [[1, "a"], (2, "b")]
    assert same(roundtrip(rows), [(1, "a"), (2, "b")])


def test_a_big_result() -> None:
    rows = [(i, f"value {i}", i * 0.5, None, bytes([i % 256]) * 10,
             decimal.Decimal(i) / 7 if i % 100 == 0 else i) for i in range(20_000)]
    data, escaped = convert.pack_rows(rows)
    assert escaped
    assert same(convert.unpack_rows(data, escaped), rows)


def test_unsupported_types_are_refused() -> None:
    # as the typed Values refuse them (a tablet's backends never give them)
    with pytest.raises(InvalidArgument, match="cannot send a value of type timedelta"):
        convert.pack_rows([(datetime.timedelta(1),)])
    with pytest.raises(InvalidArgument, match="list, dict or set"):
        convert.pack_rows([([decimal.Decimal(1)],)])
    # the types marshal writes go as they are either way
    for rows in ([({1}, [1], {"a": 1}, 1j)], [({1}, [1], {"a": 1}, 1j, decimal.Decimal(1))]):
        assert same(roundtrip(rows), rows)


def test_a_lane_answer_carries_the_whole_result() -> None:
    result = Result(fields=["id", "amount"], rows=[(1, decimal.Decimal("9.99")), (2, None)],
                    rows_affected=2, insert_id=7,
                    event_token=EventToken(1.5, "-", "0/16B3748"), fresher=True)
    response = pb.TabletLaneResponse.FromString(
        convert.lane_response(result).SerializeToString())
    assert not response.result.rows  # the rows travel packed
    got = convert.lane_result(response)
    assert got == result
    assert same(got.rows, result.rows)
    empty = convert.lane_result(pb.TabletLaneResponse.FromString(
        convert.lane_response(Result()).SerializeToString()))
    assert empty == Result()


cells = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False), st.text(), st.binary(),
    st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: d.normalize()),
    st.dates(), st.times(), st.datetimes(), st.uuids(),
)


@given(st.lists(st.lists(cells, min_size=0, max_size=6).map(tuple), max_size=20))
def test_any_rows_round_trip(rows: list[tuple[Any, ...]]) -> None:
    assert same(roundtrip(rows), rows)
