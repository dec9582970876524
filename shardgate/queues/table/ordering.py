"""Per-key ordering of a queue manager's events (:class:`KeyOrder`), with its circuit breaker.

Invariants
----------
1. At most one event per ordering key is in flight: ``owner[key]`` is its id; the key's
   later events wait in ``waiting[key]`` (in scan order) until the owner is acked or failed
   (:meth:`KeyOrder.release` hands the next one back to the window, due now at the latest).
2. A key with more than ``hot_key_threshold`` waiting events is *hot*: ordering is off for
   it during ``hot_key_cooldown`` seconds (``hot``), and its waiting events go back to the
   window at once, so one hot key cannot stall the shard.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from shardgate.queues.options import QueueOptions
from shardgate.queues.table.window import Event

log = logging.getLogger(__name__)


class KeyOrder:
    """The ordering keys of one queue manager (see the module docstring)."""

    def __init__(self, options: QueueOptions, name: str, clock: Callable[[], int],
                 push: Callable[[Event], None]) -> None:
        self.options = options
        self.name = name
        self._clock = clock
        self._push = push
        #: ordering is on (the queue has an ordering key)
        self.enabled = bool(options.ordering_key)
        self.owner: dict[Any, int] = {}
        self.waiting: dict[Any, collections.deque[Event]] = {}
        self.hot: dict[Any, float] = {}

    def release(self, key: Any) -> None:
        """``key``'s owner is done: its next waiting event may go (due now at the latest)."""
        self.owner.pop(key, None)
        waiting = self.waiting.get(key)
        if waiting:
            nxt = waiting.popleft()
            if not waiting:
                del self.waiting[key]
            nxt.due = min(nxt.due, self._clock())
            self._push(nxt)

    def release_owned_by(self, eid: int) -> None:
        """Release every key event ``eid`` owns (an event not in memory, e.g. fired
        before a restart, may still own its key)."""
        for k, owner in list(self.owner.items()):
            if owner == eid:
                self.release(k)

    def ordered(self, key: Any) -> bool:
        """Whether ``key``'s events go one at a time now (not None, not hot)."""
        if key is None:
            return False
        until = self.hot.get(key)
        if until is None:
            return True
        if time.monotonic() >= until:
            del self.hot[key]
            return True
        return False

    def takes(self, ev: Event) -> bool:
        """Whether ``ev`` now owns its key (ordering on for the key): the manager's
        fires call it for each event they take."""
        if self.enabled and self.ordered(ev.key):
            self.owner[ev.key] = ev.id
            return True
        return False

    def blocked(self, ev: Event) -> bool:
        """True (and the event parked) if another event of its key is in flight."""
        if not self.enabled or not self.ordered(ev.key):
            return False
        owner = self.owner.get(ev.key)
        if owner is None or owner == ev.id:
            return False
        waiting = self.waiting.setdefault(ev.key, collections.deque())
        waiting.append(ev)
        if len(waiting) > self.options.hot_key_threshold:
            # Circuit breaker: one hot key must not stall the shard.
            log.warning("queue %s: key %r is hot (%d waiting); ordering off for %ss",
                        self.name, ev.key, len(waiting), self.options.hot_key_cooldown)
            self.hot[ev.key] = time.monotonic() + self.options.hot_key_cooldown
            del self.waiting[ev.key]
            for w in waiting:
                self._push(w)
        return True

    def blocked_keys(self) -> int:
        """Keys with waiting events, plus the owned keys among them (as the manager's
        statistics always counted them)."""
        return len(self.waiting) + len([k for k in self.owner if k in self.waiting])
