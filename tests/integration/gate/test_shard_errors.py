"""Errors a shard database raises, worded for the user on every backend (issue 18)."""

from __future__ import annotations

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.errors import Code, ShardgateError
from tests.integration.conftest import Cluster


@pytest.mark.parametrize(
    ("sql", "lead"),
    [
        ("SELECT nosuchcol FROM customer", "unknown column 'nosuchcol'"),
        ("SELECT name FROM customer WHERE nosuchcol = 1", "unknown column 'nosuchcol'"),
        ("SELECT name FROM customer ORDER BY nosuchcol", "unknown column 'nosuchcol'"),
    ],
)
async def test_unknown_column_leads_with_the_column(cluster: Cluster, sql: str, lead: str) -> None:
    gate = cluster.gate
    with pytest.raises(ShardgateError) as err:
        await gate.execute(gate.session("commerce", identity=TRUSTED), sql)
    assert err.value.code is Code.NOT_FOUND
    assert err.value.message.startswith(lead), err.value.message
    assert "(shard database " in err.value.message  # the shard only as a detail, at the end
    assert "no such column" not in err.value.message
    assert "does not exist" not in err.value.message
