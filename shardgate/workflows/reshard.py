"""Online resharding: Vitess's ``Reshard`` (split and merge shards of a keyspace).

One workflow record, ``reshard:<keyspace>.<workflow>`` in the topo store,
holds the spec and the state; every step saves it (compare-and-swap) before
the next one starts, so any process can resume the workflow after a crash.
States and what each guarantees:

``copying``
    The targets are in the keyspace's ``pending_shards`` (they exist and
    serve nothing; see :class:`~shardgate.topo.model.KeyspaceTopo`), their
    tables were created, change capture runs on the sources. Each source
    shard's **stream** (``streams[<source>]``) copies its rows in copy cycles
    (:mod:`shardgate.workflows.rowcopy`) under consistent snapshots, saving
    ``(position, last key)`` per table after every batch.
``running``
    Every row is copied; each stream's position says how far its change log
    is applied on the targets (:mod:`shardgate.workflows.catchup`). Any command
    catches up first. ``switch-traffic --reads`` may move reads (outside
    transactions) to the targets: ``read_shards`` in the keyspace record;
    ``reverse-traffic`` moves them back.
``cutover``
    ``switch-traffic --writes`` runs: the sources refuse writes to the moving
    tables (a trigger whose error carries
    :data:`~shardgate.topo.model.WRITES_FROZEN`; gates hold such statements,
    see :mod:`shardgate.gate.cutover`), the streams are caught up to the
    sources' final positions, then the **journal** record
    (``journal:<workflow record>``) is written: the point of no return. A
    failure before the journal drops the triggers and returns to
    ``running`` (the sources keep serving); a process that died in
    ``cutover`` is rolled back (no journal) or forward (journal) by the next
    command.
``switched``
    The targets are the serving shards, the sources are pending (frozen). The
    **reverse streams** (:mod:`shardgate.workflows.reverse`) replay the
    targets' changes on the sources; ``reverse-traffic`` switches writes back
    (state ``reversing`` while it runs) and returns to ``running``.
``complete`` then removes the sources from the keyspace, moves the journal to
the keyspace's ``reshard_history`` (with the sources' and targets'
databases: readers behind the switch still hop over it) and deletes the
records (the source databases keep their data, and their change capture
when it was there before the workflow: ``source_capture`` in the record);
``cancel`` (before ``switched``) removes the targets from the keyspace and
deletes the record (the target databases keep what was copied) and drops
the change capture the workflow set up on the targets.

Who works on it: every save of the record also renews this process's
**lease** (``runner``: id, pid, host, expiry ``LEASE_S`` later). A command
that writes refuses while another live process holds the lease (a process of
this host that is gone, SIGKILLed say, holds none), so two appliers
never replay the logs onto the targets at once; ``run --follow``
(:meth:`ReshardWorkflow.follow`) keeps the targets caught up, and the lease,
until it is stopped.

Moving tables: every user table of the source shards must be a sharded table
of the keyspace's VSchema with a functional single-column primary vindex and
a primary key, or a reference table with a primary key (others are refused
with ``UNIMPLEMENTED`` at create). Every shard holds all the rows of a
reference table, and the gates write them to every shard: the first source's
stream alone copies it to every target and replays its changes there
(:meth:`ReshardWorkflow._source_tables`), so each change is applied once.
Lookup tables of the keyspace are sharded tables: each moves by its own
primary vindex (:func:`~shardgate.workflows.rowsql.placement`). Queue tables
move by their ``SHARD BY`` vindex with their events in whatever state
(``to_be_fired``, ``fired`` with its epoch and retry time, ``acked``); the
targets' copies get the queue's defaults, marker and scan indexes. At the
write cut-over the freeze refuses the sources' fire writes too, so their queue
managers pause (:mod:`shardgate.queues.table.manager`, invariant 7) and the
final catch-up carries every fire and ack committed before it; acks refused
meanwhile are held by the gates and replayed on the targets, whose managers
fire once gates' receivers subscribe to them (:mod:`shardgate.queues.router`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Self

from shardgate.aio import wait_for
from shardgate.backends import open_backend
from shardgate.backends.base import Backend, Connection
from shardgate.backends.changes import ChangeLog
from shardgate.backends.changes.open import capture_exists, open_change_log
from shardgate.errors import (
    Aborted,
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ShardgateError,
    Unavailable,
    Unsupported,
)
from shardgate.keys import KeyRange, parse_shard_name
from shardgate.queues.ddl import queue_table_extras
from shardgate.queues.options import QueueOptions
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import Record, TopoConflict
from shardgate.vindexes import SingleColumn
from shardgate.workflows.catchup import (
    Applier,
    LogCursor,
    catch_up,
    final_position,
    position_key,
)
from shardgate.workflows.coltypes import column_kinds
from shardgate.workflows.ddl import source_table
from shardgate.workflows.freeze import PG_DENY_FUNCTION, SQLITE_MARK_DDL, sqlite_deny_trigger
from shardgate.workflows.mariadb import freeze_sql
from shardgate.workflows.metrics import figures
from shardgate.workflows.reverse import REVERSING, ReverseStreams
from shardgate.workflows.rowcopy import DEFAULT_BATCH, copy_cycle, open_snapshot
from shardgate.workflows.rowsql import (
    MovingTable,
    placement,
    quote,
    table_shape,
    user_tables,
)
from shardgate.workflows.vdiff import TableDiff, diff_table, merge_diffs

#: the default lag bound of ``switch-traffic`` (seconds behind the sources)
DEFAULT_MAX_LAG_S = 5.0
#: the longest the final catch-up of a write cut-over may take (seconds)
CUTOVER_TIMEOUT_S = 10.0
#: before a write cut-over: catch-up rounds at most, and a round short enough to stop
PRE_CUTOVER_ROUNDS = 10
SHORT_ROUND_S = 0.2
#: completed write switches' journals kept in the keyspace record (``reshard_history``)
HISTORY_KEPT = 32
#: how often catch-up saves its position (a crash replays at most this much)
SAVE_EVERY_S = 0.5
#: how long a process's claim on a workflow lasts without a save (seconds)
LEASE_S = 5.0
#: ``run --follow``: the pause between catch-up rounds when the sources are idle
FOLLOW_IDLE_S = 0.2
#: freezing (or unfreezing) a source: tries when its statements lose a lock conflict
FREEZE_ATTEMPTS = 4

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
log = logging.getLogger(__name__)

#: Test hook (crash tests): with ``SHARDGATE_WORKFLOW_PAUSE=<step>`` in its
#: environment the workflow process stops dead at that step: it prints
#: ``paused at <step>`` on stderr and blocks (nothing of it runs any more, not even
#: its lease renewal) until it is killed. Steps: ``catch-up`` (a catch-up round in
#: ``running``, of a process holding the lease, applied changes to the targets and
#: has not saved their position),
#: ``frozen`` (write cut-over: the sources frozen, the final catch-up done, no
#: journal), ``journal`` (the journal written, the switch not published),
#: ``published`` (the keyspace switched, the record still ``cutover``).
PAUSE_ENV = "SHARDGATE_WORKFLOW_PAUSE"


def _pause_point(step: str) -> None:
    """Stop here for good if the test hook :data:`PAUSE_ENV` names ``step``."""
    if os.environ.get(PAUSE_ENV) != step:
        return
    sys.stderr.write(f"\npaused at {step}\n")
    sys.stderr.flush()
    while True:  # blocking on purpose: the process hangs here until killed
        time.sleep(3600)


@dataclass(frozen=True)
class ReshardSpec:
    """What ``shardgate reshard create`` was asked for."""

    keyspace: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    target_urls: tuple[tuple[str, str], ...]
    workflow: str = "reshard"

    def __post_init__(self) -> None:
        for what, name in (("--keyspace", self.keyspace), ("--workflow", self.workflow)):
            if not _NAME.match(name):
                raise InvalidArgument(f"{what} {name!r}: letters, digits and '_' only")
        if not self.sources or not self.targets:
            raise InvalidArgument("give the --source and --target shards")
        urls = dict(self.target_urls)
        missing = [t for t in self.targets if t not in urls]
        if missing:
            raise InvalidArgument(f"no --target-url for target shards {missing} "
                                  "(give --target-url SHARD=URL for each)")
        extra = sorted(set(urls) - set(self.targets))
        if extra:
            raise InvalidArgument(f"--target-url for {extra}, which are not --target shards")
        self._check_shards()

    def _check_shards(self) -> None:
        """Sources and targets: distinct shards covering the same key range."""
        if set(self.sources) & set(self.targets):
            raise InvalidArgument("a shard cannot be both a source and a target")
        _same_cover([parse_shard_name(s) for s in self.sources],
                    [parse_shard_name(t) for t in self.targets])

    @property
    def record(self) -> str:
        """The workflow record's name."""
        return f"reshard:{self.keyspace}.{self.workflow}"

    @property
    def journal(self) -> str:
        return f"journal:{self.record}"

    def to_doc(self) -> dict[str, Any]:
        """The spec as JSON (tuples as lists, ``target_urls`` as an object); a
        subclass's fields come along."""
        doc = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        doc["target_urls"] = dict(self.target_urls)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Self:
        """The spec :meth:`to_doc` wrote (of this class or a subclass)."""
        values: dict[str, Any] = {
            f.name: tuple(doc[f.name]) if isinstance(doc[f.name], list) else doc[f.name]
            for f in fields(cls) if f.name in doc}
        values["target_urls"] = tuple(sorted(doc["target_urls"].items()))
        return cls(**values)


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


Progress = Callable[[int, int], None]


class ReshardWorkflow:
    """One reshard, resumable from its topo store record (see the module docstring).

    :class:`~shardgate.workflows.movetables.MoveTablesWorkflow` reuses the copy,
    catch-up, VDiff and write cut-over by subclassing it (its sources are the
    shards of one keyspace, its targets those of another).
    """

    #: the CLI command group that drives this kind of workflow (for messages)
    command = "reshard"

    def __init__(self, store: TopoServer, spec: ReshardSpec, *, batch: int = DEFAULT_BATCH,
                 progress: Progress | None = None) -> None:
        if batch < 1:
            raise InvalidArgument("batch must be at least 1")
        self.store = store
        self.spec = spec
        self.batch = batch
        self.progress = progress
        self.doc: dict[str, Any] = {}
        self.version = 0
        self._backends: dict[str, Backend] = {}
        self._logs: dict[str, ChangeLog] = {}
        self._tables: dict[str, MovingTable] = {}
        #: the moving tables that are queue tables, with their options
        self._queues: dict[str, QueueOptions] = {}
        self._cursors: dict[str, LogCursor] = {}
        #: this process's id in the record's lease (``runner``)
        self._runner = secrets.token_hex(8)
        #: the targets -> sources streams after the write switch
        self._reverse = ReverseStreams(self)

    @classmethod
    async def resume(cls, store: TopoServer, keyspace: str, workflow: str = "reshard",
                     **kwargs: Any) -> ReshardWorkflow:
        """The workflow from its record (NotFound if there is none)."""
        found = await store.get_workflow(f"reshard:{keyspace}.{workflow}")
        if found is None or found.doc is None:
            raise NotFound(f"no reshard workflow reshard:{keyspace}.{workflow} in the topo "
                           "store")
        flow = cls(store, ReshardSpec.from_doc(found.doc["spec"]), **kwargs)
        flow.doc, flow.version = found.doc, found.version
        return flow

    async def _cursor(self, source: str, log: ChangeLog, position: str) -> LogCursor:
        """The open reader of ``source``'s log, if it is at ``position``; else a new one."""
        cur = self._cursors.get(source)
        if cur is None or cur.position != position or cur.log is not log:
            if cur is not None:
                await cur.close()
            cur = self._cursors[source] = LogCursor(log, position)
        return cur

    async def close(self) -> None:
        """Give up the lease; release the connections and change-log readers."""
        await self.release()
        for cur in self._cursors.values():
            await cur.close()
        self._cursors.clear()
        for log in self._logs.values():
            await log.close()
        for backend in self._backends.values():
            await backend.close()
        self._logs.clear()
        self._backends.clear()

    # -- the record -------------------------------------------------------------

    async def _load(self, *, lease: bool = True) -> None:
        found = await self.store.get_workflow(self.spec.record)
        if found is None or found.doc is None:
            raise NotFound(f"no reshard workflow {self.spec.record} in the topo store")
        self.doc, self.version = found.doc, found.version
        if lease:
            self._check_lease()

    def _check_lease(self, doc: Mapping[str, Any] | None = None) -> None:
        """Refuse to work on the workflow while another live process does (its lease,
        renewed with every save of its record, has not expired); ``doc``: the record
        to look at (default: the one loaded)."""
        runner = (self.doc if doc is None else doc).get("runner") or {}
        if runner.get("id") not in (None, self._runner) \
                and float(runner.get("until", 0)) > time.time() and _alive(runner):
            raise FailedPrecondition(
                f"process {runner.get('pid')} works on {self.spec.record} (e.g. `shardgate "
                f"{self.command} run --follow`): stop it first, or wait "
                f"{float(runner['until']) - time.time():.0f}s if it died")

    async def _save(self, **changes: Any) -> None:
        self.doc.update(changes)
        self.doc["runner"] = {"id": self._runner, "pid": os.getpid(),
                              "host": socket.gethostname(), "until": time.time() + LEASE_S}
        try:
            self.version = await self.store.put_workflow(self.spec.record, self.doc,
                                                         expect=self.version)
        except TopoConflict:
            # Another process saved since our load: if it holds a live lease (its
            # lease had lapsed when we loaded, e.g. one slow catch-up round), the
            # refusal is the lease's, not a bare conflict.
            found = await self.store.get_workflow(self.spec.record)
            if found is not None and found.doc is not None:
                self._check_lease(found.doc)
            raise

    async def release(self) -> None:
        """Give up this process's lease (the record may be gone: complete, cancel)."""
        if (self.doc.get("runner") or {}).get("id") != self._runner:
            return
        self.doc["runner"] = None
        with contextlib.suppress(ShardgateError):
            self.version = await self.store.put_workflow(self.spec.record, self.doc,
                                                         expect=self.version)

    @property
    def state(self) -> str:
        return str(self.doc.get("state", "new"))

    # -- databases --------------------------------------------------------------

    async def _topology(self) -> Topology:
        return await self.store.load_topology()

    def _url(self, topo: Topology, shard: str) -> str:
        return topo.keyspace(self.spec.keyspace).any_shard(shard).url

    def _backend(self, url: str) -> Backend:
        if url not in self._backends:
            self._backends[url] = open_backend(url, pool_size=2)
        return self._backends[url]

    def _log(self, url: str, shard: str) -> ChangeLog:
        if url not in self._logs:
            self._logs[url] = open_change_log(url, f"{self.spec.keyspace}/{shard}")
        return self._logs[url]

    async def _sources(self) -> dict[str, tuple[Backend, ChangeLog]]:
        topo = await self._topology()
        out = {}
        for s in self.spec.sources:
            url = self._url(topo, s)
            out[s] = (self._backend(url), self._log(url, s))
        return out

    def _targets(self) -> tuple[list[tuple[str, KeyRange]], dict[str, Backend]]:
        urls = dict(self.spec.target_urls)
        ranges = [(t, parse_shard_name(t)) for t in self.spec.targets]
        return ranges, {t: self._backend(urls[t]) for t in self.spec.targets}

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
                if vt is not None and vt.type == "reference":
                    column: str | None = None
                    vindex: SingleColumn | None = None
                elif vt is not None and vt.type == "queue":
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

    async def _source_placement(self) -> dict[str, MovingTable]:
        """The moving tables with the vindexes that place their rows on the sources (the
        reverse streams' targets, a resumed copy's clean-up): a reshard keeps the
        keyspace's vindexes, so the moving tables themselves."""
        return await self._moving_tables()

    async def _serve_sources(self) -> None:
        """After a reverse journal (:meth:`.reverse.ReverseStreams.publish`): the sources
        are the keyspace's serving shards again, the targets pending."""
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

    async def _source_tables(self, source: str) -> dict[str, MovingTable]:
        """The tables ``source``'s stream moves: all of them for the first source,
        the others' sharded tables only (a reference table is copied and replayed
        from one source: every source holds the same rows and changes)."""
        tables = await self._moving_tables()
        if source == self.spec.sources[0]:
            return tables
        return {n: t for n, t in tables.items() if not t.reference}

    async def _applier(self, source: str) -> Applier:
        ranges, backends = self._targets()
        return Applier(await self._source_tables(source), ranges, backends)

    # -- create and run ---------------------------------------------------------

    async def create(self) -> None:
        """Create the workflow (or resume it, with the same arguments) and copy."""
        found = await self.store.get_workflow(self.spec.record)
        if found is not None and found.doc is not None:
            recorded = ReshardSpec.from_doc(found.doc["spec"])
            if recorded != self.spec:
                raise AlreadyExists(
                    f"workflow {self.spec.record} exists with other arguments "
                    f"({recorded.to_doc()}); resume it with the same ones or cancel it")
            self.doc, self.version = found.doc, found.version
        else:
            await self._start()
        if self.state == "copying":
            await self._setup()  # idempotent: a crash may have cut it short
        await self.run()

    async def _start(self) -> None:
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
        self.doc = {"kind": "reshard", "spec": self.spec.to_doc(), "state": "copying"}
        self._tables = {}
        tables = await self._moving_tables()
        streams = {s: {"state": "copying", "pos": None, "lag_s": 0.0, "error": None,
                       "tables": {t: {"last": None, "done": False, "rows": 0}
                                  for t in await self._source_tables(s)}}
                   for s in self.spec.sources}
        await self._create_target_tables(check_only=True)  # refuse before recording
        self.doc.update(tables=sorted(tables), streams=streams,
                        estimate=await self._estimate(), started=time.time())
        self.version = await self.store.put_workflow(self.spec.record, self.doc, expect=0)

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

    async def _estimate(self) -> int:
        total = 0
        for source, (backend, _) in (await self._sources()).items():
            for name in await self._source_tables(source):
                res = await backend.execute(
                    f"SELECT COUNT(*) FROM {quote(backend.dialect, name)}")
                total += int(res.rows[0][0])
        return total

    async def _create_target_tables(self, *, check_only: bool = False) -> None:
        """Create the moving tables on the targets lacking them, with the source table's
        definition (:mod:`shardgate.workflows.ddl`); ``check_only``: only compute the
        statements, so that what cannot be carried is refused before anything is done."""
        topo = await self._topology()
        src = self._backend(self._url(topo, self.spec.sources[0]))
        _, targets = self._targets()
        conn = await src.acquire()
        try:
            for name in await self._moving_tables():
                table = await source_table(conn, src.dialect, name)
                for t, backend in targets.items():
                    tconn = await backend.acquire()
                    try:
                        if name in await user_tables(tconn, backend.dialect):
                            continue
                        stmts = table.statements(backend.dialect, f"target {t}",
                                                 queue=name in self._queues)
                        if not check_only:
                            await self._run_ddl(tconn, backend.dialect, name, t, stmts)
                            if name in self._queues:
                                await self._make_queue(tconn, src.dialect, backend.dialect,
                                                       name)
                    finally:
                        await backend.release(tconn)
        finally:
            await src.release(conn)

    @staticmethod
    async def _run_ddl(conn: Connection, dialect: str, table: str, target: str,
                       stmts: list[str]) -> None:
        """Run ``stmts`` (the table, then its indexes); a statement the target refuses
        drops the table again (MariaDB's DDL is not transactional), so that the next
        attempt does not take a half-made table for one created on purpose."""
        for i, sql in enumerate(stmts):
            try:
                await conn.execute(sql)
            except (Unavailable, DeadlineExceeded):
                raise
            except ShardgateError as exc:
                if i:
                    with contextlib.suppress(ShardgateError):
                        await conn.execute(f"DROP TABLE {quote(dialect, table)}")
                raise Unsupported(f"table {table}: target {target} ({dialect}) refused "
                                  f"{sql!r}: {exc}; create the table on the target "
                                  "first") from exc

    async def _make_queue(self, conn: Connection, source_dialect: str, dialect: str,
                          name: str) -> None:
        """Make a target's new copy of queue table ``name`` a queue table: defaults,
        comment marker and scan indexes (:func:`~shardgate.queues.ddl.queue_table_extras`;
        SQLite's ``CREATE TABLE`` copied from a SQLite source and MariaDB's ``SHOW
        CREATE TABLE`` carry the marker and defaults already)."""
        if dialect == source_dialect == "mysql":
            return
        for sql in queue_table_extras(name, self._queues[name], dialect):
            await conn.execute(sql)

    async def _edit_keyspace(self, change: Callable[[dict[str, Any]], object],
                             keyspace: str | None = None) -> None:
        """Apply ``change`` to the record of ``keyspace`` (default: the workflow's;
        compare-and-swap, retried)."""
        name = keyspace or self.spec.keyspace
        while True:
            rec = await self.store.store.get("keyspace", name)
            if rec is None or rec.doc is None:
                raise NotFound(f"keyspace {name!r} is not in the topo store")
            doc = rec.doc
            change(doc)
            if not doc.get("pending_shards"):
                doc.pop("pending_shards", None)
            try:
                await self.store.put_keyspace(name, doc, expect=rec.version)
                return
            except TopoConflict:
                continue  # another change got in first: apply ours to it

    async def run(self) -> None:
        """Copy what is left, then catch up with the sources' logs as they are now."""
        self._check_lease()
        await self._recover()
        if self.state == "copying":
            await self._copy()
        await self.catch_up()

    async def _copy(self) -> None:
        sources = await self._sources()
        ranges, backends = self._targets()
        for name, (backend, log) in sources.items():
            tables = await self._source_tables(name)
            applier = await self._applier(name)
            stream = self.doc["streams"][name]
            first = True
            while not all(t["done"] for t in stream["tables"].values()):
                await copy_cycle(stream, source=backend, log=log,
                                 cursor=functools.partial(self._cursor, name, log),
                                 tables=tables,
                                 targets=ranges, target_backends=backends, applier=applier,
                                 save=self._save, batch=self.batch,
                                 progress=self._copied if self.progress else None,
                                 clean_tail=parse_shard_name(name) if first else None,
                                 placed=await self._source_placement())
                first = False
            stream["state"] = "running"
            await self._save()
        await self._save(state="running")

    def _copied(self, _rows: int) -> None:
        if self.progress is not None:
            done = sum(t["rows"] for s in self.doc["streams"].values()
                       for t in s["tables"].values())
            self.progress(done, int(self.doc.get("estimate", 0)))

    async def catch_up(self, *, deadline: float | None = None,
                       until: Mapping[str, str] | None = None) -> bool:
        """Apply each source's log up to its current end (or ``until[source]``); True
        when every stream got there before ``deadline``. After the write switch: the
        reverse streams, targets to sources (``until[target]``, see :mod:`.reverse`)."""
        if self.state in ("switched", REVERSING):
            return await self._reverse.catch_up(deadline=deadline, until=until)
        if self.state not in ("running", "cutover"):
            return False
        done_all = True
        for name, (backend, log) in (await self._sources()).items():
            applier = await self._applier(name)
            stream = self.doc["streams"][name]
            target = until[name] if until is not None else await log.current_position()

            saved = time.monotonic()

            async def report(pos: str, lag: float, stream: dict[str, Any] = stream,
                             applier: Applier = applier) -> None:
                nonlocal saved
                stream["pos"], stream["lag_s"] = pos, lag
                if applier.applied and self.state == "running" \
                        and (self.doc.get("runner") or {}).get("id") == self._runner:
                    _pause_point("catch-up")
                if time.monotonic() - saved >= SAVE_EVERY_S:  # the record is not a log
                    await self._save()
                    saved = time.monotonic()

            _, done = await catch_up(await self._cursor(name, log, stream["pos"]),
                                     backend.dialect,
                                     applier, report=report, until=target, deadline=deadline)
            if done:  # at the log's end as it was: nothing older is left to apply
                stream["lag_s"] = 0.0
            await self._save()
            done_all = done_all and done
        return done_all

    async def follow(self, stop: asyncio.Event, *, idle_s: float = FOLLOW_IDLE_S) -> None:
        """Keep the targets caught up until ``stop`` is set (``reshard run --follow``),
        holding the workflow's lease: other commands that write refuse meanwhile. After
        the write switch it keeps the sources caught up with the targets instead."""
        await self._load()
        await self._recover()
        if self.state != "switched":
            self._need("running", "follow the sources")
        while not stop.is_set():
            await self.catch_up()  # saves the record: renews the lease
            with contextlib.suppress(TimeoutError):
                await wait_for(stop.wait(), idle_s)

    # -- status -----------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """The record, with each stream's distance to its source's log end."""
        await self._load(lease=False)
        out: dict[str, Any] = {"workflow": self.spec.record, "state": self.state,
                               "spec": self.spec.to_doc(), "streams": {}}
        journal = await self.store.get_workflow(self.spec.journal)
        out["journal"] = journal.doc if journal is not None else None
        sources = await self._sources()
        for name, stream in self.doc.get("streams", {}).items():
            backend, log = sources[name]
            head = await log.current_position()
            rows = sum(t["rows"] for t in stream["tables"].values())
            out["streams"][name] = {
                "state": "error" if stream.get("error") else stream["state"],
                "position": stream["pos"], "source_position": head,
                "behind": _distance(backend.dialect, stream["pos"], head),
                "lag_s": stream.get("lag_s", 0.0), "rows_copied": rows,
                "copy_s": float(stream.get("copy_s", 0.0)),
                "last_error": stream.get("error"),
            }
        out["rows_copied"] = sum(s["rows_copied"] for s in out["streams"].values())
        out["estimate"] = self.doc.get("estimate", 0)
        out["reverse_streams"] = await self._reverse.status()
        out["reads_switched"] = bool(self.doc.get("reads_switched"))
        out["last_error"] = self.doc.get("error")
        out["metrics"] = figures(self.doc)
        runner = self.doc.get("runner") or {}
        live = float(runner.get("until", 0)) > time.time() and _alive(runner)
        out["runner_pid"] = runner.get("pid") if live else None
        # a cut-over whose process is gone: its frozen shards refuse writes (the gates
        # hold them at most HOLD_S) until the next command rolls it forward or back
        out["interrupted"] = None
        if self.state in ("cutover", REVERSING) and not live:
            journal_name = self.spec.journal if self.state == "cutover" else \
                self._reverse.journal
            forward = await self.store.get_workflow(journal_name) is not None
            out["interrupted"] = "forward" if forward else "back"
        return out

    # -- vdiff ------------------------------------------------------------------

    async def vdiff(self) -> list[TableDiff]:
        """Compare sources and targets at one consistent point (see :mod:`.vdiff`)."""
        await self._load()
        await self._recover()
        if self.state != "running":
            raise FailedPrecondition(
                f"workflow {self.spec.record} is {self.state!r}: VDiff runs once the copy is "
                "done and before the write switch")
        sources = await self._sources()
        _, targets = self._targets()
        async with contextlib.AsyncExitStack() as stack:
            snaps: dict[str, Connection] = {}
            positions: dict[str, str] = {}
            for name, (backend, log) in sources.items():
                conn, pos = await stack.enter_async_context(_snapshot(backend, log))
                snaps[name], positions[name] = conn, pos
            await self.catch_up(until=positions)
            tconns = {}
            for t, backend in targets.items():
                tconns[t] = await stack.enter_async_context(_connection(backend))
            reports = []
            for table in (await self._moving_tables()).values():
                if table.reference:  # the first source's rows, on every target
                    first, (b, _) = next(iter(sources.items()))
                    reports.append(merge_diffs(table.name, [
                        (t, await diff_table([(snaps[first], b.dialect, b.placeholder)],
                                             [(tconns[t], tb.dialect, tb.placeholder)], table))
                        for t, tb in targets.items()]))
                    continue
                reports.append(await diff_table(
                    [(snaps[s], b.dialect, b.placeholder) for s, (b, _) in sources.items()],
                    [(tconns[t], b.dialect, b.placeholder) for t, b in targets.items()],
                    table))
        await self._save(last_vdiff={"at": time.time(),
                                     "tables": [r.to_doc() for r in reports]})
        return reports

    # -- traffic ----------------------------------------------------------------

    async def switch_reads(self, *, dry_run: bool = False) -> str:
        """Serve reads outside transactions from the targets."""
        await self._load()
        await self._recover()
        self._need("running", "switch reads")
        await self.catch_up()
        self._check_lag()
        topo = await self._topology()
        ks = topo.keyspace(self.spec.keyspace)
        reads = sorted({s.name for s in ks.shards} - set(self.spec.sources)
                       | set(self.spec.targets))
        plan = f"reads of {ks.name} would be served by shards {reads}"
        if dry_run:
            return "dry run: " + plan
        await self._edit_keyspace(lambda doc: doc.update(read_shards=reads))
        await self._save(reads_switched=True)
        return plan.replace("would be", "are")

    async def reverse_traffic(self, *, max_lag_s: float = DEFAULT_MAX_LAG_S,
                              timeout_s: float = CUTOVER_TIMEOUT_S) -> str:
        """Serve reads from the sources again; after the write switch, writes too (the
        reverse cut-over, see :mod:`.reverse`)."""
        await self._load()
        await self._recover()
        if self.state == "switched":
            return await self._reverse.reverse_writes(
                max_lag_s=max_lag_s, timeout_s=timeout_s, rounds=PRE_CUTOVER_ROUNDS,
                short_round_s=SHORT_ROUND_S)
        await self._edit_keyspace(lambda doc: doc.pop("read_shards", None))
        await self._save(reads_switched=False)
        return f"reads of {self.spec.keyspace} are served by the sources again"

    def _need(self, state: str, what: str) -> None:
        if self.state != state:
            raise FailedPrecondition(
                f"cannot {what}: workflow {self.spec.record} is {self.state!r}, not {state!r}")

    def _check_lag(self, bound: float = DEFAULT_MAX_LAG_S) -> None:
        lags = {s: float(v.get("lag_s", 0.0)) for s, v in self.doc["streams"].items()}
        worst = max(lags.values(), default=0.0)
        if worst > bound:
            raise FailedPrecondition(
                f"the targets lag the sources by {worst:.1f}s (bound {bound:g}s): "
                f"let `shardgate {self.command} status` show them caught up and retry")

    async def switch_writes(self, *, dry_run: bool = False, max_lag_s: float = DEFAULT_MAX_LAG_S,
                            timeout_s: float = CUTOVER_TIMEOUT_S) -> dict[str, Any]:
        """The write cut-over (see ``cutover`` in the module docstring); returns timings."""
        await self._load()
        await self._recover()
        self._need("running", "switch writes")
        if not self.doc.get("reads_switched"):
            raise FailedPrecondition("switch reads first (switch-traffic --reads)")
        if not dry_run:
            await self._reverse.prepare()  # capture on the targets, for reverse-traffic
        # catch up until one round is short: what is left for the final catch-up
        # (while writes are refused) is then what a short round leaves
        for _ in range(PRE_CUTOVER_ROUNDS):
            round_start = time.monotonic()
            await self.catch_up()
            if time.monotonic() - round_start < SHORT_ROUND_S:
                break
        self._check_lag(max_lag_s)
        if dry_run:
            return {"dry_run": True, "plan": f"freeze writes on {list(self.spec.sources)}, "
                    f"catch up, journal, serve writes from {list(self.spec.targets)}"}
        # change capture on the targets (idempotent), before the freeze: a PostgreSQL
        # slot waits for the transactions open on the server
        targets = self._target_logs()
        for target_log in targets.values():
            await target_log.prepare()
        await self._save(state="cutover")
        start = time.monotonic()
        sources = await self._sources()
        steps: dict[str, float] = {}
        try:
            for backend, _ in sources.values():
                await self._freeze(backend, True)
            steps["freeze_s"] = time.monotonic() - start
            final = dict(zip(sources, await asyncio.gather(*(
                final_position(backend, log) for backend, log in sources.values())),
                strict=True))
            if not await self.catch_up(until=final, deadline=time.monotonic() + timeout_s):
                raise DeadlineExceeded(
                    f"the final catch-up did not finish within {timeout_s:g}s; writes were "
                    "released on the sources, retry when the lag is lower")
            steps["catch_up_s"] = time.monotonic() - start - steps["freeze_s"]
            _pause_point("frozen")
            # the targets' log ends now: nothing but the catch-up wrote to them, so a
            # change stream resumes each target there, after the sources' final positions
            mark = time.monotonic()
            # (each position a round trip of its own: all at once)
            ends, reverse = await asyncio.gather(
                asyncio.gather(*(log.current_position() for log in targets.values())),
                self._reverse.positions())
            starts = dict(zip(targets, ends, strict=True))
            await self.store.put_workflow(self.spec.journal, {
                "workflow": self.spec.record, "positions": final, "targets": starts,
                "reverse_positions": reverse, "at": time.time()},
                expect=0)
            steps["journal_s"] = time.monotonic() - mark
        except BaseException as exc:
            self.doc["cutover_s"] = time.monotonic() - start  # saved by the roll-back
            with contextlib.suppress(Exception):
                await self._roll_back(f"{type(exc).__name__}: {exc}")
            raise
        self.doc["cutover_s"] = time.monotonic() - start  # saved with the switch
        _pause_point("journal")
        mark = time.monotonic()
        await self._publish_switch(steps)
        frozen = time.monotonic() - start
        steps["publish_s"] = time.monotonic() - mark
        log.info("reshard %s: write cut-over %.0f ms: %s", self.spec.record, frozen * 1000,
                 ", ".join(f"{k[:-2]} {v * 1000:.0f} ms" for k, v in steps.items()
                           if k.endswith("_s")))
        return {"frozen_s": frozen, "positions": final, **steps}

    def _target_logs(self) -> dict[str, ChangeLog]:
        return {t: self._log(url, t) for t, url in self.spec.target_urls}

    async def _freeze(self, backend: Backend, on: bool) -> None:
        """Make the source refuse (``on``) or accept again writes to the moving tables.

        Its statements are idempotent: one that lost a lock conflict (``ABORTED``: a
        SQLite shard held by writers that wait on each other across shards, a
        deadlock) is run again, all of them, up to :data:`FREEZE_ATTEMPTS` times.
        """
        for attempt in range(FREEZE_ATTEMPTS):
            try:
                await self._freeze_once(backend, on)
                return
            except Aborted:
                if attempt == FREEZE_ATTEMPTS - 1:
                    raise
                log.info("reshard %s: %s the source met a lock conflict; again",
                         self.spec.record, "freezing" if on else "unfreezing")
                await asyncio.sleep(0.05 * (attempt + 1))

    async def _freeze_once(self, backend: Backend, on: bool) -> None:
        d = backend.dialect
        conn = await backend.acquire()
        try:
            if d == "postgres" and on:
                await conn.execute(PG_DENY_FUNCTION)
            elif d == "sqlite" and on:
                await conn.execute(SQLITE_MARK_DDL)
            for name in await self._moving_tables():
                if d == "mysql":
                    for sql in freeze_sql(name, on):
                        await conn.execute(sql)
                    continue
                trig = quote(d, f"_sg_deny_{name}")
                t = quote(d, name)
                if d == "sqlite":
                    for op in ("INSERT", "UPDATE", "DELETE"):
                        tn = quote(d, f"_sg_deny_{op.lower()}_{name}")
                        if on:
                            await conn.execute(sqlite_deny_trigger(tn, op, t))
                        else:
                            await conn.execute(f"DROP TRIGGER IF EXISTS {tn}")
                elif d == "postgres":
                    await conn.execute(f"DROP TRIGGER IF EXISTS {trig} ON {t}")
                    if on:
                        await conn.execute(
                            f"CREATE TRIGGER {trig} BEFORE INSERT OR UPDATE OR DELETE ON {t} "
                            "FOR EACH ROW EXECUTE FUNCTION _sg_deny_writes()")
                else:
                    raise Unsupported(f"write cut-over on {d} sources is not implemented")
        finally:
            await backend.release(conn)

    async def _roll_back(self, error: str) -> None:
        for backend, _ in (await self._sources()).values():
            await self._freeze(backend, False)
        await self._save(state="running", error=error)

    async def _publish_switch(self, steps: dict[str, float] | None = None) -> None:
        """After the journal: the reverse streams start, the targets serve, the sources
        become pending. ``steps``: gets the durations of its parts and ``published_at``
        (wall clock, when the topology serving the targets was stored)."""
        steps = steps if steps is not None else {}
        mark = time.monotonic()
        found = await self.store.get_workflow(self.spec.journal)
        journal: dict[str, Any] = found.doc if found is not None and found.doc else {}
        await self._reverse.begin(journal)
        steps["reverse_begin_s"] = time.monotonic() - mark
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
        _pause_point("published")
        await self._save(state="switched", switched_at=time.time(), error=None)

    async def _recover(self) -> None:
        """Finish a cut-over a dead process left: forward with a journal, else back."""
        if self.state == REVERSING:
            await self._reverse.recover()
            return
        if self.state != "cutover":
            return
        if await self.store.get_workflow(self.spec.journal) is not None:
            await self._publish_switch()
        else:
            await self._roll_back("the cut-over was interrupted before its journal; "
                                  "rolled back")

    # -- the end ----------------------------------------------------------------

    async def complete(self) -> str:
        """After the switch: drop the sources from the keyspace, delete the records."""
        await self._load()
        await self._recover()
        self._need("switched", "complete")

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
        await self._load()
        await self._recover()
        if self.state == "switched":
            raise FailedPrecondition(f"{self.spec.record} has switched writes: run "
                                     "`reverse-traffic` first (or `complete` to keep them)")
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


def _alive(runner: Mapping[str, Any]) -> bool:
    """Whether a lease's process may still run (a process of this host that is gone
    does not; one of another host may)."""
    if runner.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(runner.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def _distance(dialect: str, pos: str | None, head: str) -> int | None:
    """How far ``pos`` is behind ``head`` (SQLite: change rows; PostgreSQL: WAL bytes)."""
    if pos is None:
        return None
    return max(0, position_key(dialect, head) - position_key(dialect, pos))


@contextlib.asynccontextmanager
async def _snapshot(backend: Backend, log: ChangeLog) -> AsyncIterator[tuple[Connection, str]]:
    conn, pos = await open_snapshot(backend, log)
    try:
        yield conn, pos
    finally:
        try:
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
        finally:
            await backend.release(conn)


@contextlib.asynccontextmanager
async def _connection(backend: Backend) -> AsyncIterator[Connection]:
    conn = await backend.acquire()
    try:
        yield conn
    finally:
        await backend.release(conn)


def list_workflows(records: list[Record]) -> dict[str, Any]:
    """The reshard and MoveTables workflow records among ``records`` (name -> document)."""
    return {r.name: r.doc for r in records
            if r.doc is not None and r.name.startswith(("reshard:", "movetables:"))}
