"""``shardgate inbox ...`` and the blocking :class:`SyncInbox` on an embedded (SQLite) cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardgate.cli import main
from shardgate.topo.embedded import embedded_topology
from shardgate.topo.file import write_cluster_file


def test_inbox_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    topo = embedded_topology(tmp_path)
    topo.keyspaces["commerce"].vschema = {"sharded": True,
                                          "vindexes": {"hash": {"type": "hash"}}}
    write_cluster_file(topo, cluster)
    base = ["--keyspace", "commerce", "--cluster", str(cluster), "notes"]

    def run(*args: str) -> list[dict[str, object]]:
        capsys.readouterr()
        assert main(["inbox", args[0], *base, *args[1:]]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    created = run("create")[0]["created"]
    assert isinstance(created, list) and len(created) == 2
    sent = run("append", "12", "hello")[0]
    got = run("read", "12", "--consumer", "phone", "--commit")
    assert [(m["msg_id"], m["body"]) for m in got[:-1]] == [(sent["msg_id"], "hello")]
    assert got[-1]["more"] is False and str(got[-1]["pointer"]).startswith("p1:")
    assert run("read", "12", "--consumer", "phone")[:-1] == []  # committed
    assert len(run("read", "12", "--consumer", "laptop")) == 2  # its own pointer
    assert run("maintain")[0] == {"created": [], "dropped": []}

    capsys.readouterr()
    assert main(["inbox", "read", *base, "not-a-number"]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    assert main(["inbox", "buckets", "--keyspace", "commerce", "--cluster", str(cluster),
                 "missing"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_sync_inbox(tmp_path: Path) -> None:
    from shardgate.client.inbox import SyncInbox

    topo = embedded_topology(tmp_path)
    topo.keyspaces["commerce"].vschema = {"sharded": True,
                                          "vindexes": {"hash": {"type": "hash"}}}
    with SyncInbox(topo, "commerce", "notes") as inbox:
        inbox.create()
        sent = [inbox.append(7, f"m{i}") for i in range(3)]
        first = inbox.read_committed(7, "w", limit=2)
        assert [m.msg_id for m in first.messages] == [m.msg_id for m in sent[:2]]
        assert first.more and first.pointer is not None
        inbox.commit(7, "w", first.pointer)
        assert inbox.committed(7, "w") == first.pointer
        assert [m.body for m in inbox.read_committed(7, "w").messages] == ["m2"]
        assert len(inbox.buckets()) == 2
    inbox.close()  # idempotent
