"""The reshard workflow process SIGKILLed during catch-up and during the write cut-over
(issue 21), on SQLite and PostgreSQL shards, with writers running through a gate the
whole time (no writer may see an error, but for the gate's coded hold timeout:
``UNAVAILABLE``, "retry the statement", when the next command takes longer than the
gates' hold bound, as it can on a loaded machine; the writers
retry it, as a client would, and every write lands exactly once; no hold outlasts its
bound):

* during catch-up (after the copy, before any switch): the next ``reshard run``
  replays what the dead process applied but had not saved, the split finishes, VDiff
  is clean, every row is once on its shard;
* during ``switch-traffic --writes`` before the journal (sources frozen, gates holding
  writes): the next command rolls the cut-over back (the sources serve, held writes go
  through within the gates' hold bound) and a second ``switch-traffic --writes``
  succeeds;
* after the journal (before the switch is published, or published but not recorded):
  the next command finishes the switch.

The kill lands at an exact step through the workflow's test hook
(:data:`~shardgate.workflows.cutover.PAUSE_ENV`): the command stops dead there and
says so on stderr; the test checks the state it left, then SIGKILLs it. The command
that dies is a process of its own; the commands around it (``create``, the next
command after the kill) run in this process (``cli_main`` in a thread: the same
command, another runner, without an interpreter's start-up, ~1 CPU-s each).
The test_copy_resumes_after_sigkill test of test_reshard.py covers the copy.

One PostgreSQL variant of the kill after the journal (``published``): what differs
between ``journal`` and ``published`` is the topo records the next command finds
(backend-independent, both run on SQLite); what PostgreSQL adds (replication
connections and slots a SIGKILLed process held, the targets' slots it prepared) is
the same at both steps.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shardgate.backends import open_backend
from shardgate.cli.app import main as cli_main
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.gate.cutover import HOLD_S
from shardgate.keys import parse_shard_name
from shardgate.topo.model import WRITES_FROZEN
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.cutover import PAUSE_ENV
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.acceptance.test_cli import cli_env
from tests.integration.workflows.test_reshard import HASH, Writers, _cluster, _wait, check_placement

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SOURCES = ("-80", "80-")
TARGETS = ("-40", "40-80", "80-c0", "c0-")
RECORD = "reshard:app.wf"
JOURNAL = f"journal:{RECORD}"
#: the longest a workflow command may take here (seconds)
COMMAND_S = 120.0
#: waits for progress (writers, gates' topology) on a loaded machine (seconds)
WAIT_S = 30.0
#: a held write is refused HOLD_S after it started; a loaded event loop may run late
SLACK_S = 5.0


def _cli(topo: str, command: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "shardgate.cli", "reshard", command, "--keyspace", "app",
            "--workflow", "wf", "--topo", topo, *args]


def _create(topo: str, four: dict[str, str]) -> list[str]:
    return _cli(topo, "create", f"--source={','.join(SOURCES)}", f"--target={','.join(four)}",
                "--batch", "300", *(f"--target-url={n}={u}" for n, u in four.items()))


async def _start(cmd: list[str], pause: str | None = None) -> asyncio.subprocess.Process:
    env = cli_env()
    env.pop(PAUSE_ENV, None)
    if pause is not None:
        env[PAUSE_ENV] = pause
    return await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _run(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a workflow command to its successful end in this process; its stdout."""
    capsys.readouterr()
    code = await asyncio.wait_for(asyncio.to_thread(cli_main, cmd[3:]), COMMAND_S)
    said = capsys.readouterr()
    assert code == 0, (cmd, said.out, said.err)
    return said.out


async def _until_paused(proc: asyncio.subprocess.Process, step: str) -> None:
    """Wait until the command stops at ``step`` (the test hook says so on stderr)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + COMMAND_S
    said: list[bytes] = []
    while True:
        line = await asyncio.wait_for(proc.stderr.readline(), deadline - time.monotonic())
        if line.strip().endswith(f"paused at {step}".encode()):
            return
        said.append(line)
        if not line:  # the command ended without reaching the step
            await proc.wait()
            pytest.fail(f"the command ended ({proc.returncode}) before {step}: "
                        f"{b''.join(said[-20:]).decode(errors='replace')}")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.communicate()
    assert proc.returncode == -signal.SIGKILL


async def _record(server: TopoServer, name: str = RECORD) -> dict[str, Any] | None:
    found = await server.get_workflow(name)
    return None if found is None else found.doc


async def _source_accepts(shards: dict[str, str], frozen: bool) -> None:
    """Each source refuses a direct write (``frozen``) or takes it (a marker row of a
    negative id, deleted again at once)."""
    for name, url in shards.items():
        kr = parse_shard_name(name)
        marker = next(i for i in range(-1, -10_000, -1) if kr.contains(HASH.map([i])[0][0]))
        backend = open_backend(url)
        mark = backend.placeholder
        try:
            insert = f"INSERT INTO t (id, v, n) VALUES ({mark}, 'marker', 0)"
            if frozen:
                with pytest.raises(ShardgateError, match=WRITES_FROZEN):
                    await backend.execute(insert, (marker,))
            else:
                await backend.execute(insert, (marker,))
                await backend.execute(f"DELETE FROM t WHERE id = {mark}", (marker,))
        finally:
            await backend.close()


async def _status_says_interrupted(topo: str, capsys: pytest.CaptureFixture[str],
                                   way: str) -> None:
    """``reshard status`` (in this process: no start-up) names the interrupted
    cut-over and the way the next command takes it, and no live runner."""
    capsys.readouterr()
    base = ["reshard", "status", "--keyspace", "app", "--workflow", "wf", "--topo", topo]
    assert await asyncio.to_thread(cli_main, [*base, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "cutover" and status["interrupted"] == way, status
    assert status["runner_pid"] is None, status
    assert await asyncio.to_thread(cli_main, base) == 0
    text = capsys.readouterr().out
    assert "write cut-over was interrupted" in text, text
    assert ("finishes it" if way == "forward" else "rolls it back") in text, text


def _serving(gate: Gate) -> set[str]:
    return {s.name for s in gate.topology.keyspace("app").shards}


async def _progress(writers: Writers, what: str) -> None:
    before = writers.counts["insert"]
    await _wait(lambda: writers.counts["insert"] > before + 10, what, timeout=WAIT_S)


async def _ready_to_switch(make_database: Any, tmp_path: Path, kind: str
                           ) -> tuple[str, Gate, dict[str, str], dict[str, str], Writers]:
    """A cluster, writers running, a split 2 -> 4 copied with reads switched (by a
    process that let go of the workflow)."""
    topo, gate, shards, model = await _cluster(make_database, tmp_path, kind)
    four = {n: make_database(kind, f"kill{i}") for i, n in enumerate(TARGETS)}
    writers = Writers(gate, model, retry_held=True)
    writers.start()
    server = TopoServer(open_topo_store(topo))
    flow = ReshardWorkflow(server, ReshardSpec(
        keyspace="app", sources=SOURCES, targets=TARGETS,
        target_urls=tuple(sorted(four.items())), workflow="wf"), batch=300)
    try:
        await flow.create()
        reports = await flow.vdiff()
        assert reports[0].clean, reports[0].to_doc()
        await flow.switch_reads()
    finally:
        await flow.close()
        await server.close()
    return topo, gate, shards, four, writers


async def _finish(server: TopoServer, gate: Gate, writers: Writers,
                  four: dict[str, str]) -> None:
    """After the write switch: the targets serve the writers; complete."""
    await _wait(lambda: _serving(gate) == set(four), "the gate did not switch", timeout=WAIT_S)
    await _progress(writers, "the writers stalled on the targets")
    flow = await ReshardWorkflow.resume(server, "app", "wf")
    try:
        await flow.complete()
    finally:
        await flow.close()
    assert await _record(server) is None and await _record(server, JOURNAL) is None


@pytest.mark.parametrize("kind", KINDS)
async def test_catch_up_survives_sigkill(make_database: Any, tmp_path: Path, kind: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    topo, gate, _, model = await _cluster(make_database, tmp_path, kind)
    four = {n: make_database(kind, f"kc{i}") for i, n in enumerate(TARGETS)}
    writers = Writers(gate, model)
    writers.start()
    server = TopoServer(open_topo_store(topo))
    try:
        assert "running" in await _run(_create(topo, four), capsys)
        # a follower applies the sources' changes; it dies holding the lease, with a
        # batch applied on the targets but not saved in the record
        proc = await _start(_cli(topo, "run", "--follow"), pause="catch-up")
        await _until_paused(proc, "catch-up")
        await _kill(proc)
        doc = await _record(server)
        assert doc is not None and doc["state"] == "running"
        assert doc["runner"]["pid"] == proc.pid and doc["runner"]["until"] > time.time()
        flow = await ReshardWorkflow.resume(server, "app", "wf")
        try:  # its lease is not unexpired, but its process is gone: nobody holds it
            assert (await flow.status())["runner_pid"] is None
        finally:
            await flow.close()

        # the next run takes over at once (the lease's process is gone) and replays
        start = time.monotonic()
        assert "running" in await _run(_cli(topo, "run"), capsys)
        with capsys.disabled():  # the figure, on the terminal
            print(f"\n[{kind}] restart after the kill: `reshard run` "
                  f"{time.monotonic() - start:.2f}s")
        flow = await ReshardWorkflow.resume(server, "app", "wf")
        try:
            reports = await flow.vdiff()
            assert reports[0].clean, reports[0].to_doc()
            assert reports[0].matching > 1000
            await flow.switch_reads()
            out = await flow.switch_writes()
            assert flow.state == "switched" and out["frozen_s"] < HOLD_S, out
        finally:
            await flow.close()
        await _finish(server, gate, writers, four)
    finally:
        await writers.halt()  # raises a writer's error, if one saw any
        await gate.close()
        await server.close()
    assert min(writers.counts.values()) > 0, writers.counts
    await check_placement(four, writers.model)


@pytest.mark.parametrize("kind", KINDS)
async def test_cutover_killed_before_journal_rolls_back(
    make_database: Any, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topo, gate, shards, four, writers = await _ready_to_switch(make_database, tmp_path, kind)
    server = TopoServer(open_topo_store(topo))
    try:
        proc = await _start(_cli(topo, "switch-traffic", "--writes"), pause="frozen")
        await _until_paused(proc, "frozen")
        frozen_at = time.monotonic()
        doc = await _record(server)
        assert doc is not None and doc["state"] == "cutover"
        assert await _record(server, JOURNAL) is None
        await _source_accepts(shards, frozen=True)
        await _kill(proc)
        await _status_says_interrupted(topo, capsys, "back")

        # the next command rolls the cut-over back: the sources serve again, the
        # writes the gate held go to them
        start = time.monotonic()
        await _run(_cli(topo, "run"), capsys)
        thawed_s = time.monotonic() - frozen_at
        with capsys.disabled():  # the figure, on the terminal
            print(f"\n[{kind}] frozen -> rolled back {thawed_s:.2f}s (the roll-back command "
                  f"{time.monotonic() - start:.2f}s; writes refused after the hold: "
                  f"{writers.held_out})")
        doc = await _record(server)
        assert doc is not None and doc["state"] == "running", doc
        assert "interrupted before its journal" in doc["error"]
        assert await _record(server, JOURNAL) is None
        await _source_accepts(shards, frozen=False)
        await _progress(writers, "the writers stalled on the sources after the roll-back")
        assert _serving(gate) == set(SOURCES)

        # and the cut-over can be done again
        flow = await ReshardWorkflow.resume(server, "app", "wf")
        try:
            reports = await flow.vdiff()
            assert reports[0].clean, reports[0].to_doc()
        finally:
            await flow.close()
        assert "writes switched" in await _run(_cli(topo, "switch-traffic", "--writes"), capsys)
        await _finish(server, gate, writers, four)
    finally:
        await writers.halt()  # raises a writer's error, if one saw any
        await gate.close()
        await server.close()
    assert writers.slowest < HOLD_S + SLACK_S, writers.slowest  # no hold outlasts its bound
    assert min(writers.counts.values()) > 0, writers.counts
    await check_placement(four, writers.model)


@pytest.mark.parametrize(("kind", "step"), [
    ("sqlite", "journal"), ("sqlite", "published"),
    pytest.param("postgres", "published", marks=pytest.mark.postgres)])
async def test_cutover_killed_after_journal_finishes(
    make_database: Any, tmp_path: Path, kind: str, step: str,
    capsys: pytest.CaptureFixture[str]
) -> None:
    topo, gate, shards, four, writers = await _ready_to_switch(make_database, tmp_path, kind)
    server = TopoServer(open_topo_store(topo))
    try:
        proc = await _start(_cli(topo, "switch-traffic", "--writes"), pause=step)
        await _until_paused(proc, step)
        paused_at = time.monotonic()
        doc = await _record(server)
        assert doc is not None and doc["state"] == "cutover"
        assert await _record(server, JOURNAL) is not None
        ks = (await server.load_topology()).keyspace("app")
        assert {s.name for s in ks.shards} == set(SOURCES if step == "journal" else TARGETS)
        await _source_accepts(shards, frozen=True)
        await _kill(proc)
        await _status_says_interrupted(topo, capsys, "forward")

        # the next command finishes the switch
        start = time.monotonic()
        await _run(_cli(topo, "run"), capsys)
        done_s = time.monotonic() - paused_at
        with capsys.disabled():  # the figure, on the terminal
            print(f"\n[{kind}-{step}] paused -> switched {done_s:.2f}s (the command "
                  f"{time.monotonic() - start:.2f}s; writes refused after the hold: "
                  f"{writers.held_out})")
        doc = await _record(server)
        assert doc is not None and doc["state"] == "switched", doc
        assert doc.get("switched_at") and not doc.get("error"), doc
        assert doc["reverse"]["streams"].keys() == set(TARGETS)
        await _source_accepts(shards, frozen=True)  # pending now, and frozen
        await _finish(server, gate, writers, four)
    finally:
        await writers.halt()  # raises a writer's error, if one saw any
        await gate.close()
        await server.close()
    assert writers.slowest < HOLD_S + SLACK_S, writers.slowest  # no hold outlasts its bound
    assert min(writers.counts.values()) > 0, writers.counts
    await check_placement(four, writers.model)
