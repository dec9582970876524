"""UpdateStream messages <-> :class:`~shardgate.streams.merge.StreamEvent` (transport only)."""

from __future__ import annotations

from typing import Any

from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.api.grpc.convert import from_value, to_value
from shardgate.backends.changes import RowChange
from shardgate.event_token import EventToken
from shardgate.streams.merge import StreamEvent


def _image(image: dict[str, Any] | None, typed: bool = False) -> dict[str, pb.Value]:
    return {} if image is None else {k: to_value(v, typed) for k, v in image.items()}


def change_message(c: RowChange, typed: bool = False) -> pb.RowChange:
    """A row change as its message (``typed``: see :func:`~shardgate.api.grpc.convert.to_value`)."""
    return pb.RowChange(
        table=c.table, op=c.op, pk=[to_value(v, typed) for v in c.pk],
        before=_image(c.before, typed), after=_image(c.after, typed),
        has_before=c.before is not None, has_after=c.after is not None,
    )


def change_of(c: pb.RowChange) -> RowChange:
    """The row change a message carries."""
    return RowChange(
        c.table, c.op, tuple(from_value(v) for v in c.pk),
        {k: from_value(v) for k, v in c.before.items()} if c.has_before else None,
        {k: from_value(v) for k, v in c.after.items()} if c.has_after else None,
    )


def event_response(event: StreamEvent) -> pb.UpdateStreamResponse:
    t = event.token
    return pb.UpdateStreamResponse(
        keyspace=event.keyspace,
        shard=event.shard,
        token=pb.EventToken(timestamp=t.timestamp, shard=t.shard, position=t.position),
        changes=[change_message(c) for c in event.changes],
        safe_timestamp=event.safe_timestamp,
        heartbeat=event.heartbeat,
    )


def event_of(response: pb.UpdateStreamResponse) -> StreamEvent:
    t = response.token
    return StreamEvent(
        keyspace=response.keyspace,
        shard=response.shard,
        token=EventToken(t.timestamp, t.shard, t.position),
        changes=[change_of(c) for c in response.changes],
        safe_timestamp=response.safe_timestamp,
        heartbeat=response.heartbeat,
    )
