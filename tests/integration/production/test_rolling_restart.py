"""``shardgate cluster restart --rolling`` under load (issue 35 item 5).

A real cluster started by ``shardgate cluster up``: 2 PostgreSQL shards, 2
tablet processes a shard (lease holder + standby), 2 gate processes. Clients
naming both gates (``grpc://gate1,gate2``) write (autocommit and in
transactions), read, enqueue and receive/ack queue events while ``shardgate
cluster restart --rolling`` restarts every process. Clients follow the retry
contract of ``docs/production.md`` ("Rolling restart and upgrade"): a
statement failing ``UNAVAILABLE`` runs again, a transaction failing
``UNAVAILABLE`` or ``ABORTED`` runs again from BEGIN; ``UNKNOWN`` would need a
read-back and counts as a failure here, as does anything else.

Asserts: no failed statement beyond those retryable ones (in transactions too:
each gate drains on SIGTERM, :mod:`shardgate.api.grpc.gate_drain`), every
acknowledged write stored and nothing else, no queue event lost, none
delivered again after its ack unless that is at-least-once delivery (its ack
came later than the ack wait after it was received, or was in flight while
its shard's lease moved), every process restarted (new pids, all running),
each gate drained. Processes are stopped even when the test fails
(``cluster down``, then SIGKILL to any pid of the state file still running).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from shardgate.api.grpc.client import GateClient
from shardgate.auth.identity import TRUSTED
from shardgate.errors import Aborted, ShardgateError, Unavailable
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store
from shardgate.workflows.rolling_restart import alive
from tests.conftest import require_server

pytestmark = pytest.mark.postgres

VSCHEMA = {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}},
    "tables": {"w": {"column_vindexes": [{"column": "id", "name": "hash"}]}},
}
#: the longest a command of the test may take (seconds)
COMMAND_TIMEOUT_S = 300.0
RETRY_PAUSE_S = 0.02
#: the queue's ack wait (s): an event not acked within it fires again
ACK_WAIT_S = 2


def _two_free_ports() -> int:
    """A port P with P and P+1 free (the two gates of ``cluster up --gates 2``)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with contextlib.ExitStack() as stack:
            try:
                for p in (port, port + 1):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise AssertionError("no two consecutive free ports")


async def _shardgate(*args: str, lines: list[tuple[float, str]] | None = None) -> str:
    """Run ``shardgate ARGS``; its output (each line timestamped into ``lines``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shardgate.cli", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    out: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode().rstrip()
            out.append(line)
            if lines is not None:
                lines.append((time.monotonic(), line))

    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), COMMAND_TIMEOUT_S)
    except TimeoutError:
        raise AssertionError(f"shardgate {' '.join(args)} took over {COMMAND_TIMEOUT_S:.0f} s:\n"
                             + "\n".join(out)) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = "\n".join(out)
    assert proc.returncode == 0, f"shardgate {' '.join(args)} exited {proc.returncode}:\n{text}"
    return text


@dataclass
class Load:
    """Clients of both gates and what they saw."""

    target: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ok: set[int] = field(default_factory=set)
    reads: int = 0
    #: retried failures by code (the documented retryable ones)
    retried: dict[str, int] = field(default_factory=dict)
    #: anything else: the test fails on these
    failed: list[str] = field(default_factory=list)
    #: (start, seconds) of each successful write, retries included
    latencies: list[tuple[float, float]] = field(default_factory=list)
    #: (start, seconds) of each committed transaction, runs again included
    tx_latencies: list[tuple[float, float]] = field(default_factory=list)
    jobs_ok: set[str] = field(default_factory=set)
    received: dict[str, int] = field(default_factory=dict)
    #: (shard, id) -> (received, ack answered) of each acked event (monotonic times)
    acked: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    #: events delivered again after their ack: (key, received, ack answered, again)
    refired: list[tuple[tuple[str, int], float, float, float]] = field(default_factory=list)

    def _retry(self, exc: ShardgateError) -> None:
        self.retried[exc.code.name] = self.retried.get(exc.code.name, 0) + 1

    async def _statement(self, what: str, run: Callable[[], Awaitable[object]]) -> bool:
        """``run`` until it succeeds, retrying UNAVAILABLE (it did not run); False on
        any other failure (recorded)."""
        while True:
            try:
                await run()
                return True
            except Unavailable as exc:
                self._retry(exc)
            except ShardgateError as exc:
                self.failed.append(f"{what}: {exc.code.name}: {exc}")
                return False
            await asyncio.sleep(RETRY_PAUSE_S)

    async def writer(self, first: int) -> None:
        async with GateClient(self.target, keyspace="app", timeout=30) as c:
            n = first
            while not self.stop.is_set():
                n += 1
                began = time.monotonic()
                if await self._statement(f"write {n}", lambda n=n: c.execute(  # type: ignore[misc]
                        "INSERT INTO w (id, v) VALUES (:id, 'auto')", {"id": n})):
                    self.ok.add(n)
                    self.latencies.append((began, time.monotonic() - began))
                await asyncio.sleep(0.01)

    async def transactions(self, first: int) -> None:
        """Two rows (usually on two shards) a transaction, run again on UNAVAILABLE/ABORTED."""
        async with GateClient(self.target, keyspace="app", timeout=30) as c:
            n = first
            while not self.stop.is_set():
                n += 2
                began = time.monotonic()
                while True:
                    try:
                        await c.execute("BEGIN")
                        await c.execute("INSERT INTO w (id, v) VALUES (:id, 'tx')", {"id": n})
                        await c.execute("INSERT INTO w (id, v) VALUES (:id, 'tx')",
                                        {"id": n + 1})
                        await c.execute("COMMIT")
                        self.ok |= {n, n + 1}
                        self.tx_latencies.append((began, time.monotonic() - began))
                        break
                    except (Unavailable, Aborted) as exc:
                        self._retry(exc)
                        with contextlib.suppress(ShardgateError):
                            await c.execute("ROLLBACK")
                    except ShardgateError as exc:
                        self.failed.append(f"transaction {n}: {exc.code.name}: {exc}")
                        break
                    await asyncio.sleep(RETRY_PAUSE_S)
                await asyncio.sleep(0.02)

    async def reader(self) -> None:
        async with GateClient(self.target, keyspace="app", timeout=30) as c:
            while not self.stop.is_set():
                if await self._statement("read", lambda: c.execute(
                        "SELECT id, v FROM w WHERE id = :id", {"id": 1_000_001})):
                    self.reads += 1
                await asyncio.sleep(0.01)

    async def producer(self) -> None:
        async with GateClient(self.target, keyspace="app", timeout=30) as c:
            n = 0
            while not self.stop.is_set():
                n += 1
                body = f"job-{n}"
                if await self._statement(f"enqueue {body}", lambda n=n, body=body: c.execute(  # type: ignore[misc]
                        "INSERT INTO jobs (user_id, body) VALUES (:u, :b)",
                        {"u": n, "b": body})):
                    self.jobs_ok.add(body)
                await asyncio.sleep(0.02)

    async def receiver(self, done: asyncio.Event) -> None:
        """Receive and ack until ``done``; a subscription that fails UNAVAILABLE is
        made again (unacked events fire again: nothing is lost)."""
        async with GateClient(self.target, keyspace="app", timeout=30) as c:
            while not done.is_set():
                try:
                    async for batch in c.receive("jobs"):
                        fields = batch.fields
                        got = time.monotonic()
                        for e in batch.events:
                            key = (e.shard, e.id)
                            if key in self.acked:
                                self.refired.append((key, *self.acked[key], got))
                            body = str(e.values[fields.index("body")])
                            self.received[body] = self.received.get(body, 0) + 1
                        await self._statement("ack", lambda b=batch: c.ack(b))  # type: ignore[misc]
                        answered = time.monotonic()
                        self.acked.update(
                            {(e.shard, e.id): (got, answered) for e in batch.events})
                        if done.is_set():
                            return
                except Unavailable as exc:
                    self._retry(exc)
                except ShardgateError as exc:
                    self.failed.append(f"receive: {exc.code.name}: {exc}")
                    return
                await asyncio.sleep(RETRY_PAUSE_S)


async def _down(state_dir: Path) -> None:
    """``cluster down``, then SIGKILL to any process of the state file still running
    (a failed test leaves nothing behind)."""
    state = state_dir / "cluster-state.json"
    if not state.exists():
        return
    pids = json.loads(state.read_text()).get("pids", {}).values()
    try:
        await _shardgate("cluster", "down", "--dir", str(state_dir))
    finally:
        for pid in pids:
            if alive(int(pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _stored(urls: list[str]) -> set[int]:
    found: set[int] = set()
    for url in urls:
        with psycopg.connect(url.replace("postgresql://", "postgres://", 1)) as conn:
            found |= {int(r[0]) for r in conn.execute("SELECT id FROM w").fetchall()}
    return found


async def _until(cond: Callable[[], bool], timeout: float,
                 what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what if isinstance(what, str) else what()
        await asyncio.sleep(0.05)


async def test_rolling_restart_under_load(make_database: Callable[..., str],
                                          tmp_path: Path) -> None:
    require_server("postgres")
    urls = {kr.name: make_database("postgres", f"roll{i}")
            for i, kr in enumerate(KeyRange(b"", b"").split(2))}
    topology = Topology.from_dict({"default_keyspace": "app", "keyspaces": {
        "app": {"shards": urls, "vschema": VSCHEMA}}})
    setup = Gate.open(topology)
    try:
        await setup.execute(setup.session(identity=TRUSTED),
                            "CREATE TABLE w (id BIGINT PRIMARY KEY, v VARCHAR(32))")
    finally:
        await setup.close()
    topo_url = f"sqlite:///{tmp_path / 'topo.db'}"
    topo = TopoServer(open_topo_store(topo_url))
    try:
        await topo.import_topology(topology)
    finally:
        await topo.close()
    state_dir = tmp_path / "cluster"
    port = _two_free_ports()
    try:
        await _shardgate("cluster", "up", "--topo", topo_url, "--dir", str(state_dir),
                         "--tablets-per-shard", "2", "--gates", "2", "--port", str(port),
                         "--http-port", "0", "--mysql-port", "0")
        state = json.loads((state_dir / "cluster-state.json").read_text())
        before = {str(n): int(p) for n, p in state["pids"].items()}
        assert len(before) == 6  # 4 tablets, 2 gates
        target = str(state["gate"])
        assert target == f"grpc://127.0.0.1:{port},127.0.0.1:{port + 1}"
        async with GateClient(target, keyspace="app", timeout=30) as c:
            await c.execute("CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(64)) "
                            f"SHARD BY user_id WITH (ack_wait = {ACK_WAIT_S}, min_backoff = 0.2)")
        for p in (port, port + 1):  # both gates know the queue (the topo store's watch)
            async with GateClient(f"grpc://127.0.0.1:{p}", keyspace="app", timeout=30) as c:
                deadline = time.monotonic() + 10
                while "jobs" not in (await c.vschema())["app"].get("tables", {}):
                    assert time.monotonic() < deadline, f"gate :{p} did not learn the queue"
                    await asyncio.sleep(0.05)

        load = Load(target)
        received_all = asyncio.Event()
        tasks = [asyncio.create_task(load.writer(k * 1_000_000)) for k in (1, 2)]
        tasks += [asyncio.create_task(load.transactions(3_000_000)),
                  asyncio.create_task(load.reader()), asyncio.create_task(load.producer())]
        rx = asyncio.create_task(load.receiver(received_all))
        lines: list[tuple[float, str]] = []
        try:
            await _until(lambda: len(load.ok) > 40 and len(load.received) > 10, 30,
                         f"no load before the restart: {load.failed[:3]}")
            began = time.monotonic()
            out = await _shardgate("cluster", "restart", "--rolling", "--dir", str(state_dir),
                                   "--settle", "0.5", lines=lines)
            took = time.monotonic() - began
            ok_at_end = len(load.ok)
            await _until(lambda: len(load.ok) > ok_at_end + 20, 30,
                         lambda: f"no writes after the restart: {out}\nretried {load.retried}, "
                         f"failed {load.failed}")
            load.stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            await _until(lambda: load.jobs_ok <= set(load.received), 30,
                         "queue events lost: "
                         f"{sorted(load.jobs_ok - set(load.received))[:10]}")
        finally:
            load.stop.set()
            received_all.set()
            for t in [*tasks, rx]:
                t.cancel()
            await asyncio.gather(*tasks, rx, return_exceptions=True)
        after = json.loads((state_dir / "cluster-state.json").read_text())["pids"]
    finally:
        await _down(state_dir)

    # Pauses: per hand-over, the longest write (retries included) begun in its window.
    pauses = []
    handovers: list[tuple[float, float]] = []
    for _at, line in lines:
        m = re.search(r"restarted (\S+): .*lease handed over in ([0-9.]+) s", line)
        if m:
            handed = next(t for t, ln in lines if ln.startswith(f"{m.group(1)}: handing"))
            handovers.append((handed - 0.5, handed + float(m.group(2)) + 0.5))
            pauses.append(max((s for t, s in load.latencies
                               if handed - 0.5 <= t <= handed + float(m.group(2)) + 0.5),
                              default=0.0))
    # An event delivered again after its ack is at-least-once delivery, explained, when
    # its ack came later than the ack wait after it was received (it had fired again),
    # or was in flight while its shard's lease moved (the new holder fires every unacked
    # event at once); any other is a failure.
    unexplained = [r for r in load.refired if r[2] - r[1] <= ACK_WAIT_S
                   and not any(lo <= r[2] and r[1] <= hi for lo, hi in handovers)]
    # each gate's first drain is the restart's (the second, `cluster down`'s)
    drains = [re.findall(r"drained in ([0-9.]+) s.*", (state_dir / "logs" / f"{name}.log")
                         .read_text())[:1] for name in ("gate", "gate-2")]
    print(out)
    print(f"rolling restart: {took:.1f} s; writes ok {len(load.ok)}, reads {load.reads}, "
          f"retried {load.retried}, jobs {len(load.jobs_ok)} (received {len(load.received)}); "
          f"longest write per hand-over (s) {[round(p, 3) for p in pauses]}; longest write "
          f"{max(s for _, s in load.latencies):.3f} s, longest transaction "
          f"{max((s for _, s in load.tx_latencies), default=0.0):.3f} s; gate drains (s) "
          f"{drains}; delivered again after their ack {len(load.refired)} (unexplained "
          f"{len(unexplained)}); failed {load.failed}")
    # No failure at all: autocommit writes, transactions, reads, the producer, the
    # receiver and acks saw only the retry contract's UNAVAILABLE / ABORTED.
    assert load.failed == [], load.failed
    assert set(after) == set(before)
    for name, pid in after.items():
        assert pid != before[name], f"{name} was not restarted"
    for pid in before.values():
        assert not alive(pid)
    assert len(pauses) == 2, out  # one hand-over a shard
    stored = _stored(list(urls.values()))
    assert load.ok <= stored, f"acknowledged writes missing: {sorted(load.ok - stored)[:10]}"
    assert stored <= load.ok, f"writes stored that failed: {sorted(stored - load.ok)[:10]}"
    assert load.jobs_ok <= set(load.received)
    assert unexplained == [], f"events delivered again after their ack: {unexplained[:5]}"
    assert all(drains), f"each gate drains (its log says so): {drains}"
