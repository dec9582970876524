"""The reverse stream of a reshard: after the write switch, the targets' changes
replayed on the sources, so ``reverse-traffic`` can go back without losing a write.

Part of :class:`~shardgate.workflows.reshard.ReshardWorkflow` (which holds one
:class:`ReverseStreams`); the record keeps its state:

``reverse_capture``
    per target, whether the workflow set up its change capture (``True``:
    ``complete`` and ``cancel`` drop it again; ``False``: it was there before,
    someone else's). ``switch-traffic --writes`` prepares it before the
    freeze (creating a PostgreSQL slot waits for open transactions), so the
    targets' logs hold every change from the write switch on. A MariaDB
    target's log is its server's binlog (checked: ROW, full images): always
    there, server-wide, shared by every database of the server, so it is
    recorded ``False`` and never dropped.
``reverse``
    from the write switch's journal on: ``{"streams": {<target>: {"pos",
    "lag_s"}}}``, each target's log position from which its changes are the
    gates' (the journal record carries them as ``reverse_positions``: the
    targets' log ends once the final catch-up committed; on MariaDB the
    server's GTID position, the same for targets sharing a server: each
    target's reader filters the binlog to its own schema). Catch-up in state
    ``switched`` (every command, ``run --follow``) replays each target's log
    from ``pos`` on the sources whose key ranges hold the images' keyspace
    ids (:class:`~shardgate.workflows.catchup.Applier` with the roles
    swapped, so just as idempotent), through the sources' freeze
    (:mod:`shardgate.workflows.freeze`).

``reverse-traffic`` after the switch is the write cut-over the other way
(state :data:`REVERSING` while it runs): refuse if the reverse lag is above
the bound, freeze the targets (gates hold writes), catch the sources up to
the targets' final positions, write the **reverse journal**
(``journal:<record>:reverse``, with the sources' log ends: the point of no
return), unfreeze the sources, make them the serving shards again (the
targets pending, frozen; reads back on the sources), and set each forward
stream's position to its source's log end in the journal. State ``running``
again: the forward catch-up resumes there (what the reverse stream wrote is
already on the targets), and ``switch-traffic --reads``/``--writes`` may run
again. A failure before the journal unfreezes the targets and returns to
``switched``; a process that died in :data:`REVERSING` is rolled forward
(journal) or back by the next command.

Invariant: in ``switched`` the sources hold every target change up to the
reverse streams' positions; in ``running`` after a reverse, the targets hold
every source change up to the forward streams' positions (the same
invariants as the forward stream's, with the roles swapped).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from shardgate.backends.base import Backend
from shardgate.backends.changes import ChangeLog
from shardgate.backends.changes.open import capture_exists
from shardgate.errors import DeadlineExceeded, FailedPrecondition, Unsupported
from shardgate.keys import parse_shard_name
from shardgate.sql.dialects import Dialect
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.workflows.catchup import (
    Applier,
    LogCursor,
    catch_up,
    final_position,
    position_key,
)
from shardgate.workflows.rowsql import MovingTable

#: the workflow's state while ``reverse-traffic`` switches writes back
REVERSING = "reversing"
#: target kinds whose changes the reverse stream can read
_CAPTURED = frozenset(Dialect)
#: how often reverse catch-up saves its positions (seconds)
_SAVE_EVERY_S = 0.5


class Spec(Protocol):
    """What the reverse streams read of a reshard's spec (``ReshardSpec``)."""

    @property
    def keyspace(self) -> str: ...
    @property
    def sources(self) -> tuple[str, ...]: ...
    @property
    def targets(self) -> tuple[str, ...]: ...
    @property
    def target_urls(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def record(self) -> str: ...
    @property
    def journal(self) -> str: ...


class Host(Protocol):
    """The parts of :class:`~shardgate.workflows.reshard.ReshardWorkflow` the reverse
    streams work with (its record, databases, logs, freeze and keyspace edits)."""

    store: TopoServer
    doc: dict[str, Any]
    _cursors: dict[str, LogCursor]

    @property
    def spec(self) -> Spec: ...
    def _backend(self, url: str) -> Backend: ...
    def _log(self, url: str, shard: str) -> ChangeLog: ...
    def _url(self, topo: Topology, shard: str) -> str: ...
    async def _save(self, **changes: Any) -> None: ...
    async def _sources(self) -> dict[str, tuple[Backend, ChangeLog]]: ...
    async def _moving_tables(self) -> dict[str, MovingTable]: ...
    async def _source_placement(self) -> dict[str, MovingTable]: ...
    async def _serve_sources(self) -> None: ...
    async def _cursor(self, source: str, log: ChangeLog, position: str) -> LogCursor: ...
    async def _freeze(self, backend: Backend, on: bool) -> None: ...
    async def _topology(self) -> Topology: ...
    async def _edit_keyspace(self, change: Callable[[dict[str, Any]], object]) -> None: ...


class ReverseStreams:
    """The reverse streams of one workflow (see the module docstring)."""

    def __init__(self, flow: Host) -> None:
        self.flow = flow

    @property
    def journal(self) -> str:
        """The reverse cut-over's journal record."""
        return f"{self.flow.spec.journal}:reverse"

    def _targets(self) -> dict[str, tuple[Backend, ChangeLog]]:
        urls = dict(self.flow.spec.target_urls)
        return {t: (self.flow._backend(urls[t]), self.flow._log(urls[t], t))
                for t in self.flow.spec.targets}

    def supported(self) -> bool:
        """Whether every target's changes can be read (SQLite, PostgreSQL, MariaDB)."""
        return all(b.dialect in _CAPTURED for b, _ in self._targets().values())

    # -- at the write switch ------------------------------------------------------

    async def prepare(self) -> None:
        """Before the write freeze: change capture on the targets (idempotent); forget
        a forward journal a reverse left (in ``running`` it is stale)."""
        flow = self.flow
        await flow.store.delete_workflow(flow.spec.journal)
        if not self.supported():
            return
        created = dict(flow.doc.get("reverse_capture") or {})
        for t, (backend, _) in self._targets().items():
            if t not in created:
                created[t] = not await capture_exists(backend)
        if created != flow.doc.get("reverse_capture"):
            await flow._save(reverse_capture=created)  # before: a crash still cleans up
        for _, log in self._targets().values():
            await log.prepare()

    async def positions(self) -> dict[str, str]:
        """The targets' log ends once the final forward catch-up committed (the journal's
        ``reverse_positions``); empty when the targets have no capture."""
        if not self.supported() or not self.flow.doc.get("reverse_capture"):
            return {}
        targets = self._targets()
        return dict(zip(targets, await asyncio.gather(*(
            final_position(b, log) for b, log in targets.values())), strict=True))

    async def begin(self, journal: Mapping[str, Any]) -> None:
        """After the write switch's journal, before the targets serve: start the reverse
        streams at the journal's positions; lift a freeze a reverse left on the targets."""
        flow = self.flow
        for backend, _ in self._targets().values():
            if backend.dialect in _CAPTURED:
                await flow._freeze(backend, False)
        if flow.doc.get("reverse"):
            return
        pos = journal.get("reverse_positions") or {}
        flow.doc["reverse"] = {"streams": {t: {"pos": p, "lag_s": 0.0} for t, p in pos.items()},
                               "started": time.time()}

    # -- catch-up -----------------------------------------------------------------

    async def catch_up(self, *, deadline: float | None = None,
                       until: Mapping[str, str] | None = None) -> bool:
        """Apply each target's log to the sources up to its end now (or ``until``);
        True when every stream got there before ``deadline``."""
        flow = self.flow
        streams = (flow.doc.get("reverse") or {}).get("streams") or {}
        if not streams:
            return False
        sources = await flow._sources()
        applier = Applier(await flow._source_placement(),
                          [(s, parse_shard_name(s)) for s in flow.spec.sources],
                          {s: b for s, (b, _) in sources.items()})
        done_all = True
        for name, (backend, log) in self._targets().items():
            stream = streams[name]
            target = until[name] if until is not None else await log.current_position()
            saved = time.monotonic()

            async def report(pos: str, lag: float, stream: dict[str, Any] = stream) -> None:
                nonlocal saved
                stream["pos"], stream["lag_s"] = pos, lag
                if time.monotonic() - saved >= _SAVE_EVERY_S:
                    await flow._save()
                    saved = time.monotonic()

            cursor = await flow._cursor(f"reverse {name}", log, stream["pos"])
            _, done = await catch_up(cursor, backend.dialect, applier, report=report,
                                     until=target, deadline=deadline)
            if done:
                stream["lag_s"] = 0.0
            await flow._save()
            done_all = done_all and done
        return done_all

    def check_lag(self, bound: float) -> None:
        streams = (self.flow.doc.get("reverse") or {}).get("streams") or {}
        worst = max((float(s.get("lag_s", 0.0)) for s in streams.values()), default=0.0)
        if worst > bound:
            raise FailedPrecondition(
                f"the sources lag the targets by {worst:.1f}s (bound {bound:g}s): let "
                "`shardgate reshard status` show the reverse streams caught up and retry")

    async def status(self) -> dict[str, Any]:
        """Per reverse stream: position, the target's log end, distance, lag."""
        streams = (self.flow.doc.get("reverse") or {}).get("streams") or {}
        out = {}
        targets = self._targets()
        for name, stream in streams.items():
            backend, log = targets[name]
            head = await log.current_position()
            behind = None if stream["pos"] is None else max(
                0, position_key(backend.dialect, head) - position_key(backend.dialect,
                                                                      stream["pos"]))
            out[name] = {"position": stream["pos"], "target_position": head, "behind": behind,
                         "lag_s": float(stream.get("lag_s", 0.0))}
        return out

    # -- reverse-traffic ----------------------------------------------------------

    async def reverse_writes(self, *, max_lag_s: float, timeout_s: float,
                             rounds: int, short_round_s: float) -> str:
        """The write cut-over back to the sources (see the module docstring)."""
        flow = self.flow
        if not (flow.doc.get("reverse") or {}).get("streams"):
            raise Unsupported(
                f"{flow.spec.record} has no reverse stream (its writes were switched by a "
                "version that did not capture the targets' changes): reverse-traffic after "
                "the write switch needs the targets' changes from the switch on")
        for _ in range(rounds):
            round_start = time.monotonic()
            await self.catch_up()
            if time.monotonic() - round_start < short_round_s:
                break
        self.check_lag(max_lag_s)
        await flow.store.delete_workflow(self.journal)  # in ``switched`` it is stale
        await flow._save(state=REVERSING)
        start = time.monotonic()
        targets = self._targets()
        sources = await flow._sources()
        try:
            for backend, _ in targets.values():
                await flow._freeze(backend, True)
            final = {t: await final_position(b, log) for t, (b, log) in targets.items()}
            if not await self.catch_up(until=final, deadline=time.monotonic() + timeout_s):
                raise DeadlineExceeded(
                    f"the final reverse catch-up did not finish within {timeout_s:g}s; the "
                    "targets serve writes again, retry when the reverse lag is lower")
            ends = {s: await final_position(b, log) for s, (b, log) in sources.items()}
            await flow.store.put_workflow(self.journal, {
                "workflow": flow.spec.record, "positions": ends, "reverse_positions": final,
                "at": time.time()}, expect=0)
        except BaseException as exc:
            flow.doc["reverse_cutover_s"] = time.monotonic() - start
            with contextlib.suppress(Exception):
                await self.roll_back(f"{type(exc).__name__}: {exc}")
            raise
        flow.doc["reverse_cutover_s"] = time.monotonic() - start
        await self.publish()
        return (f"writes and reads of {flow.spec.keyspace} are served by the sources "
                f"{list(flow.spec.sources)} again (targets refused writes "
                f"{flow.doc['reverse_cutover_s'] * 1000:.0f} ms); the targets are caught up "
                "from here on: `switch-traffic --reads`, then `--writes`, may run again")

    async def roll_back(self, error: str) -> None:
        """A reverse cut-over that did not reach its journal: the targets serve on."""
        for backend, _ in self._targets().values():
            await self.flow._freeze(backend, False)
        await self.flow._save(state="switched", error=error)

    async def publish(self) -> None:
        """After the reverse journal: the sources serve (unfrozen; the host's
        ``_serve_sources``: the keyspace's shards for a reshard, the routing rules for a
        MoveTables), the targets are pending (frozen), the forward streams resume at
        the journal's positions."""
        flow = self.flow
        found = await flow.store.get_workflow(self.journal)
        if found is None or found.doc is None:  # pragma: no cover - called after the journal
            raise FailedPrecondition(f"no reverse journal {self.journal}")
        for backend, _ in (await flow._sources()).values():
            await flow._freeze(backend, False)
        await flow._serve_sources()
        for s, pos in found.doc["positions"].items():
            flow.doc["streams"][s].update(pos=pos, lag_s=0.0)
        await flow.store.delete_workflow(flow.spec.journal)
        await flow._save(state="running", reads_switched=False, reverse=None, error=None,
                         reversed_at=time.time())
        await flow.store.delete_workflow(self.journal)

    async def recover(self) -> None:
        """Finish a reverse cut-over a dead process left: forward with its journal, else back."""
        if await self.flow.store.get_workflow(self.journal) is not None:
            await self.publish()
        else:
            await self.roll_back("the reverse cut-over was interrupted before its journal; "
                                 "rolled back")

    # -- the end ------------------------------------------------------------------

    async def finish(self, *, drop_capture: bool) -> None:
        """``complete`` / ``cancel``: stop the reverse streams and delete the reverse
        journal; with ``drop_capture`` (``cancel``: the targets are discarded) also drop
        the capture the workflow set up on the targets (and their PostgreSQL slots;
        a MariaDB target's binlog is server-wide, never the workflow's: kept).
        ``complete`` keeps it: the targets are the serving shards, and their change logs
        carry the keyspace's change streams from the write switch on."""
        flow = self.flow
        targets = self._targets()
        for name, created in (flow.doc.get("reverse_capture") or {}).items():
            cursor = flow._cursors.pop(f"reverse {name}", None)
            if cursor is not None:
                await cursor.close()
            if drop_capture and created and name in targets:
                await targets[name][1].drop()
        await flow.store.delete_workflow(self.journal)
