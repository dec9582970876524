"""Routing golden files: SQL -> plan JSON, one case per line of data.

Each ``tests/unit/golden/*_cases.jsonl`` line is ``{"comment", "query", "plan"}``
(Vitess's planbuilder testdata shape), or ``{"comment", "query", "error"}`` for
statements that must be refused; ``"keyspace"`` sets the default keyspace
(``user`` when absent). The VSchema is ``golden/vschema.json``; the columns the
gate tracked from the shards (:mod:`shardgate.sql.schema`) are
``golden/schema.json`` (``"untracked": true``: planned before any were read).

To add a case, append a line with ``"plan": null`` and run
``python tests/unit/test_golden_routing.py --regen``, then review the diff:
the expectation is only accepted once a person has read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardgate.errors import ShardgateError
from shardgate.planner import build_plan
from shardgate.sql.parse import parse
from shardgate.sql.schema import ColumnInfo, KeyspaceSchema, Schema, TableColumns
from shardgate.vschema import VSchema

GOLDEN = Path(__file__).parent / "golden"


def _vschema() -> VSchema:
    return VSchema.from_json(json.loads((GOLDEN / "vschema.json").read_text()))


def _schema() -> Schema:
    """``golden/schema.json``: ``{keyspace: {table: [column, ...]}}``."""
    doc = json.loads((GOLDEN / "schema.json").read_text())
    return Schema({
        ks: KeyspaceSchema.of(TableColumns(t, tuple(ColumnInfo(c) for c in cols))
                              for t, cols in tables.items())
        for ks, tables in doc.items()
    })


def _cases() -> list[tuple[Path, int, dict[str, Any]]]:
    out = []
    for f in sorted(GOLDEN.glob("*_cases.jsonl")):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if line.strip():
                out.append((f, i, json.loads(line)))
    return out


def _outcome(vschema: VSchema, case: dict[str, Any]) -> dict[str, Any]:
    if not case.get("untracked"):
        vschema = vschema.with_schema(_schema())
    try:
        plan = build_plan(
            parse(case["query"]), case["query"], vschema, case.get("keyspace", "user")
        )
    except ShardgateError as exc:
        return {"error": str(exc)}
    return {"plan": plan.describe()["Instructions"]}


CASES = _cases()


@pytest.mark.parametrize("path,line,case", CASES, ids=[f"{p.stem}:{i}" for p, i, _ in CASES])
def test_golden(path: Path, line: int, case: dict[str, Any]) -> None:
    got = _outcome(_vschema(), case)
    expected = {k: case[k] for k in ("plan", "error") if k in case}
    assert got == expected, f"{path.name}:{line} {case['comment']}"


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 300


def regenerate() -> None:
    """Rewrite every case file with the current outcomes (review the diff!)."""
    vschema = _vschema()
    for f in sorted(GOLDEN.glob("*_cases.jsonl")):
        lines = []
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            case = json.loads(line)
            case.pop("plan", None)
            case.pop("error", None)
            case.update(_outcome(vschema, case))
            lines.append(json.dumps(case, sort_keys=False))
        f.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--regen"]:
        sys.exit("usage: python tests/unit/test_golden_routing.py --regen")
    regenerate()
