"""shardgate's error model: one root exception, a small set of stable codes.

Every error that leaves shardgate is a :class:`ShardgateError` (or a subclass)
carrying a :class:`Code`. Codes match gRPC status codes one to one, so the gRPC
transport maps them without a table of messages, and callers branch on
``err.code``, never on the message text (as Vitess's ``vterrors`` asks).

Messages name the thing that is wrong and say what to do about it. Driver
exceptions are translated into these exactly once, in ``shardgate.backends``.
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Stable error codes. The value is the gRPC status code name."""

    CANCELED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class ShardgateError(Exception):
    """Root of every error shardgate raises.

    ``code`` is stable; ``str(err)`` is for people. Subclasses fix the code and
    their docstring is the default message.
    """

    code: Code = Code.UNKNOWN

    def __init__(self, message: str | None = None, *, code: Code | None = None) -> None:
        if code is not None:
            self.code = code
        text = message or (type(self).__doc__ or "").strip().splitlines()[0]
        super().__init__(text)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


class InvalidArgument(ShardgateError):
    """The request is malformed: fix the statement, bind variables or options."""

    code = Code.INVALID_ARGUMENT


class SyntaxError_(InvalidArgument):
    """The SQL could not be parsed: check the statement near the position given.

    ``line`` is the 1-based line of the first token that could not be parsed and
    ``near`` the statement's text from that token on (what MySQL's error 1064
    quotes), when known.
    """

    def __init__(self, message: str | None = None, *, code: Code | None = None,
                 line: int | None = None, near: str | None = None) -> None:
        super().__init__(message, code=code)
        self.line = line
        self.near = near


class Unsupported(ShardgateError):
    """This statement cannot be routed correctly, so it is refused rather than mis-routed."""

    code = Code.UNIMPLEMENTED


class NotFound(ShardgateError):
    """A named keyspace, table, vindex, shard or sequence does not exist."""

    code = Code.NOT_FOUND


class AlreadyExists(ShardgateError):
    """A row or object with this key already exists."""

    code = Code.ALREADY_EXISTS


class FailedPrecondition(ShardgateError):
    """The system is not in a state that allows this: see the message for what to change."""

    code = Code.FAILED_PRECONDITION


class Aborted(ShardgateError):
    """The transaction was aborted (conflict or deadlock); it is safe to retry it."""

    code = Code.ABORTED


class Unavailable(ShardgateError):
    """A shard or server cannot be reached; retry once it is back."""

    code = Code.UNAVAILABLE


class TabletUnreachable(Unavailable):
    """The tablet did not answer: the connection failed or broke, or it is draining.

    ``sent`` says whether the request may have reached it (and run): False
    when the connection could not be made or the tablet refused it while
    draining, True when the connection broke or the deadline passed after
    the request went out. The gate's fleet (:mod:`shardgate.gate.fleet`)
    fails over on it.
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class DeadlineExceeded(ShardgateError):
    """The statement ran past its timeout and was cancelled on the shard."""

    code = Code.DEADLINE_EXCEEDED


class OutcomeUnknown(ShardgateError):
    """The outcome is unknown: the tablet went away after the statement was sent; check first.

    The statement may or may not have been applied. shardgate never retries
    it itself; check the data before retrying it. Code ``UNKNOWN``.
    """

    code = Code.UNKNOWN


#: How a :class:`CommitOutcomeUnknown` message starts (the stable marker clients may test).
COMMIT_OUTCOME_UNKNOWN = "commit outcome unknown"


class CommitOutcomeUnknown(OutcomeUnknown):
    """commit outcome unknown: a shard was lost after COMMIT was sent; check before retrying.

    Code ``UNKNOWN``; the message starts with :data:`COMMIT_OUTCOME_UNKNOWN` and
    names the shard. The transaction may or may not be committed there: read
    the rows back (or an idempotency key written in the same transaction)
    before retrying, or a retry may write them twice.
    """

    code = Code.UNKNOWN


class ResourceExhausted(ShardgateError):
    """A limit was reached (rows, connections, rate); slow down or raise the limit."""

    code = Code.RESOURCE_EXHAUSTED


class Unauthenticated(ShardgateError):
    """The caller is not authenticated: pass a valid user and password or client certificate."""

    code = Code.UNAUTHENTICATED


class PermissionDenied(ShardgateError):
    """The caller may not do this: the message names the table or statement and the missing role."""

    code = Code.PERMISSION_DENIED


class Internal(ShardgateError):
    """A bug or an unexpected database error; the message says what failed."""

    code = Code.INTERNAL


class VSchemaError(InvalidArgument):
    """The VSchema is invalid; the message names the JSON path at fault."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"vschema {path}: {problem}")


_CLASS_BY_CODE: dict[Code, type[ShardgateError]] = {
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.UNIMPLEMENTED: Unsupported,
    Code.NOT_FOUND: NotFound,
    Code.ALREADY_EXISTS: AlreadyExists,
    Code.FAILED_PRECONDITION: FailedPrecondition,
    Code.ABORTED: Aborted,
    Code.UNAVAILABLE: Unavailable,
    Code.RESOURCE_EXHAUSTED: ResourceExhausted,
    Code.UNAUTHENTICATED: Unauthenticated,
    Code.PERMISSION_DENIED: PermissionDenied,
    Code.INTERNAL: Internal,
    Code.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_for_code(code: Code, message: str) -> ShardgateError:
    """The error of the subclass that owns ``code``, e.g. to re-raise a remote error.

    Codes without a subclass of their own give a plain :class:`ShardgateError`
    carrying ``code``; ``UNKNOWN`` with the commit-outcome marker gives
    :class:`CommitOutcomeUnknown`.
    """
    if code is Code.UNKNOWN and message.startswith(COMMIT_OUTCOME_UNKNOWN):
        return CommitOutcomeUnknown(message)
    cls = _CLASS_BY_CODE.get(code)
    if cls is None:
        return ShardgateError(message, code=code)
    return cls(message)
