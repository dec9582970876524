"""Queue batches to and from their protobuf messages (transport only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardgate.api.grpc import convert
from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.queues.events import QueueBatch, QueueEvent


def batch_response(batch: QueueBatch) -> pb.QueueReceiveResponse:
    return pb.QueueReceiveResponse(
        fields=[pb.Field(name=f) for f in batch.fields],
        events=[
            pb.QueueEvent(shard=e.shard, id=e.id, epoch=e.epoch, time_scheduled=e.time_scheduled,
                          priority=e.priority, values=[convert.to_value(v) for v in e.values])
            for e in batch.events
        ],
    )


def enqueue_response(
    session_id: int, refs: Sequence[tuple[str, int]], in_transaction: bool
) -> pb.QueueEnqueueResponse:
    return pb.QueueEnqueueResponse(
        session_id=session_id, in_transaction=in_transaction,
        jobs=[pb.QueueJobRef(shard=shard, id=job_id) for shard, job_id in refs])


def jobs_of(jobs: Sequence[tuple[Any, str | None]]) -> list[pb.QueueJob]:
    return [pb.QueueJob(key=convert.to_value(k), payload=p) for k, p in jobs]


def batch_of(keyspace: str, queue: str, response: pb.QueueReceiveResponse) -> QueueBatch:
    return QueueBatch(
        keyspace, queue, [f.name for f in response.fields],
        [QueueEvent(e.id, e.shard, e.epoch, e.time_scheduled, e.priority,
                    tuple(convert.from_value(v) for v in e.values)) for e in response.events],
    )
