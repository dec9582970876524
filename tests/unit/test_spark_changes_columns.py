"""``shardgate_changes`` builds its columns per transaction: the one-shot JSON encoder and the
commit time in microseconds give exactly what the per-row code gave."""

from __future__ import annotations

import base64
import datetime
import decimal
import random

from shardgate.spark.changes_source import _ENCODER, _encode, _micros, to_json


def test_the_one_shot_encoder_writes_the_encoders_text() -> None:
    values = [
        {"id": 1, "sku": "sku-1", "price": None},
        {"n": decimal.Decimal("12.500"), "b": b"\x00\xff", "t": datetime.time(1, 2, 3)},
        {"d": datetime.date(2024, 2, 29), "ts": datetime.datetime(2024, 1, 1, 12, 0, 1, 5)},
        {"gap": datetime.timedelta(seconds=90), "f": 0.1, "nan": float("nan"), "inf": -1e309},
        {"é": "ünïcode \u2028 \"quoted\"\n", "nested": {"a": [1, 2.5, True, None]}},
        (1, "a"), [decimal.Decimal("1e-30")], memoryview(b"xy"), {},
    ]
    for v in values:
        assert _encode(v) == _ENCODER.encode(v), v
    assert to_json(None) is None
    b64 = base64.b64encode(b"\x01").decode()
    assert to_json({"b": b"\x01"}) == '{"b":"' + b64 + '"}'


def test_micros_round_as_datetime_does() -> None:
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    rnd = random.Random(17)
    stamps = [0.0, 1.5e-6, 2.5e-6, 1_700_000_000.0000005, 1_700_000_000.9999996]
    stamps += [rnd.uniform(1.5e9, 2.0e9) for _ in range(20_000)]
    for ts in stamps:
        want = datetime.datetime.fromtimestamp(ts, datetime.UTC)
        assert epoch + datetime.timedelta(microseconds=_micros(ts)) == want, ts
