"""The cluster's topology as records of a topo store, read and changed safely.

Each keyspace is one ``keyspace`` record whose document has the shape of a
keyspace in the cluster file (``shards``, ``vschema``, ``collation``); the
``cluster/global`` record holds ``default_keyspace`` and ``routing_rules``.
So a cluster file imports record by record, and a topology read back is the
same :class:`~shardgate.topo.model.Topology` the file would give.

Invariants:

* Nothing invalid is saved: every change is applied to a copy of the whole
  topology and checked (shards, then every VSchema with routing rules) before
  its record is written; a refusal names the JSON path and writes nothing.
* A change never overwrites one it did not see: writes are compare-and-swap
  on the version that was read (:class:`~shardgate.topo.store.TopoConflict`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from shardgate.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from shardgate.topo.model import Topology
from shardgate.topo.store import Record, TopoConflict, TopoStore

GLOBAL = "global"


class TopoServer:
    """Topology, VSchemas and workflow records on top of a :class:`TopoStore`."""

    def __init__(self, store: TopoStore) -> None:
        self.store = store

    @property
    def location(self) -> str:
        return self.store.location

    async def load_topology(self) -> Topology:
        """The current topology; FailedPrecondition if the store holds no keyspace."""
        clock, records = await self.store.changes_since(0)
        live = [r for r in records if r.doc is not None]
        if not any(r.kind == "keyspace" for r in live):
            raise FailedPrecondition(
                f"the topo store at {self.location} holds no keyspaces; seed it with "
                "`shardgate topo import cluster.yaml`"
            )
        return topology_from_records(live, clock)

    async def is_empty(self) -> bool:
        return not await self.store.list_records("keyspace")

    async def import_topology(self, topo: Topology, *, replace: bool = False) -> int:
        """Write every keyspace of ``topo`` (and the global record); return the clock.

        Without ``replace`` a keyspace already in the store is AlreadyExists
        (nothing written); with it, keyspaces not in ``topo`` are deleted.
        """
        doc = topo.to_dict()
        existing = {r.name: r.version for r in await self.store.list_records("keyspace")}
        if not replace:
            clash = sorted(set(existing) & set(doc["keyspaces"]))
            if clash:
                raise AlreadyExists(
                    f"keyspaces {clash} are already in the topo store at {self.location}; "
                    "use --replace to overwrite them"
                )
        version = 0
        for name, spec in doc["keyspaces"].items():
            version = await self.store.put("keyspace", name, spec)
        if replace:
            for name in set(existing) - set(doc["keyspaces"]):
                version = await self.store.delete("keyspace", name)
        glob: dict[str, Any] = {
            k: doc[k] for k in ("default_keyspace", "routing_rules") if k in doc
        }
        if glob or replace:
            version = await self.store.put("cluster", GLOBAL, glob)
        return version

    async def keyspace_vschema(self, keyspace: str) -> tuple[dict[str, Any], int]:
        """The VSchema document of ``keyspace`` and its record's version."""
        rec = await self._keyspace(keyspace)
        assert rec.doc is not None
        return copy.deepcopy(rec.doc.get("vschema", {})), rec.version

    async def update_vschema(
        self,
        keyspace: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        expect: int | None = None,
        dry_run: bool = False,
    ) -> tuple[Topology, int]:
        """Apply ``change`` to the keyspace's VSchema, check it, save it.

        Returns the new topology and the record's new version (the old one
        with ``dry_run``, or when ``change`` leaves the VSchema as it was: nothing
        is written, no gate reloads). ``expect=None`` re-reads and re-applies ``change``
        when another writer got in first; ``expect=N`` raises TopoConflict
        unless the keyspace record is still at version N.
        """
        while True:
            current = await self.load_topology()
            rec = await self._keyspace(keyspace)
            assert rec.doc is not None
            if expect is not None and rec.version != expect:
                raise TopoConflict(
                    f"the VSchema of keyspace {keyspace!r} changed concurrently: expected "
                    f"version {expect}, it is at {rec.version}; read it again and retry"
                )
            spec = copy.deepcopy(rec.doc)
            new_vschema = change(copy.deepcopy(spec.get("vschema", {})))
            if not isinstance(new_vschema, dict):
                raise InvalidArgument(f"the VSchema of keyspace {keyspace!r} must be an object")
            unchanged = new_vschema == spec.get("vschema", {})
            spec["vschema"] = new_vschema
            candidate = check_with(current, keyspace, spec)
            if dry_run or unchanged:  # a no-op change saves nothing: the version stays
                return candidate, rec.version
            try:
                version = await self.store.put("keyspace", keyspace, spec, expect=rec.version)
            except TopoConflict:
                if expect is not None:
                    raise
                continue
            candidate.version = version
            return candidate, version

    async def put_keyspace(self, name: str, spec: dict[str, Any], *, expect: int | None) -> int:
        """Write a whole keyspace record (shards and VSchema), checked first."""
        current = await self.load_topology()
        check_with(current, name, spec)
        return await self.store.put("keyspace", name, spec, expect=expect)

    async def update_routing_rules(self, change: Callable[[dict[str, Any]], object]) -> int:
        """Apply ``change`` to the routing rules document (``{"rules": [...],
        "read_rules": [...]}``) of the ``cluster/global`` record, check the
        whole VSchema with it, save it (compare-and-swap, re-applied when another
        writer got in first); return the new version."""
        while True:
            current = await self.load_topology()
            rec = await self.store.get("cluster", GLOBAL)
            doc: dict[str, Any] = copy.deepcopy(rec.doc) if rec is not None and rec.doc else {}
            rules: dict[str, Any] = copy.deepcopy(doc.get("routing_rules") or {})
            change(rules)
            rules = {k: v for k, v in rules.items() if v}
            if rules:
                doc["routing_rules"] = rules
            else:
                doc.pop("routing_rules", None)
            trial = current.to_dict()
            trial["routing_rules"] = rules
            Topology.from_dict(trial, path="topo").build_vschema()
            try:
                return await self.store.put("cluster", GLOBAL, doc,
                                            expect=rec.version if rec is not None else 0)
            except TopoConflict:
                continue

    # -- workflows ----------------------------------------------------------------

    async def get_workflow(self, name: str) -> Record | None:
        return await self.store.get("workflow", name)

    async def list_workflows(self) -> list[Record]:
        return await self.store.list_records("workflow")

    async def put_workflow(self, name: str, doc: dict[str, Any], *, expect: int | None) -> int:
        return await self.store.put("workflow", name, doc, expect=expect)

    async def delete_workflow(self, name: str, *, expect: int | None = None) -> int:
        return await self.store.delete("workflow", name, expect=expect)

    async def _keyspace(self, name: str) -> Record:
        rec = await self.store.get("keyspace", name)
        if rec is None:
            known = sorted(r.name for r in await self.store.list_records("keyspace")
                           if r.doc is not None)
            raise NotFound(f"keyspace {name!r} is not in the topo store at {self.location}; "
                           f"keyspaces: {known}")
        return rec

    async def close(self) -> None:
        await self.store.close()


def topology_from_records(records: list[Record], version: int) -> Topology:
    """The topology the live ``keyspace`` and ``cluster`` records describe."""
    doc: dict[str, Any] = {"keyspaces": {}}
    for r in records:
        if r.doc is None:
            continue
        if r.kind == "keyspace":
            doc["keyspaces"][r.name] = copy.deepcopy(r.doc)
        elif r.kind == "cluster" and r.name == GLOBAL:
            doc.update(copy.deepcopy(r.doc))
    topo = Topology.from_dict(doc, path="topo")
    topo.version = version
    return topo


def check_with(current: Topology, keyspace: str, spec: dict[str, Any]) -> Topology:
    """``current`` with keyspace ``keyspace`` replaced by ``spec``, fully checked."""
    doc = current.to_dict()
    doc["keyspaces"][keyspace] = spec
    topo = Topology.from_dict(doc, path="topo")
    topo.build_vschema()
    return topo
