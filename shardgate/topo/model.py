"""The topology model: keyspaces, their shards (key ranges) and database URLs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardgate.backends.urls import redacted
from shardgate.errors import InvalidArgument, NotFound
from shardgate.evalengine.sqlsem import collation
from shardgate.keys import KeyRange, ShardMap, parse_shard_name
from shardgate.vschema import VSchema

#: the marker in the error a source shard raises for a write during a reshard's
#: write cut-over (see :mod:`shardgate.gate.cutover`)
WRITES_FROZEN = "sg_reshard_writes_frozen"


def writes_frozen(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a reshard cut-over's write
    refusal (its text carries :data:`WRITES_FROZEN`)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        text = str(getattr(seen, "message", None) or seen)
        if WRITES_FROZEN in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True)
class ShardTopo:
    """One shard: its name (``-80``), key range and database URL."""

    keyspace: str
    name: str
    key_range: KeyRange
    url: str = field(repr=False)

    def __repr__(self) -> str:
        return (f"ShardTopo(keyspace={self.keyspace!r}, name={self.name!r}, "
                f"url={redacted(self.url)!r})")


@dataclass
class KeyspaceTopo:
    """One keyspace: its shards in key order and its VSchema document.

    Serving state (resharding, :mod:`shardgate.workflows.reshard`): ``shards``
    are the shards serving **writes** (and reads, unless ``read_shards`` says
    otherwise); ``pending`` are shards that exist but serve nothing (the
    targets of a reshard before its switch, or its sources after it, kept for
    ``reverse-traffic``); ``read_shards`` names the shards serving reads
    outside transactions when they are not ``shards`` (after ``switch-traffic
    --reads``). Both serving sets partition the keyspace.

    ``journal`` is the last write switch's journal while its sources are still
    pending (from the switch to ``complete``): ``{"sources": {shard: final
    position}, "targets": {shard: position at the journal}, "at": time}``.
    Change streams hop over the switch with it (:mod:`shardgate.streams.hop`).

    ``history`` keeps the journals of completed write switches, oldest first,
    each with ``urls`` (the retired sources' databases): ``complete`` moves
    the journal there, so a reader behind the switch (a Spark
    ``shardgate_changes`` checkpoint) can still hop over it.
    """

    name: str
    shards: list[ShardTopo]
    vschema: dict[str, Any] = field(default_factory=dict)
    #: the collation of the shards' strings, which the gate follows when it
    #: merges, groups and sorts them (None: the dialect's default)
    collation: str | None = None
    #: shards that exist but serve neither reads nor writes (unless in ``read_shards``)
    pending: list[ShardTopo] = field(default_factory=list)
    #: names of the shards serving reads when they are not ``shards`` (None: ``shards``)
    read_shards: list[str] | None = None
    #: the journal of the last write switch, until ``complete`` (see above)
    journal: dict[str, Any] | None = None
    #: the journals of completed write switches, oldest first (see above)
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shards.sort(key=lambda s: s.key_range.start)
        self.pending.sort(key=lambda s: s.key_range.start)
        self.shard_map = ShardMap([(s.name, s.key_range) for s in self.shards])
        self._by_name = {s.name: s for s in self.shards}
        clash = sorted(set(self._by_name) & {s.name for s in self.pending})
        if clash:
            raise InvalidArgument(f"shards {clash} are both serving and pending")
        self._all = {**self._by_name, **{s.name: s for s in self.pending}}
        self.read_shard_map = self.shard_map
        if self.read_shards is not None:
            unknown = sorted(set(self.read_shards) - set(self._all))
            if unknown:
                raise InvalidArgument(f"read_shards {unknown} are not shards of the keyspace")
            self.read_shard_map = ShardMap(
                [(n, self._all[n].key_range) for n in self.read_shards])

    def any_shard(self, name: str) -> ShardTopo:
        """A serving or pending shard by name (NotFound if neither)."""
        try:
            return self._all[name]
        except KeyError:
            raise NotFound(
                f"shard {self.name}/{name} does not exist; shards: {list(self._all)}"
            ) from None

    @property
    def all_shards(self) -> list[ShardTopo]:
        """Serving and pending shards (every shard a gate may need a tablet for)."""
        return [*self.shards, *self.pending]

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
            pending = _pending_shards(ks_name, spec.get("pending_shards", {}), kpath)
            read_shards = spec.get("read_shards")
            if read_shards is not None and (not isinstance(read_shards, list) or not all(
                    isinstance(n, str) for n in read_shards)):
                raise InvalidArgument(f"{kpath}.read_shards: must be a list of shard names")
            journal = spec.get("reshard_journal")
            if journal is not None and not (
                    isinstance(journal, Mapping) and isinstance(journal.get("sources"), Mapping)
                    and isinstance(journal.get("targets", {}), Mapping)):
                raise InvalidArgument(f"{kpath}.reshard_journal: must be an object with "
                                      "'sources' and 'targets' (shard -> position)")
            history = spec.get("reshard_history", [])
            if not isinstance(history, list) or not all(
                    isinstance(h, Mapping) and isinstance(h.get("sources"), Mapping)
                    and isinstance(h.get("targets", {}), Mapping)
                    and isinstance(h.get("urls"), Mapping) for h in history):
                raise InvalidArgument(f"{kpath}.reshard_history: must be a list of journals "
                                      "with 'sources', 'targets' and 'urls'")
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
                keyspaces[ks_name] = KeyspaceTopo(
                    ks_name, shards, vs, coll, pending, read_shards,
                    dict(journal) if journal is not None else None,
                    [dict(h) for h in history])
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
                    **({"pending_shards": {s.name: s.url for s in ks.pending}}
                       if ks.pending else {}),
                    **({"read_shards": list(ks.read_shards)}
                       if ks.read_shards is not None else {}),
                    **({"reshard_journal": ks.journal} if ks.journal is not None else {}),
                    **({"reshard_history": ks.history} if ks.history else {}),
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


def _pending_shards(keyspace: str, doc: Any, kpath: str) -> list[ShardTopo]:
    """The ``pending_shards`` mapping (shard name -> URL) of a keyspace document."""
    if not isinstance(doc, Mapping):
        raise InvalidArgument(f"{kpath}.pending_shards: must map shard names to URLs")
    out = []
    for name, url in doc.items():
        if not isinstance(url, str):
            raise InvalidArgument(f"{kpath}.pending_shards.{name}: must be a database URL")
        try:
            kr = parse_shard_name(str(name))
        except InvalidArgument as exc:
            raise InvalidArgument(f"{kpath}.pending_shards: {exc.message}") from exc
        out.append(ShardTopo(keyspace, str(name), kr, url))
    return out
