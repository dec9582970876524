"""The consumer of one segmented queue on one shard: ordering, retries, compaction.

One :class:`ShardConsumer` runs per shard and queue, only while it holds the
queue's lease on the shard (``shardgate/<ks>/<shard>/segmented/<queue>``,
the same kind of database lock as the tablet's lease); all its writes
(status rows, compaction) go through the lease's own connection, so if the
lease is lost the next write fails. Any database error in a read or write
makes it drop the lease and all its memory and start over from the tables
(:attr:`ShardConsumer.restarts`); only a bug stops it for good
(:attr:`ShardConsumer.failure`).

Parts
-----
* **The read cursor** (``_read_n``, ``_last_id``): jobs are read in
  ``(dataset, job_id)`` order, ``read_batch`` at a time, while fewer than
  ``cache_size`` are pending in memory. Job ids increase per shard in commit
  order (see :mod:`~shardgate.queues.segmented.store`), so ``job_id > last``
  misses nothing. The cursor leaves a dataset only after a read that started
  after the catalog showed the dataset ``closed`` returned its end: from then
  on the dataset is *fully read*. Jobs stored before this consumer started
  are matched with their dataset's latest status rows (one scan of the
  status table per dataset): terminal ones are skipped; ``executing`` (a
  crash mid-flight), ``failed`` and ``pending`` ones are pending again,
  keeping their attempt count. Later jobs can only have rows this consumer
  writes, so they are read from the jobs table alone.
* **Pending jobs** (:mod:`~shardgate.queues.segmented.pending`): per key in id
  order, runnable when ready, due, and first of its key or its key is *hot* (the
  circuit breaker: more than ``hot_key_threshold`` pending jobs hot for
  ``hot_key_cooldown`` seconds); a failed job waits ``clamp(min_backoff * 2^attempt,
  min, max)``, still first of its key; after ``max_attempts`` it is ``aborted``.
* **Status rows** (:mod:`~shardgate.queues.segmented.status`): every change
  (``executing``, ``succeeded``, ``failed``, ``aborted``, ``pending``) is appended to
  the job's dataset, gathered while one write runs and written together, on
  PostgreSQL with ``synchronous_commit = off`` (a status row lost in a server crash
  means the job runs again: at least once). Whoever asked for a row returns once it
  is committed.
* **Compaction** (every ``compaction_interval``): datasets that are closed,
  fully read and have no pending job are dropped whole (``DROP TABLE``);
  the leading run of closed, fully read datasets is merged into one when it
  has two or more datasets and at most ``merge_max_rows`` pending jobs (so
  the count of datasets goes down). A merge holds the status writer, so it
  pauses handing out and acking for at most the time to copy
  ``merge_max_rows`` jobs and their status rows; producers never wait for it
  (they only write the open dataset).
* **Operator actions** (``<queue>_actions``): ``retry`` makes a waiting job
  due now, or re-queues an ``aborted`` job still in a live dataset; ``abort``
  aborts a pending job (also one not read yet). Applied in order at start and
  every compaction interval, then deleted.

Invariants
----------
1. A job is handed out only if it is pending in memory; it leaves memory only
   after its ``succeeded`` / ``aborted`` row committed, and a job whose
   terminal row committed is never read back as pending. So no job is handed
   out after its success committed (acks of other copies are ignored).
2. Per key, a job is handed out only when every earlier job of the key is
   done (succeeded or aborted), unless the key is hot.
3. A dataset is dropped only when it is closed, fully read and none of its
   jobs is pending: every job in it has a terminal status.
4. A merge copies exactly the pending jobs of its sources with their status
   history, switches the catalog in the same transaction, and only then
   drops the sources; pending jobs point at the new dataset afterwards.
5. ``in_flight <= max_in_flight`` (when set); memory holds at most
   ``cache_size`` pending jobs plus one read batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends import Backend, Connection
from shardgate.backends.base import LeaseHandle
from shardgate.errors import FailedPrecondition, NotFound, ShardgateError, Unavailable
from shardgate.queues import metrics
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.ddl import (
    ABORTED,
    CLOSED,
    DATASET_STEP,
    DROPPING,
    EXECUTING,
    FAILED,
    MERGING,
    OPEN,
    PENDING,
    READY,
    SUCCEEDED,
    TERMINAL,
)
from shardgate.queues.segmented.pending import Job, JobState, PendingJobs
from shardgate.queues.segmented.status import StatusRow, StatusWriter
from shardgate.queues.segmented.store import Dataset, SegmentedStore, StoredJob

log = logging.getLogger(__name__)

DEFAULT_READ_BATCH = 2000
DEFAULT_POLL_INTERVAL_S = 0.05
DEFAULT_COMPACTION_INTERVAL_S = 1.0
DEFAULT_LEASE_RETRY_S = 0.5
@dataclass(slots=True)
class SegmentedJob:
    """A job handed to a worker. Ack or fail it by ``(shard, job_id)``."""

    shard: str
    job_id: int
    key: str
    payload: str | None
    attempt: int
    created: int


class ShardConsumer:
    """Hands out, retries and compacts one segmented queue on one shard (see the module
    docstring for its parts and invariants)."""

    def __init__(
        self,
        *,
        keyspace: str,
        shard: str,
        store: SegmentedStore,
        backend: Backend,
        options: QueueOptions,
        read_batch: int = DEFAULT_READ_BATCH,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        compaction_interval: float = DEFAULT_COMPACTION_INTERVAL_S,
        lease_retry: float = DEFAULT_LEASE_RETRY_S,
        on_runnable: Callable[[], None] | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.keyspace = keyspace
        self.shard = shard
        self.store = store
        self.backend = backend
        self.options = options
        self.read_batch = read_batch
        self.poll_interval = poll_interval
        self.compaction_interval = compaction_interval
        self.lease_retry = lease_retry
        self.on_runnable = on_runnable
        self._clock = clock
        #: set when the consumer stopped for good (a bug, not a database error)
        self.failure: ShardgateError | None = None
        #: the database error that made it drop its state and start over, if any
        self.last_error: ShardgateError | None = None
        self.restarts = 0
        self.leader = False
        self._lease: LeaseHandle | None = None
        self._status = StatusWriter(store, self._not_leader, self._broke)
        self._broken: ShardgateError | None = None
        self._reset_state()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self.max_pause = 0.0
        self.counts = collections.Counter[str]()
        self._labels = (keyspace, shard, store.names.queue)

    def _reset_state(self) -> None:
        """Forget everything held in memory (it is all re-read from the tables)."""
        self._pending = PendingJobs(self.options, self._clock, self.on_runnable)
        self._fully_read: set[int] = set()
        self._datasets: list[Dataset] = []
        self._catalog: list[Dataset] = []
        self._view: list[int] = []
        self._read_n = 0
        self._last_id = 0
        self._recovering = 0
        self._recover_states: dict[int, dict[int, tuple[int, str]]] = {}

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Compete for the lease and run once it is held (idempotent; needs a loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._main())

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until this consumer holds the lease and has recovered its state."""
        await _wait_ready(self, self._ready, timeout)

    async def close(self) -> None:
        """Stop; write the status rows already asked for; release the lease."""
        task, self._task = self._task, None
        await cancel_and_wait([task], swallow=(ShardgateError,))
        await self._status.drain()
        self.leader = False
        if self._lease is not None:
            await self._lease.release()
            self._lease = None
        self._status.conn = None
        self._status.fail_waiters(Unavailable(f"segmented queue {self.store.names.queue} on "
                                       f"{self.keyspace}/{self.shard}: consumer closed"))

    @property
    def lease_name(self) -> str:
        return f"shardgate/{self.keyspace}/{self.shard}/segmented/{self.store.names.queue}"

    async def _main(self) -> None:
        while True:
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except ShardgateError as exc:  # lost lease or database: start over from the tables
                await self._lose(exc)
            except Exception as exc:  # a bug: stop loudly rather than loop or hang the workers
                log.exception("segmented consumer %s/%s crashed", self.keyspace, self.shard)
                self._stop(FailedPrecondition(f"segmented consumer crashed: {exc!r}"))
                return
            await asyncio.sleep(self.lease_retry)

    async def _serve(self) -> None:
        while self._lease is None:
            self._lease = await self.backend.try_lease(self.lease_name)
            if self._lease is None:
                await asyncio.sleep(self.lease_retry)
        self._status.conn = self._lease.conn
        relaxed = self.store.sql.relaxed_durability_sql
        if relaxed is not None:  # PostgreSQL: no WAL flush wait per status batch
            await self._status.conn.execute(relaxed)
        async with self._status.lock:
            live = await self.store.recover(self._status.conn)
            await self.store.add_spare(self._status.conn)
        self._set_datasets(live)
        self._read_n = min((d.n for d in self._datasets), default=0)
        # jobs stored before now may have status rows (an earlier consumer's); later
        # ones get theirs only from this consumer, so they are read without a lookup
        self._recovering = max((d.next_id for d in self._datasets), default=0)
        self._broken = None
        self.leader = True
        await self._apply_actions()  # operators' requests made while no consumer ran
        await self._read()
        self._ready.set()
        next_compaction = time.monotonic() + self.compaction_interval
        while True:
            if self._broken is not None:
                raise self._broken
            self._wake.clear()
            self._timers()
            got = await self._read()
            if time.monotonic() >= next_compaction:
                await self._apply_actions()
                await self.compact()
                self._refresh_metrics()
                next_compaction = time.monotonic() + self.compaction_interval
            if got:
                continue
            with contextlib.suppress(TimeoutError):
                await wait_for(self._wake.wait(),
                               self._pending.sleep_for(self.poll_interval))

    async def _lose(self, exc: ShardgateError) -> None:
        """A write or read failed: drop the lease and all state; :meth:`_main` starts over
        (jobs handed out meanwhile are handed out again: at least once)."""
        log.warning("segmented queue %s on %s/%s: %s; starting over from the tables",
                    self.store.names.queue, self.keyspace, self.shard, exc)
        self.leader = False
        self.last_error = exc
        self.restarts += 1
        self._ready.clear()
        async with self._status.lock:
            self._status.fail_waiters(exc)
            self._reset_state()
            lease, self._lease, self._status.conn = self._lease, None, None
        if lease is not None:
            await lease.release()

    def _stop(self, exc: ShardgateError) -> None:
        log.warning("segmented queue %s on %s/%s stopped: %s", self.store.names.queue,
                    self.keyspace, self.shard, exc)
        self.failure = exc
        self.leader = False
        self._status.fail_waiters(exc)
        if self.on_runnable is not None:
            self.on_runnable()

    def wake(self) -> None:
        """New jobs were stored on this shard (in-process producers call this)."""
        self._wake.set()

    # -- reading ----------------------------------------------------------------------

    def _set_datasets(self, live: Sequence[Dataset]) -> None:
        self._catalog = list(live)
        self._datasets = [d for d in live if d.state in (OPEN, CLOSED)]

    async def _refresh(self, conn: Connection) -> None:
        self._set_datasets(await self.store.datasets(conn))

    def _current(self) -> Dataset | None:
        for d in self._datasets:
            if d.n >= self._read_n and d.n not in self._fully_read:
                return d
        return None

    async def _read(self) -> int:
        """Read new jobs up to the free room; return how many were read."""
        room = self.options.cache_size - len(self._pending.jobs)
        if room <= 0:
            return 0
        total = 0
        conn = await self.backend.acquire()
        try:
            refreshed = False
            while room > 0:
                d = self._current()
                if d is None:
                    if refreshed:
                        break
                    await self._refresh(conn)
                    refreshed = True
                    continue
                self._read_n = d.n
                closed_before = d.state == CLOSED
                limit = min(room, self.read_batch)
                rows = await self.store.read_jobs(conn, d.n, self._last_id, limit)
                if self._last_id < self._recovering:
                    # stored before this consumer started: an earlier one may have written
                    # status rows; later jobs get theirs only from this consumer
                    states = self._recover_states.get(d.n)
                    if states is None:
                        states = await self.store.latest_states(conn, d.n)
                        self._recover_states = {d.n: states}
                    rows = [StoredJob(r.job_id, r.key, r.payload, r.created, *states[r.job_id])
                            if r.job_id in states else r for r in rows]
                elif self._recover_states:
                    self._recover_states = {}
                for row in rows:
                    self._pending.add(d.n, row)
                if rows:
                    self._last_id = rows[-1].job_id
                    if self.on_runnable is not None:
                        self.on_runnable()
                total += len(rows)
                room -= len(rows)
                if len(rows) == limit:
                    continue
                if closed_before:
                    self._fully_read.add(d.n)
                    continue
                if refreshed:
                    break
                await self._refresh(conn)
                refreshed = True
        finally:
            await self.backend.release(conn)
        return total

    # -- handing out ------------------------------------------------------------------

    def holds(self, job_id: int) -> bool:
        """Whether job ``job_id`` is pending in memory (not finished)."""
        return int(job_id) in self._pending.jobs

    def has_runnable(self) -> bool:
        """Whether :meth:`pick` may return jobs now (or raise this consumer's failure)."""
        if self.failure is not None:
            return True
        return self.leader and self._pending.has_runnable()

    def pick(self, max_n: int) -> list[Job]:
        """Take up to ``max_n`` runnable jobs (marked executing in memory; the caller
        writes their status with :meth:`started`)."""
        if self.failure is not None:
            raise self.failure
        if not self.leader:
            return []
        return self._pending.pick(max_n)

    async def started(self, jobs: Sequence[Job]) -> list[SegmentedJob]:
        """Append the ``executing`` rows of picked jobs; return them once committed."""
        now = self._clock()
        try:
            await self._write([(j, j.attempt, EXECUTING, None, now) for j in jobs])
        except asyncio.CancelledError:
            # The caller went away before getting them: they are ready again at once
            # (their executing rows may still commit; the next attempt writes its own).
            for j in jobs:
                if j.state == JobState.EXECUTING:
                    self._pending.ready_again(j)
            raise
        self.counts["executing"] += len(jobs)
        metrics.SEG_EXECUTING.labels(*self._labels).inc(len(jobs))
        return [SegmentedJob(self.shard, j.job_id, j.key, j.payload, j.attempt, j.created)
                for j in jobs]

    def release(self, jobs: Sequence[tuple[int, int]]) -> int:
        """Give back ``(job_id, attempt)`` pairs handed out and not finished (their
        receiver went away): each still executing in that attempt is ready again at once,
        first of its key, without a status row (the next attempt writes its own
        ``executing`` row). Returns how many were released."""
        n = self._pending.release(jobs)
        if n:
            self._wake.set()
            self._pending.signal()
        return n

    async def ack(self, job_ids: Sequence[int]) -> int:
        """Record success of ``job_ids``; return how many were pending (the others were
        done already). Returns once the ``succeeded`` rows committed."""
        jobs = self._pending.finishing(job_ids)
        if not jobs:
            return 0
        now = self._clock()
        await self._write([(j, j.attempt, SUCCEEDED, None, now) for j in jobs])
        for j in jobs:
            self._pending.done(j)
        self._pending.signal()  # room under max_in_flight again
        self.counts["succeeded"] += len(jobs)
        metrics.SEG_SUCCEEDED.labels(*self._labels).inc(len(jobs))
        return len(jobs)

    async def fail(self, job_ids: Sequence[int], reason: str, *,
                   retry_at: int | None = None) -> int:
        """Record a failed attempt of ``job_ids`` (executing ones): each is retried after
        its backoff (or at ``retry_at``, ns since the epoch, if later than now),
        blocking the later jobs of its key, or aborted once out of attempts.
        Returns how many were executing."""
        jobs = [j for j in (self._pending.jobs.get(int(i)) for i in job_ids)
                if j is not None and j.state == JobState.EXECUTING]
        return await self._fail(jobs, reason, retry_at=retry_at)

    async def _fail(self, jobs: Sequence[Job], reason: str, *,
                    retry_at: int | None = None) -> int:
        if not jobs:
            return 0
        now = self._clock()
        aborted, retried = self._pending.failing(jobs, retry_at, now)
        limit = self.options.max_attempts
        rows = [(j, j.attempt, ABORTED, f"{reason} (attempt {j.attempt} of {limit})", now)
                if j.state == JobState.FINISHING else (j, j.attempt, FAILED, reason, now)
                for j in jobs]
        await self._write(rows)
        for j in aborted:
            self._pending.done(j, was_executing=False)
        self._pending.retry_later(retried)
        self._wake.set()
        self._pending.signal()
        self.counts["failed"] += len(retried)
        self.counts["aborted"] += len(aborted)
        metrics.SEG_FAILED.labels(*self._labels).inc(len(retried))
        metrics.SEG_ABORTED.labels(*self._labels).inc(len(aborted))
        return len(jobs)

    def _timers(self) -> None:
        """Retries that are due become ready; executing jobs past ack_wait fail."""
        expired = self._pending.timers()
        if expired:
            asyncio.get_running_loop().create_task(self._expire(expired))

    async def _expire(self, jobs: list[Job]) -> None:
        live = [j for j in jobs if j.state == JobState.EXECUTING]
        with contextlib.suppress(ShardgateError):
            await self._fail(live, f"no ack within ack_wait ({self.options.ack_wait:g} s)")

    # -- status writes ----------------------------------------------------------------

    async def _write(self, rows: Sequence[StatusRow]) -> None:
        if self.failure is not None:
            raise self.failure
        if not self.leader:
            raise self._not_leader()
        await self._status.write(rows)

    def _broke(self, exc: ShardgateError) -> None:
        """A status write failed: the main task starts over."""
        self._broken = exc
        self._wake.set()

    def _not_leader(self) -> ShardgateError:
        return Unavailable(f"segmented queue {self.store.names.queue} on "
                           f"{self.keyspace}/{self.shard}: this consumer does not hold the "
                           "lease now (starting over, or another process consumes the shard)")

    # -- operator actions -------------------------------------------------------------

    async def _apply_actions(self) -> None:
        conn = await self.backend.acquire()
        try:
            actions = await self.store.actions_after(conn, 0)
        finally:
            await self.backend.release(conn)
        for action_id, job_id, action, reason in actions:
            try:
                await self._apply(job_id, action, reason or f"{action} by operator")
            except NotFound as exc:
                log.warning("segmented queue %s: action %s on job %s ignored: %s",
                            self.store.names.queue, action, job_id, exc.message)
            async with self._status.lock:
                await self._status.connection().execute(
                    f"DELETE FROM {self.store.names.actions} WHERE id = {self.store.ph}",
                    [action_id])

    async def _apply(self, job_id: int, action: str, reason: str) -> None:
        job = self._pending.jobs.get(job_id)
        now = self._clock()
        if job is not None:
            if action == "abort":
                if job.state == JobState.FINISHING:
                    return
                was = job.state == JobState.EXECUTING
                job.state = JobState.FINISHING
                await self._write([(job, job.attempt, ABORTED, reason, now)])
                self._pending.done(job, was_executing=was)
                self.counts["aborted"] += 1
            elif job.state == JobState.WAITING:
                job.state = JobState.READY
                job.due = now
                self._pending.push(job)
            return
        async with self._status.lock:
            found = await self.store.find_job(self._status.connection(), job_id)
        if found is None:
            raise NotFound(f"job {job_id} is in no live dataset (done and dropped, or never "
                           "stored on this shard)")
        d, stored = found
        if stored.state in TERMINAL and action == "abort":
            return
        if action == "abort":
            async with self._status.lock:
                await self.store.append_status(self._status.connection(), d.n, [
                    (job_id, stored.attempt, ABORTED, reason, now)])
            if job_id > self._last_id:
                self._pending.skip.add(job_id)
            return
        if stored.state != ABORTED:
            return  # not read yet (it will be) or already succeeded: nothing to retry
        async with self._status.lock:
            await self.store.append_status(self._status.connection(), d.n, [
                (job_id, stored.attempt, PENDING, reason, now)])
        if job_id <= self._last_id:
            self._pending.add(d.n, StoredJob(job_id, stored.key, stored.payload, stored.created,
                                     stored.attempt, PENDING))

    # -- compaction -------------------------------------------------------------------

    async def compact(self) -> tuple[list[int], list[int]]:
        """One compaction step: drop done datasets, merge the leading ones if that lowers
        their count. Returns ``(dropped, merged)`` dataset numbers."""
        if self._status.conn is None or self.failure is not None:
            return [], []
        dropped: list[int] = []
        merged: list[int] = []
        async with self._status.lock:
            t0 = time.monotonic()
            conn = self._status.connection()
            await self._refresh(conn)
            done = [d.n for d in self._datasets if d.state == CLOSED and d.n in self._fully_read
                    and self._pending.outstanding.get(d.n, 0) == 0]
            if done:
                keep = [d.n for d in self._datasets if d.n not in done]
                await self.store.drop_datasets(conn, done, keep)
                for n in done:
                    self._pending.outstanding.pop(n, None)
                    self._fully_read.discard(n)
                dropped = done
                metrics.SEG_DROPPED.labels(*self._labels).inc(len(done))
                await self._refresh(conn)
            cap = min(self.options.merge_max_rows, self.options.dataset_max_rows)
            prefix = merge_prefix(self._datasets, self._fully_read, self._pending.outstanding,
                                  cap)
            if len(prefix) >= 2 and (prefix[-1].n + 1) % DATASET_STEP != 0:
                sources = {d.n for d in prefix}
                moving = [j for j in self._pending.jobs.values() if j.n in sources]
                keep = [d.n for d in self._datasets if d.n not in sources]
                target = await self.store.merge(conn, prefix, [j.job_id for j in moving], keep)
                for j in moving:
                    j.n = target.n
                for n in sources:
                    self._pending.outstanding.pop(n, None)
                    self._fully_read.discard(n)
                self._pending.outstanding[target.n] = len(moving)
                self._fully_read.add(target.n)
                merged = sorted(sources)
                metrics.SEG_MERGED.labels(*self._labels).inc(len(sources))
                await self._refresh(conn)
            shown = [d.n for d in self._catalog if d.state in (READY, OPEN, CLOSED)]
            if shown != self._view:
                await self.store.rebuild_view(conn, shown)
                self._view = shown
            if dropped or merged:
                pause = time.monotonic() - t0
                self.max_pause = max(self.max_pause, pause)
                metrics.SEG_PAUSE.labels(*self._labels).set(self.max_pause)
        return dropped, merged

    # -- inspection -------------------------------------------------------------------

    def blocked_keys(self) -> list[str]:
        """Keys whose first pending job failed and waits for its retry, holding back
        later jobs of the key."""
        return self._pending.blocked_keys()

    def stats(self) -> dict[str, Any]:
        """What this consumer knows: pending, in flight, keys, datasets, counters."""
        return {
            "shard": self.shard,
            "leader": self.leader,
            **self._pending.summary(),
            "datasets": [{"n": d.n, "state": d.state, "rows": d.job_rows,
                          "pending": self._pending.outstanding.get(d.n, 0),
                          "fully_read": d.n in self._fully_read} for d in self._datasets],
            "max_compaction_pause_s": round(self.max_pause, 4),
            **dict(self.counts),
        }

    def _refresh_metrics(self) -> None:
        metrics.SEG_DATASETS.labels(*self._labels).set(len(self._datasets))
        self._pending.export(self._labels)


def merge_prefix(datasets: Sequence[Dataset], fully_read: set[int],
                 outstanding: dict[int, int], cap: int) -> list[Dataset]:
    """The leading run of closed, fully read datasets holding at most ``cap`` pending
    jobs together: what one merge may combine."""
    prefix: list[Dataset] = []
    total = 0
    for d in datasets:
        if d.state != CLOSED or d.n not in fully_read:
            break
        c = outstanding.get(d.n, 0)
        if total + c > cap:
            break
        prefix.append(d)
        total += c
    return prefix


async def _wait_ready(consumer: ShardConsumer, ready: asyncio.Event, timeout: float) -> None:
    """:meth:`ShardConsumer.wait_ready`: ``UNAVAILABLE`` after ``timeout`` s, naming the
    consumer's last database error, or else another process (a tablet serving the
    keyspace, another worker) holding the queue's lock."""
    try:
        await wait_for(ready.wait(), timeout)
        return
    except TimeoutError:
        pass
    cause = (f"last error: {consumer.last_error}" if consumer.last_error is not None else
             "another process holds the queue's lock (a tablet serving the keyspace "
             "consumes it: receive through the gate instead)")
    raise Unavailable(f"segmented queue {consumer.store.names.queue} on "
                      f"{consumer.keyspace}/{consumer.shard}: consumer not ready within "
                      f"{timeout:g} s; {cause}")


# Names re-exported for callers that branch on dataset states.
__all__ = ["DROPPING", "MERGING", "READY", "SegmentedJob", "ShardConsumer"]
