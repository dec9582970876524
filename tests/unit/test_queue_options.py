"""Queue options, comment markers and CREATE QUEUE parsing (pure)."""

from __future__ import annotations

import pytest

from shardgate.errors import InvalidArgument
from shardgate.queues.ddl import is_create_queue, parse_create_queue, queue_table_ddl
from shardgate.queues.options import QueueOptions, parse_comment
from shardgate.queues.table.manager import followup_id


def test_defaults_and_round_trip_through_comment() -> None:
    opts = QueueOptions.from_mapping({"ack_wait": 5, "max_in_flight": "10", "ordering_key": "K"})
    assert opts.ack_wait == 5.0 and opts.max_in_flight == 10 and opts.ordering_key == "k"
    comment = opts.to_comment()
    assert comment.startswith("shardgate_queue,")
    assert parse_comment(comment) == opts
    assert parse_comment("just a table") is None


@pytest.mark.parametrize(
    "doc",
    [{"nope": 1}, {"ack_wait": "soon"}, {"batch_size": -1}, {"ack_wait": 0},
     {"min_backoff": 10, "max_backoff": 1}, {"ordering_key": 3}],
)
def test_bad_options_are_refused(doc: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        QueueOptions.from_mapping(doc)


def test_parse_create_queue() -> None:
    sql = ("create queue if not exists app.jobs (user_id bigint not null, body text) "
           "shard by user_id using xx with (ack_wait = 2, ordering_key = 'user_id')")
    assert is_create_queue(sql) and not is_create_queue("create table q (a int)")
    cq = parse_create_queue(sql)
    assert (cq.name, cq.keyspace, cq.if_not_exists) == ("jobs", "app", True)
    assert (cq.shard_column, cq.vindex) == ("user_id", "xx")
    assert cq.options.ack_wait == 2 and cq.options.ordering_key == "user_id"
    assert cq.vschema_table() == {
        "type": "queue",
        "queue": {"ack_wait": 2, "ordering_key": "user_id"},
        "column_vindexes": [{"column": "user_id", "name": "xx"}],
    }


@pytest.mark.parametrize(
    "sql",
    ["create queue q (id bigint)", "create queue q (a int) shard by b",
     "create queue q (a int) with (ordering_key = b)", "create queue q (a int) junk",
     "create queue q (a int"],
)
def test_bad_create_queue(sql: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_create_queue(sql)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_ddl_has_mandatory_columns_scan_indexes_and_marker(dialect: str) -> None:
    cq = parse_create_queue("create queue q (k bigint) with (group_key = k)")
    stmts = queue_table_ddl("q", cq.columns, cq.options, dialect)
    text = "\n".join(stmts)
    for col in ("id", "time_scheduled", "time_next", "epoch", "state", "time_acked",
                "priority"):
        assert col in stmts[0]
    assert "time_next BIGINT NOT NULL DEFAULT 0" in stmts[0]
    if dialect == "mysql":  # no partial indexes: the state leads each scan index
        assert "(state, time_scheduled)" in text and "(state, time_next)" in text
    else:  # one partial index per scanned state
        assert "ON q (time_scheduled) WHERE state = 'to_be_fired'" in text
        assert "ON q (time_next) WHERE state = 'fired'" in text
        assert "ON q (time_next) WHERE state = 'acked'" in text
    assert "shardgate_queue,group_key=k" in text


def test_followup_id_is_stable_and_positive() -> None:
    assert followup_id("q", 7) == followup_id("q", 7) > 0
    assert followup_id("q", 7) != followup_id("q", 8)
