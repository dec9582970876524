"""Production mode's pure parts: typed values on the tablet hop, what may be sent again,
and reader-side expiry of tablet records."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import time
import uuid
from typing import Any

import pytest

from shardgate.api.grpc import convert
from shardgate.gate.fleet import is_read
from shardgate.tablet.registry import KIND, TabletRecord, TabletRoster
from shardgate.topo.store import Record

TYPED = [
    decimal.Decimal("12.340"),
    datetime.date(2024, 2, 29),
    datetime.time(23, 59, 58, 123456),
    datetime.datetime(2024, 2, 29, 12, 0, 1, 5),
    datetime.datetime(2024, 2, 29, 12, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
]


@pytest.mark.parametrize("value", TYPED, ids=repr)
def test_typed_values_keep_their_type_between_tablet_and_gate(value: Any) -> None:
    back = convert.from_value(convert.to_value(value, typed=True))
    assert type(back) is type(value) and back == value
    # The Gate service still sends them as text (its clients' contract).
    assert isinstance(convert.from_value(convert.to_value(value)), str)


@pytest.mark.parametrize(("sql", "read"), [
    ("SELECT 1", True),
    ("  (select id from t) union (select id from u)", True),
    ("show tables", True),
    ("SELECT id FROM t WHERE id = 1 FOR UPDATE", False),
    ("INSERT INTO t VALUES (1)", False),
    ("UPDATE t SET v = 1", False),
    ("WITH d AS (DELETE FROM t RETURNING id) SELECT id FROM d", False),
    ("", False),
])
def test_only_plain_reads_may_be_sent_again(sql: str, read: bool) -> None:
    assert is_read(sql) is read


def _record(alias: str, *, heartbeat_at: float, version: int = 1,
            doc: dict[str, Any] | None = None) -> Record:
    rec = TabletRecord(alias=alias, keyspace="ks", shard="-80", address="h:1",
                       role="standby", health="serving", position="", started_at=0.0,
                       heartbeat_at=heartbeat_at, heartbeat_s=0.05, beat=1,
                       dialect="postgres", placeholder="%s", supports_twopc=True, collation="")
    return Record(KIND, alias, dataclasses.asdict(rec) if doc is None else doc, version)


def test_roster_ignores_records_that_stopped_changing() -> None:
    roster = TabletRoster()
    roster.seed([_record("fresh", heartbeat_at=time.time()),
                 _record("dead", heartbeat_at=time.time() - 3600),
                 _record("junk", heartbeat_at=0, doc={"alias": "junk"})])
    assert [r.alias for r in roster.live()] == ["fresh"]
    assert {r.alias for r in roster.all()} == {"fresh", "dead"}
    time.sleep(0.2)  # more than 3 heartbeats of 0.05 s without a change
    assert roster.live() == []
    roster.update([_record("fresh", heartbeat_at=time.time(), version=2)])
    assert [r.alias for r in roster.live("ks", "-80")] == ["fresh"]
    assert roster.live("ks", "80-") == []
    roster.update([Record(KIND, "fresh", None, 3)])  # deleted
    assert [r.alias for r in roster.all()] == ["dead"]
