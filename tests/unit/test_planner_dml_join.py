"""Multi-table DELETE/UPDATE on sharded tables (issue 13, item 17)."""

from __future__ import annotations

import pytest

from shardgate.errors import ShardgateError
from shardgate.planner import build_plan
from shardgate.sql.parse import parse

from .recording import VSCHEMA


def _plan(sql: str) -> dict[str, object]:
    described: dict[str, object] = build_plan(parse(sql), sql, VSCHEMA, "user").describe()
    return described["Instructions"]  # type: ignore[return-value]


def test_delete_joined_on_the_primary_vindex_runs_on_each_shard_as_exists() -> None:
    plan = _plan("delete u from user_extra u join music m on u.user_id = m.user_id "
                 "where u.user_id = 1 and m.col = 2")
    assert plan["Variant"] == "EqualUnique" and plan["Values"] == ["1"]
    assert plan["Query"] == (
        "DELETE FROM user_extra WHERE user_extra.user_id = 1 AND EXISTS(SELECT 1 FROM music "
        "AS m WHERE user_extra.user_id = m.user_id AND m.col = 2)"
    )


def test_update_joined_on_the_primary_vindex_sets_unqualified_columns() -> None:
    plan = _plan("update user_extra u join music m on u.user_id = m.user_id "
                 "set u.v = u.v + 1 where m.id = 4")
    assert plan["Variant"] == "Scatter"
    assert plan["Query"] == (
        "UPDATE user_extra SET v = user_extra.v + 1 WHERE EXISTS(SELECT 1 FROM music AS m "
        "WHERE user_extra.user_id = m.user_id AND m.id = 4)"
    )


@pytest.mark.parametrize("sql", [
    "update user_extra u join music m on u.col = m.col set u.v = 1",  # not co-located
    "update user_extra u join music m on u.user_id = m.user_id set u.v = m.v",  # reads m
    "delete u, m from user_extra u join music m on u.user_id = m.user_id",  # two targets
    "delete u from user_extra u left join music m on u.user_id = m.user_id",  # outer join
])
def test_what_cannot_run_as_one_statement_is_refused(sql: str) -> None:
    with pytest.raises(ShardgateError) as caught:
        _plan(sql)
    assert caught.value.code.name == "UNIMPLEMENTED"
