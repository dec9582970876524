"""``shardgate spark archive``: acked queue events older than a cut-off, to Parquet, then purged.

One Spark task per shard (:func:`archive_shard`) loops over chunks of the
shard's acked events whose ack time (``time_next`` of an acked event) is
before the cut-off, in ``id`` order, and for each chunk:

1. writes one Parquet file per ack date under ``<out>/date=YYYY-MM-DD/``
   (Hive partitioning: ``spark.read.parquet(out)`` gives a ``date`` column),
   first under a hidden ``.part-...tmp`` name (readers skip it), fsynced;
2. writes the chunk's **marker** ``<out>/_pending/<shard>.json`` (the final
   file names and row counts), fsynced, then renames the files to their final
   names (``part-<shard>-<first id>-<last id>.parquet``) and fsyncs the
   directories;
3. re-reads every file (row count, ``id`` column) and checks it against the
   marker, then deletes **exactly the ids read back from the files**, in
   batches of 500 (``... AND state = 'acked'``);
4. removes the marker.

Invariants: an event is deleted only once a verified, durable file holds it
(purges only what it wrote); a chunk's files appear under their final names
only while its marker exists, until the purge finished. A run that finds a
marker (the previous run or task attempt died between 2 and 4) finishes that
chunk first (renames what is left, verifies, purges, removes the marker)
instead of selecting the events again, so nothing is archived twice; temporary
files without a marker are deleted. Events acked after the cut-off, and events
in any other state, are never touched. Run one archive per queue at a time.

The queue manager's own retention purge deletes acked events after
``retention``: archive more often than that, or raise it, or events go
unarchived.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from shardgate.backends.bulk import arrow
from shardgate.backends.bulk import copy as bulk
from shardgate.backends.urls import parse_url
from shardgate.errors import FailedPrecondition, Internal, InvalidArgument, NotFound
from shardgate.keys import ShardId
from shardgate.spark.jobs.tasks import run_tasks, table_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from shardgate.topo import Topology

#: events per chunk (one file per ack date of the chunk)
DEFAULT_CHUNK_ROWS = 100_000
#: ids per DELETE statement (bounded purge, as Vitess does)
PURGE_BATCH = 500
QUEUE_COLUMNS = ("id", "state", "time_next")

Progress = Callable[[str], None]


@dataclass
class ArchiveSummary:
    """What an archive run did (``shardgate spark archive`` prints it as JSON)."""

    keyspace: str
    queue: str
    before: str
    out: str
    archived: int = 0
    purged: int = 0
    files: int = 0
    resumed_chunks: int = 0
    seconds: float = 0.0
    shards: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _tmp_name(final: str) -> str:
    """A hidden name (Spark and Hive readers skip names starting with a dot) for ``final``."""
    folder, name = os.path.split(final)
    return os.path.join(folder, "." + name + ".tmp")


def _shard_tag(shard: str) -> str:
    """A column-name-safe tag of a qualified shard (``ks/-80`` -> ``s_80``)."""
    name = ShardId.parse(shard).shard
    return "s" + (name.replace("-", "_") or "_")


class _ShardArchiver:
    """The per-shard loop of :func:`archive_shard` (see the module docstring)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.url: str = spec["url"]
        self.kind = parse_url(self.url).kind
        self.queue: str = spec["queue"]
        self.before_ns: int = int(spec["before_ns"])
        self.out: str = spec["out"]
        self.chunk_rows: int = int(spec.get("chunk_rows", DEFAULT_CHUNK_ROWS))
        self.schema: pa.Schema = spec["schema"]
        self.tag = _shard_tag(spec["shard"])
        self.crash_after_write = bool(spec.get("crash_after_write", False))
        self.pending_dir = os.path.join(self.out, "_pending")
        self.marker = os.path.join(self.pending_dir, f"{self.tag}.json")
        self.stats = {"archived": 0, "purged": 0, "files": 0, "resumed_chunks": 0}

    def run(self) -> dict[str, int]:
        os.makedirs(self.pending_dir, exist_ok=True)
        if os.path.exists(self.marker):
            with open(self.marker, encoding="utf-8") as fh:
                chunk = json.load(fh)
            self._finish(chunk)
            self.stats["archived"] += int(chunk["rows"])
            self.stats["resumed_chunks"] += 1
        self._remove_orphans()
        last: int | None = None
        while True:
            table = self._select(last)
            if table.num_rows == 0:
                return self.stats
            ids = table.column("id")
            last = int(ids[table.num_rows - 1].as_py())
            chunk = self._write(table)
            if self.crash_after_write:
                raise Internal("crash_after_write: the archive task stops before the purge")
            self._finish(chunk)
            self.stats["archived"] += table.num_rows

    def _remove_orphans(self) -> None:
        for root, _dirs, files in os.walk(self.out):
            for f in files:
                if f.startswith(f".part-{self.tag}-") and f.endswith(".tmp"):
                    os.remove(os.path.join(root, f))

    def _select(self, after: int | None) -> pa.Table:
        import pyarrow as pa

        q = bulk.quote_ident(self.kind, self.queue)
        where = f"state = 'acked' AND time_next < {self.before_ns}"
        if after is not None:
            where += f" AND id > {after}"
        sql = f"SELECT * FROM {q} WHERE {where} ORDER BY id LIMIT {self.chunk_rows}"
        with bulk.ShardReader(self.url) as reader:
            if not bulk.supports_arrow(self.url):
                rows = [dict(zip(f, r, strict=True)) for f, rs in reader.row_batches(sql)
                        for r in rs]
                if not rows:
                    return self.schema.empty_table()
                return arrow.conform(pa.Table.from_pylist(rows), self.schema)
            batches = [arrow.conform(b, self.schema) for b in reader.arrow_batches(sql)]
        return pa.Table.from_batches(batches, schema=self.schema)

    def _write(self, table: pa.Table) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        acked = pc.cast(table.column("time_next"), pa.int64())
        days = pc.strftime(pc.cast(acked, pa.timestamp("ns", tz="UTC")), format="%Y-%m-%d")
        files: list[dict[str, Any]] = []
        for day in sorted(set(days.to_pylist())):
            part = table.filter(pc.equal(days, day))
            ids = part.column("id")
            first, last = int(ids[0].as_py()), int(ids[part.num_rows - 1].as_py())
            folder = os.path.join(self.out, f"date={day}")
            os.makedirs(folder, exist_ok=True)
            rel = f"date={day}/part-{self.tag}-{first}-{last}.parquet"
            tmp = _tmp_name(os.path.join(self.out, rel))
            pq.write_table(part, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            files.append({"path": rel, "rows": part.num_rows})
        chunk = {"files": files, "rows": table.num_rows}
        _write_durable(self.marker, json.dumps(chunk).encode())
        return chunk

    def _finish(self, chunk: dict[str, Any]) -> None:
        """Rename, verify, purge and forget one chunk (idempotent: safe to redo)."""
        import pyarrow.parquet as pq

        ids: list[int] = []
        for f in chunk["files"]:
            final = os.path.join(self.out, f["path"])
            if not os.path.exists(final):
                tmp = _tmp_name(final)
                if not os.path.exists(tmp):
                    raise FailedPrecondition(
                        f"archive file {final} of a pending chunk is missing: restore it or "
                        f"delete {self.marker} (its events are still in the queue table)"
                    )
                os.replace(tmp, final)
                _fsync_dir(os.path.dirname(final))
            back = pq.read_table(final, columns=["id"])
            if back.num_rows != int(f["rows"]):
                raise Internal(f"archive file {final} holds {back.num_rows} rows, "
                               f"{f['rows']} were written: not purging")
            ids.extend(int(i) for i in back.column("id").to_pylist())
            self.stats["files"] += 1
        _fsync_dir(self.out)
        q = bulk.quote_ident(self.kind, self.queue)
        for i in range(0, len(ids), PURGE_BATCH):
            batch = ids[i : i + PURGE_BATCH]
            sql = (f"DELETE FROM {q} WHERE state = 'acked' AND id IN "
                   f"({', '.join(str(x) for x in batch)})")
            self.stats["purged"] += sum(bulk.run(self.url, [sql]))
        os.remove(self.marker)
        _fsync_dir(self.pending_dir)


def archive_shard(spec: dict[str, Any]) -> dict[str, Any]:
    """Spark task: archive and purge one shard's old acked events (see the module doc).

    ``spec``: ``shard`` (qualified), ``url``, ``queue``, ``before_ns``, ``out``,
    ``schema`` (Arrow schema of the queue table), ``chunk_rows``. Returns the
    shard's counts.
    """
    stats = _ShardArchiver(spec).run()
    return {"shard": spec["shard"], **stats}


def parse_before(text: str) -> datetime.datetime:
    """An ISO 8601 cut-off (a date, or a time; UTC when no offset is given)."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidArgument(
            f"--before {text!r} is not an ISO 8601 date or time (2024-05-01, "
            "2024-05-01T12:00:00+00:00)") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when


class ArchiveJob:
    """Archive ``keyspace.queue``'s acked events acked before ``before`` into ``out``."""

    def __init__(
        self,
        spark: SparkSession,
        topology: Topology,
        keyspace: str,
        queue: str,
        before: datetime.datetime,
        out: str,
        *,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        progress: Progress | None = None,
    ) -> None:
        if chunk_rows < 1:
            raise InvalidArgument("chunk_rows must be >= 1")
        if before.tzinfo is None:
            raise InvalidArgument("the cut-off needs a time zone (or use parse_before)")
        self.spark = spark
        self.keyspace = keyspace
        self.queue = queue
        self.before = before
        self.out = os.path.abspath(out)
        self.chunk_rows = chunk_rows
        self.shards = {str(ShardId(keyspace, s.name)): s.url
                       for s in topology.keyspace(keyspace).shards}
        self.progress: Progress = progress or (lambda _msg: None)

    def run_sync(self, **extra: Any) -> ArchiveSummary:
        """:meth:`run` for synchronous callers."""
        return asyncio.run(self.run(**extra))

    async def run(self, **extra: Any) -> ArchiveSummary:
        """Run the per-shard tasks on Spark; ``extra`` goes into every task's spec (tests)."""
        began = time.monotonic()
        first_url = next(iter(self.shards.values()))
        schema = await asyncio.to_thread(table_schema, first_url, self.queue)
        missing = [c for c in QUEUE_COLUMNS if c not in schema.names]
        if missing:
            raise NotFound(f"{self.keyspace}.{self.queue} is not a queue table (no {missing})")
        os.makedirs(self.out, exist_ok=True)
        before_ns = int(self.before.timestamp() * 1_000_000) * 1000
        specs = [
            {"shard": q, "url": u, "queue": self.queue, "before_ns": before_ns, "out": self.out,
             "schema": schema, "chunk_rows": self.chunk_rows, **extra}
            for q, u in self.shards.items()
        ]
        self.progress(f"archiving {self.keyspace}.{self.queue}: events acked before "
                      f"{self.before.isoformat()} from {len(specs)} shards into {self.out}")
        results: list[dict[str, Any]] = await asyncio.to_thread(
            run_tasks, self.spark, specs, archive_shard, "archive")
        summary = ArchiveSummary(self.keyspace, self.queue, self.before.isoformat(), self.out)
        for r in sorted(results, key=lambda r: str(r["shard"])):
            counts = {k: int(v) for k, v in r.items() if k != "shard"}
            summary.shards[str(r["shard"])] = counts
            summary.archived += counts["archived"]
            summary.purged += counts["purged"]
            summary.files += counts["files"]
            summary.resumed_chunks += counts["resumed_chunks"]
            self.progress(f"  {r['shard']}: {counts['archived']} archived, "
                          f"{counts['purged']} purged, {counts['files']} files")
        summary.seconds = round(time.monotonic() - began, 3)
        return summary
