"""Change streams check every table an event names (issue 30, item 8).

A gate served with a users file and an ACL file; keyspace ``app`` holds two
VSchema tables (``pub``, ``secret``) and a table ``hidden`` created directly
on the shard database, which neither the VSchema nor any ACL group names.
A subscriber gets the changes of the tables it may read and nothing else:
``hidden`` never, ``secret`` only with a role on its group, and its position
still moves past the transactions it cannot see. Over gRPC (GateClient's
stream API, what ``shardgate stream --target`` uses) and the gate's own API
with an identity, on SQLite, PostgreSQL and MariaDB shards.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ServerSecurity
from shardgate.api.grpc.server import serve
from shardgate.auth import StaticUsers
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED, Identity
from shardgate.backends import open_backend
from shardgate.backends.changes.open import open_change_log
from shardgate.errors import PermissionDenied
from shardgate.gate import Gate
from shardgate.streams.merge import StreamEvent, StreamPosition
from shardgate.topo import Topology

USERS = {
    "alice": [{"Password": "alice-pw"}],
    "bob": [{"Password": "bob-pw"}],
    "carol": [{"Password": "carol-pw"}],
}
ACL = {"table_groups": [
    {"name": "public", "table_names_or_prefixes": ["pub"],
     "readers": ["alice", "bob"], "writers": [], "admins": []},
    {"name": "secret", "table_names_or_prefixes": ["secret"],
     "readers": ["alice"], "writers": [], "admins": []},
]}
KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
         pytest.param("mysql", marks=pytest.mark.mysql)]
DDL = "CREATE TABLE {} (id BIGINT PRIMARY KEY, v VARCHAR(32))"


@dataclass
class Served:
    gate: Gate
    target: str
    url: str

    def client(self, user: str) -> GateClient:
        return GateClient(self.target, keyspace="app", timeout=30, user=user,
                          password=f"{user}-pw")


@pytest.fixture(params=KINDS)
async def served(request: pytest.FixtureRequest, make_database: Callable[..., str],
                 tmp_path: Path) -> AsyncIterator[Served]:
    kind: str = request.param
    url = make_database(kind, "streams")
    topology = Topology.from_dict({"default_keyspace": "app", "keyspaces": {"app": {
        "shards": {"0": url},
        "vschema": {"sharded": False, "tables": {"pub": {}, "secret": {}}}}}})
    users_file, acl_file = tmp_path / "users.json", tmp_path / "acl.json"
    users_file.write_text(json.dumps(USERS))
    acl_file.write_text(json.dumps(ACL))
    gate = Gate.open(topology, guard=Guard(TableACL.load(acl_file)))
    log = open_change_log(url, "app/0")
    try:
        s = gate.session("app", identity=TRUSTED)
        for table in ("pub", "secret"):
            await gate.execute(s, DDL.format(table))
        backend = open_backend(url, pool_size=1)  # straight to the shard: no VSchema
        try:
            await backend.execute(DDL.format("hidden"))
        finally:
            await backend.close()
        await log.prepare()  # capture set up before the timed reads
        security = ServerSecurity(users=StaticUsers.load(users_file))
        server, port = await serve(gate, "127.0.0.1", 0, security=security, no_auth=False)
        try:
            yield Served(gate, f"grpc://127.0.0.1:{port}", url)
        finally:
            await server.stop(None)
    finally:
        await gate.close()
        try:
            if kind != "sqlite":  # (a SQLite shard's capture goes with its file)
                await log.drop()
        finally:
            await log.close()


async def _write(served: Served) -> float:
    """One transaction per table, then a last row of ``pub`` (the end marker)."""
    began = time.time() - 1.0
    backend = open_backend(served.url, pool_size=1)
    try:
        for i, table in enumerate(["hidden", "secret", "pub", "hidden", "secret"]):
            await backend.execute(f"INSERT INTO {table} (id, v) VALUES ({i}, '{table}')")
        await backend.execute("INSERT INTO pub (id, v) VALUES (999, 'end')")
    finally:
        await backend.close()
    return began


async def _read_to_end(events: AsyncIterator[StreamEvent]) -> tuple[set[str], list[StreamEvent]]:
    tables: set[str] = set()
    seen: list[StreamEvent] = []
    async for event in events:
        if event.heartbeat:
            continue
        seen.append(event)
        for change in event.changes:
            tables.add(change.table)
        if any(c.table == "pub" and c.pk == (999,) for c in event.changes):
            break
    return tables, seen


async def test_a_subscriber_gets_only_the_tables_it_may_read(served: Served) -> None:
    began = await _write(served)
    async with served.client("bob") as bob:
        tables, bob_events = await _read_to_end(
            bob.update_stream("app", start=began, heartbeat_s=0.2))
    assert tables == {"pub"}  # neither hidden (no group) nor secret (no role)
    # the transactions it may not see still move its position: six transactions, one
    # token each, so a stream resumed from the last one reports no gap
    assert len(bob_events) == 6
    assert [len(e.changes) for e in bob_events] == [0, 0, 1, 0, 0, 1]
    async with served.client("alice") as alice:
        tables, _ = await _read_to_end(
            alice.update_stream("app", start=began, heartbeat_s=0.2))
    assert tables == {"pub", "secret"}  # still never hidden
    # resumed from bob's last position: nothing hidden is sent later either
    position = StreamPosition()
    for event in bob_events:
        position.advance(event)
    backend = open_backend(served.url, pool_size=1)
    try:
        await backend.execute("INSERT INTO hidden (id, v) VALUES (50, 'late')")
        await backend.execute("INSERT INTO pub (id, v) VALUES (1000, 'end')")
    finally:
        await backend.close()
    async with served.client("bob") as bob:
        seen: list[str] = []
        async for event in bob.update_stream("app", start=position.serialize(),
                                             heartbeat_s=0.2):
            seen += [c.table for c in event.changes]
            if any(c.pk == (1000,) for c in event.changes):
                break
    assert seen == ["pub"]


async def test_a_subscriber_who_may_read_nothing_is_refused(served: Served) -> None:
    async with served.client("carol") as carol:
        with pytest.raises(PermissionDenied) as info:
            async for _ in carol.update_stream("app", heartbeat_s=0.2):
                break
    assert "carol" in info.value.message and "reader role" in info.value.message


async def test_the_gate_api_filters_for_an_identity(served: Served) -> None:
    began = await _write(served)
    events = served.gate.update_stream("app", None, began, heartbeat_s=0.2,
                                       identity=Identity("bob"))
    try:
        tables, _ = await _read_to_end(events)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    assert tables == {"pub"}
    # the gate's own in-process callers (TRUSTED) see every table
    events = served.gate.update_stream("app", None, began, heartbeat_s=0.2, identity=TRUSTED)
    try:
        tables, _ = await _read_to_end(events)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    assert tables == {"pub", "secret", "hidden"}
