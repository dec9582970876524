"""Online resharding: Vitess's ``Reshard`` (split and merge shards of a keyspace).

A reshard is a :class:`~shardgate.workflows.base.Workflow` (the state machine,
its record, lease, copy, catch-up, VDiff and write cut-over are described
there) whose sources and targets are shards of one keyspace covering the same
key range; its record is ``reshard:<keyspace>.<workflow>``. What it adds is
how the keyspace record (:class:`~shardgate.topo.model.KeyspaceTopo`) serves
traffic in each state:

``copying`` / ``running``
    The targets are in the keyspace's ``pending_shards`` (they exist and
    serve nothing). ``switch-traffic --reads`` lists them in ``read_shards``
    (reads outside transactions go there); ``reverse-traffic`` removes it.
``switched``
    After the journal the targets are the keyspace's serving shards, the
    sources pending (frozen); the keyspace record keeps the journal
    (``reshard_journal``) for change streams that hop over the switch
    (:mod:`shardgate.streams.hop`). A reverse cut-over makes the sources
    serving again and the targets pending.
``complete`` removes the sources from the keyspace, moves the journal to the
keyspace's ``reshard_history`` (with the sources' and targets' databases:
readers behind the switch still hop over it) and deletes the records (the
source databases keep their data, and their change capture when it was there
before the workflow: ``source_capture`` in the record); ``cancel`` (before
``switched``) removes the targets from the keyspace and deletes the record
(the target databases keep what was copied) and drops the change capture the
workflow set up on the targets.

Moving tables: every user table of the source shards must be a sharded table
of the keyspace's VSchema with a functional single-column primary vindex and
a primary key, or a reference table with a primary key (others are refused
with ``UNIMPLEMENTED`` at create). Every shard holds all the rows of a
reference table, and the gates write them to every shard: the first source's
stream alone copies it to every target and replays its changes there
(:meth:`~shardgate.workflows.base.Workflow._source_tables`), so each change is
applied once. Lookup tables of the keyspace are sharded tables: each moves by
its own primary vindex (:func:`~shardgate.workflows.rowsql.placement`). Queue
tables move by their ``SHARD BY`` vindex with their events in whatever state
(``to_be_fired``, ``fired`` with its epoch and retry time, ``acked``); the
targets' copies get the queue's defaults, marker and scan indexes. At the
write cut-over the freeze refuses the sources' fire writes too, so their queue
managers pause (:mod:`shardgate.queues.table.manager`, invariant 7) and the
final catch-up carries every fire and ack committed before it; acks refused
meanwhile are held by the gates and replayed on the targets, whose managers
fire once gates' receivers subscribe to them (:mod:`shardgate.queues.router`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.backends.changes.open import capture_exists
from shardgate.errors import FailedPrecondition, InvalidArgument, Unsupported
from shardgate.keys import KeyRange, parse_shard_name
from shardgate.queues.options import QueueOptions
from shardgate.vindexes import SingleColumn
from shardgate.vschema import TableType
from shardgate.workflows.base import Workflow, WorkflowSpec
from shardgate.workflows.coltypes import column_kinds
from shardgate.workflows.cutover import pause_point
from shardgate.workflows.ddl import source_table
from shardgate.workflows.rowsql import MovingTable, placement, table_shape, user_tables

#: completed write switches' journals kept in the keyspace record (``reshard_history``)
HISTORY_KEPT = 32


@dataclass(frozen=True)
class ReshardSpec(WorkflowSpec):
    """What ``shardgate reshard create`` was asked for: source and target shards of
    ``keyspace``, distinct, covering the same key range."""

    workflow: str = "reshard"

    def __post_init__(self) -> None:
        super().__post_init__()
        if set(self.sources) & set(self.targets):
            raise InvalidArgument("a shard cannot be both a source and a target")
        _same_cover([parse_shard_name(s) for s in self.sources],
                    [parse_shard_name(t) for t in self.targets])

    @property
    def record(self) -> str:
        """The workflow record's name."""
        return f"reshard:{self.keyspace}.{self.workflow}"


def _same_cover(sources: list[KeyRange], targets: list[KeyRange]) -> None:
    """Sources and targets must cover the same contiguous key range."""
    def cover(ranges: list[KeyRange], what: str) -> tuple[bytes, bytes]:
        ordered = sorted(ranges, key=lambda r: r.start.rstrip(b"\x00"))
        for a, b in itertools.pairwise(ordered):
            if not a.end or a.end.rstrip(b"\x00") != b.start.rstrip(b"\x00"):
                raise InvalidArgument(f"the {what} shards {[r.name for r in ordered]} are not "
                                      "contiguous")
        return ordered[0].start.rstrip(b"\x00"), ordered[-1].end.rstrip(b"\x00")
    if cover(sources, "source") != cover(targets, "target"):
        raise InvalidArgument("the target shards must cover exactly the key range of the "
                              "source shards")


class ReshardWorkflow(Workflow[ReshardSpec]):
    """One reshard, resumable from its topo store record (see the module docstring)."""

    kind = "reshard"
    title = "reshard"
    command = "reshard"
    spec_type = ReshardSpec

    # -- the moving tables -------------------------------------------------------

    async def _moving_tables(self) -> dict[str, MovingTable]:
        if self._tables:
            return self._tables
        topo = await self._topology()
        vschema = topo.build_vschema()
        vs = vschema.keyspace(self.spec.keyspace)
        first = self._backend(self._url(topo, self.spec.sources[0]))
        conn = await first.acquire()
        try:
            names = self.doc.get("tables") or await user_tables(conn, first.dialect)
            for name in names:
                vt = vs.tables.get(name)
                if vt is not None and vt.type == TableType.REFERENCE:
                    column: str | None = None
                    vindex: SingleColumn | None = None
                elif vt is not None and vt.type == TableType.QUEUE:
                    column, vindex = self._queue_placement(vschema, vt)
                elif vt is not None and vt.type:
                    raise Unsupported(
                        f"table {self.spec.keyspace}.{name} is a {vt.type} table: resharding "
                        "moves sharded and reference tables only")
                else:
                    column, vindex = placement(vschema, self.spec.keyspace, name,
                                               self.spec.sources[0])
                columns, pk = await table_shape(conn, first.dialect, name)
                kinds = column_kinds((await source_table(conn, first.dialect, name)).create,
                                     first.dialect)
                self._tables[name] = MovingTable(name, columns, pk, column, vindex,
                                                 tuple(kinds.get(c) for c in columns),
                                                 first.dialect)
        finally:
            await first.release(conn)
        return self._tables

    def _queue_placement(self, vschema: Any, vt: Any) -> tuple[str, SingleColumn]:
        """A queue table moves like a sharded table, by its ``SHARD BY`` vindex, with
        its events in whatever state (see "Queues" in docs/resharding.md); a segmented
        queue (datasets, not a table) is refused."""
        name = f"{self.spec.keyspace}.{vt.name}"
        opts = QueueOptions.from_mapping(vt.options, path=name)
        if opts.storage == "segmented":
            raise Unsupported(
                f"table {name} is a segmented queue: resharding moves queue tables (events "
                "in place) but not a segmented queue's datasets yet")
        if vt.primary is None:
            raise Unsupported(f"queue {name} has no SHARD BY vindex: resharding places each "
                              "event by it")
        self._queues[vt.name] = opts
        return placement(vschema, self.spec.keyspace, vt.name, self.spec.sources[0])

    # -- create -----------------------------------------------------------------

    async def _check_start(self) -> dict[str, Any]:
        topo = await self._topology()
        ks = topo.keyspace(self.spec.keyspace)
        if not ks.sharded and len(self.spec.targets) > 1:
            raise Unsupported(f"keyspace {ks.name} is unsharded: make its VSchema sharded "
                              "before splitting it")
        serving = {s.name for s in ks.shards}
        missing = [s for s in self.spec.sources if s not in serving]
        if missing:
            raise FailedPrecondition(f"source shards {missing} are not serving shards of "
                                     f"{ks.name}; serving: {sorted(serving)}")
        busy = [s.name for s in ks.pending] + [n for n in self.spec.targets
                                               if n in serving]
        if busy:
            raise FailedPrecondition(
                f"keyspace {ks.name} already has shards {busy} that are pending or serving: "
                "another reshard runs (or ran without `complete`)")
        return {}

    async def _setup(self) -> None:
        """The targets pending in the keyspace, their tables, capture on the sources."""
        await self._edit_keyspace(lambda doc: doc.setdefault("pending_shards", {}).update(
            dict(self.spec.target_urls)))
        await self._create_target_tables()
        sources = await self._sources()
        created = dict(self.doc.get("source_capture") or {})
        for s, (backend, _) in sources.items():
            if s not in created:
                created[s] = not await capture_exists(backend)
        if created != self.doc.get("source_capture"):
            await self._save(source_capture=created)  # before: a crash still cleans up
        for _, log in sources.values():
            await log.prepare()

    # -- traffic ----------------------------------------------------------------

    async def _read_shards(self) -> list[str]:
        ks = (await self._topology()).keyspace(self.spec.keyspace)
        return sorted({s.name for s in ks.shards} - set(self.spec.sources)
                      | set(self.spec.targets))

    async def _reads_plan(self) -> str:
        return (f"reads of {self.spec.keyspace} would be served by shards "
                f"{await self._read_shards()}")

    async def _route_reads(self, to_targets: bool) -> str:
        """``read_shards`` in the keyspace record: the targets and the shards not
        moving (or none: the serving shards)."""
        if to_targets:
            reads = await self._read_shards()
            await self._edit_keyspace(lambda doc: doc.update(read_shards=reads))
            return f"reads of {self.spec.keyspace} are served by shards {reads}"
        await self._edit_keyspace(lambda doc: doc.pop("read_shards", None))
        return f"reads of {self.spec.keyspace} are served by the sources again"

    async def _route_writes(self, journal: Mapping[str, Any],
                            steps: dict[str, float]) -> None:
        """The targets become the keyspace's serving shards, the sources pending."""
        topo = await self._topology()
        ks = topo.keyspace(self.spec.keyspace)
        if any(s.name in self.spec.targets for s in ks.shards):
            # published by a process that died before it recorded the switch: record it
            # as that process would have (the time, no error left from the cut-over)
            if self.state != "switched":
                await self._save(state="switched", switched_at=time.time(), error=None)
            return
        source_urls = {s: self._url(topo, s) for s in self.spec.sources}
        # what change streams need to hop over the switch (streams/hop.py)
        hop = {"sources": dict(journal.get("positions", {})),
               "targets": dict(journal.get("targets", {})),
               "at": float(journal.get("at", time.time()))}

        def change(doc: dict[str, Any]) -> None:
            doc["reshard_journal"] = hop
            shards = doc["shards"]
            pending = doc.setdefault("pending_shards", {})
            for s in self.spec.sources:
                shards.pop(s, None)
                pending[s] = source_urls[s]
            for t, url in self.spec.target_urls:
                pending.pop(t, None)
                shards[t] = url
            doc.pop("read_shards", None)

        mark = time.monotonic()
        await self._edit_keyspace(change)
        steps["topology_s"] = time.monotonic() - mark
        steps["published_at"] = time.time()
        pause_point("published")
        await self._save(state="switched", switched_at=time.time(), error=None)

    async def _serve_sources(self) -> None:
        """After a reverse journal: the sources are the keyspace's serving shards
        again, the targets pending."""
        topo = await self._topology()
        target_urls = {t: self._url(topo, t) for t in self.spec.targets}
        source_urls = {s: self._url(topo, s) for s in self.spec.sources}

        def change(doc: dict[str, Any]) -> None:
            shards = doc["shards"]
            pending = doc.setdefault("pending_shards", {})
            for t in self.spec.targets:
                shards.pop(t, None)
                pending[t] = target_urls[t]
            for s in self.spec.sources:
                pending.pop(s, None)
                shards[s] = source_urls[s]
            doc.pop("read_shards", None)

        await self._edit_keyspace(change)

    # -- the end ----------------------------------------------------------------

    async def complete(self) -> str:
        """After the switch: drop the sources from the keyspace, delete the records."""
        await self._begin("switched", "complete")
        topo = await self._topology()
        urls = {s: self._url(topo, s) for s in self.spec.sources}

        def change(doc: dict[str, Any]) -> None:
            for s in self.spec.sources:
                doc.get("pending_shards", {}).pop(s, None)
            # the sources are gone: no gate stream hops any more; the journal goes to the
            # history, with the sources' databases, for readers still behind the switch
            # (a Spark ``shardgate_changes`` checkpoint, see shardgate.streams.hop)
            journal = doc.pop("reshard_journal", None)
            if journal is not None:
                history = list(doc.get("reshard_history") or [])
                history.append({**journal, "urls": urls,
                                "target_urls": dict(self.spec.target_urls)})
                doc["reshard_history"] = history[-HISTORY_KEPT:]

        sources = await self._sources()  # read before they leave the keyspace
        await self._edit_keyspace(change)
        await self._reverse.finish(drop_capture=False)
        # the sources left the keyspace: the workflow's own capture goes (a PostgreSQL
        # slot nobody reads would keep their WAL forever); capture that was there before
        # the workflow is someone else's (a change stream may still have to drain it)
        created = self.doc.get("source_capture") or {}
        for name, (_, log) in sources.items():
            cursor = self._cursors.pop(name, None)
            if cursor is not None:
                await cursor.close()
            if created.get(name, True):
                await log.drop()
        await self.store.delete_workflow(self.spec.journal)
        await self.store.delete_workflow(self.spec.record, expect=self.version)
        return (f"{self.spec.record} complete: shards {list(self.spec.sources)} left keyspace "
                f"{self.spec.keyspace} (their databases keep their rows, frozen)")

    async def cancel(self) -> str:
        """Before the write switch: drop the targets from the keyspace, delete the record."""
        await self._refuse_switched()
        for backend, _ in (await self._sources()).values():
            await self._freeze(backend, False)
        if self.doc.get("reversed_at"):  # a reverse-traffic left the targets frozen
            for backend in self._targets()[1].values():
                await self._freeze(backend, False)
        await self._reverse.finish(drop_capture=True)

        def change(doc: dict[str, Any]) -> None:
            for t in self.spec.targets:
                doc.get("pending_shards", {}).pop(t, None)
            doc.pop("read_shards", None)

        await self._edit_keyspace(change)
        await self.store.delete_workflow(self.spec.record, expect=self.version)
        return (f"{self.spec.record} cancelled: shards {list(self.spec.targets)} left keyspace "
                f"{self.spec.keyspace} (their databases keep the copied rows)")
