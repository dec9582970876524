"""Segmented store pieces that need no database: options, names, ordering of status rows."""

from __future__ import annotations

import pytest

from shardgate.errors import InvalidArgument
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.ddl import (
    SegmentedNames,
    check_queue_name,
    dataset_ddl,
    status_seq,
    view_ddl,
)
from shardgate.queues.segmented.store import job_bytes, pg_array


def test_storage_option() -> None:
    assert QueueOptions().storage == "table"
    opts = QueueOptions.from_mapping({"storage": "Segmented", "dataset_max_rows": "500"})
    assert opts.storage == "segmented" and opts.dataset_max_rows == 500
    assert opts.to_mapping() == {"storage": "segmented", "dataset_max_rows": 500}
    with pytest.raises(InvalidArgument, match="storage"):
        QueueOptions.from_mapping({"storage": "heap"})
    with pytest.raises(InvalidArgument, match="dataset_max_rows"):
        QueueOptions.from_mapping({"dataset_max_rows": 0})


def test_queue_names() -> None:
    assert check_queue_name("Events_1") == "events_1"
    for bad in ("", "1abc", "a-b", "x" * 41, "a b"):
        with pytest.raises(InvalidArgument):
            check_queue_name(bad)
    names = SegmentedNames("ev", "mysql")
    assert names.jobs(2001) == "ev_jobs_2001" and names.status(3) == "ev_job_status_3"
    assert SegmentedNames("ev", "postgres").view == "ev_job_state"


def test_status_rows_order() -> None:
    # within an attempt: executing < failed < succeeded/aborted < pending (operator retry);
    # every row of the next attempt after all of them
    a1 = [status_seq(1, s) for s in ("executing", "failed", "aborted", "pending")]
    assert a1 == sorted(a1) and len(set(a1)) == 4
    assert status_seq(1, "succeeded") == status_seq(1, "aborted")
    assert status_seq(2, "executing") > max(a1)


def test_status_tables_have_no_index() -> None:
    for dialect in ("postgres", "mysql", "sqlite"):
        stmts = dataset_ddl(SegmentedNames("ev", dialect), 1000)
        status = [s for s in stmts if "job_status" in s]
        assert len(status) == 1 and "PRIMARY KEY" not in status[0] and "INDEX" not in status[0]


def test_view_over_datasets() -> None:
    (stmt,) = view_ddl(SegmentedNames("ev", "mysql"), [2000, 1000])
    assert stmt.startswith("CREATE OR REPLACE VIEW ev_job_state AS SELECT 1000 AS dataset")
    assert stmt.count("UNION ALL") == 1
    drop, create = view_ddl(SegmentedNames("ev", "sqlite"), [])
    assert drop.startswith("DROP VIEW") and "WHERE 1 = 0" in create


def test_pg_array_literals() -> None:
    assert pg_array([1, 2, 30]) == "{1,2,30}"
    assert pg_array(['a"b', "c\\d", None, "x,y"]) == '{"a\\"b","c\\\\d",NULL,"x,y"}'
    assert job_bytes("k", None) < job_bytes("k", "payload")
