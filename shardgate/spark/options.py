"""Options of the Spark data sources, read once in the driver and validated."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.topo import Topology
from shardgate.topo.local import read_topology

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

    ``cluster``   path of the cluster file (YAML, see ``shardgate.topo.file``), or
    ``topo``      the URL of a topo store (production mode: the store ``shardgate gate
                  --topo`` and the tablet processes use); one of the two is required.
    ``keyspace``  the keyspace; defaults to the cluster's ``default_keyspace``.
    ``topology``  the topology document (``Topology.to_dict()``), shipped to the tasks so
                  that executors need not read the file or the store.
    """

    cluster: str | None
    keyspace: str
    topology: dict[str, Any]
    topo_url: str | None = None

    def topo(self) -> Topology:
        return Topology.from_dict(self.topology)

    def current(self) -> Topology:
        """The topology now: the cluster file read again, or the topo store's."""
        if self.topo_url is not None:
            return read_topology(None, url=self.topo_url)
        assert self.cluster is not None
        return read_topology(self.cluster)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        cluster = options.get("cluster") or None
        topo_url = options.get("topo") or None
        if cluster and topo_url:
            raise InvalidArgument("give option 'cluster' or option 'topo', not both")
        if topo_url is not None:
            topo = read_topology(None, url=topo_url)
        elif cluster is not None:
            # the store beside the file once it has one (a reshard changes the shards there)
            topo = read_topology(cluster)
        else:
            raise InvalidArgument(
                "option 'cluster' is required: the path of the cluster file "
                "(.option('cluster', 'cluster.yaml')), or option 'topo', the URL of the "
                "topo store of a production cluster"
            )
        keyspace = options.get("keyspace") or topo.default_keyspace
        if not keyspace:
            raise InvalidArgument(
                "option 'keyspace' is required: the cluster names no default_keyspace"
            )
        topo.keyspace(keyspace)  # NotFound names the known ones
        return cls(cluster=cluster, keyspace=keyspace, topology=topo.to_dict(),
                   topo_url=topo_url)


@dataclass(frozen=True)
class ReadOptions:
    """``table`` or ``query``; ``splits`` (total, default one per shard); ``path``;
    ``numeric_as`` (``decimal`` or ``string``: unbounded NUMERIC, see docs/types.md)."""

    table: str | None
    query: str | None
    splits: int | None
    path: str
    batch_rows: int
    numeric_as: str = "decimal"

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
        numeric_as = (options.get("numeric_as") or "decimal").lower()
        if numeric_as not in ("decimal", "string"):
            raise InvalidArgument(
                f"option 'numeric_as' must be 'decimal' or 'string', got {numeric_as!r}")
        return cls(table, query, splits, path, _int(options, "batch_rows", 65_536), numeric_as)


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


#: where a change stream starts when no checkpoint exists
STARTING = ("latest", "earliest")


def start_timestamp(text: str) -> float:
    """Option ``starting`` as seconds since the epoch (a number, or ISO 8601; UTC if naive)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        ts = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            f"option 'starting' must be latest, earliest, a timestamp (seconds or ISO 8601) "
            f"or a JSON object of positions, got {text!r}"
        ) from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=datetime.UTC)
    return ts.timestamp()


@dataclass(frozen=True)
class ChangesOptions:
    """Options of ``shardgate_changes``.

    ``starting``              ``latest`` (default), ``earliest``, a timestamp (seconds since
                              the epoch, or ISO 8601) or a JSON object ``{shard: position or
                              event token}`` (shards it does not name start at their oldest
                              position); used only when the query has no checkpoint.
    ``maxEventsPerTrigger``   row changes per micro-batch at most (0: no limit); whole
                              transactions only, so a batch exceeds it only when its first
                              transaction alone does.
    ``tables``                comma-separated tables to keep (default: every table).
    ``newShards``             where a shard that appears in the topology later starts:
                              ``earliest`` (default: nothing lost) or ``latest``.
    ``readTimeout``           seconds a task may wait for a shard's log to reach the batch's
                              end position before failing (retryable).
    ``images``                ``struct``: ``before``/``after`` as structs with the table's own
                              column types (needs ``tables`` naming one table; the default
                              then); ``json``: JSON strings (the default for several tables).
    ``numeric_as``            unbounded NUMERIC in struct images: ``decimal`` or ``string``.
    ``partitions``            partitions per micro-batch at most (0, the default: one per
                              shard that moved); a partition reads its shards' logs
                              concurrently (e.g. Spark's task slots, when there are more
                              shards than slots).
    """

    starting: str
    max_events: int
    tables: tuple[str, ...]
    new_shards: str
    read_timeout: float
    images: str = "json"
    numeric_as: str = "decimal"
    partitions: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ChangesOptions:
        starting = (options.get("starting") or "latest").strip()
        if starting.lower() not in STARTING and not starting.startswith("{"):
            start_timestamp(starting)  # refuses what is not a time
        new_shards = (options.get("newShards") or "earliest").strip().lower()
        if new_shards not in STARTING:
            raise InvalidArgument(f"option 'newShards' must be one of {STARTING}, "
                                  f"got {new_shards!r}")
        tables = tuple(t.strip().lower() for t in (options.get("tables") or "").split(",")
                       if t.strip())
        images = (options.get("images") or ("struct" if len(tables) == 1 else "json")).lower()
        if images not in ("struct", "json"):
            raise InvalidArgument(f"option 'images' must be 'struct' or 'json', got {images!r}")
        if images == "struct" and len(tables) != 1:
            raise InvalidArgument(
                "option images='struct' types the images with one table's columns: name that "
                "table in option 'tables' (or use images='json' for a mixed-table stream)")
        numeric_as = (options.get("numeric_as") or "decimal").lower()
        if numeric_as not in ("decimal", "string"):
            raise InvalidArgument(
                f"option 'numeric_as' must be 'decimal' or 'string', got {numeric_as!r}")
        return cls(starting, _int(options, "maxEventsPerTrigger", 0, low=0), tables,
                   new_shards, float(_int(options, "readTimeout", 120)), images, numeric_as,
                   _int(options, "partitions", 0, low=0))


@dataclass(frozen=True)
class QueueSourceOptions:
    """Options of ``shardgate_queue``.

    ``queue``                 the queue table (required).
    ``gate``                  ``grpc://host:port`` of a running gate to receive from; default:
                              with option ``topo``, a gate in the driver reaching the tablet
                              processes registered there; with ``cluster``, an in-process
                              gate on its topology (its tablets compete for the shards'
                              queue leases).
    ``maxEventsPerTrigger``   events per micro-batch at most (default 1000).
    ``waitMs``                how long one trigger waits for the first events (default 500).
    ``partitions``            partitions per micro-batch at most (default 2).
    """

    queue: str
    gate: str | None
    max_events: int
    wait_s: float
    partitions: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> QueueSourceOptions:
        queue = options.get("queue")
        if not queue:
            raise InvalidArgument("option 'queue' is required: the queue table to receive from")
        gate = options.get("gate") or None
        if gate is not None and not gate.startswith("grpc://"):
            raise InvalidArgument(f"option 'gate' must be a grpc://host:port URL, got {gate!r}")
        return cls(queue, gate, _int(options, "maxEventsPerTrigger", 1000),
                   _int(options, "waitMs", 500, low=0) / 1000.0, _int(options, "partitions", 2))
