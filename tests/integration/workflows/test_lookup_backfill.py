"""The lookup vindex backfill workflow (issue 14): owner rows on 4 PostgreSQL shards,
writers inserting, updating and deleting through a gate while ``shardgate lookup-vindex
create`` runs (and is SIGKILLed once, then resumed), then ``externalize``: the lookup table
matches the owner table exactly (read directly from the databases) and queries by the
looked-up column route EqualUnique.

``SG_BACKFILL_ROWS`` sets the owner row count (default 20000, ~30-50 s here; the issue's
figure, 200000, took ~150 s: run it with ``--timeout 1800``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.cli.app import main as cli_main
from shardgate.gate import Gate
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.vindexes import create_vindex
from shardgate.vindexes.base import SingleColumn
from tests.acceptance.test_cli import cli_env

ROWS = int(os.environ.get("SG_BACKFILL_ROWS", "20000"))
BATCH = 500
TIMEOUT_S = 600

VSCHEMA = {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
           "tables": {"owner": {"column_vindexes": [{"column": "id", "name": "hash"}]}}}


def _cli(topo: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "shardgate.cli", "lookup-vindex", *args, "--topo", topo]


CREATE_ARGS = ("create", "--keyspace", "app", "--table-owner", "owner", "--columns", "email",
               "--type", "consistent_lookup_unique", "--lookup-table", "lk.owner_email_lookup",
               "--batch", str(BATCH), "--settle", "1")


async def _writer(gate: Gate, stop: asyncio.Event, seed: int, counts: dict[str, int]) -> None:
    """Inserts, updates of the looked-up column and deletes through the gate until stopped."""
    rnd = random.Random(seed)
    s = gate.session("app", identity=TRUSTED)
    next_id = ROWS + 1 + seed * 10_000_000
    while not stop.is_set():
        op = rnd.random()
        if op < 0.4:
            await gate.execute(s, "INSERT INTO owner (id, email, n) VALUES (:i, :e, 0)",
                               {"i": next_id, "e": f"new{next_id}@x"})
            next_id += 1
            counts["insert"] += 1
        elif op < 0.8:
            i = rnd.randint(1, ROWS)
            await gate.execute(s, "UPDATE owner SET email = :e, n = n + 1 WHERE id = :i",
                               {"i": i, "e": f"upd{i}_{seed}_{counts['update']}@x"})
            counts["update"] += 1
        else:
            await gate.execute(s, "DELETE FROM owner WHERE id = :i",
                               {"i": rnd.randint(1, ROWS)})
            counts["delete"] += 1
        await asyncio.sleep(0)


def _load(gate: Gate, shards: dict[str, str]) -> None:
    """The owner rows, each COPied straight into the shard its ``hash`` places it on
    (set-up only: the gate is what the test is about, not the load)."""
    smap = gate.topology.keyspace("app").shard_map
    vindex = create_vindex("hash", "hash", {})
    assert isinstance(vindex, SingleColumn)
    ids = list(range(1, ROWS + 1))
    per_shard: dict[str, list[int]] = {name: [] for name in shards}
    for i, ksids in zip(ids, vindex.map(ids), strict=True):
        per_shard[smap.find(ksids[0])].append(i)
    for name, url in shards.items():
        with contextlib.closing(psycopg.connect(url, autocommit=True)) as conn, \
                conn.cursor() as cur, cur.copy("COPY owner (id, email, n) FROM STDIN") as copy:
            for i in per_shard[name]:
                copy.write_row((i, f"e{i}@x", 0))


def _progress(stderr: str) -> list[int]:
    # the bar on a terminal (`] N/`), a line per stage in a pipe (`backfill: N/`, issue 34)
    return [int(m) for m in re.findall(r"(?:\]|backfill:) (\d+)/", stderr)]


async def _record(topo: str) -> dict[str, Any] | None:
    server = TopoServer(open_topo_store(topo))
    try:
        rec = await server.get_workflow("lookup_vindex:app.owner_email_lookup")
        return None if rec is None else rec.doc
    finally:
        await server.close()


async def _run_cli(capsys: pytest.CaptureFixture[str], topo: str, *args: str
                   ) -> tuple[int, str, str]:
    """The command in this process (``cli_main`` in a thread: no interpreter start-up);
    the SIGKILLed run stays a process of its own."""
    capsys.readouterr()
    code = await asyncio.wait_for(asyncio.to_thread(cli_main, _cli(topo, *args)[3:]),
                                  TIMEOUT_S)
    said = capsys.readouterr()
    return code, said.out, said.err


async def test_backfill_while_writing_survives_sigkill_and_externalizes(
    make_database: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = {name: make_database("postgres", f"vsddl_bf{i}")
              for i, name in enumerate(("-40", "40-80", "80-c0", "c0-"))}
    lk = make_database("postgres", "vsddl_bflk")
    topo = f"sqlite:///{tmp_path / 'topo.db'}"
    server = TopoServer(open_topo_store(topo))
    await server.import_topology(Topology.from_dict({"keyspaces": {
        "app": {"shards": shards, "vschema": VSCHEMA},
        "lk": {"shards": {"0": lk}, "vschema": {"sharded": False}}}}))
    gate = await Gate.from_topo(server)  # the writers' gate, following the store
    s = gate.session("app", identity=TRUSTED)
    try:
        await gate.execute(s, "CREATE TABLE owner (id BIGINT PRIMARY KEY, "
                              "email VARCHAR(64) NOT NULL, n INT)")
        _load(gate, shards)

        stop = asyncio.Event()
        counts = {"insert": 0, "update": 0, "delete": 0}
        writers = [asyncio.create_task(_writer(gate, stop, k, counts)) for k in range(2)]
        try:
            # first run: killed once it has saved some progress
            proc = await asyncio.create_subprocess_exec(
                *_cli(topo, *CREATE_ARGS), env=cli_env(), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            deadline = time.monotonic() + TIMEOUT_S
            killed_at = 0
            while time.monotonic() < deadline:
                doc = await _record(topo)
                done = sum(p["rows"] for p in (doc or {}).get("shards", {}).values())
                if done >= 3 * BATCH:
                    proc.send_signal(signal.SIGKILL)
                    killed_at = done
                    break
                assert proc.returncode is None, await proc.communicate()
                await asyncio.sleep(0.05)
            await proc.communicate()
            assert proc.returncode == -signal.SIGKILL
            doc = await _record(topo)
            assert doc is not None and doc["state"] == "backfilling"
            saved = sum(p["rows"] for p in doc["shards"].values())
            assert saved >= killed_at

            # the second run resumes from the saved positions and verifies
            code, out, err = await _run_cli(capsys, topo, *CREATE_ARGS)
            assert code == 0, err
            assert "verified" in out
            progress = _progress(err)
            assert progress and progress[0] > saved, (saved, progress[:3])
            assert progress[0] <= saved + BATCH
            assert (await _record(topo) or {})["state"] == "verified"
            # while it is write_only nothing routes by it
            plan = gate.explain("SELECT * FROM owner WHERE email = 'e5@x'", "app")
            assert plan["Instructions"]["Variant"] == "Scatter"
        finally:
            stop.set()
            await asyncio.gather(*writers)
        assert min(counts.values()) > 0, counts

        code, out, err = await _run_cli(capsys, topo, "externalize", "--keyspace", "app",
                                        "--name", "owner_email_lookup")
        assert code == 0, err

        # the writers' gate follows within a second and routes EqualUnique
        start = time.monotonic()
        email_plan = "SELECT id FROM owner WHERE email = :e"
        while gate.explain(email_plan, "app")["Instructions"]["Variant"] != "EqualUnique":
            assert time.monotonic() - start < 1.0, "externalize did not reach the gate"
            await asyncio.sleep(0.01)
    finally:
        await gate.close()

    # exactly one lookup row per owner row, and no other, read from the databases
    hash_vindex = create_vindex("hash", "hash", {})
    assert isinstance(hash_vindex, SingleColumn)
    owner_pairs: set[tuple[str, bytes]] = set()
    for url in shards.values():
        with contextlib.closing(psycopg.connect(url, autocommit=True)) as conn:
            rows = conn.execute("SELECT id, email FROM owner").fetchall()
        for (_i, email), ks in zip(rows, hash_vindex.map([r[0] for r in rows]), strict=True):
            owner_pairs.add((email, ks[0]))
    with contextlib.closing(psycopg.connect(lk, autocommit=True)) as conn:
        lookup_rows = conn.execute("SELECT email, keyspace_id FROM owner_email_lookup").fetchall()
    lookup_pairs = {(e, bytes(k)) for e, k in lookup_rows}
    assert len(lookup_rows) == len(lookup_pairs)
    assert lookup_pairs == owner_pairs

    # and a gate started now routes by it, finding the right row
    server = TopoServer(open_topo_store(topo))
    gate = await Gate.from_topo(server, watch=False)
    try:
        email, _ = sorted(owner_pairs)[len(owner_pairs) // 2]
        s = gate.session("app", identity=TRUSTED)
        plan = gate.explain("SELECT id FROM owner WHERE email = :e", "app")
        assert plan["Instructions"]["Variant"] == "EqualUnique"
        found = await gate.execute(s, "SELECT email FROM owner WHERE email = :e", {"e": email})
        assert found.rows == [(email,)]
    finally:
        await gate.close()
