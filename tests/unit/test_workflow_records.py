"""Workflow records written before workflows/base.py resume with it (issue 33 part 1).

The documents below are what ``ReshardSpec.to_doc`` and ``MoveTablesSpec.to_doc``
wrote when ``MoveTablesWorkflow`` subclassed ``ReshardWorkflow``: the same JSON
fields must read back into the same spec and record name, and write out unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shardgate.errors import InvalidArgument, NotFound
from shardgate.topo.server import TopoServer
from shardgate.topo.store import MemoryTopoStore
from shardgate.workflows.base import Workflow, WorkflowSpec
from shardgate.workflows.movetables import MoveTablesSpec, MoveTablesWorkflow
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow

RESHARD_SPEC: dict[str, Any] = {
    "keyspace": "app", "sources": ["-80"], "targets": ["-40", "40-80"],
    "target_urls": {"-40": "sqlite:///a.db", "40-80": "sqlite:///b.db"}, "workflow": "wf"}
MOVETABLES_SPEC: dict[str, Any] = {
    "keyspace": "commerce", "sources": ["-"], "targets": ["-80", "80-"],
    "target_urls": {"-80": "sqlite:///c.db", "80-": "sqlite:///d.db"},
    "workflow": "mt", "target_keyspace": "customer", "tables": ["customer", "orders"]}


def _record(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "spec": spec, "state": "running", "tables": ["t"],
            "streams": {s: {"state": "running", "pos": "7", "lag_s": 0.0, "error": None,
                            "tables": {"t": {"last": None, "done": True, "rows": 3}}}
                        for s in spec["sources"]},
            "estimate": 3, "started": 1.0, "runner": None, "reads_switched": True}


def test_specs_read_and_write_the_old_documents() -> None:
    reshard = ReshardSpec.from_doc(RESHARD_SPEC)
    assert reshard.to_doc() == RESHARD_SPEC
    assert (reshard.record, reshard.journal) == ("reshard:app.wf", "journal:reshard:app.wf")
    moves = MoveTablesSpec.from_doc(MOVETABLES_SPEC)
    assert moves.to_doc() == MOVETABLES_SPEC
    assert moves.record == "movetables:customer.mt"
    assert moves.tables == ("customer", "orders")


def test_specs_keep_their_checks() -> None:
    with pytest.raises(InvalidArgument, match="both a source and a target"):
        ReshardSpec.from_doc({**RESHARD_SPEC, "targets": ["-80"],
                              "target_urls": {"-80": "sqlite:///a.db"}})
    with pytest.raises(InvalidArgument, match="cover exactly"):
        ReshardSpec.from_doc({**RESHARD_SPEC, "targets": ["-40"],
                              "target_urls": {"-40": "sqlite:///a.db"}})
    with pytest.raises(InvalidArgument, match="keyspaces must differ"):
        MoveTablesSpec.from_doc({**MOVETABLES_SPEC, "target_keyspace": "commerce"})
    with pytest.raises(InvalidArgument, match="--target-url"):
        MoveTablesSpec.from_doc({**MOVETABLES_SPEC, "target_urls": {"-80": "sqlite:///c"}})


def test_movetables_is_a_workflow_not_a_reshard() -> None:
    assert issubclass(MoveTablesWorkflow, Workflow)
    assert issubclass(ReshardWorkflow, Workflow)
    assert not issubclass(MoveTablesWorkflow, ReshardWorkflow)
    assert not issubclass(MoveTablesSpec, ReshardSpec)
    assert issubclass(MoveTablesSpec, WorkflowSpec)


async def test_old_records_resume() -> None:
    server = TopoServer(MemoryTopoStore())
    old_reshard = _record("reshard", RESHARD_SPEC)
    old_moves = {**_record("movetables", MOVETABLES_SPEC),
                 "target_vschema": {"tables": {"customer": {}, "orders": {}}, "vindexes": {}}}
    await server.put_workflow("reshard:app.wf", copy.deepcopy(old_reshard), expect=0)
    await server.put_workflow("movetables:customer.mt", copy.deepcopy(old_moves), expect=0)

    reshard = await ReshardWorkflow.resume(server, "app", "wf")
    assert reshard.spec == ReshardSpec.from_doc(RESHARD_SPEC)
    assert (reshard.state, reshard.doc) == ("running", old_reshard)
    moves = await MoveTablesWorkflow.resume(server, "customer", "mt")
    assert moves.spec == MoveTablesSpec.from_doc(MOVETABLES_SPEC)
    assert (moves.state, moves.doc) == ("running", old_moves)

    # a save keeps every field and adds only the lease
    await moves._save()
    found = await server.get_workflow("movetables:customer.mt")
    assert found is not None and found.doc is not None
    assert {k: v for k, v in found.doc.items() if k != "runner"} == \
        {k: v for k, v in old_moves.items() if k != "runner"}
    assert found.doc["runner"]["pid"] > 0
    await moves.release()

    with pytest.raises(NotFound, match=r"no MoveTables workflow movetables:customer\.movetables"):
        await MoveTablesWorkflow.resume(server, "customer")
    with pytest.raises(NotFound, match=r"no reshard workflow reshard:app\.reshard"):
        await ReshardWorkflow.resume(server, "app")
