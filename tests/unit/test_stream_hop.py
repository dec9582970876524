"""The reshard journal as change streams see it (streams/hop.py): parsing from the
keyspace record, which sources feed a target, and token comparison across the hop."""

from __future__ import annotations

import pytest

from shardgate.errors import InvalidArgument
from shardgate.event_token import EventToken, Freshness
from shardgate.streams.hop import Hop
from shardgate.topo.model import Topology

JOURNAL = {"sources": {"-80": "120", "80-": "95"},
           "targets": {"-40": "7", "40-80": "3", "80-c0": "9", "c0-": "4"}, "at": 1000.0}


def _topology(journal: object) -> Topology:
    return Topology.from_dict({"keyspaces": {"app": {
        "shards": {"-40": "sqlite:///a", "40-80": "sqlite:///b", "80-c0": "sqlite:///c",
                   "c0-": "sqlite:///d"},
        "pending_shards": {"-80": "sqlite:///s1", "80-": "sqlite:///s2"},
        "vschema": {"sharded": True}, "reshard_journal": journal}}})


def test_journal_round_trips_through_the_topology_and_feeds_targets() -> None:
    topo = _topology(JOURNAL)
    assert Topology.from_dict(topo.to_dict()).keyspace("app").journal == JOURNAL
    hop = Hop.of(topo.keyspace("app"))
    assert hop is not None and hop.at == 1000.0
    assert hop.feeding("40-80") == ["-80"] and hop.feeding("c0-") == ["80-"]
    assert hop.drained("-80", "120") and hop.drained("-80", "121")
    assert not hop.drained("-80", "119") and not hop.drained("-80", None)
    with pytest.raises(InvalidArgument, match="reshard_journal"):
        _topology({"sources": "nope"})


def test_tokens_compare_across_the_hop() -> None:
    hop = Hop.of(_topology(JOURNAL).keyspace("app"))
    assert hop is not None
    src = EventToken(999.0, "app/-80", "110")
    after = EventToken(998.0, "app/40-80", "4")  # a skewed clock: positions decide
    at_journal = EventToken(1001.0, "app/40-80", "3")
    other_side = EventToken(998.0, "app/80-c0", "50")
    assert hop.compare(src, after) == Freshness.OLDER
    assert hop.compare(after, src) == Freshness.NEWER
    assert hop.compare(src, at_journal) == Freshness.UNKNOWN
    assert hop.compare(at_journal, src) == Freshness.UNKNOWN
    # ranges that do not meet, and same-shard pairs: the design's rules
    assert hop.compare(src, other_side) == Freshness.NEWER
    assert hop.compare(src, EventToken(999.0, "app/-80", "111")) == Freshness.OLDER
