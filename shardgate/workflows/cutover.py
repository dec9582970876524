"""The write cut-over of a workflow: sources frozen, final catch-up, journal, switch.

Part of :class:`~shardgate.workflows.base.Workflow` (which holds one
:class:`WriteCutover`; the states are described in :mod:`.base`).
``switch-traffic --writes`` runs, in order:

1. catch-up rounds (at most :data:`PRE_CUTOVER_ROUNDS`) until one is shorter
   than :data:`SHORT_ROUND_S`,
   and the lag bound is checked: what the final catch-up does while writes are
   refused is then what a short round leaves;
2. change capture prepared on the targets (for the reverse streams and change
   streams), before the freeze: a PostgreSQL slot waits for open transactions;
3. state ``cutover`` saved; the sources **frozen** (:mod:`.freeze`: triggers
   refusing writes to the moving tables but the applier's; gates hold the
   refused statements);
4. the **final catch-up** to each source's final position
   (:func:`~shardgate.workflows.catchup.final_position`), within ``timeout_s``;
5. the **journal** record (``journal:<record>``: the sources' final positions,
   the targets' and the reverse streams' start positions, the time), written
   once (compare-and-swap on its absence): the point of no return;
6. the switch published by the workflow's kind
   (:meth:`~shardgate.workflows.base.Workflow._route_writes`) after the reverse
   streams begin; state ``switched``.

Invariant: before the journal exists the sources own the moving tables (a
failure unfreezes them and returns to ``running``, :meth:`WriteCutover.roll_back`);
once it exists the targets do, whatever happens next (a process that died in
``cutover`` is rolled forward by the next command, :meth:`WriteCutover.recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol

from shardgate.backends.base import Backend
from shardgate.backends.changes import ChangeLog
from shardgate.errors import DeadlineExceeded, FailedPrecondition
from shardgate.topo.server import TopoServer
from shardgate.workflows.catchup import final_position
from shardgate.workflows.reverse import REVERSING, ReverseStreams, Spec

#: the default lag bound of ``switch-traffic`` (seconds behind the sources)
DEFAULT_MAX_LAG_S = 5.0
#: the longest the final catch-up of a write cut-over may take (seconds)
CUTOVER_TIMEOUT_S = 10.0
#: before a write cut-over: catch-up rounds at most, and a round short enough to stop
PRE_CUTOVER_ROUNDS = 10
SHORT_ROUND_S = 0.2

#: Test hook (crash tests): with ``SHARDGATE_WORKFLOW_PAUSE=<step>`` in its
#: environment the workflow process stops dead at that step: it prints
#: ``paused at <step>`` on stderr and blocks (nothing of it runs any more, not even
#: its lease renewal) until it is killed. Steps: ``catch-up`` (a catch-up round in
#: ``running``, of a process holding the lease, applied changes to the targets and
#: has not saved their position),
#: ``frozen`` (write cut-over: the sources frozen, the final catch-up done, no
#: journal), ``journal`` (the journal written, the switch not published),
#: ``published`` (the keyspace switched, the record still ``cutover``).
PAUSE_ENV = "SHARDGATE_WORKFLOW_PAUSE"

log = logging.getLogger(__name__)


def pause_point(step: str) -> None:
    """Stop here for good if the test hook :data:`PAUSE_ENV` names ``step``."""
    if os.environ.get(PAUSE_ENV) != step:
        return
    sys.stderr.write(f"\npaused at {step}\n")
    sys.stderr.flush()
    while True:  # blocking on purpose: the process hangs here until killed
        time.sleep(3600)


class Host(Protocol):
    """The parts of :class:`~shardgate.workflows.base.Workflow` the cut-over works with."""

    store: TopoServer
    doc: dict[str, Any]
    _reverse: ReverseStreams

    @property
    def kind(self) -> str: ...
    @property
    def spec(self) -> Spec: ...
    @property
    def state(self) -> str: ...
    async def _begin(self, state: str | None = None, what: str = "") -> None: ...
    async def catch_up(self, *, deadline: float | None = None,
                       until: Mapping[str, str] | None = None) -> bool: ...
    def _check_lag(self, bound: float = DEFAULT_MAX_LAG_S) -> None: ...
    async def _save(self, **changes: Any) -> None: ...
    async def _sources(self) -> dict[str, tuple[Backend, ChangeLog]]: ...
    def _target_logs(self) -> dict[str, ChangeLog]: ...
    async def _freeze(self, backend: Backend, on: bool) -> None: ...
    async def _route_writes(self, journal: Mapping[str, Any],
                            steps: dict[str, float]) -> None: ...




class WriteCutover:
    """The write cut-over of one workflow (see the module docstring)."""

    def __init__(self, flow: Host) -> None:
        self.flow = flow

    async def switch_writes(self, *, dry_run: bool = False,
                            max_lag_s: float = DEFAULT_MAX_LAG_S,
                            timeout_s: float = CUTOVER_TIMEOUT_S) -> dict[str, Any]:
        """Steps 1-6 of the module docstring; returns their timings."""
        flow = self.flow
        await flow._begin("running", "switch writes")
        if not flow.doc.get("reads_switched"):
            raise FailedPrecondition("switch reads first (switch-traffic --reads)")
        if not dry_run:
            await flow._reverse.prepare()  # capture on the targets, for reverse-traffic
        # catch up until one round is short: what is left for the final catch-up
        # (while writes are refused) is then what a short round leaves
        for _ in range(PRE_CUTOVER_ROUNDS):
            round_start = time.monotonic()
            await flow.catch_up()
            if time.monotonic() - round_start < SHORT_ROUND_S:
                break
        flow._check_lag(max_lag_s)
        if dry_run:
            return {"dry_run": True, "plan": f"freeze writes on {list(flow.spec.sources)}, "
                    f"catch up, journal, serve writes from {list(flow.spec.targets)}"}
        # change capture on the targets (idempotent), before the freeze: a PostgreSQL
        # slot waits for the transactions open on the server
        targets = flow._target_logs()
        for target_log in targets.values():
            await target_log.prepare()
        await flow._save(state="cutover")
        start = time.monotonic()
        sources = await flow._sources()
        steps: dict[str, float] = {}
        try:
            for backend, _ in sources.values():
                await flow._freeze(backend, True)
            steps["freeze_s"] = time.monotonic() - start
            final = dict(zip(sources, await asyncio.gather(*(
                final_position(backend, log) for backend, log in sources.values())),
                strict=True))
            if not await flow.catch_up(until=final, deadline=time.monotonic() + timeout_s):
                raise DeadlineExceeded(
                    f"the final catch-up did not finish within {timeout_s:g}s; writes were "
                    "released on the sources, retry when the lag is lower")
            steps["catch_up_s"] = time.monotonic() - start - steps["freeze_s"]
            pause_point("frozen")
            # the targets' log ends now: nothing but the catch-up wrote to them, so a
            # change stream resumes each target there, after the sources' final positions
            mark = time.monotonic()
            # (each position a round trip of its own: all at once)
            ends, reverse = await asyncio.gather(
                asyncio.gather(*(log.current_position() for log in targets.values())),
                flow._reverse.positions())
            starts = dict(zip(targets, ends, strict=True))
            await flow.store.put_workflow(flow.spec.journal, {
                "workflow": flow.spec.record, "positions": final, "targets": starts,
                "reverse_positions": reverse, "at": time.time()},
                expect=0)
            steps["journal_s"] = time.monotonic() - mark
        except BaseException as exc:
            flow.doc["cutover_s"] = time.monotonic() - start  # saved by the roll-back
            with contextlib.suppress(Exception):
                await self.roll_back(f"{type(exc).__name__}: {exc}")
            raise
        flow.doc["cutover_s"] = time.monotonic() - start  # saved with the switch
        pause_point("journal")
        mark = time.monotonic()
        await self.publish(steps)
        frozen = time.monotonic() - start
        steps["publish_s"] = time.monotonic() - mark
        log.info("%s %s: write cut-over %.0f ms: %s", flow.kind, flow.spec.record,
                 frozen * 1000, ", ".join(f"{k[:-2]} {v * 1000:.0f} ms"
                                          for k, v in steps.items() if k.endswith("_s")))
        return {"frozen_s": frozen, "positions": final, **steps}

    async def roll_back(self, error: str) -> None:
        """Before the journal: the sources accept writes again; state ``running``."""
        for backend, _ in (await self.flow._sources()).values():
            await self.flow._freeze(backend, False)
        await self.flow._save(state="running", error=error)

    async def publish(self, steps: dict[str, float] | None = None) -> None:
        """After the journal: the reverse streams start, the targets serve. ``steps``:
        gets the durations of its parts and ``published_at`` (wall clock, when the
        routing serving the targets was stored)."""
        steps = steps if steps is not None else {}
        mark = time.monotonic()
        found = await self.flow.store.get_workflow(self.flow.spec.journal)
        journal: dict[str, Any] = found.doc if found is not None and found.doc else {}
        await self.flow._reverse.begin(journal)
        steps["reverse_begin_s"] = time.monotonic() - mark
        await self.flow._route_writes(journal, steps)

    async def recover(self) -> None:
        """Finish a cut-over a dead process left: forward with a journal, else back
        (the reverse cut-over's: :meth:`.reverse.ReverseStreams.recover`)."""
        if self.flow.state == REVERSING:
            await self.flow._reverse.recover()
            return
        if self.flow.state != "cutover":
            return
        if await self.flow.store.get_workflow(self.flow.spec.journal) is not None:
            await self.publish()
        else:
            await self.roll_back("the cut-over was interrupted before its journal; "
                                 "rolled back")
