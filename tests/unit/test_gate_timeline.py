"""The gate's Timeline: calls, errors and latency quantiles per window, old windows dropped."""

from __future__ import annotations

import pytest

from shardgate.gate.stats import Timeline


def test_windows_counts_errors_and_quantiles() -> None:
    now = [1000.0]
    tl = Timeline(bucket_s=10, kept=6, clock=lambda: now[0])
    for _ in range(90):
        tl.record(("ks", ""), 0.001, False)
    for _ in range(10):
        tl.record(("ks", ""), 0.1, True)
    tl.record(("ks", "-80"), 0.002, False)
    now[0] = 1012.5  # the next window, 2.5 s in
    for _ in range(5):
        tl.record(("ks", ""), 0.004, False)
    doc = tl.series(minutes=1)
    assert doc["starts"] == [960.0, 970.0, 980.0, 990.0, 1000.0, 1010.0]
    ks = doc["keyspaces"][0]
    assert ks["count"] == [0, 0, 0, 0, 100, 5] and ks["errors"] == [0, 0, 0, 0, 10, 0]
    assert ks["error_rate"][4] == 0.1 and ks["total"] == {"count": 105, "errors": 10}
    assert ks["qps"][4] == 10.0 and ks["qps"][5] == 2.0  # 5 calls in the 2.5 s so far
    assert ks["p50_ms"][4] == pytest.approx(1.0, rel=0.12)
    assert ks["p99_ms"][4] == pytest.approx(100.0, rel=0.12)
    assert ks["p50_ms"][5] == pytest.approx(4.0, rel=0.12) and ks["p50_ms"][0] is None
    assert [(s["keyspace"], s["shard"], s["count"][4]) for s in doc["shards"]] == [
        ("ks", "-80", 1)]


def test_old_windows_fall_off() -> None:
    now = [0.0]
    tl = Timeline(bucket_s=10, kept=3, clock=lambda: now[0])
    for t in range(0, 60, 10):
        now[0] = float(t)
        tl.record(("ks", ""), 0.001, False)
    doc = tl.series(minutes=10)  # more than kept: the kept windows only
    assert doc["starts"] == [30.0, 40.0, 50.0]
    assert doc["keyspaces"][0]["count"] == [1, 1, 1]
    now[0] = 95.0  # nothing recorded lately: zeros, and the old windows are out of view
    assert tl.series(minutes=0.5)["keyspaces"][0]["count"] == [0, 0, 0]
