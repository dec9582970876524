"""Result limits, gate limits and the read/write guess the backends make from SQL."""

from __future__ import annotations

import pytest

from shardgate.backends._pool import is_read
from shardgate.errors import (
    COMMIT_OUTCOME_UNKNOWN,
    Code,
    CommitOutcomeUnknown,
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    ShardgateError,
    error_for_code,
)
from shardgate.gate.limits import GateLimits
from shardgate.result import ResultLimits, rows_size


@pytest.mark.parametrize(
    ("sql", "read"),
    [
        ("SELECT 1", True),
        ("  select * from t", True),
        ("(SELECT 1) UNION (SELECT 2)", True),
        ("WITH a AS (SELECT 1) SELECT * FROM a", True),
        ("WITH a AS (DELETE FROM t RETURNING id) SELECT * FROM a", False),
        ("with a as (select 1) insert into t select * from a", False),
        ("VALUES (1), (2)", True),
        ("SHOW TABLES", True),
        ("EXPLAIN SELECT 1", True),
        ("INSERT INTO t VALUES (1) RETURNING id", False),
        ("UPDATE t SET v = 1", False),
        ("DELETE FROM t", False),
        ("CREATE TABLE t (id INT)", False),
        ("BEGIN", False),
    ],
)
def test_is_read(sql: str, read: bool) -> None:
    assert is_read(sql) is read


def test_result_limits_check() -> None:
    limits = ResultLimits(max_rows=10, max_bytes=100)
    limits.check(10, 100, "x")
    with pytest.raises(ResourceExhausted, match="more than 10 rows") as info:
        limits.check(11, 0, "shard a")
    assert info.value.code is Code.RESOURCE_EXHAUSTED
    assert "StreamExecute" in info.value.message and "shard a" in info.value.message
    with pytest.raises(ResourceExhausted, match="more than 100 bytes"):
        limits.check(1, 101, "x")
    ResultLimits(0, 0).check(10**9, 10**12, "x")  # 0: no limit
    assert not ResultLimits(0, 0).active and ResultLimits(1, 0).active


def test_rows_size_estimate() -> None:
    assert rows_size([]) == 0
    assert rows_size([(1, "abc", b"xy", None, 2.5)]) == 8 + 3 + 2 + 8 + 8


@pytest.mark.parametrize(
    "kwargs",
    [
        {"transaction_timeout_s": 0},
        {"session_idle_timeout_s": -1.0},
        {"query_timeout_ms": -1},
        {"pool_timeout_s": 0},
        {"result_limits": ResultLimits(-1, 0)},
    ],
)
def test_gate_limits_are_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        GateLimits(**kwargs)  # type: ignore[arg-type]


def test_gate_limits_defaults() -> None:
    limits = GateLimits()
    assert limits.transaction_timeout_s == 30.0 and limits.session_idle_timeout_s == 600.0
    assert limits.query_timeout_ms == 0 and limits.result_limits.max_rows == 500_000
    assert GateLimits(transaction_timeout_s=None).transaction_timeout_s is None


def test_commit_outcome_unknown_survives_the_wire() -> None:
    """A client rebuilds the error from (code, message), as the gRPC client does."""
    sent = CommitOutcomeUnknown(f"{COMMIT_OUTCOME_UNKNOWN} on shard app/0: lost")
    got = error_for_code(sent.code, sent.message)
    assert isinstance(got, CommitOutcomeUnknown) and got.code is Code.UNKNOWN
    assert type(error_for_code(Code.UNKNOWN, "something else")) is ShardgateError
    assert isinstance(error_for_code(Code.DEADLINE_EXCEEDED, "slow"), DeadlineExceeded)
