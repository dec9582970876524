"""PostgresChangeLog.all_visible: decoded transactions against a snapshot's text."""

from __future__ import annotations

from shardgate.backends.changes import DecodedXids, xid_precedes
from shardgate.backends.changes_postgres import PostgresChangeLog


def _log(horizon: int | None = None) -> PostgresChangeLog:
    log = PostgresChangeLog("postgresql://u@127.0.0.1/db", "ks/-")
    log._horizon = horizon
    return log


def _decoded(*xids: int) -> DecodedXids:
    d = DecodedXids()
    for x in xids:
        d.add(x)
    return d


def test_every_decoded_transaction_visible() -> None:
    assert _log().all_visible("100:105:101,103", _decoded(90, 99, 102, 104))
    assert _log().all_visible("100:105:", _decoded())


def test_a_decoded_transaction_still_in_progress_is_not_visible() -> None:
    assert not _log().all_visible("100:105:101,103", _decoded(99, 103))


def test_a_decoded_transaction_at_or_past_xmax_is_not_visible() -> None:
    assert not _log().all_visible("100:105:", _decoded(99, 105))
    assert not _log().all_visible("100:105:", _decoded(107, 99))


def test_transactions_older_than_the_readers_start_must_be_over() -> None:
    # The reader started when the next id was 200: a commit of 150 before its start
    # was never decoded; while 150 may be in progress (xmin <= 150), nothing is exact.
    assert not _log(horizon=200).all_visible("150:210:150", _decoded(205))
    assert not _log(horizon=200).all_visible("199:210:", _decoded())
    assert _log(horizon=200).all_visible("200:210:", _decoded(205))


def test_64_bit_snapshot_ids_and_wraparound() -> None:
    epoch = 3 << 32
    assert _log().all_visible(f"{epoch + 100}:{epoch + 105}:{epoch + 101}", _decoded(102))
    assert not _log().all_visible(f"{epoch + 100}:{epoch + 105}:{epoch + 101}",
                                  _decoded(101))
    # Ids wrap at 2**32: 5 (after the wrap) is newer than 2**32 - 10.
    assert xid_precedes(2**32 - 10, 5) and not xid_precedes(5, 2**32 - 10)
    d = _decoded(2**32 - 10, 5)
    assert d.newest == 5
    assert not _log().all_visible(f"{epoch + 2**32 - 20}:{epoch + 2**32 - 5}:", d)
    assert _log().all_visible(f"{epoch + 2**32 - 20}:{epoch + 2**32 + 6}:", d)


def test_decoded_ids_are_bounded() -> None:
    d = DecodedXids(keep=3)
    for x in (1, 2, 3, 4):
        d.add(x)
    assert 1 not in d and 4 in d and d.newest == 4
