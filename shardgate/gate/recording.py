"""What the gate keeps of each statement it runs, and the bounds it runs it under.

:meth:`Recorder.run` runs a statement's work under the session's query
timeout (the shards' statements are cancelled with it: ``DEADLINE_EXCEEDED``,
and an open transaction is rolled back), lists it among the live queries while
it runs (an operator may kill it: ``ABORTED``), checks the merged result
against the result limits (``RESOURCE_EXHAUSTED``), and records it, failed or
not: query statistics, the console's timeline, the query log and the
Prometheus metrics.

Invariant: every statement :meth:`Recorder.run` starts is recorded exactly
once and leaves the live list, whatever happens to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shardgate.engine.plan import Plan
from shardgate.errors import Aborted, DeadlineExceeded, ShardgateError
from shardgate.gate import metrics as gate_metrics
from shardgate.gate.limits import GateLimits
from shardgate.gate.querylog import LiveQueries, QueryLog
from shardgate.gate.session import Session
from shardgate.gate.stats import Stats, Timeline
from shardgate.result import Result, WireResult, rows_size

R = TypeVar("R")


class Recorder:
    """Runs statements under the gate's bounds and records them (see the module).

    It holds the gate's own limits, statistics, timeline, live list and query
    log (the same objects the gate exposes); ``rollback`` ends a session's
    transaction when its statement times out.
    """

    def __init__(self, limits: GateLimits, stats: Stats, timeline: Timeline,
                 live: LiveQueries, querylog: QueryLog,
                 rollback: Callable[[Session], Awaitable[None]]) -> None:
        self._limits = limits
        self._stats = stats
        self._timeline = timeline
        self._live = live
        self._querylog = querylog
        self._rollback = rollback

    async def run(self, session: Session, planned: Plan, run: Callable[[], Awaitable[R]],
                  check: Callable[[R], None]) -> R:
        """``run()`` as the statement ``planned``: under the session's query timeout (the
        shards' statements cancelled with it), listed among the live queries (an operator
        may kill it), its answer ``check``-ed, and recorded (statistics, query log,
        metrics), failed or not."""
        start, calls = time.perf_counter(), session.shard_calls
        timeout_ms = (session.query_timeout_ms if session.query_timeout_ms is not None
                      else self._limits.query_timeout_ms)
        live = self._live.start(session, planned.normalized)
        try:
            if timeout_ms:
                result = await self._with_timeout(session, run, timeout_ms)
            else:
                result = await run()
            check(result)
        except ShardgateError as exc:
            self._finished(session, planned, start, calls, None, exc.code.value)
            raise
        except asyncio.CancelledError:
            if not live.killed:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._finished(session, planned, start, calls, None, "ABORTED")
            raise Aborted("the statement was killed by an operator") from None
        finally:
            self._live.finish(live)
        self._finished(session, planned, start, calls, result, None)  # type: ignore[arg-type]
        return result

    async def _with_timeout(self, session: Session, run: Callable[[], Awaitable[R]],
                            timeout_ms: int) -> R:
        """``run()`` cancelled after ``timeout_ms``: the shards' statements are
        cancelled with it (the backends cancel a statement whose caller is)."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await run()
        except TimeoutError:
            note = ""
            if session.in_transaction:
                await self._rollback(session)
                note = "; the transaction was rolled back"
            raise DeadlineExceeded(
                f"the statement ran longer than query_timeout_ms = {timeout_ms} and was "
                f"cancelled on the shards{note}. Raise it with SET query_timeout_ms = N "
                "(0: no timeout), or narrow the statement"
            ) from None

    def check_result(self, result: Result | WireResult) -> None:
        """The merged result against the result limits (each shard's part was checked
        while it arrived; this bounds what the shards add up to)."""
        limits = self._limits.result_limits
        n = len(result.rows)
        if n > 1000 or (limits.max_rows and n > limits.max_rows):
            size = (result.size if type(result) is WireResult
                    else rows_size(result.rows) if limits.max_bytes else 0)  # type: ignore[arg-type]
            limits.check(n, size, "the shards")

    def _finished(self, session: Session, planned: Plan, start: float, calls: int,
                  result: Result | WireResult | None, error: str | None) -> None:
        """Count a finished statement: statistics, query log, metrics."""
        seconds = time.perf_counter() - start
        shard_calls = session.shard_calls - calls
        rows = len(result.rows) if result is not None else 0
        affected = result.rows_affected if type(result) is Result else 0
        self._stats.record(planned.normalized, seconds, rows or affected, shard_calls,
                           error is not None)
        self._timeline.record((session.keyspace or "", ""), seconds, error is not None)
        self._querylog.record(time.time() - seconds, session.keyspace, planned.normalized,
                              seconds, rows or affected, shard_calls, error, session)
        gate_metrics.record(session.keyspace, planned.statement_type, seconds, rows, affected,
                            shard_calls, error)
