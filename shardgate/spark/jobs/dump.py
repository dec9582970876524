"""``shardgate spark dump``: a sharded table copied to a lake table that converges.

Two phases (see :mod:`shardgate.spark.jobs.lake` for the table and its
invariants):

1. **Snapshot** (first run only). One Spark task per shard opens one read
   transaction that also captures the shard's log position
   (:meth:`shardgate.backends.bulk.copy.ShardReader.snapshot`: an exported snapshot
   of a new logical slot on PostgreSQL, a consistent snapshot on MariaDB, a
   read transaction that reads the change table's last sequence on SQLite),
   reads the whole table in it as Arrow batches, and writes Parquet files into
   the lake directory, every row carrying the shard's snapshot position as its
   token. The driver then commits all the files **and** the positions in one
   Delta commit: a crash before it leaves no data and the next run starts over;
   files of failed task attempts are never committed.
2. **Change apply.** The driver follows the keyspace's change stream
   (:meth:`shardgate.gate.Gate.update_stream`) from the recorded positions,
   keeps the changes of the table, and merges them into the lake table every
   ``batch_rows`` rows (once caught up, also every ``batch_interval_s``; behind,
   only full batches, as every MERGE rewrites the files it touches): newest
   token wins, deletes as tombstones, the positions recorded in the same
   commit. A MERGE runs in a thread while the next batch is read; MERGEs commit
   one at a time, in order. Without ``follow`` it stops once every shard has
   reached the end its log had when the apply began; with ``follow`` it goes
   on until ``stop`` is set, and then drains: it stops at the log ends as of
   that moment.

**Why overlaps are harmless.** A snapshot row carries the shard's snapshot
position ``P`` as its order; the stream is read from ``P`` on and a change
replaces a row only if its order (its commit position) is larger
(``s._sg_order > t._sg_order``). A change already contained in the snapshot
(possible wherever a backend's position is read just before the snapshot, as
on MariaDB) is replayed and rewrites the row with its own image, and every later
change of the key follows in commit order, so the row ends as the newest
change left it; a change at or before ``P`` never replaces a snapshot row.
A rerun resumes from the positions of the last commit: changes applied after
them are applied again, which, by the same rule, changes nothing. Within one
micro-batch the stream's commit order decides (the last change of a key wins),
so the source of each MERGE has one row per key.

A ``TRUNCATE`` of the table on a shard turns every row of that shard with an
older order into a tombstone.

**Across a reshard.** Given the cluster file or the topo store
(``cluster_file``/``topo_url``), the apply reads the stream through a gate
that follows the store, so a reshard's write switch is a hop of the stream
(:mod:`shardgate.streams.hop`): each source is read to its final position,
then its targets from their journal positions. The dump follows it: a
target's changes get a generation above its sources' (see "Orders across a
reshard" in :mod:`shardgate.spark.jobs.lake`), and a source's token is
dropped from the recorded positions once every serving shard meeting its
range has one (the stream started them, so the source is drained): after
``complete`` the lake resumes from the targets' tokens alone. A lake whose
positions name sources of a reshard that completed since (the changes
between them and the switch are gone) is refused (``FAILED_PRECONDITION``).
So is a ``TRUNCATE`` on a shard a reshard created: its rows in the lake may
carry the names of earlier shards (``UNIMPLEMENTED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from shardgate.aio import wait_for
from shardgate.auth.identity import TRUSTED
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.changes.open import open_change_log
from shardgate.backends.urls import parse_url
from shardgate.errors import (
    Code,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ShardgateError,
    Unsupported,
)
from shardgate.event_token import EventToken, position_key
from shardgate.keys import ShardId, parse_shard_name
from shardgate.spark.jobs.dump_rows import RowBuilder, snapshot_shard
from shardgate.spark.jobs.lake import (
    DEFAULT_RETENTION_S,
    DESCRIPTION_PREFIX,
    Bucketing,
    LakeTable,
    Positions,
    Quarantine,
    choose_bucketing,
    lake_schema,
    token_order,
)
from shardgate.spark.jobs.tasks import run_tasks, table_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from shardgate.gate import Gate
    from shardgate.topo import Topology
    from shardgate.topo.model import KeyspaceTopo

#: change rows per MERGE at most
DEFAULT_BATCH_ROWS = 50_000
#: once caught up, a MERGE at least this often while changes come (seconds)
DEFAULT_BATCH_INTERVAL_S = 1.0
#: rows per Parquet file of the snapshot
DEFAULT_FILE_ROWS = 1_000_000
#: the snapshot picks the bucket count (a power of two) for about this many rows a bucket
DEFAULT_ROWS_PER_BUCKET = 512
#: stream heartbeats (seconds): how soon an idle shard's position moves
HEARTBEAT_S = 0.2
#: errors after which a step is tried again (a busy SQLite shard, a shard away), how often
RETRYABLE = (Code.ABORTED, Code.UNAVAILABLE)
RETRIES = 5
#: fail when the change stream gives nothing, not even a heartbeat, for this long (seconds)
DEFAULT_STALL_S = 120.0

Progress = Callable[[str], None]


@dataclass
class DumpSummary:
    """What a dump run did (``shardgate spark dump`` prints it as JSON)."""

    keyspace: str
    table: str
    lake: str
    snapshot: bool = False
    snapshot_rows: int = 0
    snapshot_files: int = 0
    snapshot_s: float = 0.0
    change_events: int = 0
    change_rows_merged: int = 0
    merges: int = 0
    catchup_s: float = 0.0
    compacted_files: int = 0
    vacuumed_files: int = 0
    quarantined: int = 0
    buckets: int = 0
    lake_bytes: int = 0
    positions: dict[str, str] = field(default_factory=dict)

    @property
    def snapshot_rows_per_s(self) -> float:
        return self.snapshot_rows / self.snapshot_s if self.snapshot_s > 0 else 0.0

    @property
    def catchup_events_per_s(self) -> float:
        return self.change_events / self.catchup_s if self.catchup_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["snapshot_rows_per_s"] = round(self.snapshot_rows_per_s, 1)
        d["catchup_events_per_s"] = round(self.catchup_events_per_s, 1)
        return d


def primary_key(url: str, table: str) -> list[str]:
    """The primary key columns of ``table`` on one shard database, in key order."""
    kind = parse_url(url).kind
    lit = "'" + table.replace("'", "''") + "'"
    if kind == "sqlite":
        sql = f"SELECT name FROM pragma_table_info({lit}) WHERE pk > 0 ORDER BY pk"
    elif kind == "postgresql":
        sql = ("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
               f" AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass({lit})"
               " AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)")
    else:
        sql = ("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE"
               f" TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {lit} AND CONSTRAINT_NAME ="
               " 'PRIMARY' ORDER BY ORDINAL_POSITION")
    return [str(r[0]) for r in bulk.query(url, sql)]


# ------------------------------------------------------------------------- job --


class DumpJob:
    """A dump of ``keyspace.table`` into the lake table at ``lake`` (see the module doc).

    ``spark`` is needed for the snapshot only (a rerun of a dump that has
    one does not touch Spark). ``key``: the columns identifying a row in the lake
    (default: the table's primary key on the first shard). ``retention_s``: how
    long a replaced version's files stay readable before they are vacuumed.
    ``buckets``: the partition count (a power of two; default: about
    ``rows_per_bucket`` rows each, at the snapshot). ``numeric_as``: the type of
    unbounded NUMERIC columns (see ``docs/types.md``). ``cluster_file`` or
    ``topo_url``: where the topology lives; the run reads it again there and
    follows it (a reshard's write switch, see "Across a reshard"); without
    them ``topology`` is fixed and a reshard is not seen.
    """

    def __init__(
        self,
        topology: Topology,
        keyspace: str,
        table: str,
        lake: str,
        *,
        spark: SparkSession | None = None,
        key: Sequence[str] | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_interval_s: float = DEFAULT_BATCH_INTERVAL_S,
        file_rows: int = DEFAULT_FILE_ROWS,
        progress: Progress | None = None,
        stall_s: float = DEFAULT_STALL_S,
        retention_s: float = DEFAULT_RETENTION_S,
        buckets: int | None = None,
        rows_per_bucket: int = DEFAULT_ROWS_PER_BUCKET,
        numeric_as: str = "decimal",
        cluster_file: str | None = None,
        topo_url: str | None = None,
    ) -> None:
        if batch_rows < 1 or file_rows < 1 or batch_interval_s <= 0 or stall_s <= 0:
            raise InvalidArgument(
                "batch_rows and file_rows must be >= 1, batch_interval_s and stall_s > 0")
        if buckets is not None and (buckets < 1 or buckets & (buckets - 1)
                                    or buckets > 1 << 10):
            raise InvalidArgument("buckets must be a power of two from 1 to 1024")
        if rows_per_bucket < 1:
            raise InvalidArgument("rows_per_bucket must be >= 1")
        self.buckets = buckets
        self.rows_per_bucket = rows_per_bucket
        self.numeric_as = numeric_as
        self.topology = topology
        self.cluster_file = cluster_file
        self.topo_url = topo_url
        self.keyspace = keyspace
        self.table = table
        self.spark = spark
        self.shards = {str(ShardId(keyspace, s.name)): s.url
                       for s in topology.keyspace(keyspace).shards}
        if not self.shards:
            raise NotFound(f"keyspace {keyspace!r} has no shards")
        self.key = list(key) if key else []
        self.lake = LakeTable(lake, self.key, retention_s=retention_s)
        self.quarantine = Quarantine(self.lake.path)
        self.batch_rows = batch_rows
        self.batch_interval_s = batch_interval_s
        self.file_rows = file_rows
        self.stall_s = stall_s
        self.progress: Progress = progress or (lambda _msg: None)
        self.description = f"{DESCRIPTION_PREFIX}{keyspace}.{table}"

    # -- entry points -----------------------------------------------------------------

    def run_sync(self, *, follow: bool = False, stop: threading.Event | None = None) -> DumpSummary:
        """:meth:`run` for synchronous callers (not from inside an event loop)."""
        return asyncio.run(self.run(follow=follow, stop=stop))

    async def run(
        self, *, follow: bool = False, stop: threading.Event | None = None
    ) -> DumpSummary:
        """Snapshot (first run), then apply changes until caught up (or ``stop`` with follow)."""
        summary = DumpSummary(self.keyspace, self.table, self.lake.path)
        if self.cluster_file is not None or self.topo_url is not None:
            self.topology = await self._load_topology()
            self.shards = {str(ShardId(self.keyspace, s.name)): s.url
                           for s in self.topology.keyspace(self.keyspace).shards}
        first_url = next(iter(self.shards.values()))
        if not self.key:
            self.key = await asyncio.to_thread(primary_key, first_url, self.table)
            if not self.key:
                raise InvalidArgument(
                    f"table {self.table!r} has no primary key: give the key columns (--key)")
            self.lake.key = list(self.key)
        await asyncio.gather(*(self._prepare_capture(q, u) for q, u in self.shards.items()))
        positions = None
        if self.lake.exists():
            positions = await asyncio.to_thread(self.lake.open, self.description)
        if positions is None:
            positions = await self._snapshot(summary)
        else:
            self._check_resumable(positions)
            self.progress(f"resuming {self.keyspace}.{self.table} from the lake's positions")
        await self._apply(positions, summary, follow=follow, stop=stop)
        summary.compacted_files += await asyncio.to_thread(self.lake.compact)
        summary.vacuumed_files += await asyncio.to_thread(self.lake.vacuum)
        summary.buckets = self.lake.bucketing.count
        summary.lake_bytes = await asyncio.to_thread(self.lake.size_bytes)
        return summary

    async def _load_topology(self) -> Topology:
        from shardgate.topo.local import open_topo

        server = await open_topo(self.cluster_file, url=self.topo_url)
        try:
            return await server.load_topology()
        finally:
            await server.close()

    async def _open_gate(self) -> Gate:
        """A gate for the change stream: following the topo store when the job has one."""
        from shardgate.gate import Gate

        if self.cluster_file is None and self.topo_url is None:
            return Gate.open(self.topology)
        from shardgate.topo.local import open_topo

        server = await open_topo(self.cluster_file, url=self.topo_url)
        try:
            return await Gate.from_topo(server, pool_size=1)
        except BaseException:
            await server.close()
            raise

    def _check_resumable(self, positions: Positions) -> None:
        """Refuse positions the stream cannot resume exactly: a serving shard without a
        token is fine only as a target of the keyspace's pending write switch whose
        sources all have tokens (the stream drains them, then starts it at the journal)."""
        from shardgate.streams.hop import Hop

        missing = set(self.shards) - set(positions.tokens)
        if not missing:
            return
        hop = Hop.of(self.topology.keyspace(self.keyspace))
        ks = self.keyspace
        local = [ShardId.parse(m).shard for m in missing]
        if hop is not None and all(
                s in hop.targets
                and all(str(ShardId(ks, f)) in positions.tokens for f in hop.feeding(s))
                for s in local):
            return
        raise FailedPrecondition(
            f"the lake table at {self.lake.path} has no position for shards "
            f"{sorted(missing)} (the keyspace was resharded and the reshard completed after "
            "the lake's last commit: the changes between them and the switch are gone): dump "
            "to a new --lake")

    async def _prepare_capture(self, shard: str, url: str) -> None:
        async def prepare() -> None:
            log = open_change_log(url, shard)
            try:
                await log.prepare()
            finally:
                await log.close()

        await _retrying(prepare, f"preparing change capture on {shard}", self.progress)

    # -- snapshot ---------------------------------------------------------------------

    async def _snapshot(self, summary: DumpSummary) -> Positions:
        if self.spark is None:
            raise InvalidArgument("the first run of a dump needs a Spark session (snapshot)")
        first_url = next(iter(self.shards.values()))
        source = await asyncio.to_thread(table_schema, first_url, self.table)
        for k in self.key:
            if k not in source.names:
                raise NotFound(f"key column {k!r} is not a column of {self.table!r}")
        schema = lake_schema(source, numeric_as=self.numeric_as)
        bucketing = await asyncio.to_thread(self._bucketing, schema)
        await asyncio.to_thread(self.lake.create, schema, self.description, bucketing)
        run = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        specs = [
            {"shard": q, "url": u, "table": self.table, "schema": schema,
             "lake": self.lake.path, "run": run, "file_rows": self.file_rows, "key": self.key,
             "bucketing": bucketing.to_json()}
            for q, u in self.shards.items()
        ]
        self.progress(f"snapshot of {self.keyspace}.{self.table}: {len(specs)} shards")
        began = time.monotonic()
        results: list[dict[str, Any]] = await asyncio.to_thread(
            run_tasks, self.spark, specs, snapshot_shard, "snapshot")
        files = [f for r in results for f in r["files"]]
        positions = Positions({
            r["shard"]: EventToken(r["timestamp"], r["shard"], r["position"]) for r in results
        })
        await asyncio.to_thread(self.lake.add_files, files, positions)
        summary.snapshot = True
        summary.snapshot_rows = sum(int(r["rows"]) for r in results)
        summary.snapshot_files = len(files)
        summary.snapshot_s = time.monotonic() - began
        for r in sorted(results, key=lambda r: str(r["shard"])):
            self.progress(f"  {r['shard']}: {r['rows']} rows at position {r['position']}")
        self.progress(f"snapshot committed: {summary.snapshot_rows} rows in "
                      f"{summary.snapshot_s:.2f} s ({summary.snapshot_rows_per_s:,.0f} rows/s)")
        return positions

    def _bucketing(self, schema: pa.Schema) -> Bucketing:
        """The snapshot's bucketing: by the primary vindex's keyspace ids where it can."""
        rows = self.rows_per_bucket
        if self.buckets is None:
            q = bulk.quote_ident
            total = sum(int(bulk.query(u, f"SELECT COUNT(*) FROM {q(parse_url(u).kind, self.table)}"
                                       )[0][0]) for u in self.shards.values())
        else:
            total, rows = self.buckets, 1
        primary = None
        ks = self.topology.build_vschema().keyspace(self.keyspace)
        table = ks.tables.get(self.table)
        if ks.sharded and table is not None and table.primary is not None:
            from shardgate.vindexes import MultiColumn, SingleColumn

            v = table.primary.vindex
            if isinstance(v, SingleColumn | MultiColumn):
                primary = (v.type_name, dict(v.params), list(table.primary.columns))
        types = [schema.field(k).type for k in self.key]
        return choose_bucketing(self.key, primary, types, total, rows)

    # -- change apply -----------------------------------------------------------------

    async def _targets(self, shards: dict[str, str] | None = None
                       ) -> dict[str, tuple[int, ...]]:
        """Per shard (default: the job's), the end of its log now (read with the log's own
        position query)."""
        shards = self.shards if shards is None else shards

        async def one(shard: str, url: str) -> tuple[str, tuple[int, ...]]:
            log = open_change_log(url, shard)
            sql = log.position_sql
            await log.close()
            rows = await asyncio.to_thread(bulk.query, url, sql)
            return shard, position_key(str(rows[0][0]) if rows and rows[0][0] is not None
                                       else "0")

        return dict(await asyncio.gather(*(one(q, u) for q, u in shards.items())))

    def _url_of(self, topology: Topology, shard: str) -> str:
        """The database of ``shard`` (qualified), serving or a reshard's source."""
        return topology.keyspace(self.keyspace).any_shard(ShardId.parse(shard).shard).url

    async def _apply(
        self, positions: Positions, summary: DumpSummary, *, follow: bool,
        stop: threading.Event | None,
    ) -> None:
        from shardgate.streams.hop import Hop
        from shardgate.streams.merge import StreamEvent, StreamPosition

        schema = await asyncio.to_thread(self.lake.schema)
        current = dict(positions.tokens)
        gens = dict(positions.generations)
        for q in current:
            gens.setdefault(q, 0)
        builder = RowBuilder(schema, self.key, self.lake.bucketing,
                              lambda t: token_order(t.position, gens.get(t.shard, 0)))
        #: the shards read: serving ones, and a reshard's sources still to drain
        tracked = dict(self.shards)
        _drop_drained(current, self.topology.keyspace(self.keyspace), self.progress)
        for q in current:
            if q not in tracked:
                with contextlib.suppress(ShardgateError):  # gone: the stream refuses it
                    tracked[q] = self._url_of(self.topology, q)
        targets = await self._targets(tracked)
        reached = {q for q, t in current.items() if position_key(t.position) >= targets[q]}
        began = time.monotonic()
        starts = json.dumps({q: t.position for q, t in current.items()})
        self.progress(f"applying changes from {starts}"
                      + ("" if follow else f" up to {len(targets)} log ends"))
        if not follow and reached >= set(tracked):
            summary.positions = {q: t.position for q, t in current.items()}
            return
        gate = await self._open_gate()
        #: write switches seen in this run, and the shards whose generation was checked
        #: since the last one
        hops: list[Hop] = []
        checked: set[str] = set()
        seen_topology: Any = None

        def note_topology() -> bool:
            """Remember the keyspace's write switch; True when the topology changed."""
            nonlocal seen_topology
            topology = gate.topology
            if topology is seen_topology:
                return False
            seen_topology = topology
            with contextlib.suppress(ShardgateError):
                hop = Hop.of(topology.keyspace(self.keyspace))
                if hop is not None and hop not in hops:
                    hops.append(hop)
                    checked.clear()
            return True

        def generation(q: str) -> bool:
            """A target of a write switch: above every source feeding it; a shard met
            otherwise for the first time: above every shard known. True when ``q``
            is a new database (a new generation)."""
            local = ShardId.parse(q).shard
            for hop in reversed(hops):
                if local in hop.targets and local not in hop.sources:
                    need = 1 + max((gens.get(str(ShardId(self.keyspace, s)), 0)
                                    for s in hop.feeding(local)), default=0)
                    if gens.get(q, -1) < need:
                        gens[q] = need
                        self.progress(f"  {q}: a reshard's target, generation {need}")
                        token_order("0", need)  # refuses a generation past the order's bits
                        return True
                    return False
            if q in gens:
                return False
            gens[q] = 1 + max(gens.values(), default=-1)
            token_order("0", gens[q])
            return True

        def retire() -> None:
            for old in _drop_drained(current, gate.topology.keyspace(self.keyspace),
                                     self.progress):
                tracked.pop(old, None)
                targets.pop(old, None)
                reached.discard(old)
        pending: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        last_flush = time.monotonic()
        last_report = last_flush

        merging: asyncio.Future[None] | None = None

        def merge(pending_rows: list[tuple[Any, ...]], snap: Positions) -> None:
            try:
                rows, poison = builder.table(pending_rows, self.table)
                if poison:
                    # Before the MERGE that records positions past them (at least once).
                    self.quarantine.add(poison)
                    summary.quarantined += len(poison)
                    self.progress(f"  quarantined {len(poison)} changes: {poison[0]['reason']}")
                if rows.num_rows:
                    self.lake.merge(rows, snap)
                done = self.lake.maintain()
            except ShardgateError as exc:
                # Not a stream failure: reopening the stream would skip these rows.
                raise _MergeFailed(exc) from exc
            summary.compacted_files += done["compacted"]
            summary.vacuumed_files += done["vacuumed"]
            summary.merges += 1
            summary.change_rows_merged += rows.num_rows

        async def flush(wait: bool = False) -> None:
            """Merge ``pending`` (positions: ``current``). The MERGE runs in a thread while
            the stream is read on; MERGEs stay in order (one at a time); ``wait``: until
            every MERGE started has committed."""
            nonlocal last_flush, merging
            last_flush = time.monotonic()
            if pending:
                rows = list(pending.values())
                pending.clear()
                snap = Positions(dict(current), dict(gens))
                if merging is not None:
                    await merging
                merging = asyncio.ensure_future(asyncio.to_thread(merge, rows, snap))
            if wait and merging is not None:
                running, merging = merging, None
                await running

        async def handle(event: StreamEvent) -> bool:
            """Apply one stream event; True once the run is done."""
            nonlocal follow, targets, reached, last_report
            q = event.token.shard
            changed = note_topology()
            new_database = False
            if q not in checked:
                new_database = generation(q)
                checked.add(q)
            if q not in tracked or new_database:  # the stream hopped to a switch's target
                tracked[q] = self._url_of(gate.topology, q)
                targets.update(await self._targets({q: tracked[q]}))
                changed = True
            for c in event.changes:
                if c.table != self.table:
                    continue
                summary.change_events += 1
                if c.op == "truncate":
                    if gens.get(q, 0) > 0:
                        raise Unsupported(
                            f"a TRUNCATE of {self.table} on {q}, a shard a reshard created: "
                            "the lake's rows of its range may carry earlier shards' names; "
                            "dump to a new --lake")
                    await flush(wait=True)
                    await asyncio.to_thread(self.lake.tombstone_shard, q, event.token)
                    continue
                for key, row in builder.rows(c, event.token):
                    pending[key] = row
            current[q] = event.token
            if changed:
                retire()
            if q in targets and q not in reached \
                    and position_key(event.token.position) >= targets[q]:
                reached.add(q)
            if follow and stop is not None and stop.is_set():
                # Drain: stop at the log ends as of now, everything before is applied.
                follow = False
                targets = await self._targets(tracked)
                reached = {s for s, t in current.items()
                           if position_key(t.position) >= targets[s]}
                self.progress("stopping: applying changes up to the log ends")
            now = time.monotonic()
            live = reached >= set(tracked)
            done = not follow and live
            # Behind (a backlog): only full batches, every MERGE rewrites the files it
            # touches. Caught up (following): at least every batch_interval_s.
            if (len(pending) >= self.batch_rows or done
                    or (live and now - last_flush >= self.batch_interval_s)):
                await flush()
            if now - last_report >= 5.0:
                last_report = now
                behind = ", ".join(f"{s} at {current[s].position}"
                                   for s in sorted(set(tracked) - reached))
                self.progress(f"  {summary.change_events} changes, {summary.merges} merges, "
                              f"{len(reached & set(tracked))}/{len(tracked)} shards caught up"
                              + (f" ({behind})" if behind and not follow else ""))
            return done

        failures = 0
        try:
            while True:
                events = gate.update_stream(
                    self.keyspace, None, StreamPosition(dict(current)), heartbeat_s=HEARTBEAT_S,
                    identity=TRUSTED,  # the job reads the shards' logs with the cluster's URLs
                )
                try:
                    while True:
                        try:
                            event = await wait_for(anext(events), self.stall_s)
                        except StopAsyncIteration:
                            break
                        except TimeoutError:
                            raise ShardgateError(
                                f"no change stream event (not even a heartbeat) for "
                                f"{self.stall_s:g} s; shards not caught up: "
                                f"{sorted(set(tracked) - reached)}. Check change capture "
                                "on them (a PostgreSQL slot invalidated by "
                                "max_slot_wal_keep_size, a purged log) and rerun: the lake "
                                "resumes from its last commit", code=Code.DEADLINE_EXCEEDED,
                            ) from None
                        failures = 0
                        if await handle(event):
                            break
                    await flush(wait=True)
                    break
                except ShardgateError as exc:
                    # A shard busy (SQLite lock) or away: reopen the stream where it stopped
                    # (``current``); changes not merged yet stay in ``pending``.
                    failures += 1
                    if exc.code not in RETRYABLE or failures > RETRIES:
                        raise
                    self.progress(f"  change stream interrupted ({exc}); reopening")
                    await asyncio.sleep(min(2.0, 0.2 * 2**failures))
                finally:
                    await events.aclose()  # type: ignore[attr-defined]
        except _MergeFailed as failed:
            raise failed.error from None
        finally:
            try:
                if merging is not None:  # never return with a MERGE still writing
                    with contextlib.suppress(_MergeFailed):
                        await merging
            finally:
                await gate.close()
        self.shards = {q: u for q, u in tracked.items() if q in current}
        summary.catchup_s = time.monotonic() - began
        summary.positions = {q: t.position for q, t in current.items()}
        self.progress(f"caught up: {summary.change_events} changes in {summary.merges} merges, "
                      f"{summary.catchup_s:.2f} s ({summary.catchup_events_per_s:,.0f}/s)")


def _drop_drained(current: dict[str, EventToken], ks: KeyspaceTopo, progress: Progress
                  ) -> list[str]:
    """Drop from ``current`` the tokens of shards no longer serving once every serving
    shard meeting their range has one (the stream starts those only after the old ones
    are drained). Returns the shards dropped."""
    serving = {str(ShardId(ks.name, s.name)): s.key_range for s in ks.shards}
    dropped = []
    for old in [q for q in current if q not in serving]:
        try:
            kr = parse_shard_name(ShardId.parse(old).shard)
        except ShardgateError:
            continue
        meeting = sorted(n for n, r in serving.items() if r.intersects(kr))
        if meeting and all(n in current for n in meeting):
            del current[old]
            dropped.append(old)
            progress(f"  {old} drained: its range is read on {meeting}")
    return dropped


class _MergeFailed(Exception):
    """A MERGE into the lake failed: the run stops (the next one resumes at the last commit)."""

    def __init__(self, error: ShardgateError) -> None:
        super().__init__(str(error))
        self.error = error


async def _retrying(fn: Callable[[], Awaitable[None]], what: str, progress: Progress) -> None:
    """``fn()``, tried again after ``ABORTED``/``UNAVAILABLE`` errors (``RETRIES`` times)."""
    for attempt in range(RETRIES + 1):
        try:
            await fn()
            return
        except ShardgateError as exc:
            if exc.code not in RETRYABLE or attempt == RETRIES:
                raise
            progress(f"  {what}: {exc}; trying again")
            await asyncio.sleep(min(2.0, 0.2 * 2**attempt))


__all__ = ["DumpJob", "DumpSummary", "primary_key", "snapshot_shard"]
