"""Python values and results <-> protobuf messages (shardgate.api.grpc.convert)."""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardgate.api.grpc import convert
from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.errors import Code, InvalidArgument
from shardgate.result import Result

EXACT = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**63,  # first uint64-only value
    2**64 - 1,
    1.5,
    -0.0,
    math.inf,
    "",
    "héllo ✓",
    b"",
    b"\x00\xff\x80binary",
]


def wire(v: Any) -> Any:
    """Through the message and its serialized bytes and back."""
    msg = pb.Value.FromString(convert.to_value(v).SerializeToString())
    return convert.from_value(msg)


@pytest.mark.parametrize("value", EXACT, ids=repr)
def test_exact_round_trip(value: Any) -> None:
    back = wire(value)
    assert back == value
    assert type(back) is type(value)


def test_cases_chosen() -> None:
    assert convert.to_value(None).WhichOneof("kind") == "null_value"
    assert convert.to_value(True).WhichOneof("kind") == "bool_value"  # not int
    assert convert.to_value(2**63 - 1).WhichOneof("kind") == "int64_value"
    assert convert.to_value(2**63).WhichOneof("kind") == "uint64_value"
    assert convert.to_value(bytearray(b"ab")).WhichOneof("kind") == "bytes_value"
    assert convert.to_value(memoryview(b"ab")).bytes_value == b"ab"


def test_nan_round_trips() -> None:
    assert math.isnan(wire(math.nan))


def test_unset_value_is_null() -> None:
    assert convert.from_value(pb.Value()) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (decimal.Decimal("12345678901234567890.000001"), "12345678901234567890.000001"),
        (datetime.date(2024, 2, 29), "2024-02-29"),
        (datetime.datetime(2024, 2, 29, 13, 5, 7, 120), "2024-02-29T13:05:07.000120"),
        (datetime.time(23, 59, 1), "23:59:01"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ],
    ids=repr,
)
def test_types_sent_as_strings(value: Any, text: str) -> None:
    assert wire(value) == text


@pytest.mark.parametrize(
    "value", [2**64, -(2**63) - 1, object(), [1, 2], {"a": 1}],
    ids=["2**64", "-(2**63)-1", "object()", "[1, 2]", "{a: 1}"])
def test_unsupported_values_are_invalid_argument(value: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        convert.to_value(value)
    assert err.value.code is Code.INVALID_ARGUMENT


def test_bind_vars_round_trip_and_name_the_bad_one() -> None:
    bv = {"a": 1, "b": None, "c": b"\x01", "d": 2**64 - 1, "e": "x"}
    request = pb.ExecuteRequest(sql="x", bind_vars=convert.to_bind_vars(bv))
    again = pb.ExecuteRequest.FromString(request.SerializeToString())
    assert convert.from_bind_vars(again.bind_vars) == bv
    assert convert.to_bind_vars(None) == {}
    with pytest.raises(InvalidArgument, match="'bad'"):
        convert.to_bind_vars({"bad": object()})


@given(
    st.lists(
        st.tuples(
            st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1),
            st.text() | st.binary(),
            st.floats(allow_nan=False),
        ),
        max_size=5,
    ),
    st.integers(0, 2**63 - 1),
    st.none() | st.integers(-(2**63), 2**63 - 1),
)
def test_result_round_trip(
    rows: list[tuple[Any, ...]], affected: int, insert_id: int | None
) -> None:
    result = Result(fields=["a", "b", "c"], rows=rows, rows_affected=affected, insert_id=insert_id)
    unary = pb.ExecuteResponse.FromString(convert.execute_response(7, result).SerializeToString())
    assert unary.session_id == 7
    assert convert.to_result(unary) == result
    chunk = pb.StreamExecuteResponse.FromString(
        convert.stream_response(8, result).SerializeToString()
    )
    assert chunk.session_id == 8
    assert convert.to_result(chunk) == result


def test_insert_id_zero_is_not_none() -> None:
    response = convert.execute_response(1, Result(insert_id=0))
    assert convert.to_result(response).insert_id == 0
    assert convert.to_result(convert.execute_response(1, Result())).insert_id is None
