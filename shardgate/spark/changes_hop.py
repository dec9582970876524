"""Which databases ``shardgate_changes`` reads, and how its offsets hop over a reshard.

An offset of the source maps **offset keys** to log positions. A key names
one database: the shard's name for a database no reshard created
(generation 0: the keys of offsets written before reshards were followed),
``<name>@<generation>`` for a reshard's target (see
:func:`shardgate.streams.hop.generations`). A merge may give a new database
the name of a shard an earlier split retired; the two keys differ, so a
position is never read against the wrong log.

:class:`View` is the keyspace at one batch: its databases by key (serving,
pending, and the retired sources the keyspace's ``history`` remembers, each
source with its final position) and its write switches
(:meth:`~shardgate.streams.hop.Hop.lineage`, the same journal the gate's
stream hops with). :meth:`View.hop` moves an offset across them:

* a source is read up to its final position, never past it (a reverse
  stream may replay the targets' changes onto it after the switch);
* a target joins the offset at its journal position once every source in
  the offset whose range meets it has reached its final position; it is
  read from the next batch on, so per row every change of the sources is in
  an earlier batch than any change of the target;
* a source at its final position leaves the offset once every target
  meeting its range is in it.

Invariant: a key is in an offset from the position its database's reading
begins to the one it ends; no two keys name one database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardgate.backends.urls import parse_url
from shardgate.errors import FailedPrecondition
from shardgate.event_token import position_key
from shardgate.streams.hop import Hop, generations
from shardgate.topo.model import KeyspaceTopo


def offset_key(name: str, generation: int) -> str:
    """The offset key of shard ``name``'s database of ``generation``."""
    return name if generation == 0 else f"{name}@{generation}"


@dataclass(frozen=True)
class Db:
    """One shard database the source may read."""

    key: str
    name: str
    url: str
    #: a write switch's source: its final position (read no further)
    final: str | None = None

    @property
    def kind(self) -> str:
        return parse_url(self.url).kind

    def drained(self, position: str | None) -> bool:
        """Whether ``position`` is at or past this source's final position."""
        return self.final is not None and position is not None and \
            position_key(position) >= position_key(self.final)


@dataclass(frozen=True)
class Join:
    """A hop target to add to the offset: at ``position`` (its journal position), or,
    when the journal has none (an older journal, a MariaDB target), at the first
    commit at or after ``since``."""

    db: Db
    position: str | None
    since: float


class View:
    """The keyspace's databases and write switches, as one batch plans them."""

    def __init__(self, ks: KeyspaceTopo) -> None:
        self.hops = Hop.lineage(ks)
        self._gen = generations(self.hops)
        self.by_key: dict[str, Db] = {}
        finals: dict[str, str] = {}
        for hop in self.hops:  # a later switch's source may be an earlier one's target
            for source, url in hop.source_urls.items():
                finals[url] = hop.sources[source]
        for hop in self.hops:
            for source, url in hop.source_urls.items():
                self._add(source, url, finals.get(url))
        for shard in ks.all_shards:
            self._add(shard.name, shard.url, finals.get(shard.url))
        self.serving = [self.by_key[self.key(s.name, s.url)] for s in ks.shards]
        for shard, db in zip(ks.shards, self.serving, strict=True):
            if db.url != shard.url:
                raise FailedPrecondition(
                    f"shard {ks.name}/{shard.name} and a database a reshard retired share the "
                    f"offset key {db.key!r}: shardgate_changes cannot tell their positions "
                    "apart; restart the query with a new checkpoint")

    def key(self, name: str, url: str) -> str:
        return offset_key(name, self._gen.get(url, 0))

    def _add(self, name: str, url: str, final: str | None) -> None:
        key = self.key(name, url)
        if key not in self.by_key:
            self.by_key[key] = Db(key, name, url, final)

    def hop(self, start: Mapping[str, str], out: dict[str, str]) -> tuple[list[Join], set[str]]:
        """Move ``out`` (the batch's end offset, from ``start``) across the switches.

        Drops from ``out`` the sources that ``start`` already has at their final
        positions and whose targets are all in ``out``. Returns the targets to join
        now (every source of ``out`` meeting them is at its final position in
        ``out``) and the keys of targets that wait for their sources (not to be
        joined as new shards meanwhile).
        """
        joins: list[Join] = []
        waiting: set[str] = set()
        for hop in self.hops:
            tracked = {s: self.key(s, url) for s, url in hop.source_urls.items()
                       if self.key(s, url) in out}
            if not tracked:
                continue
            targets = {t: self.key(t, url) for t, url in hop.target_urls.items()}
            for target, key in targets.items():
                if key in out:
                    continue
                fed = [tracked[s] for s in hop.feeding(target) if s in tracked]
                if not fed:
                    continue
                waiting.add(key)
                if all(self.by_key[k].drained(out[k]) for k in fed):
                    joins.append(Join(self.by_key.get(key) or Db(key, target,
                                                                 hop.target_urls[target]),
                                      hop.targets.get(target), hop.at))
            for source, key in tracked.items():
                meeting = [targets[t] for t in targets if hop.meets(source, t)]
                if self.by_key[key].drained(start.get(key)) and all(k in out for k in meeting):
                    del out[key]
        return joins, waiting

    def db(self, key: str, fallback: KeyspaceTopo) -> Db:
        """The database of offset ``key``; ``fallback``: the topology the query began with
        (a shard removed from the cluster file by hand, not by a reshard)."""
        found = self.by_key.get(key)
        if found is not None:
            return found
        if "@" not in key:
            for shard in fallback.all_shards:
                if shard.name == key:
                    return Db(key, key, shard.url)
        raise FailedPrecondition(
            f"the offset names shard database {key!r} of keyspace {fallback.name!r}, which "
            "neither the keyspace nor its reshard history knows any more (its reshard was "
            "completed too long ago): its unread changes cannot be read; restart the query "
            "with a new checkpoint (and a batch read of the tables)")


__all__ = ["Db", "Join", "View", "offset_key"]
