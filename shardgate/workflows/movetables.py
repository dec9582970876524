"""Vertical resharding: Vitess's ``MoveTables`` (tables from one keyspace to another).

A MoveTables workflow moves tables ``T`` from keyspace ``A`` (the **source**)
to keyspace ``B`` (the **target**, sharded or not) while applications keep
sending the same SQL. It is a reshard whose sources are ``A``'s shard and
whose targets are ``B``'s serving shards, for the tables ``T`` only: a
:class:`~shardgate.workflows.base.Workflow` (copy cycles under a snapshot and
its position, catch-up from the source's change log filtered to ``T``, VDiff,
lease, metrics and write cut-over: freeze, final catch-up, journal) whose
traffic moves by **routing rules**
(:func:`~shardgate.vschema.parse_routing_rules`) in the ``cluster/global``
record. For each moved table ``t`` the rules are written for ``t`` and
``A.t`` (``B.t`` always names the target's copy):

``copying`` / ``running``
    ``t`` and ``A.t`` route to ``A.t``; ``B``'s VSchema lists ``t`` (from
    ``A``'s VSchema for an unsharded target, from ``--vschema`` for a sharded
    one) and ``t`` exists on every shard of ``B``, filled by the copy.
reads switched
    read rules (``read_rules``: reads outside transactions only) route ``t``
    and ``A.t`` to ``B.t``; writes and transactions still go to ``A``.
``cutover``
    ``A.t`` refuses writes (gates hold them), the final catch-up runs, the
    journal is written (the point of no return); a failure before it rolls
    back to ``running`` (:class:`~shardgate.workflows.base.Workflow`).
``switched``
    the rules route ``t`` and ``A.t`` to ``B.t`` for everything; ``A.t`` stays
    frozen.
``complete``
    removes ``t`` from ``A``'s VSchema, renames ``A.t`` to
    ``_sg_moved_<workflow>_<t>`` (kept, frozen; drop it when you like), then
    removes the rules: ``t`` resolves to ``B`` by the VSchema alone.
``cancel`` (before ``switched``)
    removes ``t`` from ``B``'s VSchema, the rules, and drops ``B``'s copies.
``reverse-traffic`` (in ``switched``)
    the reverse cut-over of :mod:`.reverse`: from the journal on, the reverse
    streams replay ``B``'s changes to ``t`` on ``A``'s shards; ``B.t`` is
    frozen, ``A`` caught up, the reverse journal written, ``A.t`` unfrozen,
    and the rules route ``t`` and ``A.t`` to ``A.t`` again (state
    ``running``; ``B.t`` stays frozen, caught up by the forward streams, so
    the switches may run again).

Invariant: at every step each of ``t`` and ``A.t`` resolves, for writes, to
exactly one table holding every committed row: ``A.t`` until the journal,
``B.t`` after it, ``A.t`` again after a reverse journal (the rules change in
one record write).

Sources: every serving shard of ``A`` (sharded or not). Each row is placed by
the primary vindex of its keyspace: on ``B``'s shards by ``B``'s (copy,
catch-up), on ``A``'s by ``A``'s (the reverse streams, a resumed copy's
clean-up, :meth:`MoveTablesWorkflow._source_placement`); the two may differ
(another column, another vindex). Refused at create (``UNIMPLEMENTED``, see
:func:`_check_kind`): sequence and queue tables, lookup vindexes' tables and
tables with a lookup vindex, reference tables of a sharded source. A table
numbered by a sequence (``auto_increment``) keeps it: ``B``'s entry gets the
source's (qualified), and another sequence given for it is refused
(``INVALID_ARGUMENT``), so no id is handed out twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.errors import FailedPrecondition, InvalidArgument, NotFound, Unsupported
from shardgate.topo.server import TopoServer
from shardgate.vindexes import Lookup, create_vindex
from shardgate.vindexes.base import SingleColumn
from shardgate.vschema import TableType, VSchema
from shardgate.workflows.base import NAME, Workflow, WorkflowSpec
from shardgate.workflows.coltypes import column_kinds
from shardgate.workflows.ddl import source_table
from shardgate.workflows.rowsql import (
    MovingTable,
    lookup_tables,
    primary_vindex,
    quote,
    table_shape,
    user_tables,
)


@dataclass(frozen=True)
class MoveTablesSpec(WorkflowSpec):
    """What ``shardgate movetables create`` was asked for (``keyspace`` is the source
    keyspace; ``sources``/``targets``/``target_urls`` are the shards of both, read
    from the topology at create)."""

    workflow: str = "movetables"
    target_keyspace: str = ""
    tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not NAME.match(self.target_keyspace):
            raise InvalidArgument(f"--target-keyspace {self.target_keyspace!r}: letters, "
                                  "digits and '_' only")
        if self.target_keyspace == self.keyspace:
            raise InvalidArgument("the source and target keyspaces must differ")
        if not self.tables:
            raise InvalidArgument("give the tables to move (--tables t1,t2)")
        for t in self.tables:
            if not NAME.match(t):
                raise InvalidArgument(f"table {t!r}: letters, digits and '_' only")

    @property
    def record(self) -> str:
        """The workflow record's name (after the target keyspace)."""
        return f"movetables:{self.target_keyspace}.{self.workflow}"


async def movetables_spec(store: TopoServer, *, source_keyspace: str, target_keyspace: str,
                          tables: tuple[str, ...], workflow: str = "movetables"
                          ) -> MoveTablesSpec:
    """The spec of a new workflow, its shards read from the topology."""
    topo = await store.load_topology()
    src = topo.keyspace(source_keyspace)
    dst = topo.keyspace(target_keyspace)
    if src.pending or dst.pending:
        raise FailedPrecondition(
            f"keyspace {src.name if src.pending else dst.name} has pending shards (a reshard "
            "runs): finish it before moving tables")
    return MoveTablesSpec(
        keyspace=source_keyspace, sources=tuple(s.name for s in src.shards),
        targets=tuple(s.name for s in dst.shards),
        target_urls=tuple(sorted((s.name, s.url) for s in dst.shards)),
        workflow=workflow, target_keyspace=target_keyspace, tables=tuple(sorted(tables)))


def _null() -> SingleColumn:
    """The vindex of a single-shard keyspace's rows (every row on its one shard)."""
    null = create_vindex("null", "null")
    assert isinstance(null, SingleColumn)
    return null


def _check_kind(vschema: VSchema, keyspace: str, name: str, sources: int) -> None:
    """Refuse (``UNIMPLEMENTED``) a table MoveTables cannot move correctly: a sequence
    table (gates hand out its ids in cached blocks, read from where the VSchema says:
    moving it could give an id twice; the tables numbered by it move and keep it), a
    queue table, a lookup vindex's table or a table with a lookup vindex (their rows
    hold keyspace ids of one keyspace), a reference table of a sharded source (every
    shard holds every row)."""
    ks = vschema.keyspace(keyspace)
    vt = ks.tables.get(name)
    where = f"table {keyspace}.{name}"
    owners = lookup_tables(vschema, keyspace).get(name)
    if owners:
        raise Unsupported(f"{where} holds the rows of lookup vindex {', '.join(owners)} "
                          "(keyspace ids of its keyspace): MoveTables does not move it")
    if vt is None:
        if sources > 1:
            raise Unsupported(f"{where} is not in the VSchema of sharded keyspace "
                              f"{keyspace}: its rows cannot be placed")
        return
    if vt.type == TableType.SEQUENCE:
        raise Unsupported(
            f"{where} is a sequence table: gates hand out its ids in cached blocks, so "
            "moving it could give an id twice; move the tables it numbers (they keep "
            "their auto_increment) and leave it where it is")
    if vt.type == TableType.QUEUE:
        raise Unsupported(f"{where} is a queue table: MoveTables does not move queues "
                          "(a reshard moves them within their keyspace)")
    if vt.type == TableType.REFERENCE and sources > 1:
        raise Unsupported(f"{where} is a reference table of a sharded keyspace (every "
                          "shard holds every row): MoveTables moves it from a single-shard "
                          "keyspace only")
    if any(isinstance(cv.vindex, Lookup) for cv in vt.column_vindexes):
        raise Unsupported(f"{where} has a lookup vindex (its rows hold keyspace ids of "
                          f"{keyspace}): MoveTables does not move it")


def _auto_increment(entry: Mapping[str, Any], source: Any, target_keyspace: str,
                    name: str) -> dict[str, Any]:
    """``entry`` with the source table's ``auto_increment`` (qualified): the moved table
    keeps drawing ids from the same sequence, so no id is handed out twice. A
    different one given for the target is refused."""
    ai = None if source is None else source.auto_increment
    if ai is None:
        return dict(entry)
    given = entry.get("auto_increment") or entry.get("autoIncrement")
    if given is None:
        return {**entry, "auto_increment": {"column": ai.column, "sequence": ai.sequence}}
    seq = str(given.get("sequence", ""))
    if str(given.get("column", "")).lower() != ai.column \
            or (seq != ai.sequence and seq != ai.sequence.split(".", 1)[1]):
        raise InvalidArgument(
            f"table {name}: its ids come from sequence {ai.sequence} (column {ai.column}); "
            f"the VSchema of {target_keyspace} gives {given}: another sequence could hand "
            "out ids the table holds already; keep the source's (or leave it out)")
    return dict(entry)


def _rules_for(spec: MoveTablesSpec, to_keyspace: str) -> list[dict[str, Any]]:
    """Rules sending ``t`` and ``A.t`` of every moved table to ``to_keyspace.t``."""
    return [{"from_table": f, "to_tables": [f"{to_keyspace}.{t}"]}
            for t in spec.tables for f in (t, f"{spec.keyspace}.{t}")]


class MoveTablesWorkflow(Workflow[MoveTablesSpec]):
    """One MoveTables, resumable from its topo store record (see the module docstring)."""

    kind = "movetables"
    title = "MoveTables"
    command = "movetables"
    spec_type = MoveTablesSpec

    def __init__(self, store: TopoServer, spec: MoveTablesSpec, *,
                 vschema: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(store, spec, **kwargs)
        #: ``--vschema``: the target keyspace's VSchema entries (``tables``, ``vindexes``)
        self.vschema_arg = dict(vschema or {})
        #: the moved tables placed by the source keyspace's vindexes
        self._placed: dict[str, MovingTable] = {}

    # -- create -----------------------------------------------------------------

    def _same_request(self, recorded: MoveTablesSpec) -> bool:
        """The same tables of the same source keyspace (the shards are the recorded ones)."""
        return (recorded.keyspace, recorded.tables) == (self.spec.keyspace, self.spec.tables)

    async def _target_entries(self) -> dict[str, Any]:
        """The target keyspace's VSchema entries of the moved tables (checked)."""
        topo = await self._topology()
        src = topo.keyspace(self.spec.keyspace).vschema
        svs = topo.build_vschema().keyspace(self.spec.keyspace)
        dst = dict(topo.keyspace(self.spec.target_keyspace).vschema)
        given = self.vschema_arg
        extra = set(given) - {"tables", "vindexes"}
        if extra:
            raise InvalidArgument(f"--vschema: only 'tables' and 'vindexes' are read, not "
                                  f"{sorted(extra)}")
        entries: dict[str, Any] = {}
        for t in self.spec.tables:
            entry = (given.get("tables") or {}).get(t) or (dst.get("tables") or {}).get(t)
            if entry is None and not dst.get("sharded"):
                entry = {k: v for k, v in ((src.get("tables") or {}).get(t) or {}).items()
                         if k != "column_vindexes"}
            if dst.get("sharded") and not (entry or {}).get("column_vindexes"):
                raise InvalidArgument(
                    f"target keyspace {self.spec.target_keyspace} is sharded and has no vindex "
                    f"for table {t!r}: give its VSchema entry (column_vindexes) with "
                    "--vschema FILE")
            entries[t] = _auto_increment(entry or {}, svs.tables.get(t),
                                         self.spec.target_keyspace, t)
        return {"tables": entries, "vindexes": dict(given.get("vindexes") or {})}

    @staticmethod
    def _merged(vschema: Mapping[str, Any], entries: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(vschema)
        out["vindexes"] = {**(vschema.get("vindexes") or {}), **entries.get("vindexes", {})}
        if not out["vindexes"]:
            out.pop("vindexes")
        out["tables"] = {**(vschema.get("tables") or {}), **entries["tables"]}
        return out

    async def _check_start(self) -> dict[str, Any]:
        """Refused when rules for the tables exist; the record's ``target_vschema``."""
        topo = await self._topology()
        vs = topo.build_vschema()
        rules = {*vs.routing_rules, *vs.read_routing_rules}
        clash = sorted(r for t in self.spec.tables for r in (t, f"{self.spec.keyspace}.{t}")
                       if r in rules)
        if clash:
            raise FailedPrecondition(f"routing rules for {clash} exist already: another "
                                     "MoveTables runs (or ran without `complete`)")
        return {"target_vschema": await self._target_entries()}

    async def _moving_tables(self) -> dict[str, MovingTable]:
        if self._tables:
            return self._tables
        topo = await self._topology()
        target = topo.keyspace(self.spec.target_keyspace)
        entries = self.doc.get("target_vschema") or await self._target_entries()
        trial = VSchema.from_json({
            ks.name: self._merged(ks.vschema, entries) if ks.name == target.name
            else ks.vschema for ks in topo.keyspaces.values()})
        tks = trial.keyspace(target.name)
        source = topo.keyspace(self.spec.keyspace)
        vschema = topo.build_vschema()
        sks = vschema.keyspace(source.name)
        first = self._backend(self._url(topo, self.spec.sources[0]))
        conn = await first.acquire()
        try:
            present = await user_tables(conn, first.dialect)
            missing = [t for t in self.spec.tables if t not in present]
            if missing:
                raise NotFound(f"tables {missing} are not in keyspace {self.spec.keyspace}")
            for name in self.spec.tables:
                _check_kind(vschema, source.name, name, len(self.spec.sources))
                vindex: SingleColumn
                if tks.sharded:
                    column, vindex = primary_vindex(tks.tables[name], target.name)
                else:  # one target shard: every row goes there
                    column, vindex = "", _null()
                columns, pk = await table_shape(conn, first.dialect, name)
                kinds = column_kinds((await source_table(conn, first.dialect, name)).create,
                                     first.dialect)
                self._tables[name] = MovingTable(name, columns, pk, column or columns[0],
                                                 vindex, tuple(kinds.get(c) for c in columns),
                                                 first.dialect)
                if len(self.spec.sources) > 1:
                    scol, svindex = primary_vindex(sks.tables[name], source.name)
                else:  # one source shard: every row is there
                    scol, svindex = columns[0], _null()
                self._placed[name] = MovingTable(name, columns, pk, scol, svindex,
                                                 tuple(kinds.get(c) for c in columns),
                                                 first.dialect)
        finally:
            await first.release(conn)
        return self._tables

    async def _source_placement(self) -> dict[str, MovingTable]:
        """The moved tables placed by the source keyspace's primary vindexes (which may
        differ from the target's: another column, another vindex)."""
        await self._moving_tables()
        return self._placed

    async def _setup(self) -> None:
        """Target tables, routing rules (``t``, ``A.t`` -> ``A.t``), the target's VSchema,
        capture on the source; idempotent."""
        await self._create_target_tables()
        stay = _rules_for(self.spec, self.spec.keyspace)
        await self._set_rules(rules=stay)
        entries = self.doc["target_vschema"]
        await self.store.update_vschema(self.spec.target_keyspace,
                                        lambda vs: self._merged(vs, entries))
        for _, log in (await self._sources()).values():
            await log.prepare()

    async def _set_rules(self, *, rules: list[dict[str, Any]] | None = None,
                         read_rules: list[dict[str, Any]] | None = None) -> None:
        """Replace this workflow's rules (``None``: remove them) of each kind."""
        ours = {f for t in self.spec.tables for f in (t, f"{self.spec.keyspace}.{t}")}

        def change(doc: dict[str, Any]) -> None:
            for key, new in (("rules", rules), ("read_rules", read_rules)):
                kept = [r for r in doc.get(key) or []
                        if (r.get("from_table") or r.get("fromTable")) not in ours]
                doc[key] = kept + (new or [])

        await self.store.update_routing_rules(change)

    # -- traffic ----------------------------------------------------------------

    async def _reads_plan(self) -> str:
        return (f"reads of {list(self.spec.tables)} would be served by keyspace "
                f"{self.spec.target_keyspace}")

    async def _route_reads(self, to_targets: bool) -> str:
        """Read rules (reads outside transactions) of ``t`` and ``A.t`` to ``B.t``;
        back: none (everything to ``A.t``)."""
        if to_targets:
            await self._set_rules(rules=_rules_for(self.spec, self.spec.keyspace),
                                  read_rules=_rules_for(self.spec, self.spec.target_keyspace))
            return (f"reads of {list(self.spec.tables)} are served by keyspace "
                    f"{self.spec.target_keyspace}")
        await self._set_rules(rules=_rules_for(self.spec, self.spec.keyspace))
        return f"reads of {list(self.spec.tables)} are served by {self.spec.keyspace} again"

    async def _serve_sources(self) -> None:
        """After a reverse journal: every use of ``t`` and ``A.t`` routes to ``A.t``."""
        await self._set_rules(rules=_rules_for(self.spec, self.spec.keyspace))

    async def _route_writes(self, journal: Mapping[str, Any],
                            steps: dict[str, float]) -> None:
        """Every use of ``t`` and ``A.t`` routes to ``B.t``."""
        mark = time.monotonic()
        await self._set_rules(rules=_rules_for(self.spec, self.spec.target_keyspace))
        steps["topology_s"] = time.monotonic() - mark
        steps["published_at"] = time.time()
        if self.state != "switched":
            await self._save(state="switched", switched_at=time.time(), error=None)
        else:
            await self._save()

    # -- the end ----------------------------------------------------------------

    def moved_name(self, table: str) -> str:
        """What ``complete`` renames a source table to."""
        return f"_sg_moved_{self.spec.workflow}_{table}"

    async def complete(self) -> str:
        """After the switch: the tables belong to ``B``'s VSchema alone; the source's
        copies are renamed (kept, frozen); the rules go."""
        await self._begin("switched", "complete")

        def drop_entries(doc: dict[str, Any]) -> None:
            tables = (doc.get("vschema") or {}).get("tables") or {}
            for t in self.spec.tables:
                tables.pop(t, None)

        await self._edit_keyspace(drop_entries)
        for backend, _ in (await self._sources()).values():
            d = backend.dialect
            conn = await backend.acquire()
            try:
                present = await user_tables(conn, d)
                for t in self.spec.tables:
                    if t in present:
                        await conn.execute(f"ALTER TABLE {quote(d, t)} RENAME TO "
                                           f"{quote(d, self.moved_name(t))}")
            finally:
                await backend.release(conn)
        await self._set_rules()
        # the target keyspace serves from here on: its change capture stays (its change
        # streams read it); the reverse streams stop
        await self._reverse.finish(drop_capture=False)
        await self.store.delete_workflow(self.spec.journal)
        await self.store.delete_workflow(self.spec.record, expect=self.version)
        return (f"{self.spec.record} complete: tables {list(self.spec.tables)} belong to "
                f"keyspace {self.spec.target_keyspace}; the source's copies were renamed "
                f"{[self.moved_name(t) for t in self.spec.tables]} (frozen; drop them when "
                "you like)")

    async def cancel(self) -> str:
        """Before the write switch: remove the target's copies, its VSchema entries and
        the rules; delete the record."""
        await self._refuse_switched()
        for backend, _ in (await self._sources()).values():
            await self._freeze(backend, False)
        await self._reverse.finish(drop_capture=True)
        created = set((self.doc.get("target_vschema") or {}).get("tables") or {})
        await self.store.update_vschema(
            self.spec.target_keyspace,
            lambda vs: {**vs, "tables": {k: v for k, v in (vs.get("tables") or {}).items()
                                         if k not in created}})
        await self._set_rules()
        _, targets = self._targets()
        for backend in targets.values():
            d = backend.dialect
            conn = await backend.acquire()
            try:
                for t in self.spec.tables:
                    await conn.execute(f"DROP TABLE IF EXISTS {quote(d, t)}")
            finally:
                await backend.release(conn)
        await self.store.delete_workflow(self.spec.record, expect=self.version)
        return (f"{self.spec.record} cancelled: tables {list(self.spec.tables)} dropped from "
                f"keyspace {self.spec.target_keyspace}; {self.spec.keyspace} serves them")

