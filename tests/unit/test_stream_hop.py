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


def test_spark_offsets_hop_a_split_then_a_merge_that_reuses_a_name() -> None:
    """``shardgate_changes`` offsets (spark/changes_hop.py): a split of ``-80`` completed
    (in the history), then a merge of its halves back into a new ``-80`` switched; an
    offset from before both reads old ``-80`` to its end, then the halves, then the new
    ``-80``, which has its own key."""
    from shardgate.spark.changes_hop import View

    split = {"sources": {"-80": "120"}, "targets": {"-40": "7", "40-80": "3"}, "at": 1.0,
             "urls": {"-80": "sqlite:///old80"},
             "target_urls": {"-40": "sqlite:///a", "40-80": "sqlite:///b"}}
    merge = {"sources": {"-40": "50", "40-80": "60"}, "targets": {"-80": "9"}, "at": 2.0}
    topo = Topology.from_dict({"keyspaces": {"app": {
        "shards": {"-80": "sqlite:///new80", "80-": "sqlite:///e"},
        "pending_shards": {"-40": "sqlite:///a", "40-80": "sqlite:///b"},
        "vschema": {"sharded": True}, "reshard_journal": merge,
        "reshard_history": [split]}}})
    ks = Topology.from_dict(topo.to_dict()).keyspace("app")
    assert ks.history == [split]
    view = View(ks)
    assert [s.key for s in view.serving] == ["-80@2", "80-"]
    assert view.by_key["-80"].url == "sqlite:///old80" and view.by_key["-80"].final == "120"
    assert view.by_key["-40@1"].final == "50"

    start = {"-80": "100", "80-": "5"}  # a checkpoint from before the split
    out = {"-80": "110", "80-": "6"}
    joins, waiting = view.hop(start, out)
    assert not joins and waiting == {"-40@1", "40-80@1"}  # old -80 not at its end yet
    out = {"-80": "120", "80-": "6"}
    joins, _ = view.hop(start, out)
    assert sorted((j.db.key, j.position) for j in joins) == [("-40@1", "7"), ("40-80@1", "3")]
    start = {"-80": "120", "80-": "6", "-40@1": "7", "40-80@1": "3"}
    out = {**start, "-40@1": "50", "40-80@1": "20"}
    joins, waiting = view.hop(start, out)
    assert "-80" not in out  # drained in ``start``, its targets in the offset: it leaves
    assert not joins and waiting == {"-80@2"}  # 40-80 is not at its end yet
    out["40-80@1"] = "60"
    joins, _ = view.hop(start, out)
    assert [(j.db.key, j.db.url, j.position) for j in joins] == [
        ("-80@2", "sqlite:///new80", "9")]
