"""The inbox store's pure parts: buckets, ids, pointers and the delivery rule."""

from __future__ import annotations

import calendar
import random
from datetime import UTC, datetime

import pytest

from shardgate.errors import Code, InvalidArgument
from shardgate.queues.inbox.model import (
    US,
    Bucket,
    IdGenerator,
    InboxOptions,
    Message,
    Pointer,
    bucket_of,
    buckets_to_read,
    check_name,
    deliver,
    next_bucket,
    parse_bucket_table,
)


def at(*args: int) -> int:
    """µs since the epoch of a UTC date-time."""
    return calendar.timegm(datetime(*args, tzinfo=UTC).timetuple()) * US  # type: ignore[misc]


def msg(ts: int, mid: int) -> Message:
    return Message(1, ts, mid, f"m{mid}")


# ------------------------------------------------------------------ buckets --


@pytest.mark.parametrize(
    ("granularity", "ts", "table", "start", "end"),
    [
        ("day", at(2026, 11, 21, 13, 5, 7), "ib_20261121", at(2026, 11, 21), at(2026, 11, 22)),
        ("hour", at(2026, 11, 21, 13, 5, 7), "ib_2026112113", at(2026, 11, 21, 13),
         at(2026, 11, 21, 14)),
        ("month", at(2026, 12, 31, 23, 59, 59), "ib_202612", at(2026, 12, 1), at(2027, 1, 1)),
        ("month", at(2024, 2, 29, 12), "ib_202402", at(2024, 2, 1), at(2024, 3, 1)),
        ("day", at(2026, 12, 31, 23, 59, 59) + 999_999, "ib_20261231", at(2026, 12, 31),
         at(2027, 1, 1)),
    ],
)
def test_bucket_bounds_and_names(granularity: str, ts: int, table: str, start: int,
                                 end: int) -> None:
    b = bucket_of("ib", granularity, ts)
    assert (b.table, b.start, b.end) == (table, start, end)
    assert b.start <= ts < b.end
    assert parse_bucket_table("ib", granularity, table) == b
    nb = next_bucket("ib", granularity, b)
    assert nb.start == b.end and nb.table > b.table


def test_parse_bucket_table_ignores_other_tables_and_refuses_other_granularity() -> None:
    assert parse_bucket_table("ib", "day", "ib_pointers") is None
    assert parse_bucket_table("ib", "day", "ibx_20261121") is None
    assert parse_bucket_table("ib", "day", "ib_20261399") is None  # not a date
    assert parse_bucket_table("ib", "day", "other_20261121") is None
    with pytest.raises(InvalidArgument, match="granularity='hour'"):
        parse_bucket_table("ib", "day", "ib_2026112113")


def test_names_and_options_are_validated() -> None:
    assert check_name("user_inbox") == "user_inbox"
    for bad in ("", "Inbox", "1x", "a-b", "x" * 41, "a b"):
        with pytest.raises(InvalidArgument) as err:
            check_name(bad)
        assert err.value.code is Code.INVALID_ARGUMENT
    bad_options: list[dict[str, object]] = [
        {"granularity": "week"}, {"user_type": "uuid"}, {"rescan_window_s": -1},
        {"retention_s": 10, "rescan_window_s": 10}, {"precreate": -1}, {"max_recent": 0},
        {"forward_insert": "yes"},
    ]
    for kwargs in bad_options:
        with pytest.raises(InvalidArgument):
            InboxOptions(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown option"):
        InboxOptions.from_mapping({"granularity": "day", "windw": 3})
    assert InboxOptions.from_mapping({"granularity": "hour"}).granularity == "hour"


def test_ids_are_unique_positive_and_time_ordered() -> None:
    gen = IdGenerator()
    t0 = at(2026, 11, 21)
    ids = [gen.next(t0) for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(0 < i < 2**63 for i in ids)
    later = gen.next(t0 + 1000)  # one millisecond later
    assert later > max(ids)


# ------------------------------------------------------------------ pointers --


def test_pointer_round_trips_and_refuses_garbage() -> None:
    p = Pointer.of(100, 7, [(90, 5), (100, 7), (95, 6)])
    assert p.recent == ((90, 5), (95, 6), (100, 7))
    assert Pointer.decode(p.encode()) == p
    assert Pointer.decode(Pointer(5, 6).encode()) == Pointer(5, 6)
    for bad in ("", "p1:1", "p2:1.2:", "p1:x.2:", "p1:1.2:3", "p1:1.2:3.4.5", "garbage"):
        with pytest.raises(InvalidArgument) as err:
            Pointer.decode(bad)
        assert err.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(InvalidArgument, match="at or below"):
        Pointer.of(100, 7, [(101, 1)])
    with pytest.raises(InvalidArgument, match="distinct ids"):
        Pointer.of(100, 7, [(90, 1), (91, 1)])


# ------------------------------------------------------------------ delivery --

W = 10 * US  # rescan window in these tests


def test_first_read_delivers_in_order_up_to_the_limit() -> None:
    rows = [msg(i * US, i) for i in range(1, 6)]
    out, p, full = deliver(rows, None, window_us=W, limit=3, max_recent=100)
    assert [m.msg_id for m in out] == [1, 2, 3] and full
    assert p is not None and p.position == (3 * US, 3)
    assert p.recent == ((1 * US, 1), (2 * US, 2), (3 * US, 3))
    # The next read, given what a scan from p.ts - W returns, gives the rest once.
    out2, p2, full2 = deliver([r for r in rows if r.ts >= p.ts - W], p, window_us=W,
                              limit=3, max_recent=100)
    assert [m.msg_id for m in out2] == [4, 5] and not full2
    assert p2 is not None and p2.position == (5 * US, 5)


def test_late_message_below_the_pointer_is_delivered_once() -> None:
    rows = [msg(10 * US, 1), msg(20 * US, 2)]
    _, p, _ = deliver(rows, None, window_us=W, limit=10, max_recent=100)
    assert p is not None
    late = msg(15 * US, 3)  # a writer whose clock lags committed it after the read
    rows = sorted([*rows, late], key=lambda m: m.position)
    scan = [r for r in rows if r.ts >= p.ts - W]
    out, p2, _ = deliver(scan, p, window_us=W, limit=10, max_recent=100)
    assert [m.msg_id for m in out] == [3]
    assert p2 is not None and p2.position == p.position  # the pointer did not move back
    out3, p3, _ = deliver(scan, p2, window_us=W, limit=10, max_recent=100)
    assert out3 == [] and p3 == p2


def test_message_older_than_the_window_is_not_delivered() -> None:
    p = Pointer.of(100 * US, 9, [(100 * US, 9)])
    out, p2, _ = deliver([msg(85 * US, 1), msg(100 * US, 9)], p, window_us=W, limit=10,
                         max_recent=100)
    assert out == [] and p2 == p


def test_forward_insert_copies_are_delivered_once() -> None:
    rows = [msg(1 * US, 1), msg(2 * US, 2), msg(2 * US, 2), msg(3 * US, 3)]
    out, _, _ = deliver(rows, None, window_us=W, limit=10, max_recent=100)
    assert [m.msg_id for m in out] == [1, 2, 3]


def test_recent_is_pruned_to_the_window_and_capped() -> None:
    rows = [msg(i * US, i) for i in range(1, 31)]
    _, p, _ = deliver(rows, None, window_us=W, limit=100, max_recent=100)
    assert p is not None
    assert [i for _, i in p.recent] == list(range(20, 31))  # ts >= 30 s - 10 s
    _, capped, _ = deliver(rows, None, window_us=W, limit=100, max_recent=4)
    assert capped is not None and [i for _, i in capped.recent] == [27, 28, 29, 30]
    # Forgotten positions may come again (at least once), never go missing.
    again, _, _ = deliver([r for r in rows if r.ts >= 20 * US], capped, window_us=W,
                          limit=100, max_recent=4)
    assert [m.msg_id for m in again] == list(range(20, 27))


def test_buckets_to_read() -> None:
    day = 86_400 * US
    bs = [Bucket(i * day, (i + 1) * day, f"b{i}") for i in range(5)]
    now = 3 * day + 100 * US
    names = [b.table for b in buckets_to_read(bs, None, window_us=W, now=now,
                                                forward_insert=False)]
    assert names == ["b0", "b1", "b2", "b3"]  # b4 starts beyond now + window
    p = Pointer(3 * day + 5 * US, 1)  # its window reaches back into b2
    assert [b.table for b in buckets_to_read(bs, p, window_us=W, now=now,
                                             forward_insert=False)] == ["b2", "b3"]
    assert [b.table for b in buckets_to_read(bs, p, window_us=W, now=now,
                                             forward_insert=True)] == ["b3"]
    near_end = 4 * day - 5 * US
    assert [b.table for b in buckets_to_read(bs, p, window_us=W, now=near_end,
                                             forward_insert=True)] == ["b3", "b4"]


@pytest.mark.parametrize("seed", range(8))
def test_exactly_once_under_skew_and_commit_delay_model(seed: int) -> None:
    """A model of the whole protocol: writers with skewed clocks and slow commits.

    Messages become visible at ``commit`` time, carry ``ts`` from their
    writer's clock (skew + commit delay < the window); a reader reads with a
    random limit at random times from what is visible. Every message is
    delivered exactly once.
    """
    rnd = random.Random(seed)
    window = 10 * US
    visible: list[tuple[int, Message]] = []  # (commit time, message)
    mid = 0
    for t in range(0, 200 * US, 1 * US // 4):
        for skew in (-4 * US, 0, 3 * US):
            if rnd.random() < 0.3:
                mid += 1
                commit_delay = rnd.randint(0, 2 * US)
                visible.append((t + commit_delay, msg(t + skew, mid)))
    delivered: list[int] = []
    pointer: Pointer | None = None
    now = 0
    while now < 210 * US:
        now += rnd.randint(0, 3 * US)
        table = sorted((m for c, m in visible if c <= now), key=lambda m: m.position)
        scan = table if pointer is None else [m for m in table if m.ts >= pointer.ts - window]
        out, pointer, _ = deliver(scan, pointer, window_us=window, limit=rnd.randint(1, 8),
                                  max_recent=1000)
        delivered += [m.msg_id for m in out]
    while True:  # drain
        table = sorted((m for _, m in visible), key=lambda m: m.position)
        assert pointer is not None
        out, pointer, _ = deliver([m for m in table if m.ts >= pointer.ts - window], pointer,
                                  window_us=window, limit=50, max_recent=1000)
        if not out:
            break
        delivered += [m.msg_id for m in out]
    assert sorted(delivered) == list(range(1, mid + 1))
