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

Columns: the source table's columns, then

==================  =========  =================================================
column              type       meaning
==================  =========  =================================================
``_sg_shard``       string     the shard the row's last change came from
``_sg_position``    string     that change's log position (backend format)
``_sg_order``       bigint     the position as a number: orders changes of a shard
``_sg_ts``          double     commit time (snapshot rows: the snapshot time)
``_sg_deleted``     boolean    a tombstone: the row was deleted at that token
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

Orders compare positions of one shard only, which is enough because a key
lives on one shard (see "Limits" in ``docs/spark.md`` for resharding).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardgate.errors import Aborted, FailedPrecondition, Internal, InvalidArgument, Unsupported
from shardgate.event_token import EventToken, position_key

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

SHARD, POSITION, ORDER = "_sg_shard", "_sg_position", "_sg_order"
TS, DELETED = "_sg_ts", "_sg_deleted"
TOKEN_COLUMNS = (SHARD, POSITION, ORDER, TS, DELETED)
#: commit metadata key holding the positions (JSON: {qualified shard: [timestamp, position]})
POSITIONS_KEY = "shardgate.positions"
#: table description marking a table this module created
DESCRIPTION_PREFIX = "shardgate dump of "
#: compact when a run leaves more live files than this
COMPACT_FILES = 64


def _need_deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover - the spark extra has it
        raise FailedPrecondition(
            f"the dump job needs the 'spark' extra (pip install 'shardgate[spark]'): {exc}"
        ) from exc
    return deltalake


def token_order(position: str) -> int:
    """A log position as one 64-bit integer ordering the changes of one shard.

    PostgreSQL LSNs and SQLite sequences are numbers already; a MariaDB GTID
    position orders by its sequence number within its one domain (a position
    spanning several domains has no single order and is refused).
    """
    key = position_key(position)
    if len(key) == 1:
        return key[0]
    if len(key) == 2:
        return key[1]
    raise Unsupported(
        f"log position {position!r} spans several GTID domains: the dump job needs one"
    )


def token_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field(SHARD, pa.string()), pa.field(POSITION, pa.string()),
        pa.field(ORDER, pa.int64()), pa.field(TS, pa.float64()),
        pa.field(DELETED, pa.bool_()),
    ])


def lake_schema(table_schema: pa.Schema) -> pa.Schema:
    """The lake table's schema: the source columns, then the token columns."""
    import pyarrow as pa

    for name in table_schema.names:
        if name.startswith("_sg_"):
            raise InvalidArgument(f"column {name!r}: names starting with _sg_ are reserved")
    fields = [pa.field(f.name, _lake_type(f.type)) for f in table_schema]
    return pa.schema(fields + list(token_schema()))


def _lake_type(t: pa.DataType) -> pa.DataType:
    """Types Delta stores: large strings/binaries as plain ones, time zones as UTC."""
    import pyarrow as pa

    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_time(t):
        return pa.string()
    return t


@dataclass(frozen=True)
class Positions:
    """Per qualified shard (``keyspace/shard``), the token changes are applied up to."""

    tokens: dict[str, EventToken]

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
    any time and see committed versions only.
    """

    def __init__(self, path: str, key: Sequence[str] = ()) -> None:
        self.path = os.path.abspath(path)
        #: the key columns; :meth:`merge` needs them (the dump job sets them when it
        #: has read the primary key)
        self.key = list(key)
        self._dt: DeltaTable | None = None

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
                return Positions.from_json(str(text))
        return None

    def create(self, schema: pa.Schema, description: str) -> None:
        """Create the (empty) table, replacing an empty one left by a crashed first run."""
        deltalake = _need_deltalake()
        os.makedirs(self.path, exist_ok=True)
        mode = "overwrite" if deltalake.DeltaTable.is_deltatable(self.path) else "error"
        self._dt = deltalake.DeltaTable.create(
            self.path, schema, mode=mode, name="shardgate_dump", description=description,
        )

    @property
    def table(self) -> DeltaTable:
        if self._dt is None:
            raise FailedPrecondition("the lake table is not open")
        return self._dt

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.schema(self.table.schema().to_arrow())

    # -- writing --------------------------------------------------------------------

    def add_files(self, files: Sequence[dict[str, Any]], positions: Positions) -> None:
        """Commit Parquet files already written under the table's directory, with positions.

        ``files``: ``{"path": relative path, "size": bytes, "rows": n, "stats": {...}}``.
        One commit: the snapshot's rows appear together with the positions they
        were read at, or not at all.
        """
        import time

        deltalake = _need_deltalake()
        from deltalake.transaction import AddAction, RemoveAction

        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f["path"], int(f["size"]), {}, now, True,
                      json.dumps({"numRecords": int(f["rows"]), **f.get("stats", {})}))
            for f in files
        ]
        with _delta_errors(self.path, "commit the snapshot"):
            self.table.create_write_transaction(
                actions, mode="append", schema=self.table.schema(),
                commit_properties=deltalake.CommitProperties(
                    custom_metadata={POSITIONS_KEY: positions.to_json()}),
            )
            self.table.update_incremental()

    def merge(self, rows: pa.Table, positions: Positions) -> dict[str, Any]:
        """Upsert change rows (one per key) where they are newer; record ``positions``.

        ``rows`` has the lake schema. Returns delta-rs's merge metrics.
        """
        deltalake = _need_deltalake()
        if not self.key:
            raise InvalidArgument("the lake table needs key columns (the primary key)")
        on = " AND ".join(f"t.{_ident(k)} = s.{_ident(k)}" for k in self.key)
        with _delta_errors(self.path, "merge changes"):
            return self._merge(rows, on, positions, deltalake)

    def _merge(self, rows: pa.Table, on: str, positions: Positions, deltalake: Any
               ) -> dict[str, Any]:
        metrics = (
            self.table.merge(
                rows, predicate=on, source_alias="s", target_alias="t",
                commit_properties=deltalake.CommitProperties(
                    custom_metadata={POSITIONS_KEY: positions.to_json()}),
            )
            .when_matched_update_all(predicate=f"s.{ORDER} > t.{ORDER}")
            .when_not_matched_insert_all()
            .execute()
        )
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
                predicate=f"{SHARD} = {_sql_str(shard)} AND {ORDER} < {order}", updates=sets)

    def compact(self, min_files: int = COMPACT_FILES) -> int:
        """Rewrite small files into bigger ones when there are more than ``min_files``.

        Returns the number of files removed (0 when nothing was done). Old files
        stay on disk for readers of older versions until ``vacuum``.
        """
        if len(self.table.file_uris()) <= min_files:
            return 0
        metrics = self.table.optimize.compact()
        return int(metrics.get("numFilesRemoved", 0))

    def live_files(self) -> list[str]:
        return list(self.table.file_uris())


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
