"""How the gate turns failures into coded errors, shared by its execution modules.

Every exception that reaches a caller is a :class:`~shardgate.errors.ShardgateError`:
one that escaped planning or execution (a bug) becomes ``INTERNAL`` naming what
failed; a failure of the gate's own query on a shard (savepoints, lookup vindex
queries, sequence blocks) says so, keeping the shard's code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.errors import Code, Internal, ShardgateError, error_for_code
from shardgate.result import Result
from shardgate.sql.parse import too_deep
from shardgate.tablet import TabletClient


async def execute(prim: Primitive, cursor: ExecCursor, bv: Mapping[str, Any]) -> Result:
    """``prim.execute``, where an exception that is not a ShardgateError becomes one.

    Such an exception is a bug (user input is checked before), but the caller
    still gets a coded error, and the transaction handling around this call
    (which reacts to ShardgateError) still undoes the statement.
    """
    try:
        return await prim.execute(cursor, bv)
    except ShardgateError:
        raise
    except Exception as exc:
        raise unexpected(exc) from exc


def unexpected(exc: Exception, doing: str = "running the statement") -> ShardgateError:
    """The coded error for an exception that escaped planning or execution."""
    if isinstance(exc, RecursionError):
        return too_deep()
    return Internal(
        f"{doing} failed with {type(exc).__name__}: {exc} "
        "(a shardgate bug: please report the statement)"
    )


def outcome_unknown(exc: ShardgateError) -> bool:
    """Whether a failed COMMIT may still have committed: the shard (or the tablet
    in between) was lost or stopped answering, rather than refusing the commit."""
    return exc.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.CANCELED, Code.UNKNOWN)


def internal_failure(exc: ShardgateError, shard: str, purpose: str) -> ShardgateError:
    """``exc`` (same class and code) saying the gate's own query on ``shard`` failed."""
    if exc.message.startswith("internal query"):
        return exc  # already said by an inner layer
    return error_for_code(
        exc.code, f"internal query for shard {shard} failed ({purpose}): {exc.message}"
    )


def with_note(exc: ShardgateError, note: str) -> ShardgateError:
    """``exc`` with ``note`` appended to its message (what the gate did about it)."""
    exc.args = (f"{exc.message} ({note})",)
    return exc


async def quiet_rollback(tablet: TabletClient, tid: int) -> None:
    """Roll back ``tid`` on ``tablet``, ignoring a lost shard (its transaction died with
    the connection)."""
    with contextlib.suppress(ShardgateError):
        await tablet.rollback(tid)
