"""Inboxes over gRPC, on SQLite, PostgreSQL and MariaDB shards with real gRPC servers.

* the async client creates an inbox (its options stored with it), appends,
  reads after a pointer, advances a consumer's pointer, lists and counts;
* an append in a session's transaction is invisible until COMMIT and gone
  after ROLLBACK;
* options are stored in the database: a second configuration is refused
  with FAILED_PRECONDITION naming the options, over gRPC and in-process, and
  a store opened without options adopts the stored ones;
* the blocking :class:`RemoteInbox` works against the same gate;
* a remote ``shardgate inbox`` session: the CLI in its own processes against
  a ``shardgate gate`` process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.server import serve
from shardgate.client.inbox import RemoteInbox
from shardgate.errors import FailedPrecondition, NotFound
from shardgate.queues.inbox import InboxOptions, InboxStore
from shardgate.queues.inbox.model import Pointer
from shardgate.topo import Topology
from shardgate.topo.file import write_cluster_file
from tests.acceptance.test_cli import STOP_TIMEOUT_S, cli_env, free_port, wait_for_port
from tests.integration.conftest import Cluster, close_cluster, cluster_for

OPTIONS = InboxOptions(precreate=0, rescan_window_s=60.0, retention_s=7 * 86_400.0)


@pytest.fixture
async def served(backend_kind: str, tablets: str, make_database: Callable[..., str],
                 request: pytest.FixtureRequest) -> AsyncIterator[tuple[Cluster, str]]:
    c = await cluster_for(backend_kind, tablets, make_database, request, shards=2)
    try:
        server, port = await serve(c.gate, "127.0.0.1", 0)
        try:
            yield c, f"grpc://127.0.0.1:{port}"
        finally:
            await server.stop(None)
    finally:
        await close_cluster(c)


async def test_inbox_over_grpc(served: tuple[Cluster, str]) -> None:
    _, target = served
    async with GateClient(target, keyspace="commerce") as client:
        report = await client.inbox_create("notes", OPTIONS)
        assert len(report.created) == 1
        assert (await client.inbox_create("notes", OPTIONS)).created == []  # idempotent
        sent = [await client.inbox_append("notes", 42, f"m{i}") for i in range(5)]
        await client.inbox_append("notes", 7, "other user")
        first = await client.inbox_read("notes", 42, limit=3)
        assert [m.body for m in first.messages] == ["m0", "m1", "m2"]
        assert [m.msg_id for m in first.messages] == [m.msg_id for m in sent[:3]]
        assert first.more and first.pointer is not None
        # Read after a pointer, then advance a consumer's pointer.
        rest = await client.inbox_read("notes", 42, after=first.pointer)
        assert [m.body for m in rest.messages] == ["m3", "m4"] and not rest.more
        assert await client.inbox_committed("notes", 42, "phone") is None
        await client.inbox_commit("notes", 42, "phone", first.pointer)
        assert await client.inbox_committed("notes", 42, "phone") == first.pointer
        after = await client.inbox_read("notes", 42, consumer="phone")
        assert [m.body for m in after.messages] == ["m3", "m4"]
        assert [m.body for m in (await client.inbox_read("notes", 42, consumer="laptop",
                                                         limit=10)).messages] == [
            "m0", "m1", "m2", "m3", "m4"]
        # List and stats.
        listed = await client.inbox_list()
        assert [(i["name"], i["options"]) for i in listed] == [("notes", OPTIONS.stored())]
        stats = await client.inbox_stats("notes", counts=True)
        assert stats["options"] == OPTIONS.stored()
        assert stats["messages"] == 6 and stats["pointers"] == 1
        assert [b["rows"] for b in stats["buckets"]] == [6]
        with pytest.raises(NotFound, match="create it"):
            await client.inbox_read("missing", 1)


async def test_append_in_a_transaction(served: tuple[Cluster, str]) -> None:
    cluster, target = served
    async with GateClient(target, keyspace="commerce") as client, \
            GateClient(target, keyspace="commerce") as other:
        await client.inbox_create("notes", OPTIONS)
        await client.execute("BEGIN")
        await client.execute("INSERT INTO customer (customer_id, email) VALUES (1, 'a@x')")
        await client.inbox_append("notes", 42, "rolled back")
        await client.execute("ROLLBACK")
        await client.execute("BEGIN")
        await client.execute("INSERT INTO customer (customer_id, email) VALUES (2, 'b@x')")
        kept = await client.inbox_append("notes", 42, "kept")
        if cluster.kind != "sqlite":  # SQLite's writer would hold the other reader's shard
            assert (await other.inbox_read("notes", 42)).messages == []
        await client.execute("COMMIT")
        got = await other.inbox_read("notes", 42)
        assert [(m.msg_id, m.body) for m in got.messages] == [(kept.msg_id, "kept")]
        rows = await client.execute("SELECT customer_id FROM customer")
        assert rows.rows == [(2,)]


async def test_options_are_stored_and_checked(served: tuple[Cluster, str]) -> None:
    cluster, target = served
    async with GateClient(target, keyspace="commerce") as client:
        await client.inbox_create("notes", OPTIONS)
        with pytest.raises(FailedPrecondition) as remote:
            await client.inbox_create("notes", {"granularity": "hour", "precreate": 0,
                                                "rescan_window_s": 60, "retention_s": 604800})
        assert "granularity='hour' (stored: 'day')" in remote.value.message
    # In-process, in "another process" (a store of its own): the same rule.
    gate = cluster.gate
    with pytest.raises(FailedPrecondition) as local:
        await InboxStore(gate, "commerce", "notes", InboxOptions(retention_s=86_400.0)).open()
    assert "retention_s=86400.0 (stored: 604800.0)" in local.value.message
    assert "rescan_window_s=300.0 (stored: 60.0)" in local.value.message
    adopted = InboxStore(gate, "commerce", "notes")
    await adopted.open()
    assert adopted.options.stored() == OPTIONS.stored()
    # The rows are in every shard's database.
    for shard in cluster.topology.keyspace("commerce").shards:
        res = await gate.tablets[("commerce", shard.name)].execute(
            "SELECT name, options FROM _sg_inboxes", [])
        assert [(str(n), json.loads(str(o))) for n, o in res.rows] == [
            ("notes", OPTIONS.stored())]


async def test_sync_remote_inbox(served: tuple[Cluster, str]) -> None:
    _, target = served

    def work() -> list[str | None]:
        with RemoteInbox(target, "commerce", "notes", timeout=30) as inbox:
            inbox.create(OPTIONS)
            for i in range(3):
                inbox.append("12", f"s{i}")  # a bigint user given as text is converted
            got = inbox.read_committed(12, "w", limit=2)
            assert got.pointer is not None
            inbox.commit(12, "w", got.pointer)
            assert inbox.committed(12, "w") == got.pointer
            assert inbox.stats(counts=True)["messages"] == 3
            return [m.body for m in got.messages] + [
                m.body for m in inbox.read_committed(12, "w").messages]

    assert await asyncio.to_thread(work) == ["s0", "s1", "s2"]


# One backend: the session proves the CLI's processes -> gRPC -> gate path, which has no
# backend branch; the store on PostgreSQL and MariaDB behind the same gRPC handlers is the
# other tests' here (each on every backend). Three kinds cost 150 s of the suite.
@pytest.mark.parametrize("backend_kind", ["sqlite"], indirect=True)
def test_remote_cli_session(backend_kind: str, make_database: Callable[..., str],
                            tmp_path: Path) -> None:
    """``shardgate inbox ... --target`` (each a process) against a ``shardgate up`` process."""
    shards = {"-80": make_database(backend_kind, "i0"), "80-": make_database(backend_kind, "i1")}
    topo = Topology.from_dict({"default_keyspace": "commerce", "keyspaces": {"commerce": {
        "shards": shards, "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}}}}})
    cluster = tmp_path / "cluster.yaml"
    write_cluster_file(topo, cluster)
    port = free_port()
    gate = subprocess.Popen(
        [sys.executable, "-m", "shardgate.cli", "up", "--http-port", "0", "--mysql-port", "0",
         "--cluster", str(cluster),
         "--port", str(port)],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = f"grpc://127.0.0.1:{port}"

    def cli(*args: str, ok: bool = True) -> list[dict[str, object]]:
        done = subprocess.run(
            [sys.executable, "-m", "shardgate.cli", "inbox", args[0], "--keyspace", "commerce",
             "--target", target, *args[1:]],
            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
        if not ok:
            assert done.returncode == 1, done.stdout
            return [{"stderr": done.stderr}]
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    try:
        wait_for_port(gate, port)
        created = cli("create", "notes", "--precreate", "0", "--rescan-window", "30")
        assert len(created[0]["created"]) == 1  # type: ignore[arg-type]
        sent = [cli("append", "notes", "12", f"hello {i}")[0] for i in range(3)]
        got = cli("read", "notes", "12", "--consumer", "phone", "--limit", "2", "--commit")
        assert [m["msg_id"] for m in got[:-1]] == [s["msg_id"] for s in sent[:2]]
        assert got[-1]["more"] is True
        pointer = Pointer.decode(str(got[-1]["pointer"]))
        assert pointer.msg_id == sent[1]["msg_id"]
        rest = cli("read", "notes", "12", "--consumer", "phone", "--commit")
        assert [m["body"] for m in rest[:-1]] == ["hello 2"]
        assert cli("read", "notes", "12", "--consumer", "phone")[:-1] == []
        assert cli("list") == [{"name": "notes", "options": InboxOptions(
            precreate=0, rescan_window_s=30.0).stored()}]
        stats = cli("stats", "notes")[0]
        assert stats["messages"] == 3 and stats["pointers"] == 1
        assert cli("maintain", "notes") == [{"created": [], "dropped": []}]
        # A second configuration is refused, naming the option; so is a missing inbox.
        err = cli("read", "notes", "12", "--rescan-window", "60", ok=False)[0]["stderr"]
        assert "FAILED_PRECONDITION" in str(err) and "rescan_window_s=60.0" in str(err)
        err = cli("create", "notes", "--granularity", "hour", ok=False)[0]["stderr"]
        assert "FAILED_PRECONDITION" in str(err) and "granularity='hour'" in str(err)
        err = cli("buckets", "missing", ok=False)[0]["stderr"]
        assert "NOT_FOUND" in str(err)
    finally:
        gate.kill()
        gate.communicate(timeout=STOP_TIMEOUT_S)
