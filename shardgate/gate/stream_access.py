"""Which rows of a change stream its reader may see (the table ACL on streams).

A change stream carries every table its shards' logs name: the VSchema's
tables, and tables created directly on a shard database that no VSchema
lists. Each row change is checked on its own, against the reader's role on
the table it names (:meth:`TableACL.role`, the rule every statement follows):
the reader role is needed, and a table no ACL group names is denied.

The stream is **filtered**, not refused: a transaction is delivered with the
changes its reader may see, and with none when it touched only tables the
reader may not read. Its token still advances the reader's position, so a
resumed stream neither reports a gap nor sends the hidden changes later. A
reader who may read no table of the keyspace's VSchema is refused the stream
(``PERMISSION_DENIED``) before it starts.

Without an ACL, or for the gate's own in-process callers (identity None),
nothing is filtered. In dry-run mode nothing is filtered either (a reader who
may read no table is logged and counted, as dry run does for statements).
Events are never changed in place (a stream's events may be shared): a
filtered event is a copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable

from shardgate.auth.acl import Role, TableACL
from shardgate.auth.guard import DENIALS, Guard
from shardgate.auth.identity import Identity
from shardgate.streams.merge import StreamEvent


def check_stream_reader(
    guard: Guard, identity: Identity | None, keyspace: str, tables: Iterable[str]
) -> TableACL | None:
    """The ACL the stream of ``keyspace`` is filtered with (None: no filtering).

    Raises ``PERMISSION_DENIED`` (naming a table) when ``identity`` may read none
    of ``tables`` (the keyspace's VSchema tables).
    """
    acl = guard.acl
    if identity is None or acl is None:
        return None
    names = sorted(tables)
    if names and not any(_readable(acl, identity.user, keyspace, t) for t in names):
        guard.require(identity, keyspace, names[:1], Role.READER)  # raises (or logs: dry run)
    return None if guard.dry_run else acl


async def readable_events(
    events: AsyncIterator[StreamEvent], acl: TableACL, identity: Identity, keyspace: str
) -> AsyncIterator[StreamEvent]:
    """``events`` with each change of a table ``identity`` may not read left out."""
    user = identity.user
    hidden: set[str] = set()
    try:
        async for event in events:
            if event.changes:
                kept = [c for c in event.changes if _readable(acl, user, keyspace, c.table)]
                if len(kept) != len(event.changes):
                    for c in event.changes:
                        if c.table not in hidden and not _readable(acl, user, keyspace, c.table):
                            hidden.add(c.table)
                            DENIALS.labels(Role.READER.label, "false").inc()
                    event = dataclasses.replace(event, changes=kept)
            yield event
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _readable(acl: TableACL, user: str, keyspace: str, table: str) -> bool:
    role = acl.role(user, keyspace, table)
    return role is not None and role >= Role.READER
