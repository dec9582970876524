"""Topology model and the YAML cluster file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardgate.errors import Code, ShardgateError
from shardgate.topo import Topology, load_cluster_file, write_cluster_file
from shardgate.topo.embedded import embedded_topology


def test_cluster_file_round_trip_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "ks.json").write_text(json.dumps({
        "sharded": True, "vindexes": {"hash": {"type": "hash"}},
        "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}))
    (tmp_path / "cluster.yaml").write_text(
        "default_keyspace: ks\n"
        "keyspaces:\n"
        "  ks:\n"
        "    shards: {'-80': 'sqlite:///a.db', '80-': 'sqlite:////abs/b.db'}\n"
        "    vschema: ks.json\n"
        "  lk:\n"
        "    shards: {'0': 'postgresql://postgres@127.0.0.1/lk'}\n"
    )
    topo = load_cluster_file(tmp_path / "cluster.yaml")
    ks = topo.keyspace("ks")
    assert [s.name for s in ks.shards] == ["-80", "80-"]
    assert ks.shards[0].url == f"sqlite:///{tmp_path.resolve() / 'a.db'}"
    assert ks.shards[1].url == "sqlite:////abs/b.db"
    assert ks.shard_map.find(b"\x90") == "80-"
    assert topo.default_keyspace == "ks"
    assert topo.build_vschema().keyspaces["ks"].sharded
    write_cluster_file(topo, tmp_path / "again.yaml")
    again = load_cluster_file(tmp_path / "again.yaml")
    assert again.to_dict() == topo.to_dict()


@pytest.mark.parametrize(
    "doc,words",
    [
        ({}, "'keyspaces'"),
        ({"keyspaces": {"k": {"shards": {}}}}, "shards"),
        ({"keyspaces": {"k": {"shards": {"-80": "sqlite:///a"}, "vschema": {"sharded": True}}}},
         "gap"),
        ({"keyspaces": {"k": {"shards": {"-80": "a", "80-": "b"}}}, "default_keyspace": "x"},
         "default_keyspace"),
        ({"keyspaces": {"k": {"shards": {"-80": "a", "80-": "b"}, "vschema": {}}}},
         "unsharded keyspace has exactly one shard"),
        ({"keyspaces": {"k": {"shards": {"zz": "a"}}}},
         "cluster.keyspaces.k.shards: bad shard name"),
    ],
)
def test_bad_topologies(doc: dict[str, object], words: str) -> None:
    with pytest.raises(ShardgateError) as err:
        Topology.from_dict(doc)
    assert err.value.code is Code.INVALID_ARGUMENT
    assert words.lower() in str(err.value).lower(), err.value


def test_missing_or_broken_cluster_file(tmp_path: Path) -> None:
    with pytest.raises(ShardgateError) as err:
        load_cluster_file(tmp_path / "nope.yaml")
    assert err.value.code is Code.NOT_FOUND
    (tmp_path / "bad.yaml").write_text("keyspaces: [1, 2\n")
    with pytest.raises(ShardgateError) as err:
        load_cluster_file(tmp_path / "bad.yaml")
    assert err.value.code is Code.INVALID_ARGUMENT


def test_embedded_default(tmp_path: Path) -> None:
    topo = embedded_topology(tmp_path)
    assert [s.name for s in topo.keyspace("commerce").shards] == ["-40", "40-80", "80-c0", "c0-"]
    assert topo.keyspace("lookup").shards[0].name == "0"
    vs = topo.build_vschema()
    assert vs.keyspaces["commerce"].tables["customer"].auto_increment is not None


RESHARDING = {"keyspaces": {"app": {
    "shards": {"-80": "sqlite:///a.db", "80-": "sqlite:///b.db"},
    "pending_shards": {"-40": "sqlite:///c.db", "40-80": "sqlite:///d.db"},
    "read_shards": ["-40", "40-80", "80-"],
    "vschema": {"sharded": True}}}}


def test_pending_and_read_serving_shards_round_trip() -> None:
    """A reshard's targets are pending (no traffic); reads may be served by another set."""
    topo = Topology.from_dict(RESHARDING)
    ks = topo.keyspace("app")
    assert [s.name for s in ks.shards] == ["-80", "80-"]
    assert [s.name for s in ks.pending] == ["-40", "40-80"]
    assert [s.name for s in ks.all_shards] == ["-80", "80-", "-40", "40-80"]
    assert ks.shard_map.find(b"\x10") == "-80"  # writes: the serving shards
    assert ks.read_shard_map.find(b"\x10") == "-40"  # reads: the read-serving set
    assert ks.read_shard_map.find(b"\x90") == "80-"
    assert ks.any_shard("40-80").url == "sqlite:///d.db"
    assert Topology.from_dict(topo.to_dict()).to_dict() == topo.to_dict()
    plain = Topology.from_dict({"keyspaces": {"app": {
        "shards": {"-80": "sqlite:///a.db", "80-": "sqlite:///b.db"},
        "vschema": {"sharded": True}}}}).keyspace("app")
    assert plain.read_shard_map is plain.shard_map and not plain.pending
    assert "pending_shards" not in Topology.from_dict(
        {"keyspaces": {"app": {"shards": {"0": "sqlite:///a.db"}}}}).to_dict()["keyspaces"]["app"]


@pytest.mark.parametrize(("change", "words"), [
    ({"read_shards": ["-40", "80-"]}, "do not partition"),
    ({"read_shards": ["-40", "40-80", "nope"]}, "not shards of the keyspace"),
    ({"read_shards": "-80"}, "list of shard names"),
    ({"pending_shards": {"-80": "sqlite:///x.db"}}, "both serving and pending"),
    ({"pending_shards": ["-40"]}, "must map shard names"),
    ({"pending_shards": {"4-": "sqlite:///x.db"}}, "bad shard name"),
])
def test_bad_serving_sets(change: dict[str, object], words: str) -> None:
    doc = json.loads(json.dumps(RESHARDING))
    doc["keyspaces"]["app"].update(change)
    with pytest.raises(ShardgateError) as err:
        Topology.from_dict(doc)
    assert err.value.code == Code.INVALID_ARGUMENT
    assert words in err.value.message
