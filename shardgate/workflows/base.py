"""The state machine a reshard and a MoveTables share (Vitess's VReplication workflows).

A workflow moves the rows of some tables from **source** shards to **target**
shards while applications keep writing, then switches traffic to the
targets. :class:`Workflow` holds what both kinds do; a subclass says only
what differs: which tables move and how their rows are placed
(:meth:`Workflow._moving_tables`), which shards are sources and targets (its
spec), what is set up before the copy (:meth:`Workflow._setup`) and how
traffic moves (:meth:`Workflow._route_reads`, :meth:`Workflow._route_writes`,
:meth:`Workflow._serve_sources`): the keyspace record's serving shards for
:class:`~shardgate.workflows.reshard.ReshardWorkflow`, routing rules for
:class:`~shardgate.workflows.movetables.MoveTablesWorkflow`.

One workflow record (``<kind>:<keyspace>.<workflow>``) in the topo store holds
the spec and the state; every step saves it (compare-and-swap) before the next
one starts, so any process can resume the workflow after a crash. Its JSON
fields (``kind``, ``spec``, ``state``, ``tables``, ``streams``, ``estimate``,
``started``, ``runner``, ``reads_switched``, ``switched_at``, ``cutover_s``,
``error``, ``last_vdiff``, a subclass's own) are the format on disk: a record
written by an older version resumes with this one. States and what each
guarantees:

``copying``
    The targets exist and serve nothing; their tables were created
    (:func:`~shardgate.workflows.ddl.create_tables`); change capture runs on
    the sources. Each source shard's **stream** (``streams[<source>]``) copies
    its rows in copy cycles (:mod:`shardgate.workflows.rowcopy`), each under a
    consistent snapshot whose change-log position is known exactly, saving
    ``(position, last key)`` per table after every batch. A row goes to the
    target whose key range holds its keyspace id.
``running``
    Every row is copied; each stream's position says how far its source's
    change log is applied on the targets (:mod:`shardgate.workflows.catchup`:
    the log filtered to the moving tables, each change sent to the targets by
    key range, idempotent by primary key). Any command catches up first. VDiff
    (:meth:`Workflow.vdiff`) compares sources and targets at one consistent
    point. ``switch-traffic --reads`` may move reads (outside transactions) to
    the targets; ``reverse-traffic`` moves them back.
``cutover``
    ``switch-traffic --writes`` runs: the sources refuse writes to the moving
    tables (a trigger whose error carries
    :data:`~shardgate.topo.model.WRITES_FROZEN`; gates hold such statements,
    see :mod:`shardgate.gate.cutover` and :mod:`shardgate.workflows.freeze`),
    the streams are caught up to the sources' final positions, then the
    **journal** record (``journal:<workflow record>``) is written: the point
    of no return. A failure before the journal unfreezes the sources and
    returns to ``running`` (the sources keep serving); a process that died in
    ``cutover`` is rolled back (no journal) or forward (journal) by the next
    command.
``switched``
    The targets serve the moving tables, the sources stay frozen. The
    **reverse streams** (:mod:`shardgate.workflows.reverse`) replay the
    targets' changes on the sources; ``reverse-traffic`` switches writes back
    (state ``reversing`` while it runs) and returns to ``running``.
``complete`` (after ``switched``) makes the targets' ownership final and
deletes the records; ``cancel`` (before ``switched``) undoes what the
workflow set up on the targets and deletes the record.

Invariants: at every moment each moving table has exactly one place that
accepts writes (the sources until the journal, the targets after it, the
sources again after a reverse journal), and that place holds every committed
row; a stream's saved position never passes what was applied on the targets.

Who works on it: every save of the record also renews this process's
**lease** (``runner``: id, pid, host, expiry :data:`LEASE_S` later). A
command that writes refuses while another live process holds the lease (a
process of this host that is gone, SIGKILLed say, holds none), so two
appliers never replay the logs onto the targets at once; ``run --follow``
(:meth:`Workflow.follow`) keeps the targets caught up, and the lease, until
it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import secrets
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Generic, Self, TypeVar

from shardgate.aio import wait_for
from shardgate.backends import open_backend
from shardgate.backends.base import Backend
from shardgate.backends.changes import ChangeLog
from shardgate.backends.changes.open import open_change_log
from shardgate.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ShardgateError,
)
from shardgate.keys import KeyRange, ShardId, parse_shard_name
from shardgate.queues.options import QueueOptions
from shardgate.sql.dialects import Dialect
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import Record, TopoConflict
from shardgate.workflows.catchup import (
    Applier,
    LogCursor,
    catch_up,
    position_key,
)
from shardgate.workflows.cutover import (
    CUTOVER_TIMEOUT_S,
    DEFAULT_MAX_LAG_S,
    PRE_CUTOVER_ROUNDS,
    SHORT_ROUND_S,
    WriteCutover,
    pause_point,
)
from shardgate.workflows.ddl import create_tables
from shardgate.workflows.freeze import set_frozen
from shardgate.workflows.metrics import figures
from shardgate.workflows.reverse import REVERSING, ReverseStreams
from shardgate.workflows.rowcopy import DEFAULT_BATCH, copy_cycle
from shardgate.workflows.rowsql import MovingTable, quote
from shardgate.workflows.vdiff import TableDiff, diff_workflow

#: how often catch-up saves its position (a crash replays at most this much)
SAVE_EVERY_S = 0.5
#: how long a process's claim on a workflow lasts without a save (seconds)
LEASE_S = 5.0
#: ``run --follow``: the pause between catch-up rounds when the sources are idle
FOLLOW_IDLE_S = 0.2

#: keyspace, workflow and table names: letters, digits and '_'
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
log = logging.getLogger(__name__)

@dataclass(frozen=True)
class WorkflowSpec:
    """What ``create`` was asked for: the keyspace (of the sources), the source and
    target shards, each target's database URL and the workflow's name. A subclass
    adds its own fields (they come along in :meth:`to_doc`) and names the record."""

    keyspace: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    target_urls: tuple[tuple[str, str], ...]
    workflow: str

    def __post_init__(self) -> None:
        for what, name in (("--keyspace", self.keyspace), ("--workflow", self.workflow)):
            if not NAME.match(name):
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

    @property
    @abstractmethod
    def record(self) -> str:
        """The workflow record's name."""

    @property
    def journal(self) -> str:
        """The write cut-over's journal record."""
        return f"journal:{self.record}"

    def to_doc(self) -> dict[str, Any]:
        """The spec as JSON (tuples as lists, ``target_urls`` as an object); a
        subclass's fields come along."""
        doc = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        doc["target_urls"] = dict(self.target_urls)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Self:
        """The spec :meth:`to_doc` wrote."""
        values: dict[str, Any] = {
            f.name: tuple(doc[f.name]) if isinstance(doc[f.name], list) else doc[f.name]
            for f in fields(cls) if f.name in doc}
        values["target_urls"] = tuple(sorted(doc["target_urls"].items()))
        return cls(**values)


S = TypeVar("S", bound=WorkflowSpec)
Progress = Callable[[int, int], None]


class Workflow(ABC, Generic[S]):
    """One workflow, resumable from its topo store record (see the module docstring).

    A subclass sets :attr:`kind`, :attr:`title`, :attr:`command` and
    :attr:`spec_type` and implements the abstract methods: the moving tables, the
    set-up before the copy, where reads and writes go, and ``complete`` / ``cancel``.
    """

    #: the record's prefix and ``kind`` field; the default workflow name
    kind: ClassVar[str]
    #: the workflow's name in messages
    title: ClassVar[str]
    #: the CLI command group that drives this kind of workflow (for messages)
    command: ClassVar[str]
    #: the class of its spec
    spec_type: ClassVar[type[WorkflowSpec]]

    def __init__(self, store: TopoServer, spec: S, *, batch: int = DEFAULT_BATCH,
                 progress: Progress | None = None) -> None:
        if batch < 1:
            raise InvalidArgument("batch must be at least 1")
        self.store = store
        self.spec: S = spec
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
        #: the write cut-over
        self._cutover = WriteCutover(self)

    @classmethod
    async def resume(cls, store: TopoServer, keyspace: str, workflow: str | None = None,
                     **kwargs: Any) -> Self:
        """The workflow from its record (NotFound if there is none); ``keyspace``: the
        one its record is named after."""
        name = f"{cls.kind}:{keyspace}.{workflow or cls.kind}"
        found = await store.get_workflow(name)
        if found is None or found.doc is None:
            raise NotFound(f"no {cls.title} workflow {name} in the topo store")
        flow = cls(store, cls.spec_type.from_doc(found.doc["spec"]), **kwargs)  # type: ignore[arg-type]
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
            raise NotFound(f"no {self.title} workflow {self.spec.record} in the topo store")
        self.doc, self.version = found.doc, found.version
        if lease:
            self._check_lease()

    def _check_lease(self, doc: Mapping[str, Any] | None = None) -> None:
        """Refuse to work on the workflow while another live process does (see
        :func:`_check_runner`); ``doc``: the record to look at (default: the loaded one)."""
        _check_runner((self.doc if doc is None else doc).get("runner") or {}, self._runner,
                      self.spec.record, self.command)

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
        """The record's state (``new`` before ``create`` recorded it)."""
        return str(self.doc.get("state", "new"))

    def _need(self, state: str, what: str) -> None:
        if self.state != state:
            raise FailedPrecondition(
                f"cannot {what}: workflow {self.spec.record} is {self.state!r}, not {state!r}")

    async def _begin(self, state: str | None = None, what: str = "") -> None:
        """Every command's start: load (lease checked), finish an interrupted cut-over,
        and, given ``state``, refuse unless the workflow is in it."""
        await self._load()
        await self._recover()
        if state is not None:
            self._need(state, what)

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
            self._logs[url] = open_change_log(url, str(ShardId(self.spec.keyspace, shard)))
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

    def _target_logs(self) -> dict[str, ChangeLog]:
        return {t: self._log(url, t) for t, url in self.spec.target_urls}

    @abstractmethod
    async def _moving_tables(self) -> dict[str, MovingTable]:
        """The moving tables, placed by the targets' vindexes (read once, then kept)."""

    async def _source_placement(self) -> dict[str, MovingTable]:
        """The moving tables with the vindexes that place their rows on the sources (the
        reverse streams' targets, a resumed copy's clean-up); by default the moving
        tables themselves (the same vindexes on both sides)."""
        return await self._moving_tables()

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

    async def _edit_keyspace(self, change: Callable[[dict[str, Any]], object],
                             keyspace: str | None = None) -> None:
        """Apply ``change`` to the record of ``keyspace`` (default: the workflow's;
        compare-and-swap, retried)."""
        await edit_keyspace(self.store, keyspace or self.spec.keyspace, change)

    # -- create and run ---------------------------------------------------------

    def _same_request(self, recorded: S) -> bool:
        """Whether a recorded spec is what ``create`` was asked for again."""
        return recorded == self.spec

    async def create(self) -> None:
        """Create the workflow (or resume it, with the same arguments) and copy."""
        found = await self.store.get_workflow(self.spec.record)
        if found is not None and found.doc is not None:
            recorded: S = self.spec_type.from_doc(found.doc["spec"])  # type: ignore[assignment]
            if not self._same_request(recorded):
                raise AlreadyExists(
                    f"workflow {self.spec.record} exists with other arguments "
                    f"({recorded.to_doc()}); resume it with the same ones or cancel it")
            self.spec = recorded
            self.doc, self.version = found.doc, found.version
        else:
            await self._start()
        if self.state == "copying":
            await self._setup()  # idempotent: a crash may have cut it short
        await self.run()

    @abstractmethod
    async def _check_start(self) -> dict[str, Any]:
        """Refuse a workflow that cannot start; the record's own fields of this kind."""

    async def _start(self) -> None:
        own = await self._check_start()
        self.doc = {"kind": self.kind, "spec": self.spec.to_doc(), "state": "copying", **own}
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

    @abstractmethod
    async def _setup(self) -> None:
        """What the copy needs (idempotent): the target tables, capture on the sources."""

    async def _estimate(self) -> int:
        total = 0
        for source, (backend, _) in (await self._sources()).items():
            for name in await self._source_tables(source):
                res = await backend.execute(
                    f"SELECT COUNT(*) FROM {quote(backend.dialect, name)}")
                total += int(res.rows[0][0])
        return total

    async def _create_target_tables(self, *, check_only: bool = False) -> None:
        """Create the moving tables on the targets lacking them (see
        :func:`~shardgate.workflows.ddl.create_tables`)."""
        topo = await self._topology()
        _, targets = self._targets()
        await create_tables(self._backend(self._url(topo, self.spec.sources[0])), targets,
                            await self._moving_tables(), self._queues, check_only=check_only)

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
                    pause_point("catch-up")
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
        """Keep the targets caught up until ``stop`` is set (``run --follow``),
        holding the workflow's lease: other commands that write refuse meanwhile. After
        the write switch it keeps the sources caught up with the targets instead."""
        await self._begin()
        if self.state != "switched":
            self._need("running", "follow the sources")
        while not stop.is_set():
            await self.catch_up()  # saves the record: renews the lease
            with contextlib.suppress(TimeoutError):
                await wait_for(stop.wait(), idle_s)

    # -- status and vdiff -------------------------------------------------------

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
            out["streams"][name] = _stream_status(stream, backend.dialect,
                                                  await log.current_position())
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

    async def vdiff(self) -> list[TableDiff]:
        """Compare sources and targets at one consistent point (see :mod:`.vdiff`)."""
        await self._begin()
        if self.state != "running":
            raise FailedPrecondition(
                f"workflow {self.spec.record} is {self.state!r}: VDiff runs once the copy is "
                "done and before the write switch")
        _, targets = self._targets()
        reports = await diff_workflow(await self._sources(), targets,
                                      (await self._moving_tables()).values(),
                                      lambda positions: self.catch_up(until=positions))
        await self._save(last_vdiff={"at": time.time(),
                                     "tables": [r.to_doc() for r in reports]})
        return reports

    # -- traffic ----------------------------------------------------------------

    def _check_lag(self, bound: float = DEFAULT_MAX_LAG_S) -> None:
        lags = {s: float(v.get("lag_s", 0.0)) for s, v in self.doc["streams"].items()}
        worst = max(lags.values(), default=0.0)
        if worst > bound:
            raise FailedPrecondition(
                f"the targets lag the sources by {worst:.1f}s (bound {bound:g}s): "
                f"let `shardgate {self.command} status` show them caught up and retry")

    @abstractmethod
    async def _reads_plan(self) -> str:
        """What a read switch does, said as "reads of ... would be served by ..."."""

    @abstractmethod
    async def _route_reads(self, to_targets: bool) -> str:
        """Send reads outside transactions to the targets (or back to the sources);
        what it did, for the command's output."""

    async def switch_reads(self, *, dry_run: bool = False) -> str:
        """Serve reads outside transactions from the targets."""
        await self._begin("running", "switch reads")
        await self.catch_up()
        self._check_lag()
        plan = await self._reads_plan()
        if dry_run:
            return "dry run: " + plan
        await self._route_reads(True)
        await self._save(reads_switched=True)
        return plan.replace("would be", "are")

    async def reverse_traffic(self, *, max_lag_s: float = DEFAULT_MAX_LAG_S,
                              timeout_s: float = CUTOVER_TIMEOUT_S) -> str:
        """Serve reads from the sources again; after the write switch, writes too (the
        reverse cut-over, see :mod:`.reverse`)."""
        await self._begin()
        if self.state == "switched":
            return await self._reverse.reverse_writes(
                max_lag_s=max_lag_s, timeout_s=timeout_s, rounds=PRE_CUTOVER_ROUNDS,
                short_round_s=SHORT_ROUND_S)
        said = await self._route_reads(False)
        await self._save(reads_switched=False)
        return said

    async def switch_writes(self, *, dry_run: bool = False, max_lag_s: float = DEFAULT_MAX_LAG_S,
                            timeout_s: float = CUTOVER_TIMEOUT_S) -> dict[str, Any]:
        """The write cut-over (:mod:`.cutover`); returns timings."""
        return await self._cutover.switch_writes(dry_run=dry_run, max_lag_s=max_lag_s,
                                                 timeout_s=timeout_s)

    async def _freeze(self, backend: Backend, on: bool) -> None:
        """Make the source refuse (``on``) or accept again writes to the moving tables
        (:func:`~shardgate.workflows.freeze.set_frozen`)."""
        await set_frozen(backend, list(await self._moving_tables()), on,
                         record=self.spec.record)

    @abstractmethod
    async def _route_writes(self, journal: Mapping[str, Any],
                            steps: dict[str, float]) -> None:
        """After the journal and the reverse streams' start: make the targets serve
        every use of the moving tables and record the state ``switched`` (idempotent: a
        process that died half-way left it to the next command); ``steps``: gets
        ``topology_s`` and ``published_at``."""

    @abstractmethod
    async def _serve_sources(self) -> None:
        """After a reverse journal (:meth:`.reverse.ReverseStreams.publish`): every use
        of the moving tables goes to the sources again."""

    async def _recover(self) -> None:
        """Finish a cut-over (or reverse cut-over) a dead process left."""
        await self._cutover.recover()

    # -- the end ----------------------------------------------------------------

    @abstractmethod
    async def complete(self) -> str:
        """After the switch: the targets own the moving tables for good; the records go."""

    @abstractmethod
    async def cancel(self) -> str:
        """Before the write switch: undo the targets' part; the record goes."""

    async def _refuse_switched(self) -> None:
        """``cancel``'s start: loaded, recovered, and refused after the write switch."""
        await self._begin()
        if self.state == "switched":
            raise FailedPrecondition(f"{self.spec.record} has switched writes: run "
                                     "`reverse-traffic` first (or `complete` to keep them)")


async def edit_keyspace(store: TopoServer, name: str,
                        change: Callable[[dict[str, Any]], object]) -> None:
    """Apply ``change`` to keyspace ``name``'s record (compare-and-swap, retried; an
    emptied ``pending_shards`` goes)."""
    while True:
        rec = await store.store.get("keyspace", name)
        if rec is None or rec.doc is None:
            raise NotFound(f"keyspace {name!r} is not in the topo store")
        doc = rec.doc
        change(doc)
        if not doc.get("pending_shards"):
            doc.pop("pending_shards", None)
        try:
            await store.put_keyspace(name, doc, expect=rec.version)
            return
        except TopoConflict:
            continue  # another change got in first: apply ours to it


def _check_runner(runner: Mapping[str, Any], me: str, record: str, command: str) -> None:
    """Refuse while a live process other than ``me`` holds the lease ``runner`` (it
    renews it with every save of the record ``record``, until it expires)."""
    if runner.get("id") not in (None, me) \
            and float(runner.get("until", 0)) > time.time() and _alive(runner):
        raise FailedPrecondition(
            f"process {runner.get('pid')} works on {record} (e.g. `shardgate "
            f"{command} run --follow`): stop it first, or wait "
            f"{float(runner['until']) - time.time():.0f}s if it died")


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


def _stream_status(stream: Mapping[str, Any], dialect: Dialect, head: str) -> dict[str, Any]:
    """One stream of :meth:`Workflow.status`: its state, position and distance to the
    source's log end ``head`` (SQLite: change rows; PostgreSQL: WAL bytes)."""
    pos = stream["pos"]
    return {
        "state": "error" if stream.get("error") else stream["state"],
        "position": pos, "source_position": head,
        "behind": None if pos is None else max(
            0, position_key(dialect, head) - position_key(dialect, pos)),
        "lag_s": stream.get("lag_s", 0.0),
        "rows_copied": sum(t["rows"] for t in stream["tables"].values()),
        "copy_s": float(stream.get("copy_s", 0.0)),
        "last_error": stream.get("error"),
    }


def list_workflows(records: list[Record]) -> dict[str, Any]:
    """The reshard and MoveTables workflow records among ``records`` (name -> document)."""
    return {r.name: r.doc for r in records
            if r.doc is not None and r.name.startswith(("reshard:", "movetables:"))}
