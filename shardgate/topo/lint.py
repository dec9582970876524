"""Checking a VSchema document before it is saved: errors and doubts.

* **errors** (red): the document does not compile into the topology (the same
  check the topo store runs before writing, :func:`shardgate.topo.server.check_with`);
  each names its JSON path.
* **warnings** (yellow): it compiles but looks wrong: a table that owns a
  lookup vindex without using it, a lookup vindex nobody owns, a vindex no
  table uses, a sharded table whose primary vindex is not unique, a lookup
  whose table is not in any VSchema.
"""

from __future__ import annotations

from typing import Any

from shardgate.errors import InvalidArgument, VSchemaError
from shardgate.topo.model import Topology
from shardgate.topo.server import check_with
from shardgate.vindexes.registry import describe_types
from shardgate.vschema import TableType


def _finding(path: str, message: str) -> dict[str, str]:
    return {"path": path, "message": message}


def check_vschema(topology: Topology, keyspace: str, doc: Any) -> dict[str, list[dict[str, str]]]:
    """``{"errors": [...], "warnings": [...]}`` for ``doc`` as keyspace ``keyspace``'s VSchema."""
    if keyspace not in topology.keyspaces:
        return {"errors": [_finding("", f"keyspace {keyspace!r} does not exist")], "warnings": []}
    if not isinstance(doc, dict):
        return {"errors": [_finding("", "a VSchema must be a JSON object")], "warnings": []}
    spec = topology.keyspace(keyspace)
    candidate: dict[str, Any] = {"shards": {s.name: s.url for s in spec.shards}, "vschema": doc}
    if spec.collation:
        candidate["collation"] = spec.collation
    try:
        new = check_with(topology, keyspace, candidate)
    except VSchemaError as exc:
        path = exc.path.removeprefix(keyspace).removeprefix(".")
        return {"errors": [_finding(path, exc.problem)], "warnings": []}
    except InvalidArgument as exc:
        return {"errors": [_finding("", exc.message)], "warnings": []}
    return {"errors": [], "warnings": _warnings(new, keyspace, doc)}


def _warnings(topology: Topology, keyspace: str, doc: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    lookups = {d["type"] for d in describe_types() if d["lookup"]}
    vindexes: dict[str, Any] = doc.get("vindexes") or {}
    tables: dict[str, Any] = doc.get("tables") or {}
    used: dict[str, list[str]] = {}
    for tname, table in tables.items():
        cvs = (table or {}).get("column_vindexes") or []
        for cv in cvs:
            used.setdefault(cv.get("name", ""), []).append(tname)
        kind = (table or {}).get("type", "")
        if doc.get("sharded") and not cvs and kind not in (TableType.REFERENCE, TableType.SEQUENCE):
            out.append(_finding(f"tables.{tname}", "a sharded table with no vindex: every "
                                "query on it is a scatter and inserts cannot be routed"))
        if doc.get("sharded") and cvs:
            first = vindexes.get(cvs[0].get("name", ""), {})
            if first.get("type") in lookups:
                out.append(_finding(f"tables.{tname}.column_vindexes[0]",
                                    f"the primary vindex {cvs[0].get('name')!r} is a lookup; "
                                    "a primary vindex should be a unique functional one (hash)"))
    known_tables = {f"{ks.name}.{t}" for ks in topology.keyspaces.values()
                    for t in (ks.vschema.get("tables") or {})}
    for vname, vindex in vindexes.items():
        owner = (vindex or {}).get("owner")
        vtype = (vindex or {}).get("type", "")
        path = f"vindexes.{vname}"
        if owner and vname not in [cv.get("name") for cv in
                                   (tables.get(owner, {}) or {}).get("column_vindexes", [])]:
            out.append(_finding(f"{path}.owner", f"table {owner!r} owns this vindex but does not "
                                "use it in its column_vindexes: nothing maintains its rows"))
        if vtype in lookups and not owner:
            out.append(_finding(path, "a lookup vindex without an owner: no table writes its "
                                "rows, so it finds only what something else put there"))
        if vname not in used:
            out.append(_finding(path, "no table uses this vindex"))
        table = ((vindex or {}).get("params") or {}).get("table")
        if vtype in lookups and table and "." in table and table not in known_tables:
            out.append(_finding(f"{path}.params.table",
                                f"lookup table {table!r} is not in any keyspace's VSchema"))
    return out
