"""Cache invalidation with event tokens, on Redis (the Update Stream design's algorithms).

A cache entry is JSON ``{"t": <token>, "v": <value>}`` or, token only,
``{"t": <token>}``: "the row changed at ``t``; no value cached yet".

**The invalidation process** (:class:`Invalidator`) follows the change
stream and, for every changed row, compares-and-sets its entry (Redis
``WATCH``/``MULTI``):

* no entry: store the token, without value (a reader still holding an older
  read cannot add it afterwards);
* entry with an older token: replace it by the token alone (clears the value);
* entry with a newer (or equal) token: the cached data already includes the
  change; nothing to do;
* comparison unknown: invalidate (token alone).

**The read path** (:class:`CachedReader`):

* entry with a value: return it;
* every database read is retried until it returns an exact event token (see
  ``Tablet.execute``: the token is returned only when no change of the shard
  committed between it and the read), so a returned value is never newer than
  its label;
* no entry: read the database with ``include_event_token`` and add the value
  with that token only if there is still no entry (or the entry is known older);
* token-only entry: read the database with ``compare_event_token`` (the
  entry's token) and ``include_event_token``; if the data is known fresher,
  replace the token-only entry by the value and the new token. Either way
  return what was read.

Invariant: an entry only ever moves to a token known to be newer (or to a
token-only entry), so a reader never gets, from the cache, a value older than
what the cache (or the database through this path) gave before.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from shardgate.event_token import EventToken, Freshness, compare
from shardgate.ports import TRUSTED, SessionGate
from shardgate.result import ExecuteOptions
from shardgate.streams.merge import RowEvent, StreamEvent

KeyOf = Callable[[RowEvent], str | None]

#: database reads per get() until one comes with an exact event token
EXACT_ATTEMPTS = 20


def default_key(prefix: str = "sg:") -> KeyOf:
    """``<prefix><keyspace>.<table>:<pk1>:<pk2>...`` for every row event."""

    def key_of(row: RowEvent) -> str:
        return f"{prefix}{row.keyspace}.{row.table}:" + ":".join(str(v) for v in row.pk)

    return key_of


def _load(raw: bytes | str | None) -> tuple[EventToken | None, bool, Any]:
    """(token, has value, value) of a stored entry; (None, False, None) when absent."""
    if raw is None:
        return None, False, None
    doc = json.loads(raw)
    return EventToken.parse(doc["t"]), "v" in doc, doc.get("v")


def _dump(token: EventToken, *value: Any) -> str:
    doc: dict[str, Any] = {"t": token.serialize()}
    if value:
        doc["v"] = value[0]
    return json.dumps(doc, default=str)


class Invalidator:
    """The invalidation process: apply each change's token to its cache entry."""

    def __init__(
        self, redis: aioredis.Redis, *, key_of: KeyOf | None = None, ttl_s: int | None = None
    ) -> None:
        self.redis = redis
        self.key_of = key_of or default_key()
        self.ttl_s = ttl_s
        #: row changes applied so far (for tests and metrics)
        self.applied = 0

    async def run(self, events: AsyncIterator[StreamEvent]) -> None:
        """Apply a change stream until it ends (or the task is cancelled)."""
        async for event in events:
            await self.apply(event)

    async def apply(self, event: StreamEvent) -> None:
        for row in event.rows():
            key = self.key_of(row)
            if key is not None:
                await self.invalidate(key, row.token)
            self.applied += 1

    async def invalidate(self, key: str, token: EventToken) -> None:
        """Compare-and-set one entry to "changed at ``token``" (see the module docstring)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    cached, _has, _value = _load(await pipe.get(key))
                    if cached is not None and compare(cached, token) in (
                        Freshness.NEWER,
                        Freshness.EQUAL,
                    ):
                        await pipe.unwatch()  # type: ignore[no-untyped-call]
                        return  # the cached data already includes this change
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, _dump(token), ex=self.ttl_s)
                    await pipe.execute()
                    return
                except WatchError:
                    continue  # someone changed the entry: look again


class CachedReader:
    """The application read path: cache first, the gate with event tokens otherwise."""

    def __init__(
        self, redis: aioredis.Redis, gate: SessionGate, *, keyspace: str | None = None,
        ttl_s: int | None = None, exact_attempts: int = EXACT_ATTEMPTS,
    ) -> None:
        self.redis = redis
        self.gate = gate
        self.keyspace = keyspace
        self.ttl_s = ttl_s
        self.exact_attempts = exact_attempts

    async def get(self, key: str, sql: str, bind_vars: Mapping[str, Any] | None = None) -> Any:
        """The value of ``key``: the first row of ``sql`` as a list (None if no row)."""
        cached, has_value, value = _load(await self.redis.get(key))
        if has_value:
            return value
        options = ExecuteOptions(include_event_token=True, compare_event_token=cached)
        session = self.gate.session(self.keyspace or None, identity=TRUSTED)
        for _ in range(self.exact_attempts):
            # Only a read with an exact token may be returned: a value returned without
            # one could be newer than a cached value of the same token, which a later
            # get() would then return (a reader going back in time).
            result = await self.gate.execute(session, sql, bind_vars, options=options)
            if result.event_token is not None:
                break
        fresh = [list(result.rows[0])] if result.rows else [None]
        read = json.loads(json.dumps(fresh[0], default=str))
        token = result.event_token
        if token is None:
            return read  # several shards or no reader: do not cache
        if cached is not None and not result.fresher:
            return read  # the entry's change may not be in what we read
        await self._store(key, token, read)
        return read

    async def _store(self, key: str, token: EventToken, value: Any) -> None:
        """Store ``value`` at ``token`` unless the entry is (known) as new or newer."""
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    cached, has_value, _v = _load(await pipe.get(key))
                    if cached is not None:
                        order = compare(token, cached)
                        newer = order is Freshness.NEWER or (
                            order is Freshness.EQUAL and not has_value
                        )
                        if not newer:
                            await pipe.unwatch()  # type: ignore[no-untyped-call]
                            return
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, _dump(token, value), ex=self.ttl_s)
                    await pipe.execute()
                    return
                except WatchError:
                    continue
