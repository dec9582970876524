"""Event tokens compare exactly as the Update Stream design states; the time map."""

from __future__ import annotations

import pytest

from shardgate.backends.changes import TimeMap
from shardgate.errors import InvalidArgument
from shardgate.event_token import EventToken, Freshness, compare, is_fresher, position_key
from shardgate.streams.merge import StreamPosition

A = "commerce/-80"
B = "commerce/80-"


def test_timestamps_decide_first_even_across_shards() -> None:
    assert compare(EventToken(2.0, A, "5"), EventToken(1.0, B, "9")) is Freshness.NEWER
    assert compare(EventToken(1.0, A, "9"), EventToken(2.0, A, "5")) is Freshness.OLDER


def test_same_timestamp_same_shard_compares_positions() -> None:
    assert compare(EventToken(1.0, A, "0/10"), EventToken(1.0, A, "0/F")) is Freshness.NEWER
    assert compare(EventToken(1.0, A, "0-1-7"), EventToken(1.0, A, "0-2-7")) is Freshness.EQUAL
    assert compare(EventToken(1.0, A, "3"), EventToken(1.0, A, "12")) is Freshness.OLDER


def test_otherwise_unknown() -> None:
    assert compare(EventToken(1.0, A, "3"), EventToken(1.0, B, "3")) is Freshness.UNKNOWN
    assert compare(None, EventToken(1.0, B, "3")) is Freshness.UNKNOWN
    assert not is_fresher(EventToken(1.0, A, "3"), EventToken(1.0, B, "3"))
    assert is_fresher(EventToken(1.0, A, "3"), EventToken(1.0, A, "3"))


def test_serialization_is_opaque_and_exact() -> None:
    t = EventToken(1700000000.123456, A, "1/2AB")
    text = t.serialize()
    assert text.startswith("et1.") and A not in text
    assert EventToken.parse(text) == t
    with pytest.raises(InvalidArgument):
        EventToken.parse("et1.!!!")
    with pytest.raises(InvalidArgument):
        EventToken.parse("nope")
    pos = StreamPosition({A: t})
    assert StreamPosition.parse(pos.serialize()).tokens == {A: t}


def test_position_keys() -> None:
    assert position_key("1/0") > position_key("0/FFFFFFFF")
    assert position_key("0-1-10") > position_key("0-1-9")
    assert position_key("10") > position_key("9")
    with pytest.raises(InvalidArgument):
        position_key("bogus")


def test_time_map_per_second_then_per_minute() -> None:
    m = TimeMap(fine_s=100.0, retention_s=1000.0)
    for i, ts in enumerate([1000.2, 1000.7, 1001.5, 1030.0, 1065.0]):
        m.record(ts, str(i))
    assert m.lookup(999.0) is None
    assert m.lookup(1000.9) == "0"  # before every commit of second 1000
    assert m.lookup(1001.9) == "2"
    assert m.lookup(1050.0) == "3"
    m.compact(now=1200.0)  # all older than fine_s: one entry per minute, the earliest
    assert m.lookup(1001.9) == "0" and m.lookup(1065.0) == "3"
    m.compact(now=3000.0)  # past retention
    assert len(m) == 0


def test_stream_position_keeps_its_start_for_silent_shards() -> None:
    t = EventToken(200.0, A, "9")
    pos = StreamPosition({A: t}, since=100.0)
    back = StreamPosition.parse(pos.serialize())
    assert back.tokens == {A: t} and back.since == 100.0
    assert back.start_of(A, 0.0) == ("9", None)
    assert back.start_of("commerce/80-", 0.0) == (None, 100.0)
    # without a start the silent shard resumes from the oldest token seen
    assert StreamPosition({A: t}).start_of("commerce/80-", 0.0) == (None, 200.0)


def test_postgres_lost_wal_is_out_of_range_not_retried() -> None:
    import psycopg2
    import psycopg2.errors

    from shardgate.backends.changes.postgres import _translate
    from shardgate.errors import Code, ShardgateError

    translate = _translate("postgresql://x@h/db")
    for exc in (
        psycopg2.errors.ObjectNotInPrerequisiteState(
            "cannot copy a replication slot that doesn't reserve WAL"),
        psycopg2.OperationalError(
            "ERROR: requested WAL segment 000000010000000000000042 has already been removed"),
    ):
        err = translate(exc)
        assert isinstance(err, ShardgateError) and err.code is Code.OUT_OF_RANGE
    lost = translate(psycopg2.OperationalError("server closed the connection unexpectedly"))
    assert isinstance(lost, ShardgateError) and lost.code is Code.UNAVAILABLE
