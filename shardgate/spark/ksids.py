"""Keyspace ids of whole Arrow columns: the vectorized form of a primary vindex.

The reader keeps only the rows of a batch whose keyspace id lies in its
split's key range (so a stale copy on a shard that no longer owns the row is
dropped there and the row is read once, from its owner); the writer sends each
row to the shard owning its keyspace id. Both work on a whole batch:

* ``hash`` over an integer column: the values as 8-byte big-endian uint64s,
  concatenated, go through one DES call, in place (:meth:`Hash.hash_inplace`);
* ``numeric`` over an integer column: the value is the keyspace id;
* any other functional vindex: one ``map`` call per batch.

Keyspace ids are compared as their first 8 bytes (zero-padded) read as a
big-endian uint64. That is exact as long as the key-range bounds have at most
8 bytes (every shard name shardgate and Vitess create); longer bounds fall back
to byte-wise comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardgate.errors import InvalidArgument, Unsupported
from shardgate.keys import KeyRange
from shardgate.vindexes import MultiColumn, SingleColumn, Vindex, create_vindex
from shardgate.vindexes.hash import Hash
from shardgate.vindexes.numeric import Numeric

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class VindexSpec:
    """A picklable description of a functional vindex: rebuilt in each Spark task."""

    type_name: str
    name: str
    params: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]

    @classmethod
    def of(cls, vindex: Vindex, columns: Sequence[str]) -> VindexSpec:
        if not isinstance(vindex, SingleColumn | MultiColumn):
            raise Unsupported(
                f"vindex {vindex.name!r} ({vindex.type_name}) needs a lookup table: the Spark "
                "sources compute keyspace ids only with functional primary vindexes"
            )
        return cls(vindex.type_name, vindex.name, tuple(sorted(vindex.params.items())),
                   tuple(columns))

    def build(self) -> Vindex:
        return create_vindex(self.type_name, self.name, dict(self.params))


def _u64_bound(b: bytes) -> int | None:
    """A key-range bound as a uint64, or None if it has more than 8 bytes."""
    trimmed = b.rstrip(b"\x00")
    if len(trimmed) > 8:
        return None
    return int.from_bytes(trimmed.ljust(8, b"\x00"), "big")


class KsidMapper:
    """Computes the keyspace ids of a batch's rows with one functional vindex."""

    def __init__(self, spec: VindexSpec) -> None:
        self.spec = spec
        self.vindex = spec.build()

    def _column(self, batch: pa.RecordBatch | pa.Table, name: str) -> Any:
        names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
        i = names.get(name.lower())
        if i is None:
            raise InvalidArgument(
                f"column {name!r} of vindex {self.spec.name!r} is missing: the rows need "
                f"their primary vindex columns {list(self.spec.columns)}"
            )
        return batch.column(i)

    def u64(self, batch: pa.RecordBatch | pa.Table) -> tuple[U64, Mask, list[bytes | None]]:
        """Per row: the ksid's first 8 bytes as uint64, whether it has a ksid, the ksids.

        The third element is filled only when a ksid is not 8 bytes long (then
        comparisons of longer bounds need the bytes); otherwise it is empty.
        """
        v = self.vindex
        if len(self.spec.columns) == 1 and isinstance(v, Hash | Numeric):
            col = self._column(batch, self.spec.columns[0])
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            if pa.types.is_integer(col.type):
                valid: Mask = np.asarray(col.is_valid(), dtype=np.bool_)
                ints = np.asarray(col.fill_null(0).cast(pa.int64(), safe=False),
                                  dtype=np.int64)
                plain = ints.view(np.uint64)  # negative int64: two's complement, as Vitess
                if isinstance(v, Numeric):
                    return plain.copy(), valid, []
                blocks = plain.astype(">u8")  # a copy: hashed in place
                v.hash_inplace(blocks.data)
                blocks.byteswap(inplace=True)  # big-endian ksids -> native order
                return blocks.view(np.uint64), valid, []
        # Generic: one map call for the batch.
        if isinstance(v, SingleColumn):
            values = self._column(batch, self.spec.columns[0]).to_pylist()
            mapped = v.map(values)
        elif isinstance(v, MultiColumn):
            cols = [self._column(batch, c).to_pylist() for c in self.spec.columns]
            mapped = v.map_multi(list(zip(*cols, strict=True)))
        else:  # pragma: no cover - VindexSpec.of refuses these
            raise Unsupported(f"vindex {self.spec.name!r} is not functional")
        ksids = [m[0] if m else None for m in mapped]
        out = np.zeros(len(ksids), dtype=np.uint64)
        ok = np.zeros(len(ksids), dtype=np.bool_)
        odd = False
        for i, k in enumerate(ksids):
            if k is not None:
                ok[i] = True
                out[i] = int.from_bytes(k[:8].ljust(8, b"\x00"), "big")
                odd = odd or len(k) != 8
        return out, ok, ksids if odd else []

    def in_range(self, batch: pa.RecordBatch | pa.Table, kr: KeyRange) -> Mask:
        """True for the rows whose keyspace id lies in ``kr`` (no ksid: False)."""
        u, valid, raw = self.u64(batch)
        lo, hi = _u64_bound(kr.start), _u64_bound(kr.end) if kr.end else None
        if lo is None or (kr.end and hi is None):
            keep = [k is not None and kr.contains(k) for k in (raw or self._ksids(u, valid))]
            return np.asarray(keep, dtype=np.bool_)
        mask = valid & (u >= np.uint64(lo))
        if hi is not None:
            mask &= u < np.uint64(hi)
        return mask

    @staticmethod
    def _ksids(u: U64, valid: Mask) -> list[bytes | None]:
        return [int(x).to_bytes(8, "big") if ok else None for x, ok in zip(u, valid, strict=True)]


class ShardIndex:
    """Which shard owns each keyspace id, for a batch (the vectorized ShardMap)."""

    def __init__(self, shards: Sequence[tuple[str, KeyRange]]) -> None:
        ordered = sorted(shards, key=lambda s: s[1].start.rstrip(b"\x00"))
        self.names = [n for n, _ in ordered]
        starts = [_u64_bound(kr.start) for _, kr in ordered]
        if any(s is None for s in starts):
            raise Unsupported("shard bounds longer than 8 bytes are not supported by Spark writes")
        self._starts = np.asarray(starts, dtype=np.uint64)

    def shard_of(self, u: U64) -> npt.NDArray[np.intp]:
        """Index into :attr:`names` of each ksid's shard."""
        return np.searchsorted(self._starts, u, side="right") - 1


def group_by_shard(
    batch: pa.RecordBatch | pa.Table, mapper: KsidMapper, index: ShardIndex
) -> Mapping[str, pa.Table]:
    """Split ``batch`` into one table per owning shard; rows without a ksid are refused."""
    u, valid, _ = mapper.u64(batch)
    if not bool(valid.all()):
        bad = int(np.argmin(valid))
        cols = {c: mapper._column(batch, c)[bad].as_py() for c in mapper.spec.columns}
        raise InvalidArgument(
            f"row {bad} of the batch has no keyspace id: vindex {mapper.spec.name!r} maps "
            f"{cols} to nothing (NULL or a value of the wrong type)"
        )
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    which = index.shard_of(u)
    out: dict[str, pa.Table] = {}
    order = np.argsort(which, kind="stable")
    sorted_idx = which[order]
    bounds = np.searchsorted(sorted_idx, np.arange(len(index.names) + 1))
    for i, name in enumerate(index.names):
        a, b = int(bounds[i]), int(bounds[i + 1])
        if b > a:
            out[name] = table.take(pa.array(order[a:b]))
    return out
