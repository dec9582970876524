"""Inbox messages, reads and options to and from their protobuf messages (transport only)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardgate.api.grpc import convert
from shardgate.api.grpc import shardgate_pb2 as pb
from shardgate.errors import InvalidArgument
from shardgate.queues.inbox.model import InboxOptions, Message, Pointer
from shardgate.queues.inbox.store import InboxRead, MaintainReport


def message_pb(m: Message) -> pb.InboxMessage:
    return pb.InboxMessage(user=convert.to_value(m.user), ts=m.ts, msg_id=m.msg_id, body=m.body)


def message_of(m: pb.InboxMessage) -> Message:
    return Message(convert.from_value(m.user), m.ts, m.msg_id,
                   m.body if m.HasField("body") else None)


def read_response(r: InboxRead) -> pb.InboxReadResponse:
    return pb.InboxReadResponse(messages=[message_pb(m) for m in r.messages],
                                pointer=r.pointer.encode() if r.pointer is not None else None,
                                more=r.more)


def read_of(response: pb.InboxReadResponse) -> InboxRead:
    pointer = Pointer.decode(response.pointer) if response.HasField("pointer") else None
    return InboxRead([message_of(m) for m in response.messages], pointer, response.more)


def report_response(report: MaintainReport) -> pb.InboxReportResponse:
    return pb.InboxReportResponse(report_json=json.dumps(
        {"created": report.created, "dropped": report.dropped}))


def report_of(response: pb.InboxReportResponse) -> MaintainReport:
    doc = json.loads(response.report_json)
    return MaintainReport(created=list(doc["created"]), dropped=list(doc["dropped"]))


def options_json(options: InboxOptions | Mapping[str, Any] | None) -> str:
    """The options a client sends with a create ("" for none: defaults or stored)."""
    if options is None:
        return ""
    if isinstance(options, InboxOptions):
        return json.dumps(options.stored())
    return json.dumps(dict(options))


def options_of(text: str) -> InboxOptions | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"inbox options are not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("inbox options must be a JSON object")
    return InboxOptions.from_mapping(doc, path="inbox options")
