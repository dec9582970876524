"""shardgate's errors as MySQL error numbers and SQLSTATEs, the values MySQL clients act on.

A :class:`~shardgate.errors.ShardgateError` carries a stable code; a few codes
cover several MySQL errors (``NOT_FOUND`` is an unknown table, column or
database), told apart by the kind the message names (the backends and the
planner word them ``unknown table 'x'``, ``unknown column 'x'``, ``keyspace
'x' does not exist``). The table is documented in ``docs/clients.md``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from shardgate.errors import Code, OutcomeUnknown, ShardgateError, SyntaxError_


class MysqlCode(NamedTuple):
    """A MySQL error number, its SQLSTATE and its symbol (for the docs)."""

    errno: int
    sqlstate: str
    symbol: str


PARSE = MysqlCode(1064, "42000", "ER_PARSE_ERROR")
NO_SUCH_TABLE = MysqlCode(1146, "42S02", "ER_NO_SUCH_TABLE")
BAD_FIELD = MysqlCode(1054, "42S22", "ER_BAD_FIELD_ERROR")
BAD_DB = MysqlCode(1049, "42000", "ER_BAD_DB_ERROR")
DUP_ENTRY = MysqlCode(1062, "23000", "ER_DUP_ENTRY")
TABLE_EXISTS = MysqlCode(1050, "42S01", "ER_TABLE_EXISTS_ERROR")
LOCK_WAIT_TIMEOUT = MysqlCode(1205, "HY000", "ER_LOCK_WAIT_TIMEOUT")
DEADLOCK = MysqlCode(1213, "40001", "ER_LOCK_DEADLOCK")
NOT_SUPPORTED = MysqlCode(1235, "42000", "ER_NOT_SUPPORTED_YET")
WRONG_ARGUMENTS = MysqlCode(1210, "HY000", "ER_WRONG_ARGUMENTS")
ROW_IS_REFERENCED = MysqlCode(1451, "23000", "ER_ROW_IS_REFERENCED_2")
ACCESS_DENIED = MysqlCode(1045, "28000", "ER_ACCESS_DENIED_ERROR")
TABLE_ACCESS_DENIED = MysqlCode(1142, "42000", "ER_TABLEACCESS_DENIED_ERROR")
QUERY_TIMEOUT = MysqlCode(3024, "HY000", "ER_QUERY_TIMEOUT")
QUERY_INTERRUPTED = MysqlCode(1317, "70100", "ER_QUERY_INTERRUPTED")
OUT_OF_RANGE = MysqlCode(1264, "22003", "ER_WARN_DATA_OUT_OF_RANGE")
TOO_MANY_CONNECTIONS = MysqlCode(1040, "08004", "ER_CON_COUNT_ERROR")
UNKNOWN = MysqlCode(1105, "HY000", "ER_UNKNOWN_ERROR")
SERVER_SHUTDOWN = MysqlCode(1053, "08S01", "ER_SERVER_SHUTDOWN")
#: the outcome is unknown (a shard was lost after COMMIT, or after an autocommitted
#: write, was sent): MySQL's "error during COMMIT", never 1105, which UNAVAILABLE
#: (retry once the shard is back) also gives: check the data before retrying
OUTCOME_UNKNOWN = MysqlCode(1180, "HY000", "ER_ERROR_DURING_COMMIT")

#: One MySQL error per code (the first choice when the message names nothing finer).
BY_CODE: dict[Code, MysqlCode] = {
    Code.INVALID_ARGUMENT: WRONG_ARGUMENTS,
    Code.NOT_FOUND: NO_SUCH_TABLE,
    Code.ALREADY_EXISTS: DUP_ENTRY,
    Code.ABORTED: DEADLOCK,
    Code.UNIMPLEMENTED: NOT_SUPPORTED,
    Code.FAILED_PRECONDITION: UNKNOWN,
    Code.PERMISSION_DENIED: TABLE_ACCESS_DENIED,
    Code.UNAUTHENTICATED: ACCESS_DENIED,
    Code.DEADLINE_EXCEEDED: QUERY_TIMEOUT,
    Code.CANCELED: QUERY_INTERRUPTED,
    Code.OUT_OF_RANGE: OUT_OF_RANGE,
    Code.RESOURCE_EXHAUSTED: UNKNOWN,
    Code.UNAVAILABLE: UNKNOWN,
    Code.INTERNAL: UNKNOWN,
    Code.UNKNOWN: UNKNOWN,
}

_COLUMN = re.compile(r"unknown column|column .* does not exist|no such column", re.I)
_KEYSPACE = re.compile(r"keyspace .* does not exist|unknown database|unknown keyspace", re.I)
_TABLE_EXISTS = re.compile(r"table .*already exists|already exists.*table", re.I)
_LOCK_WAIT = re.compile(r"lock wait|locked by another|lock timeout|timed? ?out", re.I)
_FOREIGN_KEY = re.compile(r"foreign key", re.I)

#: SQLSTATE of the MySQL error numbers mysql-mimic raises itself.
_MIMIC_SQLSTATES = {
    1040: "08004", 1043: "08S01", 1045: "28000", 1046: "3D000", 1047: "08S01",
    1064: "42000", 1065: "42000", 1106: "42000", 1193: "HY000", 1231: "42000",
    1235: "42000", 1835: "HY000", 3162: "HY000", 3169: "HY000",
}


def mysql_code(exc: ShardgateError) -> MysqlCode:
    """The MySQL error for ``exc``."""
    if isinstance(exc, OutcomeUnknown):
        return OUTCOME_UNKNOWN
    text = exc.message
    match exc.code:
        case Code.INVALID_ARGUMENT if isinstance(exc, SyntaxError_):
            return PARSE
        case Code.NOT_FOUND if _COLUMN.search(text):
            return BAD_FIELD
        case Code.NOT_FOUND if _KEYSPACE.search(text):
            return BAD_DB
        case Code.ALREADY_EXISTS if _TABLE_EXISTS.search(text):
            return TABLE_EXISTS
        case Code.ABORTED if _LOCK_WAIT.search(text):
            return LOCK_WAIT_TIMEOUT
        case Code.FAILED_PRECONDITION if _FOREIGN_KEY.search(text):
            return ROW_IS_REFERENCED
    return BY_CODE.get(exc.code, UNKNOWN)


#: how much of the statement a syntax error quotes (MySQL quotes 80 characters)
NEAR_CHARS = 80


def mysql_message(exc: ShardgateError) -> str:
    """The message MySQL clients get for ``exc``: a syntax error in MySQL's words (``You
    have an error in your SQL syntax; ... near '...' at line N``, quoting the statement
    from its first bad token, which tools parse), any other error as it is."""
    if not isinstance(exc, SyntaxError_):
        return exc.message
    _, _, detail = exc.message.partition(": ")
    reason = f" ({detail})" if detail else ""
    near = (exc.near or "")[:NEAR_CHARS]
    return (f"You have an error in your SQL syntax{reason}; check the gate's SQL "
            f"(docs/routing.md) for the right syntax to use near '{near}' "
            f"at line {exc.line or 1}")


def sqlstate_of(errno: int) -> str:
    """The SQLSTATE sent with MySQL error ``errno`` (``HY000`` when none is specific)."""
    for known in (*BY_CODE.values(), PARSE, BAD_FIELD, BAD_DB, TABLE_EXISTS, LOCK_WAIT_TIMEOUT,
                  ROW_IS_REFERENCED, TOO_MANY_CONNECTIONS, SERVER_SHUTDOWN, OUTCOME_UNKNOWN):
        if known.errno == errno:
            return known.sqlstate
    return _MIMIC_SQLSTATES.get(errno, "HY000")
