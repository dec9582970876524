"""Resharding a keyspace served by tablet processes (issue 35 item 3).

The production shape: PostgreSQL shards, one ``shardgate tablet`` process per shard,
a gate reaching them over gRPC (and, for autocommit reads and writes, the databases
straight: ``gate/direct.py``). Writers run through that gate the whole time while the
keyspace is split from 2 shards to 4 and merged back to 2 new databases named
``-80``/``80-`` again. The operator's part is what docs/resharding.md
gives it: once ``reshard create`` put the targets in the topo store (pending), start
a tablet for each; the gate finds them through the topo store and, after the
switches, sends the targets' reads and then its writes to them. Nobody stops the
sources' tablets: once ``complete`` takes their shards out of the topology they drain
and exit by themselves (``tablet/retire.py``); one still serving the old ``-80`` would
otherwise hold that name's lease in its database and take the merged shard's traffic.

Afterwards: every committed row exactly once, on the shard its keyspace id names
(read from the databases); no writer error; the cut-over paused writes for less than
the gate's hold.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.cli.cluster import wait_for_tablets
from shardgate.gate.cutover import HOLD_S
from shardgate.topo import Topology

from ..tablet_procs import serve_with_processes, start_tablet_process
from ..workflows import test_reshard as plain

pytestmark = pytest.mark.postgres

FOUR = ("-40", "40-80", "80-c0", "c0-")


async def test_split_and_merge_back_a_keyspace_served_by_tablet_processes(
    make_database: Any, tmp_path: Path
) -> None:
    sources = {name: make_database("postgres", f"rp{i}") for i, name in enumerate(("-80", "80-"))}
    procs = await serve_with_processes(Topology.from_dict(
        {"keyspaces": {"app": {"shards": sources, "vschema": plain.VSCHEMA}}}), tmp_path)
    gate = procs.gate
    s = gate.session("app", identity=TRUSTED)
    await gate.execute(s, plain.DDL)
    model: plain.Model = {}
    for start in range(1, plain.ROWS + 1, 250):
        ids = range(start, min(start + 250, plain.ROWS + 1))
        await gate.execute(s, "INSERT INTO t (id, v, n) VALUES "
                              + ", ".join(f"({i}, 'v{i}', 0)" for i in ids))
        model.update({i: (f"v{i}", 0) for i in ids})
    four = {n: make_database("postgres", f"rpfour{i}") for i, n in enumerate(FOUR)}
    two = {n: make_database("postgres", f"rptwo{i}") for i, n in enumerate(sources)}
    first = dict(procs.procs)  # the sources' tablets: nobody stops them

    def serve(targets: dict[str, str], generation: int) -> Callable[[], Awaitable[None]]:
        async def start() -> None:
            aliases = set()
            for name in targets:
                alias = f"app-{name.replace('-', '_')}-{generation}"
                procs.procs[alias] = start_tablet_process(procs.topo_url, "app", name, alias)
                aliases.add(alias)
            await wait_for_tablets(procs.topo.store, aliases,
                                   lease_holders={("app", n) for n in targets})
        return start

    writers = plain.Writers(gate, model)
    writers.start()
    try:
        split = await plain._reshard(procs.topo_url, writers, gate, list(sources), four,
                                     serve(four, 2))
        # `complete` took -80 and 80- out of the keyspace: their tablets drain and exit
        await _exited(first.values())
        # the same names again, on new databases (the old ones keep their frozen rows)
        merge = await plain._reshard(procs.topo_url, writers, gate, list(four), two,
                                     serve(two, 3))
        await _exited(procs.procs[f"app-{n.replace('-', '_')}-2"] for n in four)
        # a transaction goes to the lease holders (autocommit writes may go to the
        # databases straight): its rows must land in the merged shards' databases
        # (into the model once committed: the writers pick their rows from it)
        s = gate.session("app", identity=TRUSTED)
        await gate.execute(s, "BEGIN")
        for i in range(-1, -41, -1):
            await gate.execute(s, "INSERT INTO t (id, v, n) VALUES (:i, 'tx', 1)", {"i": i})
        await gate.execute(s, "COMMIT")
        model.update({i: ("tx", 1) for i in range(-1, -41, -1)})
    finally:
        try:
            await writers.halt()
        finally:
            await procs.close()
    assert min(writers.counts.values()) > 0, writers.counts
    for out in (split, merge):
        assert out["frozen_s"] < HOLD_S, out
    assert writers.slowest < 5.0, writers.slowest
    await plain.check_placement(two, model)


async def _exited(tablets: Iterable[multiprocessing.process.BaseProcess]) -> None:
    """Each of ``tablets`` ends by itself (exit code 0) within 15 s."""
    deadline = time.monotonic() + 15
    for proc in tablets:
        while proc.is_alive():
            assert time.monotonic() < deadline, f"tablet {proc.pid} still runs"
            await asyncio.sleep(0.05)
        assert proc.exitcode == 0, proc.exitcode
