"""``include_event_token`` / ``compare_event_token`` through the gate.

``Gate.execute(..., options=ExecuteOptions(...))`` runs the statement with the
options active in a context variable; every shard query the statement sends
(:func:`shard_execute`) passes them to its tablet and records the tablet's
answer. The statement's :class:`~shardgate.result.Result` then gets:

* ``event_token``: the tablet's token when exactly one shard was read, else
  None (tokens of different shards do not combine into one);
* ``fresher``: True only when every shard read was known to be at least as
  fresh as ``compare_event_token``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardgate.event_token import EventToken
from shardgate.result import ExecuteOptions, Result
from shardgate.sql.classify import WriteTarget
from shardgate.tablet.client import TabletClient


@dataclass
class _Collected:
    options: ExecuteOptions
    tokens: dict[str, EventToken | None] = field(default_factory=dict)
    fresher: list[bool] = field(default_factory=list)


_ACTIVE: contextvars.ContextVar[_Collected | None] = contextvars.ContextVar(
    "shardgate_execute_options", default=None
)


def active(options: ExecuteOptions | None) -> bool:
    return options is not None and (
        options.include_event_token or options.compare_event_token is not None
    )


async def with_options(run: Callable[[], Awaitable[Result]], options: ExecuteOptions) -> Result:
    """Run ``run()`` (one statement) collecting the shards' tokens; fill the result."""
    collected = _Collected(options)
    reset = _ACTIVE.set(collected)
    try:
        result = await run()
    finally:
        _ACTIVE.reset(reset)
    if options.include_event_token and len(collected.tokens) == 1:
        result.event_token = next(iter(collected.tokens.values()))
    if options.compare_event_token is not None:
        result.fresher = bool(collected.fresher) and all(collected.fresher)
    return result


async def shard_execute(
    tablet: TabletClient, sql: str, args: Sequence[Any], tid: int | None,
    target: WriteTarget | None = None,
) -> Result:
    """``tablet.execute`` passing the active options, if any, and recording the answer;
    ``target``: what the statement writes, as the gate classified it."""
    collected = _ACTIVE.get()
    if collected is None:
        return await tablet.execute(sql, args, tid, target=target)
    result = await tablet.execute(sql, args, tid, collected.options, target=target)
    collected.tokens[f"{tablet.keyspace}/{tablet.shard}"] = result.event_token
    if result.fresher is not None:
        collected.fresher.append(result.fresher)
    return result
