"""Change streams across a reshard's write switch: the journal as the streams see it.

A reshard's write switch (:mod:`shardgate.workflows.reshard`) writes a journal
with, per **source** shard, its final log position (every write committed on
the frozen source is at or before it) and, per **target** shard, its log
position at that moment (the catch-up had written everything the sources
committed; nothing else writes to a target before the switch). The switch
puts both in the keyspace record (``reshard_journal``, see
:class:`~shardgate.topo.model.KeyspaceTopo`), so every gate sees them
together with the new serving shards; ``complete`` removes them with the
sources.

The gate's UpdateStream (:mod:`shardgate.streams.merge`) uses :class:`Hop`
to keep going: each source's stream ends at its final position, then each
target's stream starts at its journal position, once every source whose
range meets the target's has ended (so changes of one row arrive in commit
order). Nothing is skipped; nothing is repeated when the journal has the
targets' positions.

Readers that keep their own positions (the Spark source ``shardgate_changes``)
may be behind a switch long after it, even after ``complete``: ``complete``
moves the journal to the keyspace's ``history`` with the sources' and
targets' databases. :meth:`Hop.lineage` gives every switch the record knows,
oldest first, and :func:`generations` numbers the databases across them (a
merge may give a new database an old shard's name; its generation differs).

Event tokens across the hop (:meth:`Hop.compare`): a source's token is older
than a target's token taken after the target's journal position when their
ranges meet (every change of the source in that range precedes every change
of the target); a target's token at or before its journal position holds the
copy of *some* source state: compared with a source token that is
:attr:`~shardgate.event_token.Freshness.UNKNOWN`. Other pairs follow
:func:`~shardgate.event_token.compare`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardgate.event_token import EventToken, Freshness, compare, position_key
from shardgate.keys import KeyRange, parse_shard_name
from shardgate.topo.model import KeyspaceTopo

#: events a stream may deliver twice around a hop carry ``hop=True``; a target
#: started by time (a journal without the targets' positions) marks its events
#: committed up to this long after the journal
MARK_MARGIN_S = 1.0


@dataclass(frozen=True)
class Hop:
    """One write switch of a keyspace, from its journal (see the module docstring).

    Invariant: ``sources`` and ``targets`` cover the same key range; a
    source's final position is at or after every change committed on it.
    """

    keyspace: str
    #: source shard -> its final log position
    sources: Mapping[str, str]
    #: target shard -> its log position at the journal (empty: an older journal)
    targets: Mapping[str, str]
    #: when the journal was written (seconds since the epoch)
    at: float
    #: source shard -> its database (filled by :meth:`lineage`)
    source_urls: Mapping[str, str] = field(default_factory=dict)
    #: target shard -> its database (filled by :meth:`lineage`)
    target_urls: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, ks: KeyspaceTopo) -> Hop | None:
        """The keyspace's last write switch, if its sources are still there."""
        doc: Mapping[str, Any] | None = ks.journal
        if not doc:
            return None
        return cls._parse(ks.name, doc)

    @classmethod
    def lineage(cls, ks: KeyspaceTopo) -> list[Hop]:
        """Every write switch the keyspace record knows, oldest first, with its databases:
        the completed ones (``history``) and the live journal, unless ``reverse-traffic``
        made its sources serve again (then there is no switch to hop over)."""
        out = []
        for doc in ks.history:
            hop = cls._parse(ks.name, doc)
            out.append(cls(hop.keyspace, hop.sources, hop.targets, hop.at,
                           {str(k): str(v) for k, v in doc.get("urls", {}).items()},
                           {str(k): str(v) for k, v in doc.get("target_urls", {}).items()}))
        live = cls.of(ks)
        serving = {s.name for s in ks.shards}
        known = {s.name: s.url for s in ks.all_shards}
        if live is not None and not set(live.sources) & serving:
            sources = {s: known[s] for s in live.sources if s in known}
            names = list(live.targets) or [
                s.name for s in ks.shards if any(live.meets(s.name, x) for x in live.sources)]
            targets = {t: known[t] for t in names if t in known}
            out.append(cls(live.keyspace, live.sources, live.targets, live.at, sources,
                           targets))
        return out

    @classmethod
    def _parse(cls, keyspace: str, doc: Mapping[str, Any]) -> Hop:
        return cls(keyspace, {str(k): str(v) for k, v in doc.get("sources", {}).items()},
                   {str(k): str(v) for k, v in doc.get("targets", {}).items()},
                   float(doc.get("at", 0.0)))

    @staticmethod
    def range_of(shard: str) -> KeyRange:
        return parse_shard_name(shard)

    def feeding(self, target: str) -> list[str]:
        """The sources whose key ranges meet ``target``'s."""
        kr = self.range_of(target)
        return [s for s in self.sources if _meet(self.range_of(s), kr)]

    def drained(self, source: str, position: str | None) -> bool:
        """Whether ``position`` of ``source`` is at or past its final position."""
        if position is None:
            return False
        return position_key(position) >= position_key(self.sources[source])

    def compare(self, a: EventToken, b: EventToken) -> Freshness:
        """How token ``a`` relates to ``b`` across this hop (see the module docstring)."""
        sa, sb = self._local(a) or "", self._local(b) or ""
        if sa in self.sources and sb in self.targets and self.meets(sa, sb):
            return self._source_vs_target(sb, b)
        if sb in self.sources and sa in self.targets and self.meets(sa, sb):
            result = self._source_vs_target(sa, a)
            return {Freshness.OLDER: Freshness.NEWER}.get(result, result)
        return compare(a, b)

    def _source_vs_target(self, target: str, token: EventToken) -> Freshness:
        """A source token (any, in range) against ``token`` of ``target``."""
        start = self.targets.get(target)
        if start is None or position_key(token.position) <= position_key(start):
            return Freshness.UNKNOWN
        return Freshness.OLDER

    def meets(self, a: str, b: str) -> bool:
        """Whether the key ranges of shards ``a`` and ``b`` meet."""
        return _meet(self.range_of(a), self.range_of(b))


    def _local(self, token: EventToken) -> str | None:
        ks, _, shard = token.shard.partition("/")
        return shard if ks == self.keyspace and shard else None


def generations(hops: Sequence[Hop]) -> dict[str, int]:
    """Database URL -> generation across ``hops`` (oldest first): a target gets one more
    than the largest generation among the sources feeding it; databases no hop created
    are generation 0 (absent from the result)."""
    gen: dict[str, int] = {}
    for hop in hops:
        for target, url in hop.target_urls.items():
            fed = [gen.get(hop.source_urls.get(s, ""), 0) for s in hop.feeding(target)]
            gen[url] = 1 + max(fed, default=0)
    return gen


def _meet(a: KeyRange, b: KeyRange) -> bool:
    return a.intersect(b) is not None


__all__ = ["MARK_MARGIN_S", "Hop", "generations"]
