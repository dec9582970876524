"""Lookup vindex backfill: Vitess's ``LookupVindex create`` and ``externalize``.

A new lookup vindex over an owner table that already has rows goes through
these states, each recorded in the topo store's workflow record
(``lookup_vindex:<keyspace>.<vindex>``) before the next step starts:

``new``
    nothing done yet.
``write_only``
    the lookup table exists (``CREATE TABLE IF NOT EXISTS`` in the lookup
    keyspace, which must be unsharded) and the vindex is in the owner's
    VSchema with ``write_only: "true"``: every gate maintains it on every
    write of the owner table but never routes by it (the planner skips
    ``write_only`` vindexes). The workflow then waits ``settle_s`` so every
    gate watching the store has the new VSchema (the watcher polls every
    200 ms) before it copies anything.
``backfilling``
    the owner's rows are copied shard by shard, in ``(primary vindex column,
    from column)`` order, ``batch`` rows at a time: each batch is read with
    ``LOCK IN SHARE MODE`` in a transaction of the owner shard (so a writer
    changing or deleting one of those rows waits), its lookup rows are
    inserted with ``INSERT IGNORE`` (a row a writer already created stays),
    then the shard transaction ends and the shard's position (last key
    copied, rows copied) is saved. A process killed mid-batch redoes at most
    that batch: the inserts are idempotent.
``verified``
    :meth:`LookupVindexWorkflow.verify` compared every owner row with the
    lookup table: each owner row must have exactly its ``(value, keyspace
    id)`` row and the table no other row. The two tables are read one after
    the other, so each difference is checked again on its own: a row whose
    owner is gone (an orphan, which consistent lookups allow) is deleted if
    ``grace_s`` later no owner row holds its value and keyspace id; then a
    missing row is inserted if its owner row is still there, read under a
    shared lock on its shard. Two owner rows with one value of a unique
    vindex stop the workflow with ``FailedPrecondition``.
``externalized``
    after one more verification the ``write_only`` param is removed: the
    vindex routes (``EqualUnique`` for a unique one).

Invariants: the lookup rows the backfill writes always come from an owner row
read under a shared lock in the same step; the workflow record only moves
forward and only after the step it names is durable (the lookup rows are
committed before the position that covers them is saved).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardgate.auth.identity import TRUSTED
from shardgate.errors import FailedPrecondition, InvalidArgument, NotFound, Unsupported
from shardgate.evalengine.coerce import Kind
from shardgate.gate import Gate
from shardgate.sql.dialects import sql_dialect
from shardgate.sql.statements import AddColumnVindex
from shardgate.topo.server import TopoServer
from shardgate.topo.vschema_edits import add_column_vindex, set_vindex_params
from shardgate.vindexes import Lookup, SingleColumn

#: The lookup vindex types the workflow creates (Vitess's LookupVindex types).
TYPES = ("consistent_lookup_unique", "consistent_lookup", "lookup_unique", "lookup")
#: Rows read and written per step of the backfill.
DEFAULT_BATCH = 1000
#: Seconds to wait after the vindex is added, for every gate to see it.
DEFAULT_SETTLE_S = 2.0
#: Seconds between the two verification passes that must both see an orphan.
DEFAULT_GRACE_S = 1.0
#: Rows per INSERT statement of the lookup table.
INSERT_BATCH = 1000

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LookupVindexSpec:
    """What ``shardgate lookup-vindex create`` was asked for."""

    keyspace: str
    table: str
    columns: tuple[str, ...]
    vindex_type: str
    lookup_table: str  # keyspace.table
    name: str = ""  # the vindex name (default: the lookup table's name)
    column_type: str | None = None
    ignore_nulls: bool = False

    def __post_init__(self) -> None:
        if self.vindex_type not in TYPES:
            raise InvalidArgument(f"--type {self.vindex_type!r}: one of {list(TYPES)}")
        if len(self.columns) != 1:
            raise Unsupported("lookup-vindex create takes one --columns column for now")
        lks, _, lname = self.lookup_table.partition(".")
        for what, name in (("--keyspace", self.keyspace), ("--table-owner", self.table),
                           ("--columns", self.columns[0]), ("--lookup-table keyspace", lks),
                           ("--lookup-table table", lname)):
            if not _NAME.match(name):
                raise InvalidArgument(f"{what} {name!r}: letters, digits and '_' only "
                                      "(the lookup table is given as keyspace.table)")
        if not self.name:
            object.__setattr__(self, "name", lname)
        elif not _NAME.match(self.name):
            raise InvalidArgument(f"--name {self.name!r}: letters, digits and '_' only")

    @property
    def workflow(self) -> str:
        """The workflow record's name."""
        return f"lookup_vindex:{self.keyspace}.{self.name}"

    @property
    def column(self) -> str:
        return self.columns[0]

    @property
    def unique(self) -> bool:
        return self.vindex_type.endswith("_unique")

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["columns"] = list(self.columns)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> LookupVindexSpec:
        return cls(**{**doc, "columns": tuple(doc["columns"])})


@dataclass
class VerifyReport:
    """What one verification found (and repaired)."""

    owner_rows: int = 0
    lookup_rows: int = 0
    #: lookup rows the backfill inserted (all runs of the workflow; rows a writer
    #: created first are not counted)
    backfilled: int = 0
    missing: int = 0
    orphans: int = 0
    repaired_missing: int = 0
    deleted_orphans: int = 0
    conflicts: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """No conflict, and every difference repaired (or found to be a passing write)."""
        return not self.conflicts and self.missing == self.repaired_missing \
            and self.orphans == self.deleted_orphans


Progress = Callable[[int, int], None]


class LookupVindexWorkflow:
    """One lookup vindex backfill, resumable from its topo store record."""

    def __init__(self, gate: Gate, store: TopoServer, spec: LookupVindexSpec, *,
                 batch: int = DEFAULT_BATCH, settle_s: float = DEFAULT_SETTLE_S,
                 grace_s: float = DEFAULT_GRACE_S, progress: Progress | None = None) -> None:
        if batch < 1:
            raise InvalidArgument("batch must be at least 1")
        self.gate = gate
        self.store = store
        self.spec = spec
        self.batch = batch
        self.settle_s = settle_s
        self.grace_s = grace_s
        self.progress = progress
        self.doc: dict[str, Any] = {}
        self.version = 0
        #: lookup rows this process's backfill inserted
        self._inserted = 0

    @classmethod
    async def resume(cls, gate: Gate, store: TopoServer, keyspace: str, name: str,
                     **kwargs: Any) -> LookupVindexWorkflow:
        """The workflow of vindex ``keyspace.name`` from its record (NotFound if none)."""
        workflow = f"lookup_vindex:{keyspace}.{name}"
        found = await store.get_workflow(workflow)
        if found is None or found.doc is None:
            raise NotFound(f"no lookup-vindex workflow {workflow} in the topo store")
        return cls(gate, store, LookupVindexSpec.from_doc(found.doc["spec"]), **kwargs)

    # -- the record -------------------------------------------------------------

    async def load(self) -> dict[str, Any]:
        """The workflow record, created (state ``new``) if there is none."""
        found = await self.store.get_workflow(self.spec.workflow)
        if found is None or found.doc is None:
            self.doc = {"kind": "lookup_vindex", "spec": self.spec.to_doc(), "state": "new",
                        "shards": {}, "estimate": 0}
            self.version = await self.store.put_workflow(self.spec.workflow, self.doc, expect=0)
            return self.doc
        self.doc, self.version = found.doc, found.version
        recorded = LookupVindexSpec.from_doc(self.doc["spec"])
        if recorded != self.spec:
            raise FailedPrecondition(
                f"workflow {self.spec.workflow} exists with other arguments "
                f"({recorded.to_doc()}); resume it with the same ones"
            )
        return self.doc

    async def _save(self, **changes: Any) -> None:
        self.doc.update(changes)
        self.version = await self.store.put_workflow(self.spec.workflow, self.doc,
                                                     expect=self.version)

    # -- create -----------------------------------------------------------------

    async def create(self) -> VerifyReport:
        """Run (or resume) the workflow up to ``verified``."""
        await self.load()
        state = self.doc["state"]
        if state == "externalized":
            raise FailedPrecondition(f"workflow {self.spec.workflow} is already externalized")
        if state == "new":
            await self._create_table()
            await self._add_vindex()
            await self._save(state="write_only")
            await asyncio.sleep(self.settle_s)
            state = "write_only"
        if state in ("write_only", "backfilling"):
            if state == "write_only":
                await self._save(state="backfilling", estimate=await self._estimate())
            await self.backfill()
        report = await self.verify()
        report.backfilled = self.rows_inserted()
        if not report.clean:
            raise FailedPrecondition(
                f"workflow {self.spec.workflow}: verification failed: {report.conflicts[:5]}"
            )
        if self.doc["state"] != "verified":
            await self._save(state="verified")
        return report

    async def _create_table(self) -> None:
        lks, _, lname = self.spec.lookup_table.partition(".")
        if self.gate.vschema.keyspace(lks).sharded:
            raise Unsupported(
                f"lookup table keyspace {lks!r} is sharded: the workflow creates lookup "
                "tables in an unsharded keyspace only"
            )
        col_type = self.spec.column_type or _sql_type(
            (await self.gate.column_kinds(self.spec.keyspace, self.spec.table))
            .get(self.spec.column.lower()))
        key = self.spec.column if self.spec.unique else f"{self.spec.column}, keyspace_id"
        ddl = (f"CREATE TABLE IF NOT EXISTS {lname} ({self.spec.column} {col_type} NOT NULL, "
               f"keyspace_id VARBINARY(64) NOT NULL, PRIMARY KEY ({key}))")
        await self.gate.execute(self.gate.session(lks, identity=TRUSTED), ddl)

    async def _add_vindex(self) -> None:
        ks = self.gate.vschema.keyspace(self.spec.keyspace)
        table = ks.tables.get(self.spec.table)
        if table is None:
            raise NotFound(f"table {self.spec.keyspace}.{self.spec.table} is not in the VSchema")
        if any(cv.name == self.spec.name for cv in table.column_vindexes):
            return  # added before a crash
        params = {"table": self.spec.lookup_table, "from": self.spec.column,
                  "to": "keyspace_id", "write_only": "true", "owner": self.spec.table}
        if self.spec.ignore_nulls:
            params["ignore_nulls"] = "true"
        stmt = AddColumnVindex(None, self.spec.table, self.spec.name, self.spec.columns,
                               self.spec.vindex_type, tuple(params.items()))
        keyspace = self.spec.keyspace
        await self.gate.change_vschema(keyspace,
                                       lambda doc: add_column_vindex(doc, keyspace, stmt))

    # -- backfill ---------------------------------------------------------------

    def _primary(self) -> tuple[str, SingleColumn]:
        table = self.gate.vschema.keyspace(self.spec.keyspace).tables[self.spec.table]
        primary = table.primary
        if primary is None or len(primary.columns) != 1 \
                or not isinstance(primary.vindex, SingleColumn):
            raise Unsupported(
                f"table {self.spec.keyspace}.{self.spec.table}: the backfill needs a "
                "functional single-column primary vindex"
            )
        return primary.columns[0], primary.vindex

    async def _estimate(self) -> int:
        s = self.gate.session(self.spec.keyspace, identity=TRUSTED)
        res = await self.gate.execute(
            s, f"SELECT COUNT(*) FROM {self.spec.table} WHERE {self.spec.column} IS NOT NULL")
        return int(res.rows[0][0]) if res.rows else 0

    def rows_done(self) -> int:
        return sum(int(s.get("rows", 0)) for s in self.doc.get("shards", {}).values())

    def rows_inserted(self) -> int:
        """Lookup rows the backfill inserted so far (per shard in the record)."""
        return sum(int(s.get("inserted", 0)) for s in self.doc.get("shards", {}).values())

    async def backfill(self) -> None:
        """Copy the owner's rows into the lookup table, shard by shard, from the record."""
        for shard in self.gate.topology.keyspace(self.spec.keyspace).shards:
            pos = self.doc["shards"].setdefault(shard.name, {"done": False, "last": None,
                                                             "rows": 0})
            while not pos["done"]:
                before = self._inserted
                copied, last = await self._copy_batch(shard.name, pos["last"])
                pos["rows"] += copied
                pos["inserted"] = pos.get("inserted", 0) + self._inserted - before
                if last is None:
                    pos["done"] = True
                else:
                    pos["last"] = last
                await self._save()
                if self.progress is not None:
                    self.progress(self.rows_done(), int(self.doc.get("estimate", 0)))

    async def _copy_batch(self, shard: str, last: Sequence[Any] | None
                          ) -> tuple[int, list[Any] | None]:
        """One batch of ``shard`` after ``last``: (rows copied, the new last key or None)."""
        pcol, vindex = self._primary()
        col = self.spec.column
        gate = self.gate
        owner = gate.session(self.spec.keyspace, identity=TRUSTED)
        await gate.execute(owner, f"USE `{self.spec.keyspace}:{shard}`")
        where = f"{col} IS NOT NULL"
        binds: dict[str, Any] = {}
        if last is not None:
            where += f" AND ({pcol} > :p OR ({pcol} = :p AND {col} > :c))"
            binds = {"p": last[0], "c": last[1]}
        select = (f"SELECT {pcol}, {col} FROM {self.spec.table} WHERE {where} "
                  f"ORDER BY {pcol}, {col} LIMIT {self.batch} LOCK IN SHARE MODE")
        await gate.execute(owner, "BEGIN")
        try:
            rows = (await gate.execute(owner, select, binds)).rows
            if rows:
                ksids = vindex.map([r[0] for r in rows])
                await self._insert_lookup([(r[1], k[0]) for r, k in zip(rows, ksids, strict=True)
                                           if k])
        finally:
            await gate.execute(owner, "ROLLBACK")  # read only: releases the shared locks
        if len(rows) < self.batch:
            return len(rows), None
        return len(rows), [_jsonable(rows[-1][0]), _jsonable(rows[-1][1])]

    async def _insert_lookup(self, pairs: Sequence[tuple[Any, bytes]]) -> None:
        """Insert lookup rows, keeping rows already there (the lookup keyspace's one
        shard, through its tablet: the gate would only parse and route the same rows)."""
        lks, _, lname = self.spec.lookup_table.partition(".")
        shard = self.gate.topology.keyspace(lks).shards[0].name
        client = self.gate.tablets[(lks, shard)]
        head, tail = sql_dialect(client.dialect).insert_ignore()
        for i in range(0, len(pairs), INSERT_BATCH):
            part = pairs[i:i + INSERT_BATCH]
            mark = client.placeholder
            values = ", ".join(f"({mark}, {mark})" for _ in part)
            params = [x for v, k in part for x in (v, k)]
            done = await client.execute(
                f"{head} {lname} ({self.spec.column}, keyspace_id) VALUES {values}{tail}",
                params)
            self._inserted += done.rows_affected

    # -- verify -----------------------------------------------------------------

    async def _owner_pairs(self) -> dict[tuple[Any, bytes], None]:
        pcol, vindex = self._primary()
        out: dict[tuple[Any, bytes], None] = {}
        for shard in self.gate.topology.keyspace(self.spec.keyspace).shards:
            s = self.gate.session(self.spec.keyspace, identity=TRUSTED)
            await self.gate.execute(s, f"USE `{self.spec.keyspace}:{shard.name}`")
            rows = (await self.gate.execute(
                s, f"SELECT {pcol}, {self.spec.column} FROM {self.spec.table} "
                   f"WHERE {self.spec.column} IS NOT NULL")).rows
            for r, ks in zip(rows, vindex.map([r[0] for r in rows]), strict=True):
                if ks:
                    out[(_key(r[1]), ks[0])] = None
        return out

    async def _lookup_pairs(self) -> dict[tuple[Any, bytes], None]:
        lks, _, lname = self.spec.lookup_table.partition(".")
        rows = (await self.gate.execute(
            self.gate.session(lks, identity=TRUSTED),
            f"SELECT {self.spec.column}, keyspace_id FROM {lname}")).rows
        return {(_key(r[0]), bytes(r[1])): None for r in rows}

    async def verify(self, *, repair: bool = True) -> VerifyReport:
        """Compare the owner table with the lookup table (see the module docstring).

        The two are read one after the other, so with writers running a
        difference may be a write that happened in between: each one is
        checked again on its own, on the owner's shard, before anything is
        repaired or reported.
        """
        report = VerifyReport()
        owner, lookup = await self._owner_pairs(), await self._lookup_pairs()
        report.owner_rows, report.lookup_rows = len(owner), len(lookup)
        missing = [p for p in owner if p not in lookup]
        orphans = [p for p in lookup if p not in owner]
        report.missing, report.orphans = len(missing), len(orphans)
        if self.spec.unique:
            seen: dict[Any, bytes] = {}
            twice = {v for v, k in owner if seen.setdefault(v, k) != k}
            for v in sorted(twice, key=repr):
                rows = await self._owners_of(v)
                if len({k for _, k in rows}) > 1:
                    report.conflicts.append(
                        f"value {v!r} of unique vindex {self.spec.name} is in {len(rows)} "
                        "owner rows")
        if not repair or report.conflicts:
            return report
        if orphans:  # first: a unique value's orphan row blocks its owner's new row
            await asyncio.sleep(self.grace_s)  # a writer's pre-created row gets its owner
        for v, k in orphans:
            if k in {kk for _, kk in await self._owners_of(v)}:
                report.orphans -= 1  # its owner row came meanwhile
            elif await self._delete_orphan(v, k):
                report.deleted_orphans += 1
            else:
                report.orphans -= 1  # gone meanwhile
        for v, k in missing:
            if await self._repair_one(v, k):
                report.repaired_missing += 1
            else:
                report.missing -= 1  # the owner row changed meanwhile: not missing
        return report

    async def _owners_of(self, value: Any) -> list[tuple[Any, bytes]]:
        """``(primary value, keyspace id)`` of the owner rows holding ``value`` now."""
        pcol, vindex = self._primary()
        s = self.gate.session(self.spec.keyspace, identity=TRUSTED)
        rows = (await self.gate.execute(
            s, f"SELECT {pcol} FROM {self.spec.table} WHERE {self.spec.column} = :v",
            {"v": value})).rows
        return [(r[0], k[0]) for r, k in zip(rows, vindex.map([r[0] for r in rows]),
                                             strict=True) if k]

    async def _repair_one(self, value: Any, ksid: bytes) -> bool:
        """Insert the lookup row of the owner row ``(value, ksid)`` if it is still there,
        read under a shared lock on its shard (as the backfill does)."""
        pcol, vindex = self._primary()
        ks = self.gate.topology.keyspace(self.spec.keyspace)
        shard = ks.shard_map.find(ksid)
        s = self.gate.session(self.spec.keyspace, identity=TRUSTED)
        await self.gate.execute(s, f"USE `{self.spec.keyspace}:{shard}`")
        await self.gate.execute(s, "BEGIN")
        try:
            rows = (await self.gate.execute(
                s, f"SELECT {pcol} FROM {self.spec.table} WHERE {self.spec.column} = :v "
                   "LOCK IN SHARE MODE", {"v": value})).rows
            if not any(k and k[0] == ksid for k in vindex.map([r[0] for r in rows])):
                return False
            await self._insert_lookup([(value, ksid)])
            return True
        finally:
            await self.gate.execute(s, "ROLLBACK")

    async def _delete_orphan(self, value: Any, ksid: bytes) -> bool:
        """Delete the lookup row ``(value, ksid)``; whether there was one."""
        lks, _, lname = self.spec.lookup_table.partition(".")
        res = await self.gate.execute(
            self.gate.session(lks, identity=TRUSTED),
            f"DELETE FROM {lname} WHERE {self.spec.column} = :v AND keyspace_id = :k",
            {"v": value, "k": ksid})
        return res.rows_affected > 0

    # -- externalize ------------------------------------------------------------

    async def externalize(self) -> VerifyReport:
        """Verify once more, then let the vindex route (drop ``write_only``)."""
        await self.load()
        if self.doc["state"] == "externalized":
            return VerifyReport()
        if self.doc["state"] != "verified":
            raise FailedPrecondition(
                f"workflow {self.spec.workflow} is {self.doc['state']!r}: run "
                "`shardgate lookup-vindex create` with the same arguments to finish it first"
            )
        report = await self.verify()
        if not report.clean:
            raise FailedPrecondition(
                f"workflow {self.spec.workflow}: verification failed: {report.conflicts[:5]}"
            )
        keyspace, name = self.spec.keyspace, self.spec.name
        await self.gate.change_vschema(
            keyspace, lambda doc: set_vindex_params(doc, keyspace, name, {"write_only": None}))
        vindex = self.gate.vschema.keyspace(keyspace).vindexes.get(name)
        if not isinstance(vindex, Lookup) or vindex.write_only:
            raise FailedPrecondition(f"vindex {keyspace}.{name} is still write_only")
        await self._save(state="externalized")
        return report


def _sql_type(kind: Kind | None) -> str:
    match kind:
        case Kind.INTEGER:
            return "BIGINT"
        case Kind.TEXT | Kind.CHAR:
            return "VARCHAR(255)"
    raise InvalidArgument(
        "cannot tell the lookup column's type from the owner table: give --column-type"
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raise Unsupported("binary key columns are not supported by the backfill yet")
    return value


def _key(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray | memoryview) else value
