"""Options of the Spark data sources, read once in the driver and validated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.topo import Topology, load_cluster_file

#: how a partition reads its split: straight from the shard's database with the
#: keyspace-id filter applied to each batch, or through an in-process gate
READ_PATHS = ("direct", "gate")


def _int(options: Mapping[str, str], key: str, default: int, *, low: int = 1) -> int:
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgument(f"option {key!r} must be an integer, got {raw!r}") from None
    if n < low:
        raise InvalidArgument(f"option {key!r} must be at least {low}, got {n}")
    return n


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    low = str(raw).strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {key!r} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class SourceOptions:
    """Options common to every shardgate source.

    ``cluster``   path of the cluster file (YAML, see ``shardgate.topo.file``): required.
    ``keyspace``  the keyspace; defaults to the cluster's ``default_keyspace``.
    ``topology``  the topology document (``Topology.to_dict()``), shipped to the tasks so
                  that executors need not read the file.
    """

    cluster: str
    keyspace: str
    topology: dict[str, Any]

    def topo(self) -> Topology:
        return Topology.from_dict(self.topology)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        cluster = options.get("cluster")
        if not cluster:
            raise InvalidArgument(
                "option 'cluster' is required: the path of the cluster file "
                "(.option('cluster', 'cluster.yaml'))"
            )
        topo = load_cluster_file(cluster)
        keyspace = options.get("keyspace") or topo.default_keyspace
        if not keyspace:
            raise InvalidArgument(
                "option 'keyspace' is required: the cluster file names no default_keyspace"
            )
        topo.keyspace(keyspace)  # NotFound names the known ones
        return cls(cluster=cluster, keyspace=keyspace, topology=topo.to_dict())


@dataclass(frozen=True)
class ReadOptions:
    """``table`` or ``query``; ``splits`` (total, default one per shard); ``path``."""

    table: str | None
    query: str | None
    splits: int | None
    path: str
    batch_rows: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        table, query = options.get("table") or None, options.get("query") or None
        if (table is None) == (query is None):
            raise InvalidArgument(
                "give exactly one of the options 'table' (a table of the keyspace) and "
                "'query' (a single-table SELECT without aggregates, ORDER BY or LIMIT)"
            )
        path = (options.get("path") or "direct").lower()
        if path not in READ_PATHS:
            raise InvalidArgument(f"option 'path' must be one of {READ_PATHS}, got {path!r}")
        splits = _int(options, "splits", 0, low=0) or None
        return cls(table, query, splits, path, _int(options, "batch_rows", 65_536))


@dataclass(frozen=True)
class WriteOptions:
    """``table``; ``batch_rows`` per shard write; ``ignore_duplicates``."""

    table: str
    batch_rows: int
    ignore_duplicates: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        table = options.get("table")
        if not table:
            raise InvalidArgument("option 'table' is required to write")
        return cls(table, _int(options, "batch_rows", 200_000),
                   _bool(options, "ignore_duplicates", False))
