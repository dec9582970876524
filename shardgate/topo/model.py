"""The topology model: keyspaces, their shards (key ranges) and database URLs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardgate.engine.sqlsem import collation
from shardgate.errors import InvalidArgument, NotFound
from shardgate.keys import KeyRange, ShardMap, parse_shard_name
from shardgate.vschema import VSchema


@dataclass(frozen=True)
class ShardTopo:
    """One shard: its name (``-80``), key range and database URL."""

    keyspace: str
    name: str
    key_range: KeyRange
    url: str


@dataclass
class KeyspaceTopo:
    """One keyspace: its shards in key order and its VSchema document."""

    name: str
    shards: list[ShardTopo]
    vschema: dict[str, Any] = field(default_factory=dict)
    #: the collation of the shards' strings, which the gate follows when it
    #: merges, groups and sorts them (None: the dialect's default)
    collation: str | None = None

    def __post_init__(self) -> None:
        self.shards.sort(key=lambda s: s.key_range.start)
        self.shard_map = ShardMap([(s.name, s.key_range) for s in self.shards])
        self._by_name = {s.name: s for s in self.shards}

    @property
    def sharded(self) -> bool:
        return bool(self.vschema.get("sharded", False))

    def shard(self, name: str) -> ShardTopo:
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFound(
                f"shard {self.name}/{name} does not exist; shards: {list(self._by_name)}"
            ) from None


@dataclass
class Topology:
    """The whole cluster."""

    keyspaces: dict[str, KeyspaceTopo]
    default_keyspace: str | None = None
    #: Vitess's ``RoutingRules`` JSON (``{"rules": [...]}``), checked by :meth:`build_vschema`
    routing_rules: dict[str, Any] = field(default_factory=dict)
    #: the topo store's clock when this topology was read (0: not from a store)
    version: int = 0

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, path: str = "cluster") -> Topology:
        """Build from the parsed cluster file (see :mod:`shardgate.topo.file`)."""
        kdoc = doc.get("keyspaces")
        if not isinstance(kdoc, Mapping) or not kdoc:
            raise InvalidArgument(f"{path}: 'keyspaces' must map keyspace names to their shards")
        keyspaces: dict[str, KeyspaceTopo] = {}
        for ks_name, spec in kdoc.items():
            kpath = f"{path}.keyspaces.{ks_name}"
            if not isinstance(spec, Mapping):
                raise InvalidArgument(f"{kpath}: must be a mapping with 'shards' and 'vschema'")
            shards_doc = spec.get("shards")
            if not isinstance(shards_doc, Mapping) or not shards_doc:
                raise InvalidArgument(
                    f"{kpath}.shards: must map shard names ('-80', '80-', or '0') to URLs"
                )
            shards = []
            for shard_name, url in shards_doc.items():
                if not isinstance(url, str):
                    raise InvalidArgument(f"{kpath}.shards.{shard_name}: must be a database URL")
                try:
                    kr = parse_shard_name(str(shard_name))
                except InvalidArgument as exc:
                    raise InvalidArgument(f"{kpath}.shards: {exc.message}") from exc
                shards.append(ShardTopo(ks_name, str(shard_name), kr, url))
            vschema = spec.get("vschema", {"sharded": len(shards) > 1})
            if not isinstance(vschema, Mapping):
                raise InvalidArgument(f"{kpath}.vschema: must be a vschema object")
            vs = dict(vschema)
            if not vs.get("sharded", False) and len(shards) != 1:
                raise InvalidArgument(
                    f"{kpath}: an unsharded keyspace has exactly one shard ('0'), "
                    f"got {len(shards)}; set vschema.sharded: true to shard it"
                )
            coll = spec.get("collation")
            if coll is not None:
                if not isinstance(coll, str):
                    raise InvalidArgument(f"{kpath}.collation: must be a collation name")
                try:
                    collation(coll)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"{kpath}.collation: {exc.message}") from exc
            try:
                keyspaces[ks_name] = KeyspaceTopo(ks_name, shards, vs, coll)
            except InvalidArgument as exc:
                raise InvalidArgument(f"{kpath}.shards: {exc.message}") from exc
        default = doc.get("default_keyspace")
        if default is not None and default not in keyspaces:
            raise InvalidArgument(f"{path}.default_keyspace: {default!r} is not a keyspace")
        rules = doc.get("routing_rules", {})
        if not isinstance(rules, Mapping):
            raise InvalidArgument(f"{path}.routing_rules: must be an object with 'rules'")
        return cls(keyspaces=keyspaces, default_keyspace=default, routing_rules=dict(rules))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "keyspaces": {
                ks.name: {
                    "shards": {s.name: s.url for s in ks.shards},
                    "vschema": ks.vschema,
                    **({"collation": ks.collation} if ks.collation else {}),
                }
                for ks in self.keyspaces.values()
            }
        }
        if self.default_keyspace:
            out["default_keyspace"] = self.default_keyspace
        if self.routing_rules:
            out["routing_rules"] = self.routing_rules
        return out

    def keyspace(self, name: str) -> KeyspaceTopo:
        try:
            return self.keyspaces[name]
        except KeyError:
            raise NotFound(
                f"keyspace {name!r} is not in the topology; keyspaces: {sorted(self.keyspaces)}"
            ) from None

    def build_vschema(self) -> VSchema:
        """Validate and build the VSchema of every keyspace."""
        return VSchema.from_json(
            {ks.name: ks.vschema for ks in self.keyspaces.values()}, self.routing_rules
        )
