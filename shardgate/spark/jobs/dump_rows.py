"""The rows of a dump (:mod:`~shardgate.spark.jobs.dump`): the snapshot task that writes one
shard's rows as Parquet files into the lake, and the builder turning row changes into lake rows
for a MERGE. Both run where Spark puts them (tasks, the driver) and import pyarrow when called.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardgate.backends.bulk import copy as bulk
from shardgate.backends.changes import DELETE, INSERT, UPDATE
from shardgate.errors import FailedPrecondition, Unsupported
from shardgate.event_token import EventToken
from shardgate.spark.jobs.lake import (
    BUCKET,
    DELETED,
    ORDER,
    POSITION,
    SHARD,
    TS,
    Bucketing,
    token_order,
)

if TYPE_CHECKING:
    import pyarrow as pa


# ----------------------------------------------------------------- snapshot task --


def snapshot_shard(spec: dict[str, Any]) -> dict[str, Any]:
    """Spark task: read one shard in its snapshot, write Parquet files into the lake dir.

    ``spec``: ``shard`` (qualified), ``url``, ``table``, ``schema`` (Arrow
    schema of the lake table), ``lake`` (directory), ``run`` (id),
    ``file_rows``, ``key``, ``bucketing`` (JSON). Values are converted by the
    one type mapping (:mod:`shardgate.spark.types`); a value it cannot convert
    exactly fails the task with its reason. Rows are buffered per bucket and
    written, one file per bucket under ``_sg_bucket=<n>/``, whenever
    ``file_rows`` rows are buffered and at the end. Returns the shard's
    position, its snapshot time and the files written (path relative to the
    lake, bucket, size, rows, statistics). The files of an attempt that fails
    are never returned, hence never committed.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from shardgate.spark import types as sgtypes

    schema: pa.Schema = spec["schema"]
    source = pa.schema([f for f in schema if not f.name.startswith("_sg_")])
    stored = pa.schema([f for f in schema if f.name != BUCKET])  # partition values: in paths
    bucketing = Bucketing.from_json(spec["bucketing"])
    shard = spec["shard"]
    tag = f"{spec['run']}-{shard.replace('/', '_')}-{uuid.uuid4().hex[:8]}"
    files: list[dict[str, Any]] = []
    buffered: dict[int, list[pa.Table]] = {}
    count = 0

    def write_out() -> None:
        nonlocal count
        for bucket, parts in sorted(buffered.items()):
            data = pa.concat_tables(parts)
            rel = f"{BUCKET}={bucket}/part-{tag}-{len(files):05d}.parquet"
            full = os.path.join(spec["lake"], rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            pq.write_table(data, full)
            with open(full, "rb") as fh:
                os.fsync(fh.fileno())
            stats = _Stats(spec["key"])
            for b in data.to_batches():
                stats.add(b)
            files.append({"path": rel, "bucket": bucket, "rows": data.num_rows,
                          "size": os.path.getsize(full), "stats": stats.to_dict()})
        buffered.clear()
        count = 0

    with bulk.ShardReader(spec["url"]) as reader:
        position = reader.snapshot(spec["table"])
        snap_ts = time.time()
        order = token_order(position) if position else 0
        q = bulk.quote_ident(reader.kind, spec["table"])
        sql = f"SELECT * FROM {q}"
        if not bulk.supports_arrow(spec["url"]):
            batches: Any = (sgtypes.python_row_batch(fields, rows, source)
                            for fields, rows in reader.row_batches(sql))
        else:
            batches = (sgtypes.conform(raw, source) for raw in reader.arrow_batches(sql))
        for batch in batches:
            if batch.num_rows == 0:
                continue
            n = batch.num_rows
            extra = [pa.array([shard] * n, pa.string()), pa.array([position] * n, pa.string()),
                     pa.array([order] * n, pa.int64()), pa.array([snap_ts] * n, pa.float64()),
                     pa.array([False] * n, pa.bool_())]
            out = pa.Table.from_arrays(list(batch.columns) + extra, schema=stored)
            buckets = bucketing.buckets(out)
            for bucket in pc_unique_ints(buckets):
                part = out.filter(pc.equal(buckets, pa.scalar(bucket, pa.int32())))
                buffered.setdefault(bucket, []).append(part)
            count += n
            if count >= spec["file_rows"]:
                write_out()
        write_out()
    return {"shard": shard, "position": position, "timestamp": snap_ts, "files": files,
            "rows": sum(f["rows"] for f in files)}


def pc_unique_ints(arr: pa.Array) -> list[int]:
    """The distinct values of an integer array, sorted."""
    import pyarrow.compute as pc

    return sorted(int(v) for v in pc.unique(arr).to_pylist())


class _Stats:
    """Delta file statistics (min/max/nulls) of the key columns, for MERGE file pruning."""

    def __init__(self, key: Sequence[str]) -> None:
        self.key = list(key)
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.nulls: dict[str, int] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        for k in [*self.key, ORDER]:
            col = batch.column(batch.schema.get_field_index(k))
            if not pa.types.is_integer(col.type):
                continue
            mm = pc.min_max(col).as_py()
            if mm["min"] is not None:
                self.mins[k] = mm["min"] if k not in self.mins else min(self.mins[k], mm["min"])
                self.maxs[k] = mm["max"] if k not in self.maxs else max(self.maxs[k], mm["max"])
            self.nulls[k] = self.nulls.get(k, 0) + col.null_count

    def to_dict(self) -> dict[str, Any]:
        if not self.mins:
            return {}
        return {"minValues": self.mins, "maxValues": self.maxs, "nullCount": self.nulls}


class RowBuilder:
    """Change rows -> lake rows (tuples in the lake's column order) -> an Arrow table.

    The lake's columns are the source columns, then ``_sg_shard``, ``_sg_position``,
    ``_sg_order``, ``_sg_ts``, ``_sg_deleted`` (see :func:`lake_schema`).
    """

    def __init__(self, schema: pa.Schema, key: Sequence[str], bucketing: Bucketing,
                 order: Callable[[EventToken], int] | None = None) -> None:
        import pyarrow as pa

        self.schema = schema
        self.key = list(key)
        self.bucketing = bucketing
        #: a change's ``_sg_order`` (its shard's generation and its position)
        self.order = order or (lambda t: token_order(t.position))
        self.columns = [n for n in schema.names if not n.startswith("_sg_")]
        if schema.names[len(self.columns):] != [SHARD, POSITION, ORDER, TS, DELETED, BUCKET]:
            raise FailedPrecondition(f"the lake table's columns are not a dump's: {schema.names}")
        self.stored = pa.schema([f for f in schema if f.name != BUCKET])
        self._key_at = [self.columns.index(k) for k in self.key]
        self._token: EventToken | None = None
        self._tok: tuple[Any, ...] = ()

    def _key(self, image: dict[str, Any]) -> tuple[Any, ...]:
        try:
            return tuple(image[k] for k in self.key)
        except KeyError as exc:
            raise Unsupported(f"a change image lacks key column {exc}") from exc

    def rows(self, c: Any, token: EventToken) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(key, row)`` pairs for one row change: a tombstone and/or the new image."""
        if token is not self._token:  # once per transaction, not per row
            self._token = token
            self._tok = (token.shard, token.position, self.order(token),
                         float(token.timestamp))
        out: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
        if c.op in (UPDATE, DELETE) and c.before is not None:
            old = self._key(c.before)
            if c.op == DELETE or (c.after is not None and self._key(c.after) != old):
                tomb: list[Any] = [None] * len(self.columns)
                for i, v in zip(self._key_at, old, strict=True):
                    tomb[i] = v
                out.append((old, (*tomb, *self._tok, True)))
        if c.op in (INSERT, UPDATE) and c.after is not None:
            after = c.after
            out.append((self._key(after),
                        (*[after.get(col) for col in self.columns], *self._tok, False)))
        return out

    def table(self, rows: list[tuple[Any, ...]], table: str
              ) -> tuple[pa.Table, list[dict[str, Any]]]:
        """Lake rows as an Arrow table (buckets filled) and the quarantine rows of those
        whose values the type mapping cannot convert exactly (left out of the table)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from shardgate.spark import types as sgtypes

        arrays = []
        bad: dict[int, str] = {}
        for f, values in zip(self.stored, zip(*rows, strict=True), strict=True):
            arr, reasons = sgtypes.column(values, f)
            arrays.append(arr)
            for i, why in reasons.items():
                bad.setdefault(i, why)
        data = pa.Table.from_arrays(arrays, schema=self.stored)
        poison: list[dict[str, Any]] = []
        if bad:
            keep = [i not in bad for i in range(len(rows))]
            data = data.filter(pa.array(keep))
            poison = [self._poison(rows[i], table, why) for i, why in sorted(bad.items())]
        buckets = self.bucketing.buckets(data)
        data = data.append_column(pa.field(BUCKET, pa.int32()), pc.cast(buckets, pa.int32()))
        return data, poison

    def _poison(self, row: tuple[Any, ...], table: str, reason: str) -> dict[str, Any]:
        n = len(self.columns)
        image = {c: None if v is None else str(v) for c, v in zip(self.columns, row[:n],
                                                                   strict=True)}
        key = {k: image[k] for k in self.key}
        shard, position, _order, ts, deleted = row[n:]
        return {"shard": shard, "position": position, "tbl": table,
                "op": "delete" if deleted else "upsert", "key": json.dumps(key),
                "image": json.dumps(image), "reason": reason, "ts": float(ts)}
