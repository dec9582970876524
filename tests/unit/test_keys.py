"""Keyspace ids, key ranges, shard names and shard maps."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardgate.errors import Code, InvalidArgument
from shardgate.keys import (
    FULL_RANGE,
    KeyRange,
    ShardMap,
    ksid_hex,
    ksid_to_uint64,
    parse_key_range,
    parse_shard_name,
    uint64_to_ksid,
    validate_partition,
)


def kr(name: str) -> KeyRange:
    return parse_shard_name(name)


def test_uint64_ksid_helpers() -> None:
    assert uint64_to_ksid(1) == b"\x00\x00\x00\x00\x00\x00\x00\x01"
    assert ksid_to_uint64(b"\x80") == 0x8000000000000000
    assert ksid_to_uint64(b"\x01\x02\x03\x04\x05\x06\x07\x08\xff") == 0x0102030405060708
    assert ksid_hex(b"\x16k@\xb4") == "166b40b4"
    with pytest.raises(InvalidArgument):
        uint64_to_ksid(1 << 64)
    with pytest.raises(InvalidArgument):
        uint64_to_ksid(-1)


@pytest.mark.parametrize(
    ("name", "start", "end", "canonical"),
    [
        ("-80", b"", b"\x80", "-80"),
        ("40-80", b"\x40", b"\x80", "40-80"),
        ("80-", b"\x80", b"", "80-"),
        ("-", b"", b"", "-"),
        ("0", b"", b"", "-"),
        ("C0-", b"\xc0", b"", "c0-"),
        ("4000-8000", b"\x40\x00", b"\x80\x00", "4000-8000"),
    ],
)
def test_parse_and_format(name: str, start: bytes, end: bytes, canonical: str) -> None:
    got = parse_shard_name(name)
    assert (got.start, got.end) == (start, end)
    assert got.name == canonical
    assert str(got) == canonical
    assert parse_shard_name(got.name) == got
    assert parse_key_range(name) == got


@pytest.mark.parametrize("bad", ["", "80", "x-80", "8-", "-80-", "80-40", "40-40", " -80", "1"])
def test_bad_names(bad: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_shard_name(bad)
    assert info.value.code is Code.INVALID_ARGUMENT
    assert "'-80'" in info.value.message


def test_contains_at_bounds() -> None:
    r = kr("40-80")
    assert r.contains(b"\x40")
    assert r.contains(b"\x40\x00\x00")
    assert r.contains(b"\x7f\xff\xff\xff\xff\xff\xff\xff")
    assert not r.contains(b"\x80")
    assert not r.contains(b"\x80\x00\x00\x00\x00\x00\x00\x00")
    assert not r.contains(b"\x3f\xff")
    assert kr("-80").contains(b"")
    assert kr("-80").contains(b"\x00")
    assert kr("80-").contains(b"\xff" * 20)
    assert FULL_RANGE.contains(b"") and FULL_RANGE.contains(b"\xff" * 8)
    # Trailing zero bytes do not matter (Vitess key.Normalize).
    assert kr("8000-").contains(b"\x80")


def test_intersect() -> None:
    assert kr("-80").intersect(kr("40-c0")) == KeyRange(b"\x40", b"\x80")
    assert kr("40-c0").intersect(kr("80-")) == KeyRange(b"\x80", b"\xc0")
    assert kr("-40").intersect(kr("40-80")) is None
    assert not kr("-40").intersects(kr("40-80"))
    assert kr("-").intersect(kr("40-80")) == kr("40-80")
    assert kr("80-").intersect(kr("-")) == kr("80-")
    assert kr("-40").intersects(kr("-"))


def test_is_full() -> None:
    assert FULL_RANGE.is_full and KeyRange.full().is_full and kr("0").is_full
    assert not kr("-80").is_full and not kr("80-").is_full


@pytest.mark.parametrize(
    ("n", "names"),
    [
        (1, ["-"]),
        (2, ["-80", "80-"]),
        (4, ["-40", "40-80", "80-c0", "c0-"]),
        (3, ["-5555555555555555", "5555555555555555-aaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa-"]),
        (
            16,
            [
                *("-10", "10-20", "20-30", "30-40", "40-50", "50-60", "60-70", "70-80"),
                *("80-90", "90-a0", "a0-b0", "b0-c0", "c0-d0", "d0-e0", "e0-f0", "f0-"),
            ],
        ),
    ],
)
def test_split_full(n: int, names: list[str]) -> None:
    parts = FULL_RANGE.split(n)
    assert [p.name for p in parts] == names
    validate_partition(parts)


def test_split_sub_range() -> None:
    assert [p.name for p in kr("40-80").split(2)] == ["40-60", "60-80"]
    assert [p.name for p in kr("80-").split(2)] == ["80-c0", "c0-"]
    with pytest.raises(InvalidArgument):
        FULL_RANGE.split(0)


def test_validate_partition_errors() -> None:
    validate_partition([kr("80-"), kr("-80")])
    with pytest.raises(InvalidArgument, match="gap"):
        validate_partition([kr("-40"), kr("80-")])
    with pytest.raises(InvalidArgument, match="overlap"):
        validate_partition([kr("-80"), kr("40-")])
    with pytest.raises(InvalidArgument, match="gap"):
        validate_partition([kr("-80"), kr("80-c0")])
    with pytest.raises(InvalidArgument, match="gap"):
        validate_partition([kr("40-")])
    with pytest.raises(InvalidArgument, match="overlap"):
        validate_partition([kr("-"), kr("80-")])
    with pytest.raises(InvalidArgument):
        validate_partition([])


def test_shard_map_find_at_boundaries() -> None:
    m = ShardMap.from_names(["80-c0", "-40", "c0-", "40-80"])
    assert m.names == ["-40", "40-80", "80-c0", "c0-"]
    assert len(m) == 4
    assert m.find(b"") == "-40"
    assert m.find(b"\x00" * 8) == "-40"
    assert m.find(b"\x3f\xff\xff\xff\xff\xff\xff\xff") == "-40"
    assert m.find(b"\x40") == "40-80"
    assert m.find(b"\x40\x00\x00\x00\x00\x00\x00\x00") == "40-80"
    assert m.find(b"\x7f\xff") == "40-80"
    assert m.find(b"\x80") == "80-c0"
    assert m.find(b"\xc0") == "c0-"
    assert m.find(b"\xff" * 9) == "c0-"


def test_shard_map_shards_for_range() -> None:
    m = ShardMap.from_names(["-40", "40-80", "80-c0", "c0-"])
    assert m.shards_for_range(FULL_RANGE) == ["-40", "40-80", "80-c0", "c0-"]
    assert m.shards_for_range(kr("40-80")) == ["40-80"]
    assert m.shards_for_range(kr("30-90")) == ["-40", "40-80", "80-c0"]
    assert m.shards_for_range(kr("80-")) == ["80-c0", "c0-"]
    assert m.shards_for_range(KeyRange(b"\x16k@", b"\x16kA")) == ["-40"]


def test_shard_map_refuses_bad_partition() -> None:
    with pytest.raises(InvalidArgument):
        ShardMap.from_names(["-80", "40-"])


def test_unsharded_shard_map() -> None:
    m = ShardMap.from_names(["0"])
    assert m.find(b"\x12\x34") == "0"


@given(
    n=st.integers(min_value=1, max_value=40),
    ksid=st.binary(min_size=0, max_size=12),
)
def test_every_ksid_in_exactly_one_split_shard(n: int, ksid: bytes) -> None:
    parts = FULL_RANGE.split(n)
    owners = [p.name for p in parts if p.contains(ksid)]
    assert len(owners) == 1
    assert ShardMap([(p.name, p) for p in parts]).find(ksid) == owners[0]


@given(
    start=st.binary(min_size=0, max_size=3),
    end=st.binary(min_size=0, max_size=3),
    n=st.integers(min_value=1, max_value=9),
)
def test_split_of_any_range_partitions_it(start: bytes, end: bytes, n: int) -> None:
    start, end = start.rstrip(b"\x00"), end.rstrip(b"\x00")
    if end and start >= end:
        return
    parts = KeyRange(start, end).split(n)
    assert len(parts) == n
    assert parts[0].start == start and parts[-1].end == end
    for a, b in itertools.pairwise(parts):
        assert a.end == b.start and not a.intersects(b)
        assert parse_shard_name(a.name) == a


@given(a=st.binary(max_size=3), b=st.binary(max_size=3), k=st.binary(max_size=4))
def test_intersect_agrees_with_contains(a: bytes, b: bytes, k: bytes) -> None:
    r1, r2 = KeyRange(b"", a), KeyRange(b, b"")
    both = r1.intersect(r2)
    in_both = r1.contains(k) and r2.contains(k)
    assert in_both == (both is not None and both.contains(k))
