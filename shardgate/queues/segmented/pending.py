"""The pending jobs a segmented queue's consumer holds in memory (:class:`PendingJobs`).

A :class:`~shardgate.queues.segmented.consumer.ShardConsumer` reads jobs from its shard's
datasets and keeps them here until their terminal status row commits. This module decides,
without any I/O, which job may run next; the consumer writes the status rows.

* Jobs per key in id order (``keys``) and a heap of job ids that may be runnable
  (``runnable``, each checked when popped). A job is handed out when it is ready, due,
  and either first of its key or its key is *hot*.
* A failed job waits ``clamp(min_backoff * 2^attempt, min, max)`` (``retries``, a heap by
  due time), still first of its key, so later jobs of that key wait while other keys go on.
* Handed-out jobs fail when not acked within ``ack_wait`` (``deadlines``, in hand-out order).
* The circuit breaker: a key with more than ``hot_key_threshold`` pending jobs is hot for
  ``hot_key_cooldown`` seconds: its jobs are handed out without waiting for each other.

Invariants
----------
1. ``jobs`` holds exactly the pending jobs; each is in its key's deque, and ``outstanding[n]``
   counts the pending jobs of dataset ``n``.
2. Per key, a job is handed out only when every earlier job of the key is done (it left
   ``jobs``), unless the key is hot.
3. ``in_flight`` counts the jobs in state executing; ``in_flight <= max_in_flight`` when set.
"""

from __future__ import annotations

import collections
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from shardgate.queues import metrics
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.ddl import TERMINAL
from shardgate.queues.segmented.store import StoredJob

NS = 1_000_000_000


class JobState(IntEnum):
    """Where a pending job is in memory (its status rows are the consumer's)."""

    READY = 0
    EXECUTING = 1
    WAITING = 2  # failed, waiting for its retry time
    FINISHING = 3  # terminal status row being written


@dataclass(slots=True, eq=False)
class Job:
    """A pending job in memory (``n``: the dataset holding it now)."""

    job_id: int
    n: int
    key: str
    payload: str | None
    created: int
    attempt: int
    state: JobState = JobState.READY
    due: int = 0
    queued: bool = False


class PendingJobs:
    """The pending jobs of one consumer (see the module docstring)."""

    def __init__(self, options: QueueOptions, clock: Callable[[], int],
                 on_runnable: Callable[[], None] | None) -> None:
        self.options = options
        self.clock = clock
        self.on_runnable = on_runnable
        self.jobs: dict[int, Job] = {}
        self.keys: dict[str, collections.deque[int]] = {}
        self.runnable: list[int] = []
        self.retries: list[tuple[int, int]] = []
        self.deadlines: collections.deque[tuple[int, list[Job], list[int]]] = (
            collections.deque())
        self.hot: dict[str, int] = {}
        #: pending jobs per dataset
        self.outstanding: dict[int, int] = {}
        #: jobs not read yet that an operator aborted (skipped when read)
        self.skip: set[int] = set()
        self.in_flight = 0

    # -- adding --------------------------------------------------------------------------

    def add(self, n: int, row: StoredJob) -> None:
        """Hold a job read from dataset ``n`` (terminal and skipped ones are dropped)."""
        if row.state in TERMINAL or (self.skip and row.job_id in self.skip):
            self.skip.discard(row.job_id)
            return
        job = Job(row.job_id, n, row.key, row.payload, row.created, row.attempt)
        self.jobs[job.job_id] = job
        self.outstanding[n] = self.outstanding.get(n, 0) + 1
        keyq = self.keys.get(job.key)
        if keyq is None:  # the common case: a key with no pending job
            self.keys[job.key] = collections.deque((job.job_id,))
            job.queued = True
            heapq.heappush(self.runnable, job.job_id)
            return
        if keyq and keyq[-1] > job.job_id:  # re-queued by an operator: keep id order
            items = sorted([*keyq, job.job_id])
            keyq.clear()
            keyq.extend(items)
        else:
            keyq.append(job.job_id)
        if len(keyq) > self.options.hot_key_threshold and job.key not in self.hot:
            self.hot[job.key] = self.clock() + int(self.options.hot_key_cooldown * NS)
            for jid in keyq:
                self.push(self.jobs[jid])
        elif keyq[0] == job.job_id or job.key in self.hot:
            self.push(job)

    def push(self, job: Job) -> None:
        """Mark a ready job as maybe runnable (and tell the consumer's owner)."""
        if not job.queued and job.state == JobState.READY:
            job.queued = True
            heapq.heappush(self.runnable, job.job_id)
            if self.on_runnable is not None:
                self.on_runnable()

    def is_hot(self, key: str, now: int) -> bool:
        """Whether ``key``'s circuit breaker is open at ``now`` (forgets it once closed)."""
        until = self.hot.get(key)
        if until is None:
            return False
        if until > now:
            return True
        del self.hot[key]
        return False

    def signal(self) -> None:
        """Tell the owner when some job may be runnable."""
        if self.on_runnable is not None and self.runnable:
            self.on_runnable()

    # -- handing out -----------------------------------------------------------------------

    def has_runnable(self) -> bool:
        """Whether :meth:`pick` may return jobs now (room under ``max_in_flight``)."""
        limit = self.options.max_in_flight
        return bool(self.runnable) and (not limit or self.in_flight < limit)

    def pick(self, max_n: int) -> list[Job]:
        """Take up to ``max_n`` runnable jobs, marked executing (their ack deadline starts)."""
        out: list[Job] = []
        now = self.clock()
        limit = self.options.max_in_flight
        heap = self.runnable
        while heap and len(out) < max_n and (not limit or self.in_flight < limit):
            job = self.jobs.get(heapq.heappop(heap))
            if job is None or not job.queued:
                continue
            job.queued = False
            if job.state != JobState.READY:
                continue
            keyq = self.keys[job.key]
            if keyq[0] != job.job_id and not self.is_hot(job.key, now):
                continue
            job.state = JobState.EXECUTING
            job.attempt += 1
            self.in_flight += 1
            out.append(job)
        if out:
            self.deadlines.append((now + int(self.options.ack_wait * NS), out,
                                   [j.attempt for j in out]))
        return out

    def ready_again(self, job: Job) -> None:
        """An executing job handed back unfinished: ready at once, first of its key (it
        keeps its attempt number: the next attempt is a new one)."""
        job.state = JobState.READY
        self.in_flight -= 1
        self.push(job)

    def release(self, jobs: Sequence[tuple[int, int]]) -> int:
        """Make ``(job_id, attempt)`` pairs still executing in that attempt ready again;
        how many were."""
        n = 0
        for job_id, attempt in jobs:
            j = self.jobs.get(int(job_id))
            if j is None or j.state != JobState.EXECUTING or j.attempt != attempt:
                continue
            self.ready_again(j)
            n += 1
        return n

    # -- finishing -------------------------------------------------------------------------

    def finishing(self, job_ids: Sequence[int]) -> list[Job]:
        """The pending jobs of ``job_ids`` not already finishing, now finishing."""
        out = []
        for i in job_ids:
            j = self.jobs.get(int(i))
            if j is None or j.state == JobState.FINISHING:
                continue
            if j.state == JobState.EXECUTING:
                self.in_flight -= 1
            j.state = JobState.FINISHING
            out.append(j)
        return out

    def failing(self, jobs: Sequence[Job], retry_at: int | None, now: int
                ) -> tuple[list[Job], list[Job]]:
        """Jobs whose attempt failed: ``(aborted, retried)``. Out of attempts: finishing
        (aborted); the others wait for their backoff (or ``retry_at``, if later than now).
        The retried ones wait in ``retries`` only once :meth:`retry_later` is called (after
        their status rows commit)."""
        aborted: list[Job] = []
        retried: list[Job] = []
        for j in jobs:
            if j.state == JobState.EXECUTING:
                self.in_flight -= 1
            if self.options.max_attempts and j.attempt >= self.options.max_attempts:
                j.state = JobState.FINISHING
                aborted.append(j)
            else:
                j.state = JobState.WAITING
                j.due = (now + self.backoff(j.attempt) if retry_at is None
                         else max(now, int(retry_at)))
                retried.append(j)
        return aborted, retried

    def retry_later(self, jobs: Sequence[Job]) -> None:
        """Schedule waiting jobs for their due time."""
        for j in jobs:
            heapq.heappush(self.retries, (j.due, j.job_id))

    def backoff(self, attempt: int) -> int:
        """The wait after failed attempt ``attempt`` (ns): doubling, jittered, clamped."""
        o = self.options
        delay = o.min_backoff * (2 ** min(attempt - 1, 30)) * random.uniform(0.67, 1.33)
        delay = max(o.min_backoff, delay)
        if o.max_backoff:
            delay = min(o.max_backoff, delay)
        return int(delay * NS)

    def done(self, job: Job, *, was_executing: bool = False) -> None:
        """Forget a job whose terminal row committed; let its key's next job run."""
        if was_executing:
            self.in_flight -= 1
        del self.jobs[job.job_id]
        left = self.outstanding.get(job.n, 1) - 1
        self.outstanding[job.n] = left
        keyq = self.keys[job.key]
        if keyq[0] == job.job_id:
            keyq.popleft()
        else:
            keyq.remove(job.job_id)
        if not keyq:
            del self.keys[job.key]
        else:
            nxt = self.jobs[keyq[0]]
            self.push(nxt)

    # -- timers ----------------------------------------------------------------------------

    def timers(self) -> list[Job]:
        """Retries that are due become ready; returns the executing jobs past ack_wait
        (the consumer fails them)."""
        now = self.clock()
        while self.retries and self.retries[0][0] <= now:
            _, jid = heapq.heappop(self.retries)
            job = self.jobs.get(jid)
            if job is not None and job.state == JobState.WAITING and job.due <= now:
                job.state = JobState.READY
                self.push(job)
        expired = []
        while self.deadlines and self.deadlines[0][0] <= now:
            _, jobs, attempts = self.deadlines.popleft()
            for job, attempt in zip(jobs, attempts, strict=True):
                if job.state == JobState.EXECUTING and job.attempt == attempt and (
                        self.jobs.get(job.job_id) is job):
                    expired.append(job)
        return expired

    def sleep_for(self, poll_interval: float) -> float:
        """Seconds until the next retry or deadline, at most ``poll_interval``."""
        now = self.clock()
        until = poll_interval
        if self.retries:
            until = min(until, max(0.0, (self.retries[0][0] - now) / NS))
        if self.deadlines:
            until = min(until, max(0.0, (self.deadlines[0][0] - now) / NS))
        return max(until, 0.001)

    def blocked_keys(self) -> list[str]:
        """Keys whose first pending job failed and waits for its retry, holding back
        later jobs of the key."""
        out = []
        for key, keyq in self.keys.items():
            head = self.jobs[keyq[0]]
            if head.state == JobState.WAITING and key not in self.hot:
                out.append(key)
        return out

    def summary(self) -> dict[str, Any]:
        """Pending and in-flight counts, blocked and hot keys, the 20 largest keys."""
        per_key = sorted(((k, len(q)) for k, q in self.keys.items()), key=lambda kv: -kv[1])
        return {
            "pending": len(self.jobs),
            "in_flight": self.in_flight,
            "blocked_keys": self.blocked_keys(),
            "hot_keys": sorted(self.hot),
            "pending_per_key": dict(per_key[:20]),
        }

    def export(self, labels: tuple[str, str, str]) -> None:
        """Set the pending-job gauges of ``(keyspace, shard, queue)``."""
        metrics.SEG_PENDING.labels(*labels).set(len(self.jobs))
        metrics.SEG_IN_FLIGHT.labels(*labels).set(self.in_flight)
        metrics.SEG_BLOCKED_KEYS.labels(*labels).set(len(self.blocked_keys()))
        metrics.SEG_HOT_KEYS.labels(*labels).set(len(self.hot))
