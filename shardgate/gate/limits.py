"""The gate's limits and timeouts, configured once at the edge (CLI flags, ``Gate.open``).

=============================  ===================  ==========================================
setting                        default              what happens past it
=============================  ===================  ==========================================
``transaction_timeout_s``      30 s                 the gate rolls the transaction back and
                                                    frees its connections (counted from its
                                                    first shard); the session's next
                                                    statement fails with ``ABORTED``
``session_idle_timeout_s``     600 s                the session is forgotten (an open
                                                    transaction rolled back); its id then
                                                    answers ``NOT_FOUND``
``query_timeout_ms``           0 (none) in the      the statement is cancelled on the shards;
                               library, 30 000 in   ``DEADLINE_EXCEEDED`` (a session changes
                               ``shardgate up/gate``  it with ``SET query_timeout_ms = N``)
``result_limits``              500 000 rows,        ``Execute`` refuses the result with
                               64 MiB               ``RESOURCE_EXHAUSTED`` while its rows
                                                    arrive; use ``StreamExecute``
``pool_timeout_s``             10 s                 waiting for a shard connection ends in
                                                    ``RESOURCE_EXHAUSTED``
``transaction_cap``            20                   in-process tablets (``shardgate up``):
                                                    transactions open at once per shard;
                                                    the next waits ``pool_timeout_s``,
                                                    then ``RESOURCE_EXHAUSTED``
``transaction_cap_per_user``   0 (none)             one user's share of ``transaction_cap``
                                                    (a fraction below 1, or a count): its
                                                    next BEGIN on that shard fails at once
                                                    with ``RESOURCE_EXHAUSTED``
=============================  ===================  ==========================================

``None`` (or 0 for ``query_timeout_ms``) turns a timeout off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardgate.backends._pool import DEFAULT_POOL_TIMEOUT_S
from shardgate.errors import InvalidArgument
from shardgate.result import ResultLimits
from shardgate.tablet.tablet import DEFAULT_TRANSACTION_CAP, per_user_cap

DEFAULT_TRANSACTION_TIMEOUT_S = 30.0
DEFAULT_SESSION_IDLE_TIMEOUT_S = 600.0
#: ``shardgate up`` / ``shardgate gate``'s statement timeout (the library's is 0: none)
SERVER_QUERY_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class GateLimits:
    """Timeouts and result limits of one gate (see the module docstring)."""

    transaction_timeout_s: float | None = DEFAULT_TRANSACTION_TIMEOUT_S
    session_idle_timeout_s: float | None = DEFAULT_SESSION_IDLE_TIMEOUT_S
    query_timeout_ms: int = 0
    result_limits: ResultLimits = field(default_factory=ResultLimits)
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S
    transaction_cap: int = DEFAULT_TRANSACTION_CAP
    transaction_cap_per_user: float = 0.0

    def __post_init__(self) -> None:
        for name in ("transaction_timeout_s", "session_idle_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InvalidArgument(f"{name} must be > 0 (or None: no timeout), not {value!r}")
        if not isinstance(self.query_timeout_ms, int) or self.query_timeout_ms < 0:
            raise InvalidArgument(
                f"query_timeout_ms must be a whole number >= 0, not {self.query_timeout_ms!r}")
        if not self.pool_timeout_s > 0:
            raise InvalidArgument(f"pool_timeout_s must be > 0, not {self.pool_timeout_s!r}")
        if not isinstance(self.transaction_cap, int) or self.transaction_cap < 1:
            raise InvalidArgument(
                f"transaction_cap (--transaction-cap) must be a whole number >= 1, not "
                f"{self.transaction_cap!r}")
        per_user_cap(self.transaction_cap_per_user, self.transaction_cap)  # checks it
        limits = self.result_limits
        if limits.max_rows < 0 or limits.max_bytes < 0:
            raise InvalidArgument(f"result limits must be >= 0 (0: none), not {limits}")
