"""The dump job's lake table: a Delta table (delta-rs) with a token per row.

Why Delta through ``deltalake`` (delta-rs) and not plain Parquet plus a
manifest: the change apply is a keyed upsert with a condition (newest token
wins), which delta-rs does as one atomic, crash-safe ``MERGE`` commit, with
file pruning on column statistics; its commit log gives us an atomic place for
the progress (the stream positions travel in the same commit as the rows they
cover) and readers always see a committed version. Plain Parquet would need
our own manifest, our own atomic swap and our own rewrite of touched files,
i.e. a small, worse Delta. ``delta-spark`` cannot be had here (no Maven), so
Spark reads the table through the list of its live Parquet files
(:func:`read_table`), which is exact because delta-rs writes no deletion
vectors.

**Layout: buckets by keyspace-id range.** The table is partitioned by
``_sg_bucket``, the top bits of the row's keyspace id (:class:`Bucketing`:
the table's primary vindex when its columns are part of the key, else the
``hash`` vindex of a single integer key, else a BLAKE2 hash of the key). A
key's bucket depends on the key alone, so the MERGE joins on it, prunes the
buckets its source does not touch (``t._sg_bucket IN (...)``) and rewrites
only the files of the buckets that hold changed keys. delta-rs writes no
deletion vectors, so a touched bucket's file is copied whole: the bucket
count trades file size against the bytes a MERGE rewrites.

**Maintenance** (:meth:`LakeTable.maintain`, after every MERGE): small files
are compacted when a bucket holds several; versions older than the user's
retention are vacuumed (their files deleted) and the commit log is
checkpointed and trimmed to the same retention, so the lake stays near one
snapshot's size plus what the MERGEs of one retention period rewrote.
Every commit, maintenance included, carries the positions.

Columns: the source table's columns, then

==================  =========  =================================================
column              type       meaning
==================  =========  =================================================
``_sg_shard``       string     the shard the row's last change came from
``_sg_position``    string     that change's log position (backend format)
``_sg_order``       bigint     position and shard generation as one number
``_sg_ts``          double     commit time (snapshot rows: the snapshot time)
``_sg_deleted``     boolean    a tombstone: the row was deleted at that token
``_sg_bucket``      int        partition: the key's keyspace-id range bucket
==================  =========  =================================================

Invariants (kept by :meth:`LakeTable.merge`):

* one row per primary key; a key's row only ever moves to a change with a
  larger ``_sg_order`` (``WHEN MATCHED AND s._sg_order > t._sg_order``), so
  applying a change twice, or a change older than the row, leaves the row as
  it is: replays are harmless;
* a delete leaves a tombstone (key columns, other columns NULL,
  ``_sg_deleted = true``) with its token, so an older insert or update
  replayed after it cannot bring the row back;
* every commit that writes change rows also writes the per-shard positions
  (commit metadata ``shardgate.positions``) up to which changes are in the
  table; the newest such commit is where a rerun resumes.

**Orders across a reshard.** A log position orders the changes of one shard
database only. A key moves to another shard when the keyspace is resharded,
so ``_sg_order`` is ``generation << GENERATION_SHIFT | position``: the
shards the snapshot read are generation 0, and a shard the dump first meets
after a reshard's write switch (a target of the hop) gets a generation above
every source feeding it (``Positions.generations``, recorded with the
positions in every commit). A key's changes on a target come after all its
changes on the sources (the change stream starts a target once the sources
meeting its range are drained), and the larger generation makes the order say
so, whatever the two databases' positions are; replays stay harmless.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardgate.errors import Aborted, FailedPrecondition, Internal, InvalidArgument, Unsupported
from shardgate.event_token import EventToken, position_key

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

SHARD, POSITION, ORDER = "_sg_shard", "_sg_position", "_sg_order"
TS, DELETED, BUCKET = "_sg_ts", "_sg_deleted", "_sg_bucket"
TOKEN_COLUMNS = (SHARD, POSITION, ORDER, TS, DELETED, BUCKET)
#: commit metadata key holding the positions (JSON: {qualified shard: [timestamp, position]})
POSITIONS_KEY = "shardgate.positions"
#: commit metadata key holding the bucketing (JSON, :meth:`Bucketing.to_json`)
BUCKETING_KEY = "shardgate.bucketing"
#: commit metadata key holding the shards' generations (JSON: {qualified shard: n})
GENERATIONS_KEY = "shardgate.generations"
#: ``_sg_order`` = generation << GENERATION_SHIFT | position (see "Orders across a reshard")
GENERATION_SHIFT = 56
#: the largest generation that fits in ``_sg_order`` (a signed 64-bit integer)
MAX_GENERATION = (1 << (63 - GENERATION_SHIFT)) - 1
#: at most this many buckets (partitions)
MAX_BUCKET_BITS = 10
#: default retention of old versions (seconds): vacuumed after it
DEFAULT_RETENTION_S = 60.0
#: checkpoint the commit log every this many commits
CHECKPOINT_EVERY = 20
#: table description marking a table this module created
DESCRIPTION_PREFIX = "shardgate dump of "


def _need_deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover - the spark extra has it
        raise FailedPrecondition(
            f"the dump job needs the 'spark' extra (pip install 'shardgate[spark]'): {exc}"
        ) from exc
    return deltalake


def token_order(position: str, generation: int = 0) -> int:
    """A log position as one 64-bit integer ordering the changes of one shard.

    PostgreSQL LSNs and SQLite sequences are numbers already; a MariaDB GTID
    position orders by its sequence number within its one domain (a position
    spanning several domains has no single order and is refused).
    ``generation``: the shard's (see "Orders across a reshard"), in the top bits.
    """
    key = position_key(position)
    if len(key) == 1:
        order = key[0]
    elif len(key) == 2:
        order = key[1]
    else:
        raise Unsupported(
            f"log position {position!r} spans several GTID domains: the dump job needs one"
        )
    if not 0 <= order < 1 << GENERATION_SHIFT:
        raise Unsupported(f"log position {position!r} does not fit the lake's order "
                          f"({GENERATION_SHIFT} bits)")
    if not 0 <= generation <= MAX_GENERATION:
        raise Unsupported(f"the lake's shards are at generation {generation}, past "
                          f"{MAX_GENERATION} reshards: dump to a new lake table")
    return generation << GENERATION_SHIFT | order


def token_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field(SHARD, pa.string()), pa.field(POSITION, pa.string()),
        pa.field(ORDER, pa.int64()), pa.field(TS, pa.float64()),
        pa.field(DELETED, pa.bool_()), pa.field(BUCKET, pa.int32()),
    ])


def lake_schema(table_schema: pa.Schema, *, numeric_as: str = "decimal") -> pa.Schema:
    """The lake table's schema: the source columns typed by :mod:`shardgate.spark.types`
    (the one mapping), then the token columns."""
    import pyarrow as pa

    from shardgate.spark import types as sgtypes

    for name in table_schema.names:
        if name.startswith("_sg_"):
            raise InvalidArgument(f"column {name!r}: names starting with _sg_ are reserved")
    canonical = sgtypes.canonical_schema(table_schema, numeric_as=numeric_as)
    fields = [pa.field(f.name, f.type) for f in canonical]
    return pa.schema(fields + list(token_schema()))


@dataclass(frozen=True)
class Bucketing:
    """How a key maps to its bucket: the top ``bits`` bits of a keyspace id.

    ``vindex`` (type name, params, columns) computes the keyspace id from the
    key columns; None: a BLAKE2 hash of the values of the ``key`` columns.
    Stored with every data commit, so a rerun buckets exactly as the snapshot did.
    """

    bits: int
    vindex: tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]] | None
    key: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return 1 << self.bits

    def to_json(self) -> str:
        return json.dumps({"bits": self.bits, "vindex": self.vindex, "key": self.key})

    @classmethod
    def from_json(cls, text: str) -> Bucketing:
        try:
            doc = json.loads(text)
            v = doc["vindex"]
            vindex = None if v is None else (str(v[0]), tuple((str(a), str(b)) for a, b in v[1]),
                                              tuple(str(c) for c in v[2]))
            return cls(int(doc["bits"]), vindex, tuple(str(k) for k in doc.get("key", ())))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise FailedPrecondition(f"corrupt {BUCKETING_KEY} in the lake table: {exc}") from exc

    def buckets(self, rows: pa.Table) -> pa.Array:
        """The bucket of each row of ``rows`` (which has the key columns)."""
        import numpy as np
        import pyarrow as pa

        if self.bits == 0 or rows.num_rows == 0:
            return pa.array(np.zeros(rows.num_rows, dtype=np.int32))
        shift = np.uint64(64 - self.bits)
        if self.vindex is not None:
            from shardgate.spark.ksids import KsidMapper, VindexSpec

            type_name, params, columns = self.vindex
            u, valid, _ = KsidMapper(VindexSpec(type_name, type_name, params, columns)).u64(rows)
            if not bool(valid.all()):
                raise InvalidArgument(f"a key of the lake table has no keyspace id ({columns})")
            return pa.array((u >> shift).astype(np.int32))
        keys = list(zip(*(rows.column(c).to_pylist() for c in self.key), strict=True))
        out = np.empty(len(keys), dtype=np.int32)
        for i, k in enumerate(keys):
            h = int.from_bytes(hashlib.blake2b(repr(k).encode(), digest_size=8).digest(), "big")
            out[i] = h >> (64 - self.bits)
        return pa.array(out)


def choose_bucketing(
    key: Sequence[str], primary: tuple[str, dict[str, str], Sequence[str]] | None,
    key_types: Sequence[pa.DataType], rows: int, rows_per_bucket: int,
) -> Bucketing:
    """Bucketing for a table of about ``rows`` rows keyed on ``key``.

    ``primary``: the table's primary vindex (type name, params, columns) when it
    is functional. Its keyspace ids are used when its columns are all key
    columns; else the ``hash`` vindex of a single integer key; else a hash of
    the key.
    """
    import pyarrow as pa

    want = max(1, rows // max(1, rows_per_bucket))
    bits = min(MAX_BUCKET_BITS, max(0, (want - 1).bit_length()))
    lowered = {k.lower() for k in key}
    if primary is not None and {c.lower() for c in primary[2]} <= lowered:
        return Bucketing(bits, (primary[0], tuple(sorted(primary[1].items())),
                                tuple(primary[2])))
    if len(key) == 1 and pa.types.is_integer(key_types[0]):
        return Bucketing(bits, ("hash", (), (key[0],)))
    return Bucketing(bits, None, tuple(key))


@dataclass(frozen=True)
class Positions:
    """Per qualified shard (``keyspace/shard``), the token changes are applied up to.

    ``generations``: per qualified shard, its generation (see "Orders across a
    reshard"; a shard not named is generation 0). Kept for shards whose tokens
    were dropped too: a later shard of the same name is told apart by it.
    """

    tokens: dict[str, EventToken]
    generations: dict[str, int] = field(default_factory=dict)

    def generations_json(self) -> str:
        return json.dumps(dict(sorted(self.generations.items())))

    def with_generations(self, text: str | None) -> Positions:
        """These positions with the generations of ``text`` (commit metadata)."""
        if not text:
            return self
        try:
            doc = json.loads(text)
            gens = {str(k): int(v) for k, v in doc.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise FailedPrecondition(f"corrupt {GENERATIONS_KEY} in the lake table: {exc}"
                                     ) from exc
        return Positions(self.tokens, gens)

    def to_json(self) -> str:
        return json.dumps({s: [t.timestamp, t.position] for s, t in sorted(self.tokens.items())})

    @classmethod
    def from_json(cls, text: str) -> Positions:
        try:
            doc = json.loads(text)
            return cls({s: EventToken(float(v[0]), s, str(v[1])) for s, v in doc.items()})
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise FailedPrecondition(f"corrupt {POSITIONS_KEY} in the lake table: {exc}") from exc


class LakeTable:
    """One dump's Delta table at ``path`` (a local directory), keyed on ``key`` columns.

    Not thread-safe; one writer at a time (the dump job). Readers may read at
    any time and see committed versions only, for ``retention_s`` after a
    version stops being the newest (then :meth:`maintain` vacuums its files).
    """

    def __init__(self, path: str, key: Sequence[str] = (), *,
                 retention_s: float = DEFAULT_RETENTION_S) -> None:
        if retention_s < 0:
            raise InvalidArgument("the lake's retention must be >= 0 seconds")
        self.path = os.path.abspath(path)
        #: the key columns; :meth:`merge` needs them (the dump job sets them when it
        #: has read the primary key)
        self.key = list(key)
        self.retention_s = retention_s
        #: set by :meth:`create` or :meth:`open` (from the last data commit)
        self.bucketing = Bucketing(0, None)
        self._dt: DeltaTable | None = None
        self._positions: Positions | None = None
        self._commits = 0
        self._last_vacuum = time.monotonic()

    # -- opening --------------------------------------------------------------------

    def exists(self) -> bool:
        deltalake = _need_deltalake()
        return bool(deltalake.DeltaTable.is_deltatable(self.path))

    def open(self, description: str) -> Positions | None:
        """Open an existing table; its positions, or None when it has no data commit yet.

        Refuses a table that another dump (or another tool) created.
        """
        deltalake = _need_deltalake()
        self._dt = deltalake.DeltaTable(self.path)
        have = self._dt.metadata().description or ""
        if have != description:
            raise FailedPrecondition(
                f"{self.path} is a Delta table of something else ({have!r}, expected "
                f"{description!r}): choose another --lake path"
            )
        for commit in self._dt.history():
            text = commit.get(POSITIONS_KEY)
            if text:
                bucketing = commit.get(BUCKETING_KEY)
                if bucketing:
                    self.bucketing = Bucketing.from_json(str(bucketing))
                gens = commit.get(GENERATIONS_KEY)
                self._positions = Positions.from_json(str(text)).with_generations(
                    str(gens) if gens else None)
                return self._positions
        return None

    def create(self, schema: pa.Schema, description: str, bucketing: Bucketing) -> None:
        """Create the (empty) table, replacing an empty one left by a crashed first run."""
        deltalake = _need_deltalake()
        os.makedirs(self.path, exist_ok=True)
        mode = "overwrite" if deltalake.DeltaTable.is_deltatable(self.path) else "error"
        retention = max(1, int(self.retention_s))
        self._dt = deltalake.DeltaTable.create(
            self.path, schema, mode=mode, name="shardgate_dump", description=description,
            partition_by=[BUCKET],
            configuration={"delta.logRetentionDuration": f"interval {retention} seconds",
                           "delta.deletedFileRetentionDuration":
                               f"interval {retention} seconds",
                           "delta.checkpointInterval": str(CHECKPOINT_EVERY),
                           # statistics (for MERGE file pruning) of the key only: a smaller log
                           "delta.dataSkippingStatsColumns":
                               ",".join(_ident(c) for c in [*self.key, ORDER])},
        )
        self.bucketing = bucketing

    @property
    def table(self) -> DeltaTable:
        if self._dt is None:
            raise FailedPrecondition("the lake table is not open")
        return self._dt

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.schema(self.table.schema().to_arrow())

    def _commit_properties(self, positions: Positions | None) -> Any:
        deltalake = _need_deltalake()
        positions = positions or self._positions
        if positions is None:
            return None
        return deltalake.CommitProperties(custom_metadata={
            POSITIONS_KEY: positions.to_json(), BUCKETING_KEY: self.bucketing.to_json(),
            GENERATIONS_KEY: positions.generations_json()})

    # -- writing --------------------------------------------------------------------

    def add_files(self, files: Sequence[dict[str, Any]], positions: Positions) -> None:
        """Commit Parquet files already written under the table's directory, with positions.

        ``files``: ``{"path": relative path, "bucket": n, "size": bytes, "rows": n,
        "stats": {...}}``. One commit: the snapshot's rows appear together with
        the positions they were read at, or not at all.
        """
        from deltalake.transaction import AddAction, RemoveAction

        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f["path"], int(f["size"]), {BUCKET: str(int(f["bucket"]))}, now, True,
                      json.dumps({"numRecords": int(f["rows"]), **f.get("stats", {})}))
            for f in files
        ]
        with _delta_errors(self.path, "commit the snapshot"):
            self.table.create_write_transaction(
                actions, mode="append", schema=self.table.schema(),
                partition_by=[BUCKET], commit_properties=self._commit_properties(positions),
            )
            self.table.update_incremental()
        self._positions = positions

    def merge(self, rows: pa.Table, positions: Positions) -> dict[str, Any]:
        """Upsert change rows (one per key) where they are newer; record ``positions``.

        ``rows`` has the lake schema (its ``_sg_bucket`` filled by
        :meth:`Bucketing.buckets`). Only the buckets of ``rows`` are scanned and
        only their files holding matched keys are rewritten. Returns delta-rs's
        merge metrics.
        """
        import pyarrow.compute as pc

        if not self.key:
            raise InvalidArgument("the lake table needs key columns (the primary key)")
        buckets = sorted(int(b) for b in pc.unique(rows.column(BUCKET)).to_pylist())
        on = " AND ".join([f"t.{BUCKET} IN ({', '.join(map(str, buckets))})",
                           f"t.{BUCKET} = s.{BUCKET}",
                           *(f"t.{_ident(k)} = s.{_ident(k)}" for k in self.key)])
        with _delta_errors(self.path, "merge changes"):
            metrics = (
                self.table.merge(rows, predicate=on, source_alias="s", target_alias="t",
                                 commit_properties=self._commit_properties(positions))
                .when_matched_update_all(predicate=f"s.{ORDER} > t.{ORDER}")
                .when_not_matched_insert_all()
                .execute()
            )
        self._positions = positions
        self._commits += 1
        return dict(metrics)

    def tombstone_shard(self, shard: str, token: EventToken) -> None:
        """A ``TRUNCATE`` on ``shard`` at ``token``: its rows older than it become tombstones."""
        order = token_order(token.position)
        sets = {c: "NULL" for c in self.schema().names
                if c not in self.key and not c.startswith("_sg_")}
        sets.update({DELETED: "true", ORDER: str(order), POSITION: _sql_str(token.position),
                     TS: repr(float(token.timestamp))})
        with _delta_errors(self.path, "apply a TRUNCATE"):
            self.table.update(
                predicate=f"{SHARD} = {_sql_str(shard)} AND {ORDER} < {order}", updates=sets,
                commit_properties=self._commit_properties(None))
        self._commits += 1

    def compact(self, min_files: int | None = None) -> int:
        """Rewrite small files into bigger ones, per bucket, when the table holds more
        than ``min_files`` (default: two per bucket, at least 8).

        Returns the number of files removed (0 when nothing was done). Old files
        stay on disk for readers of older versions until :meth:`vacuum`.
        """
        limit = min_files if min_files is not None else max(8, 2 * self.bucketing.count)
        if len(self.table.file_uris()) <= limit:
            return 0
        with _delta_errors(self.path, "compact"):
            metrics = self.table.optimize.compact(
                commit_properties=self._commit_properties(None))
        self._commits += 1
        return int(metrics.get("numFilesRemoved", 0))

    def vacuum(self) -> int:
        """Delete the files no version younger than the retention needs; trim the log.

        Returns the number of files deleted. The commit log is checkpointed and
        its entries older than the retention (``delta.logRetentionDuration``)
        removed.
        """
        dt = self.table
        horizon_ms = (time.time() - self.retention_s) * 1000
        keep = [int(h["version"]) for h in dt.history(limit=10_000)
                if float(h.get("timestamp", 0)) >= horizon_ms and "version" in h]
        keep.append(dt.version())
        with _delta_errors(self.path, "vacuum"):
            deleted = dt.vacuum(retention_hours=0, dry_run=False,
                                enforce_retention_duration=False, keep_versions=sorted(set(keep)),
                                commit_properties=self._commit_properties(None))
            dt.update_incremental()
            dt.create_checkpoint()
            dt.cleanup_metadata()
        self._last_vacuum = time.monotonic()
        return len(deleted)

    def maintain(self) -> dict[str, int]:
        """After a MERGE: compact when small files piled up; vacuum once per retention/2."""
        out = {"compacted": self.compact(), "vacuumed": 0}
        if time.monotonic() - self._last_vacuum >= min(self.retention_s / 2, 30.0):
            out["vacuumed"] = self.vacuum()
        return out

    def live_files(self) -> list[str]:
        return list(self.table.file_uris())

    def size_bytes(self) -> int:
        """Bytes the lake directory holds (data, old versions not vacuumed yet, the log)."""
        total = 0
        for root, _dirs, names in os.walk(self.path):
            if os.path.basename(root) == QUARANTINE_DIR or QUARANTINE_DIR in root.split(os.sep):
                continue
            for n in names:
                with contextlib.suppress(FileNotFoundError):  # vacuumed meanwhile
                    total += os.path.getsize(os.path.join(root, n))
        return total


#: the quarantine table's directory inside the lake's (a Delta table of its own)
QUARANTINE_DIR = "_sg_quarantine"


class Quarantine:
    """Changes the apply could not convert: kept with their token and the reason.

    A Delta table at ``<lake>/_sg_quarantine``: ``shard``, ``position``,
    ``ts`` (commit time), ``tbl``, ``op`` (``insert``/``update``/``delete``),
    ``key`` and ``image`` (JSON, values as text), ``reason``. Appended before
    the MERGE that records positions past those changes, so a crash in
    between quarantines them again on the rerun (at least once).
    """

    def __init__(self, lake_path: str) -> None:
        self.path = os.path.join(lake_path, QUARANTINE_DIR)

    @staticmethod
    def schema() -> pa.Schema:
        import pyarrow as pa

        return pa.schema([(n, pa.string()) for n in
                          ("shard", "position", "tbl", "op", "key", "image", "reason")]
                         + [("ts", pa.float64())])

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        import pyarrow as pa

        deltalake = _need_deltalake()
        if not rows:
            return
        data = pa.Table.from_pylist(list(rows), schema=self.schema())
        with _delta_errors(self.path, "quarantine changes"):
            deltalake.write_deltalake(self.path, data, mode="append")

    def rows(self) -> list[dict[str, Any]]:
        """Every quarantined change (for tests and ``shardgate spark dump`` reports)."""
        deltalake = _need_deltalake()
        if not deltalake.DeltaTable.is_deltatable(self.path):
            return []
        return list(deltalake.DeltaTable(self.path).to_pyarrow_table().to_pylist())


@contextlib.contextmanager
def _delta_errors(path: str, what: str) -> Iterator[None]:
    """delta-rs errors as shardgate errors (a concurrent writer's commit: ``ABORTED``)."""
    from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError

    try:
        yield
    except CommitFailedError as exc:
        raise Aborted(f"could not {what} in {path}: another writer committed first ({exc}); "
                      "run one dump per lake table, then rerun (it resumes)") from exc
    except SchemaMismatchError as exc:
        raise FailedPrecondition(f"could not {what} in {path}: the table's schema no longer "
                                 f"matches ({exc}); dump to a new lake table") from exc
    except DeltaError as exc:
        raise Internal(f"could not {what} in {path}: {exc}") from exc


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    """A column name for delta-rs's SQL predicates (backticks unless plain lowercase)."""
    if name.isidentifier() and name == name.lower():
        return name
    return "`" + name.replace("`", "``") + "`"


def read_table(
    spark: SparkSession, path: str, *, tombstones: bool = False, tokens: bool = False
) -> DataFrame:
    """The lake table as a Spark DataFrame: by default live rows and source columns only.

    Reads exactly the Parquet files of the table's current version (delta-rs
    writes no deletion vectors, so a file's rows are all live). ``tombstones``
    keeps deleted keys; ``tokens`` keeps the ``_sg_`` columns.
    """
    deltalake = _need_deltalake()
    from pyspark.sql import functions as F

    dt = deltalake.DeltaTable(os.path.abspath(path))
    files = list(dt.file_uris())
    if files:
        df = spark.read.parquet(*files)
    else:
        import pyarrow as pa

        df = spark.createDataFrame(pa.schema(dt.schema().to_arrow()).empty_table())
    if not tombstones:
        df = df.where(~F.col(DELETED))
    if not tokens:
        df = df.drop(*TOKEN_COLUMNS)
    return df
