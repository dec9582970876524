"""Visibility of what a log reader read in a read's snapshot (exact event tokens).

PostgreSQL: decoded transaction ids against ``pg_current_snapshot()`` text.
MariaDB: the last binlog coordinate read against the snapshot's
``binlog_snapshot_file`` / ``_position``.
"""

from __future__ import annotations

from shardgate.backends.changes import Transaction, xid_precedes
from shardgate.backends.changes.mysql import BinlogVisibility, MySQLChangeLog, binlog_mark
from shardgate.backends.changes.postgres import PgVisibility, PostgresChangeLog
from shardgate.event_token import EventToken

TOKEN = EventToken(1.0, "ks/-", "0/0")


def _pg(*xids: int, horizon: int | None = None) -> PgVisibility:
    log = PostgresChangeLog("postgresql://u@127.0.0.1/db", "ks/-")
    v = log.visibility()
    v.horizon = horizon
    for x in xids:
        v.note(Transaction(TOKEN, [], x))
    return v


def _snap(text: str) -> list[tuple[str]]:
    return [(text,)]


def test_every_decoded_transaction_visible() -> None:
    assert _pg(90, 99, 102, 104).all_visible(_snap("100:105:101,103"))
    assert _pg().all_visible(_snap("100:105:"))


def test_a_decoded_transaction_still_in_progress_is_not_visible() -> None:
    assert not _pg(99, 103).all_visible(_snap("100:105:101,103"))


def test_a_decoded_transaction_at_or_past_xmax_is_not_visible() -> None:
    assert not _pg(99, 105).all_visible(_snap("100:105:"))
    assert not _pg(107, 99).all_visible(_snap("100:105:"))


def test_transactions_older_than_the_readers_start_must_be_over() -> None:
    # The reader started when ids reached 200: a commit of 150 before its start was
    # never decoded; while 150 may be in progress (xmin <= 150), nothing is exact.
    assert not _pg(205, horizon=200).all_visible(_snap("150:210:150"))
    assert not _pg(horizon=200).all_visible(_snap("199:210:"))
    assert _pg(205, horizon=200).all_visible(_snap("200:210:"))


def test_64_bit_snapshot_ids_and_wraparound() -> None:
    epoch = 3 << 32
    assert _pg(102).all_visible(_snap(f"{epoch + 100}:{epoch + 105}:{epoch + 101}"))
    assert not _pg(101).all_visible(_snap(f"{epoch + 100}:{epoch + 105}:{epoch + 101}"))
    # Ids wrap at 2**32: 5 (after the wrap) is newer than 2**32 - 10.
    assert xid_precedes(2**32 - 10, 5) and not xid_precedes(5, 2**32 - 10)
    v = _pg(2**32 - 10, 5)
    assert v.decoded.newest == 5
    assert not v.all_visible(_snap(f"{epoch + 2**32 - 20}:{epoch + 2**32 - 5}:"))
    assert v.all_visible(_snap(f"{epoch + 2**32 - 20}:{epoch + 2**32 + 6}:"))


def test_decoded_ids_are_bounded() -> None:
    v = _pg()
    v.decoded.keep = 3
    for x in (1, 2, 3, 4):
        v.note(Transaction(TOKEN, [], x))
    assert 1 not in v.decoded and 4 in v.decoded and v.decoded.newest == 4


def _binlog(*marks: tuple[int, int], horizon: tuple[int, int] | None = None
            ) -> BinlogVisibility:
    log = MySQLChangeLog("mysql://root@127.0.0.1/db", "ks/-")
    v = log.visibility()
    v.horizon = horizon
    for m in marks:
        v.note(Transaction(TOKEN, [], m))
    return v


def _status(file: str, pos: int) -> list[tuple[str, str]]:
    return [("BINLOG_SNAPSHOT_FILE", file), ("BINLOG_SNAPSHOT_POSITION", str(pos))]


def test_binlog_snapshot_at_or_past_the_last_transaction_read() -> None:
    assert binlog_mark("mysql-bin.000012", 4567) == (12, 4567)
    v = _binlog((1, 500), (1, 900))
    assert v.all_visible(_status("mysql-bin.000001", 900))
    assert v.all_visible(_status("mysql-bin.000002", 4))
    # binlogged, sent, not yet committed in the engine: the snapshot is before it
    assert not v.all_visible(_status("mysql-bin.000001", 899))


def test_binlog_snapshot_before_the_readers_start_is_not_exact() -> None:
    assert not _binlog(horizon=(3, 100)).all_visible(_status("mysql-bin.000003", 50))
    assert _binlog(horizon=(3, 100)).all_visible(_status("mysql-bin.000003", 100))


def test_binlog_snapshot_without_a_coordinate_is_not_exact() -> None:
    assert not _binlog().all_visible([])
