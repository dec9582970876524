from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("null_value", "int64_value", "uint64_value", "double_value", "string_value", "bytes_value", "bool_value")
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
    null_value: Value.Null
    int64_value: int
    uint64_value: int
    double_value: float
    string_value: str
    bytes_value: bytes
    bool_value: bool
    def __init__(self, null_value: _Optional[_Union[Value.Null, _Mapping]] = ..., int64_value: _Optional[int] = ..., uint64_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., bool_value: _Optional[bool] = ...) -> None: ...

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

class ExecuteResponse(_message.Message):
    __slots__ = ("session_id", "fields", "rows", "rows_affected", "insert_id", "in_transaction")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_AFFECTED_FIELD_NUMBER: _ClassVar[int]
    INSERT_ID_FIELD_NUMBER: _ClassVar[int]
    IN_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    rows_affected: int
    insert_id: int
    in_transaction: bool
    def __init__(self, session_id: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., rows_affected: _Optional[int] = ..., insert_id: _Optional[int] = ..., in_transaction: _Optional[bool] = ...) -> None: ...

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

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
