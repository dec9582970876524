"""The etcd topo store's URL and key layout (no server: tests/integration/topo runs one)."""

from __future__ import annotations

import pytest

from shardgate.errors import InvalidArgument
from shardgate.topo.etcd import EtcdTopoStore, parse_etcd_url
from shardgate.topo.store import open_topo_store


def test_url_parts_and_defaults() -> None:
    assert parse_etcd_url("etcd://10.0.0.1") == (
        "10.0.0.1", 2379, "/shardgate", "local", None, None)
    assert parse_etcd_url("etcd://u:p%40ss@h:2400/a/b/?cell=zone1") == (
        "h", 2400, "/a/b", "zone1", "u", "p@ss")


@pytest.mark.parametrize("url", [
    "etcd://", "etcd://h:x/p", "etcd://h/p?zone=a", "etcd://h/p?cell=a/b", "etcd://h/p?cell=",
])
def test_bad_urls_are_refused_with_the_form(url: str) -> None:
    with pytest.raises(InvalidArgument, match="etcd://"):
        parse_etcd_url(url)


def test_location_hides_the_password() -> None:
    store = open_topo_store("etcd://root:secret@h:2379/sg?cell=z")
    assert isinstance(store, EtcdTopoStore)
    assert store.location == "etcd://h:2379/sg?cell=z" and store.has_leases


@pytest.mark.parametrize(("kind", "name", "key"), [
    ("keyspace", "commerce", b"/sg/global/keyspaces/commerce"),
    ("cluster", "global", b"/sg/global/cluster/global"),
    ("workflow", "r/1", b"/sg/global/workflows/r/1"),
    ("tablet", "commerce-80-1", b"/sg/cells/z/tablets/commerce-80-1"),
])
def test_keys_per_kind_and_cell_round_trip(kind: str, name: str, key: bytes) -> None:
    store = EtcdTopoStore("etcd://h/sg?cell=z")
    assert store._key(kind, name) == key
    assert store._parse_key(key) == (kind, name)
    # another cell's tablets are read too; keys of nothing are ignored
    assert store._parse_key(b"/sg/cells/y/tablets/t9") == ("tablet", "t9")
    assert store._parse_key(b"/sg/other/x") is None
