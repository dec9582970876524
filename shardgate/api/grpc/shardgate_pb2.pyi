from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("null_value", "int64_value", "uint64_value", "double_value", "string_value", "bytes_value", "bool_value", "decimal_value", "date_value", "time_value", "datetime_value", "uuid_value")
    class Null(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT64_VALUE_FIELD_NUMBER: _ClassVar[int]
    UINT64_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    DATE_VALUE_FIELD_NUMBER: _ClassVar[int]
    TIME_VALUE_FIELD_NUMBER: _ClassVar[int]
    DATETIME_VALUE_FIELD_NUMBER: _ClassVar[int]
    UUID_VALUE_FIELD_NUMBER: _ClassVar[int]
    null_value: Value.Null
    int64_value: int
    uint64_value: int
    double_value: float
    string_value: str
    bytes_value: bytes
    bool_value: bool
    decimal_value: str
    date_value: str
    time_value: str
    datetime_value: str
    uuid_value: str
    def __init__(self, null_value: _Optional[_Union[Value.Null, _Mapping]] = ..., int64_value: _Optional[int] = ..., uint64_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., bool_value: _Optional[bool] = ..., decimal_value: _Optional[str] = ..., date_value: _Optional[str] = ..., time_value: _Optional[str] = ..., datetime_value: _Optional[str] = ..., uuid_value: _Optional[str] = ...) -> None: ...

class Field(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("session_id", "keyspace", "sql", "bind_vars", "include_event_token", "compare_event_token")
    class BindVarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    BIND_VARS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EVENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPARE_EVENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    keyspace: str
    sql: str
    bind_vars: _containers.MessageMap[str, Value]
    include_event_token: bool
    compare_event_token: EventToken
    def __init__(self, session_id: _Optional[int] = ..., keyspace: _Optional[str] = ..., sql: _Optional[str] = ..., bind_vars: _Optional[_Mapping[str, Value]] = ..., include_event_token: _Optional[bool] = ..., compare_event_token: _Optional[_Union[EventToken, _Mapping]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("session_id", "fields", "rows", "rows_affected", "insert_id", "in_transaction", "event_token", "fresher", "error_code", "error_message")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_AFFECTED_FIELD_NUMBER: _ClassVar[int]
    INSERT_ID_FIELD_NUMBER: _ClassVar[int]
    IN_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    EVENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FRESHER_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    rows_affected: int
    insert_id: int
    in_transaction: bool
    event_token: EventToken
    fresher: bool
    error_code: str
    error_message: str
    def __init__(self, session_id: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., rows_affected: _Optional[int] = ..., insert_id: _Optional[int] = ..., in_transaction: _Optional[bool] = ..., event_token: _Optional[_Union[EventToken, _Mapping]] = ..., fresher: _Optional[bool] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class BoundQuery(_message.Message):
    __slots__ = ("sql", "bind_vars")
    class BindVarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    SQL_FIELD_NUMBER: _ClassVar[int]
    BIND_VARS_FIELD_NUMBER: _ClassVar[int]
    sql: str
    bind_vars: _containers.MessageMap[str, Value]
    def __init__(self, sql: _Optional[str] = ..., bind_vars: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class QueryError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: ExecuteResponse
    error: QueryError
    def __init__(self, result: _Optional[_Union[ExecuteResponse, _Mapping]] = ..., error: _Optional[_Union[QueryError, _Mapping]] = ...) -> None: ...

class ExecuteBatchRequest(_message.Message):
    __slots__ = ("session_id", "keyspace", "queries", "as_transaction")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    AS_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    keyspace: str
    queries: _containers.RepeatedCompositeFieldContainer[BoundQuery]
    as_transaction: bool
    def __init__(self, session_id: _Optional[int] = ..., keyspace: _Optional[str] = ..., queries: _Optional[_Iterable[_Union[BoundQuery, _Mapping]]] = ..., as_transaction: _Optional[bool] = ...) -> None: ...

class ExecuteBatchResponse(_message.Message):
    __slots__ = ("session_id", "results")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, session_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class StreamExecuteRequest(_message.Message):
    __slots__ = ("session_id", "keyspace", "sql", "bind_vars")
    class BindVarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    BIND_VARS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    keyspace: str
    sql: str
    bind_vars: _containers.MessageMap[str, Value]
    def __init__(self, session_id: _Optional[int] = ..., keyspace: _Optional[str] = ..., sql: _Optional[str] = ..., bind_vars: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class StreamExecuteResponse(_message.Message):
    __slots__ = ("session_id", "fields", "rows", "rows_affected", "insert_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_AFFECTED_FIELD_NUMBER: _ClassVar[int]
    INSERT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    rows_affected: int
    insert_id: int
    def __init__(self, session_id: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., rows_affected: _Optional[int] = ..., insert_id: _Optional[int] = ...) -> None: ...

class ExplainPlanRequest(_message.Message):
    __slots__ = ("session_id", "keyspace", "sql")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    keyspace: str
    sql: str
    def __init__(self, session_id: _Optional[int] = ..., keyspace: _Optional[str] = ..., sql: _Optional[str] = ...) -> None: ...

class ExplainPlanResponse(_message.Message):
    __slots__ = ("plan_json",)
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    plan_json: str
    def __init__(self, plan_json: _Optional[str] = ...) -> None: ...

class GetVSchemaRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetVSchemaResponse(_message.Message):
    __slots__ = ("vschema_json",)
    VSCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    vschema_json: str
    def __init__(self, vschema_json: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueEvent(_message.Message):
    __slots__ = ("shard", "id", "epoch", "time_scheduled", "priority", "values")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIME_SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    shard: str
    id: int
    epoch: int
    time_scheduled: int
    priority: int
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, shard: _Optional[str] = ..., id: _Optional[int] = ..., epoch: _Optional[int] = ..., time_scheduled: _Optional[int] = ..., priority: _Optional[int] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class QueueReceiveRequest(_message.Message):
    __slots__ = ("keyspace", "queue", "shard", "key_range", "max_batch")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    queue: str
    shard: str
    key_range: str
    max_batch: int
    def __init__(self, keyspace: _Optional[str] = ..., queue: _Optional[str] = ..., shard: _Optional[str] = ..., key_range: _Optional[str] = ..., max_batch: _Optional[int] = ...) -> None: ...

class QueueReceiveResponse(_message.Message):
    __slots__ = ("fields", "events")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    events: _containers.RepeatedCompositeFieldContainer[QueueEvent]
    def __init__(self, fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[QueueEvent, _Mapping]]] = ...) -> None: ...

class QueueAckRequest(_message.Message):
    __slots__ = ("keyspace", "queue", "shard", "ids")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    queue: str
    shard: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keyspace: _Optional[str] = ..., queue: _Optional[str] = ..., shard: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class QueueAckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class QueueStatsRequest(_message.Message):
    __slots__ = ("keyspace", "queue")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    queue: str
    def __init__(self, keyspace: _Optional[str] = ..., queue: _Optional[str] = ...) -> None: ...

class QueueStatsResponse(_message.Message):
    __slots__ = ("stats_json",)
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    stats_json: str
    def __init__(self, stats_json: _Optional[str] = ...) -> None: ...

class QueueJob(_message.Message):
    __slots__ = ("key", "payload")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    key: Value
    payload: str
    def __init__(self, key: _Optional[_Union[Value, _Mapping]] = ..., payload: _Optional[str] = ...) -> None: ...

class QueueJobRef(_message.Message):
    __slots__ = ("shard", "id")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    shard: str
    id: int
    def __init__(self, shard: _Optional[str] = ..., id: _Optional[int] = ...) -> None: ...

class QueueEnqueueRequest(_message.Message):
    __slots__ = ("session_id", "keyspace", "queue", "jobs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    keyspace: str
    queue: str
    jobs: _containers.RepeatedCompositeFieldContainer[QueueJob]
    def __init__(self, session_id: _Optional[int] = ..., keyspace: _Optional[str] = ..., queue: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[QueueJob, _Mapping]]] = ...) -> None: ...

class QueueEnqueueResponse(_message.Message):
    __slots__ = ("session_id", "jobs", "in_transaction")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    IN_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    jobs: _containers.RepeatedCompositeFieldContainer[QueueJobRef]
    in_transaction: bool
    def __init__(self, session_id: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[QueueJobRef, _Mapping]]] = ..., in_transaction: _Optional[bool] = ...) -> None: ...

class QueueNackRequest(_message.Message):
    __slots__ = ("keyspace", "queue", "shard", "ids", "reason", "retry_at_ns")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_NS_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    queue: str
    shard: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    retry_at_ns: int
    def __init__(self, keyspace: _Optional[str] = ..., queue: _Optional[str] = ..., shard: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., retry_at_ns: _Optional[int] = ...) -> None: ...

class QueueNackResponse(_message.Message):
    __slots__ = ("nacked",)
    NACKED_FIELD_NUMBER: _ClassVar[int]
    nacked: int
    def __init__(self, nacked: _Optional[int] = ...) -> None: ...

class InboxCreateRequest(_message.Message):
    __slots__ = ("keyspace", "name", "options_json")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    name: str
    options_json: str
    def __init__(self, keyspace: _Optional[str] = ..., name: _Optional[str] = ..., options_json: _Optional[str] = ...) -> None: ...

class InboxReportResponse(_message.Message):
    __slots__ = ("report_json",)
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    def __init__(self, report_json: _Optional[str] = ...) -> None: ...

class InboxMaintainRequest(_message.Message):
    __slots__ = ("keyspace", "name")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    name: str
    def __init__(self, keyspace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class InboxMessage(_message.Message):
    __slots__ = ("user", "ts", "msg_id", "body")
    USER_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    user: Value
    ts: int
    msg_id: int
    body: str
    def __init__(self, user: _Optional[_Union[Value, _Mapping]] = ..., ts: _Optional[int] = ..., msg_id: _Optional[int] = ..., body: _Optional[str] = ...) -> None: ...

class InboxAppendRequest(_message.Message):
    __slots__ = ("session_id", "keyspace", "name", "user", "body", "ts")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    keyspace: str
    name: str
    user: Value
    body: str
    ts: int
    def __init__(self, session_id: _Optional[int] = ..., keyspace: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[_Union[Value, _Mapping]] = ..., body: _Optional[str] = ..., ts: _Optional[int] = ...) -> None: ...

class InboxAppendResponse(_message.Message):
    __slots__ = ("session_id", "message", "in_transaction")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IN_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    message: InboxMessage
    in_transaction: bool
    def __init__(self, session_id: _Optional[int] = ..., message: _Optional[_Union[InboxMessage, _Mapping]] = ..., in_transaction: _Optional[bool] = ...) -> None: ...

class InboxReadRequest(_message.Message):
    __slots__ = ("keyspace", "name", "user", "after", "consumer", "limit")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    name: str
    user: Value
    after: str
    consumer: str
    limit: int
    def __init__(self, keyspace: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[_Union[Value, _Mapping]] = ..., after: _Optional[str] = ..., consumer: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class InboxReadResponse(_message.Message):
    __slots__ = ("messages", "pointer", "more")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    POINTER_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[InboxMessage]
    pointer: str
    more: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[InboxMessage, _Mapping]]] = ..., pointer: _Optional[str] = ..., more: _Optional[bool] = ...) -> None: ...

class InboxCommitRequest(_message.Message):
    __slots__ = ("keyspace", "name", "user", "consumer", "pointer")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    POINTER_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    name: str
    user: Value
    consumer: str
    pointer: str
    def __init__(self, keyspace: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[_Union[Value, _Mapping]] = ..., consumer: _Optional[str] = ..., pointer: _Optional[str] = ...) -> None: ...

class InboxCommitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InboxCommittedRequest(_message.Message):
    __slots__ = ("keyspace", "name", "user", "consumer")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    name: str
    user: Value
    consumer: str
    def __init__(self, keyspace: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[_Union[Value, _Mapping]] = ..., consumer: _Optional[str] = ...) -> None: ...

class InboxCommittedResponse(_message.Message):
    __slots__ = ("pointer",)
    POINTER_FIELD_NUMBER: _ClassVar[int]
    pointer: str
    def __init__(self, pointer: _Optional[str] = ...) -> None: ...

class InboxListRequest(_message.Message):
    __slots__ = ("keyspace",)
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    def __init__(self, keyspace: _Optional[str] = ...) -> None: ...

class InboxListResponse(_message.Message):
    __slots__ = ("inboxes_json",)
    INBOXES_JSON_FIELD_NUMBER: _ClassVar[int]
    inboxes_json: str
    def __init__(self, inboxes_json: _Optional[str] = ...) -> None: ...

class InboxStatsRequest(_message.Message):
    __slots__ = ("keyspace", "name", "counts")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    name: str
    counts: bool
    def __init__(self, keyspace: _Optional[str] = ..., name: _Optional[str] = ..., counts: _Optional[bool] = ...) -> None: ...

class InboxStatsResponse(_message.Message):
    __slots__ = ("stats_json",)
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    stats_json: str
    def __init__(self, stats_json: _Optional[str] = ...) -> None: ...

class EventToken(_message.Message):
    __slots__ = ("timestamp", "shard", "position")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    timestamp: float
    shard: str
    position: str
    def __init__(self, timestamp: _Optional[float] = ..., shard: _Optional[str] = ..., position: _Optional[str] = ...) -> None: ...

class RowChange(_message.Message):
    __slots__ = ("table", "op", "pk", "before", "after", "has_before", "has_after")
    class BeforeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    class AfterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PK_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    HAS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    HAS_AFTER_FIELD_NUMBER: _ClassVar[int]
    table: str
    op: str
    pk: _containers.RepeatedCompositeFieldContainer[Value]
    before: _containers.MessageMap[str, Value]
    after: _containers.MessageMap[str, Value]
    has_before: bool
    has_after: bool
    def __init__(self, table: _Optional[str] = ..., op: _Optional[str] = ..., pk: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., before: _Optional[_Mapping[str, Value]] = ..., after: _Optional[_Mapping[str, Value]] = ..., has_before: _Optional[bool] = ..., has_after: _Optional[bool] = ...) -> None: ...

class UpdateStreamRequest(_message.Message):
    __slots__ = ("keyspace", "key_range", "start_timestamp", "start_position", "heartbeat_seconds")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    key_range: str
    start_timestamp: float
    start_position: str
    heartbeat_seconds: float
    def __init__(self, keyspace: _Optional[str] = ..., key_range: _Optional[str] = ..., start_timestamp: _Optional[float] = ..., start_position: _Optional[str] = ..., heartbeat_seconds: _Optional[float] = ...) -> None: ...

class UpdateStreamResponse(_message.Message):
    __slots__ = ("keyspace", "shard", "token", "changes", "safe_timestamp", "heartbeat")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    SAFE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    shard: str
    token: EventToken
    changes: _containers.RepeatedCompositeFieldContainer[RowChange]
    safe_timestamp: float
    heartbeat: bool
    def __init__(self, keyspace: _Optional[str] = ..., shard: _Optional[str] = ..., token: _Optional[_Union[EventToken, _Mapping]] = ..., changes: _Optional[_Iterable[_Union[RowChange, _Mapping]]] = ..., safe_timestamp: _Optional[float] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class TabletExecuteRequest(_message.Message):
    __slots__ = ("sql", "params", "transaction_id", "include_event_token", "compare_event_token", "write_verb", "write_table")
    SQL_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EVENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPARE_EVENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WRITE_VERB_FIELD_NUMBER: _ClassVar[int]
    WRITE_TABLE_FIELD_NUMBER: _ClassVar[int]
    sql: str
    params: _containers.RepeatedCompositeFieldContainer[Value]
    transaction_id: int
    include_event_token: bool
    compare_event_token: EventToken
    write_verb: str
    write_table: str
    def __init__(self, sql: _Optional[str] = ..., params: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., transaction_id: _Optional[int] = ..., include_event_token: _Optional[bool] = ..., compare_event_token: _Optional[_Union[EventToken, _Mapping]] = ..., write_verb: _Optional[str] = ..., write_table: _Optional[str] = ...) -> None: ...

class TabletInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TabletInfoResponse(_message.Message):
    __slots__ = ("keyspace", "shard", "dialect", "placeholder", "supports_twopc", "collation", "lease_holder", "gives_wire")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    DIALECT_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_TWOPC_FIELD_NUMBER: _ClassVar[int]
    COLLATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    GIVES_WIRE_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    shard: str
    dialect: str
    placeholder: str
    supports_twopc: bool
    collation: str
    lease_holder: bool
    gives_wire: bool
    def __init__(self, keyspace: _Optional[str] = ..., shard: _Optional[str] = ..., dialect: _Optional[str] = ..., placeholder: _Optional[str] = ..., supports_twopc: _Optional[bool] = ..., collation: _Optional[str] = ..., lease_holder: _Optional[bool] = ..., gives_wire: _Optional[bool] = ...) -> None: ...

class TabletWireResponse(_message.Message):
    __slots__ = ("columns", "rows", "size")
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedScalarFieldContainer[bytes]
    rows: _containers.RepeatedScalarFieldContainer[bytes]
    size: int
    def __init__(self, columns: _Optional[_Iterable[bytes]] = ..., rows: _Optional[_Iterable[bytes]] = ..., size: _Optional[int] = ...) -> None: ...

class TabletTransactionRequest(_message.Message):
    __slots__ = ("transaction_id", "gate_id", "caller")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    transaction_id: int
    gate_id: str
    caller: str
    def __init__(self, transaction_id: _Optional[int] = ..., gate_id: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class TabletTwopcRequest(_message.Message):
    __slots__ = ("transaction_id", "xid", "gate_id", "caller")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    transaction_id: int
    xid: str
    gate_id: str
    caller: str
    def __init__(self, transaction_id: _Optional[int] = ..., xid: _Optional[str] = ..., gate_id: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class TabletListPreparedRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class TabletListPreparedResponse(_message.Message):
    __slots__ = ("xids",)
    XIDS_FIELD_NUMBER: _ClassVar[int]
    xids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, xids: _Optional[_Iterable[str]] = ...) -> None: ...

class TabletUpdateStreamRequest(_message.Message):
    __slots__ = ("position", "timestamp", "heartbeat_seconds")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    position: str
    timestamp: float
    heartbeat_seconds: float
    def __init__(self, position: _Optional[str] = ..., timestamp: _Optional[float] = ..., heartbeat_seconds: _Optional[float] = ...) -> None: ...

class TabletUpdateStreamResponse(_message.Message):
    __slots__ = ("heartbeat", "token", "changes", "watermark", "position")
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    heartbeat: bool
    token: EventToken
    changes: _containers.RepeatedCompositeFieldContainer[RowChange]
    watermark: float
    position: str
    def __init__(self, heartbeat: _Optional[bool] = ..., token: _Optional[_Union[EventToken, _Mapping]] = ..., changes: _Optional[_Iterable[_Union[RowChange, _Mapping]]] = ..., watermark: _Optional[float] = ..., position: _Optional[str] = ...) -> None: ...

class TabletHealthRequest(_message.Message):
    __slots__ = ("gate_id",)
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    gate_id: str
    def __init__(self, gate_id: _Optional[str] = ...) -> None: ...

class TabletHealthResponse(_message.Message):
    __slots__ = ("lease_holder", "serving")
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    lease_holder: bool
    serving: bool
    def __init__(self, lease_holder: _Optional[bool] = ..., serving: _Optional[bool] = ...) -> None: ...

class TabletQueueJob(_message.Message):
    __slots__ = ("key", "payload")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    key: str
    payload: str
    def __init__(self, key: _Optional[str] = ..., payload: _Optional[str] = ...) -> None: ...

class TabletQueueEnqueueRequest(_message.Message):
    __slots__ = ("queue", "jobs")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    jobs: _containers.RepeatedCompositeFieldContainer[TabletQueueJob]
    def __init__(self, queue: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[TabletQueueJob, _Mapping]]] = ...) -> None: ...

class TabletQueueEnqueueResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TabletTransactionResponse(_message.Message):
    __slots__ = ("transaction_id",)
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: int
    def __init__(self, transaction_id: _Optional[int] = ...) -> None: ...

class TabletQueueForgetRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class TabletQueueForgetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TabletLaneRequest(_message.Message):
    __slots__ = ("execute", "wire")
    EXECUTE_FIELD_NUMBER: _ClassVar[int]
    WIRE_FIELD_NUMBER: _ClassVar[int]
    execute: TabletExecuteRequest
    wire: bool
    def __init__(self, execute: _Optional[_Union[TabletExecuteRequest, _Mapping]] = ..., wire: _Optional[bool] = ...) -> None: ...

class TabletLaneResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "result", "wire", "rows", "rows_escaped")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    WIRE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_ESCAPED_FIELD_NUMBER: _ClassVar[int]
    error_code: str
    error_message: str
    result: ExecuteResponse
    wire: TabletWireResponse
    rows: bytes
    rows_escaped: bool
    def __init__(self, error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., result: _Optional[_Union[ExecuteResponse, _Mapping]] = ..., wire: _Optional[_Union[TabletWireResponse, _Mapping]] = ..., rows: _Optional[bytes] = ..., rows_escaped: _Optional[bool] = ...) -> None: ...
