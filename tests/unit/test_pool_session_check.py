"""Which statements leave a pooled connection's session changed (``changes_session``).

A false alarm costs one reset; a miss lets one user's session state reach the
next borrower of the connection (issue 30 item 5), so the check errs towards True.
"""

from __future__ import annotations

import pytest

from shardgate.backends._pool import changes_session
from shardgate.errors import InvalidArgument
from shardgate.tablet.tablet import per_user_cap

PLAIN = [
    "SELECT v FROM t WHERE id = %s",
    "select count(*) from t",
    "INSERT INTO t (id, v) VALUES (%s, %s)",
    'INSERT INTO "t" ("id") VALUES ($1)',
    "insert into `ks`.`t`(a) values (1), (2)",
    "UPDATE t SET v = 1 WHERE id = ANY(%s)",
    "DELETE FROM t WHERE id IN (1, 2)",
    "WITH d AS (SELECT 1) SELECT * FROM d",
    "(SELECT 1) UNION (SELECT 2)",
    "SELECT COALESCE(a, b), lower(c) FROM t JOIN u USING (id)",
    "SELECT * FROM (SELECT 1) AS q LIMIT 0",
    "SELECT @@version",
    "SELECT a FROM t WHERE x @> y",
    "SELECT tempo FROM t",
    "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY)",
    "SELECT pg_current_wal_lsn()",
]
CHANGING = [
    "SET x = 1",
    "  set session tx_read_only = 1",
    "RESET ALL",
    "USE other",
    "PREPARE p AS SELECT 1",
    "PRAGMA query_only = 1",
    "LOCK TABLES t WRITE",
    "SELECT set_config('default_transaction_read_only', 'on', false)",
    "SELECT pg_catalog.set_config('a', 'b', false)",
    'SELECT "set_config"(1)',
    "SELECT public.\"f\"(1)",
    "SELECT my_function(1)",
    "SELECT pg_advisory_lock(1)",
    "SELECT GET_LOCK('a', 0)",
    "SELECT @x := 1",
    "SELECT 1 INTO @x",
    "CREATE TEMP TABLE t (a int)",
    "CREATE TEMPORARY TABLE t (a int)",
    "SELECT 1 INTO OUTFILE '/tmp/x'",
    "INSERT INTO t SELECT nextval('s')",
]


@pytest.mark.parametrize("sql", PLAIN)
def test_plain_statements_cost_no_reset(sql: str) -> None:
    assert not changes_session(sql)
    assert not changes_session(sql)  # (cached)


@pytest.mark.parametrize("sql", CHANGING)
def test_statements_that_may_change_the_session_are_caught(sql: str) -> None:
    assert changes_session(sql)


@pytest.mark.parametrize("share, cap, expected", [
    (0, 20, None), (0.4, 20, 8), (0.01, 20, 1), (5, 20, 5), (50, 20, 20), (1, 3, 1),
])
def test_per_user_cap(share: float, cap: int, expected: int | None) -> None:
    assert per_user_cap(share, cap) == expected


@pytest.mark.parametrize("share", [-1, 1.5, True])
def test_bad_per_user_caps(share: float) -> None:
    with pytest.raises(InvalidArgument, match="--transaction-cap-per-user"):
        per_user_cap(share, 20)
