"""Names and DDL of the segmented job store, per dialect (PostgreSQL, MariaDB, SQLite).

One segmented queue ``q`` on one shard is these tables (all created by
shardgate, never by hand):

``q_datasets`` (the catalog)
    one row per live dataset: ``n`` (its number, the order of datasets),
    ``state`` (see below), ``first_id`` / ``next_id`` (the job ids it holds
    are in ``[first_id, next_id)``), ``job_rows`` and ``job_bytes`` (what the
    producers wrote into it), ``created`` / ``closed`` (ns since the epoch).
``q_jobs_<n>`` (a dataset's jobs; insert only)
    ``job_id`` (PK, increasing per shard across datasets), ``job_key`` (the
    routing and ordering key, as text), ``payload`` (text), ``created``.
``q_job_status_<n>`` (the dataset's status rows; insert only, no index: a pure
    append log)
    ``job_id``, ``attempt``, ``seq`` (the order of a job's rows:
    ``attempt * 8 + rank(state)``, see :func:`status_seq`), ``state``
    (``executing``, ``succeeded``, ``failed``, ``aborted``, ``pending`` after
    an operator's retry), ``reason``, ``at``. A job's latest state is its row
    with the highest ``seq``.
``q_actions`` (operator requests; insert only)
    ``id``, ``job_id``, ``action`` (``retry`` / ``abort``), ``reason``, ``at``;
    the shard's consumer applies them in ``id`` order.
``q_job_state`` (a view)
    each job of the live datasets with its latest status (``pending`` when
    it has none): plain SQL for debugging, rebuilt by the consumer whenever
    the set of datasets changes.

Dataset states: ``ready`` (created ahead, empty) → ``open`` (the one dataset
producers write; at most one) → ``closed`` (full; never written again) →
``dropping`` (all jobs done, or merged into another; its tables are being
dropped) → row deleted. A merge target is ``merging`` until the merge commits,
then ``closed``. New datasets are numbered in steps of :data:`DATASET_STEP`
so a merge of datasets ``..a, b`` can be numbered ``b + 1`` and still sort
before the next new one.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardgate.errors import InvalidArgument
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.dialects.base import TableComment

#: Distance between the numbers of consecutive new datasets (merges use the gaps).
DATASET_STEP = 1000

READY = "ready"
OPEN = "open"
CLOSED = "closed"
MERGING = "merging"
DROPPING = "dropping"

EXECUTING = "executing"
SUCCEEDED = "succeeded"
FAILED = "failed"
ABORTED = "aborted"
PENDING = "pending"
#: Status states after which a job is never handed out again (unless an operator retries it).
TERMINAL = (SUCCEEDED, ABORTED)

_RANK = {EXECUTING: 1, FAILED: 2, SUCCEEDED: 3, ABORTED: 3, PENDING: 4}


def status_seq(attempt: int, state: str) -> int:
    """The order of a status row among its job's rows.

    Within one attempt: ``executing`` < ``failed`` < ``succeeded`` / ``aborted``
    < ``pending`` (an operator re-queued the aborted job); the next attempt's
    rows come after all of them. The consumer writes each (attempt, state) of a
    job at most once, so the highest ``seq`` is one row.
    """
    return attempt * 8 + _RANK[state]


_MAX_NAME = 40  # keeps "<queue>_job_status_<n>" under every backend's identifier limit


def check_queue_name(name: str) -> str:
    """``name`` lower-cased if it can prefix the store's table names; else InvalidArgument."""
    low = name.lower()
    if not low or len(low) > _MAX_NAME or not (low[0].isalpha() or low[0] == "_") or not all(
        c.isalnum() or c == "_" for c in low
    ):
        raise InvalidArgument(
            f"segmented queue name {name!r}: use 1 to {_MAX_NAME} letters, digits and "
            "underscores, starting with a letter"
        )
    return low


class SegmentedNames:
    """Quoted table names of one segmented queue in one dialect."""

    def __init__(self, queue: str, dialect: Dialect) -> None:
        self.queue = check_queue_name(queue)
        self.dialect = dialect
        #: the dialect's object (its SQL forms)
        self.sql = sql_dialect(dialect)
        self._quoted: dict[str, str] = {}

    def quote(self, name: str) -> str:
        found = self._quoted.get(name)
        if found is None:
            found = self._quoted[name] = self.sql.quote(name)
        return found

    @property
    def catalog(self) -> str:
        return self.quote(f"{self.queue}_datasets")

    @property
    def actions(self) -> str:
        return self.quote(f"{self.queue}_actions")

    @property
    def view(self) -> str:
        return self.quote(f"{self.queue}_job_state")

    def jobs(self, n: int) -> str:
        return self.quote(f"{self.queue}_jobs_{int(n)}")

    def status(self, n: int) -> str:
        return self.quote(f"{self.queue}_job_status_{int(n)}")


#: The store's column types and table options per dialect: ``text`` (payloads,
#: reasons), ``key`` (job keys), ``state``, ``id`` (the actions table's generated
#: primary key) and ``engine`` (after a ``CREATE TABLE``'s columns).
_TYPES: dict[Dialect, dict[str, str]] = {
    Dialect.POSTGRES: {"text": "TEXT", "key": "VARCHAR(255)", "state": "VARCHAR(16)",
                       "id": "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                       "engine": ""},
    Dialect.MYSQL: {"text": "LONGTEXT", "key": "VARCHAR(255)", "state": "VARCHAR(16)",
                    "id": "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
                    "engine": " ENGINE=InnoDB"},
    Dialect.SQLITE: {"text": "TEXT", "key": "TEXT", "state": "TEXT",
                     "id": "id INTEGER PRIMARY KEY AUTOINCREMENT", "engine": ""},
}


def _types(dialect: Dialect) -> dict[str, str]:
    try:
        return _TYPES[dialect]
    except KeyError:
        raise InvalidArgument(
            f"segmented queues support postgres, mysql and sqlite, not {dialect}") from None


def catalog_ddl(names: SegmentedNames, marker: str | None = None) -> list[str]:
    """The catalog and actions tables (idempotent).

    ``marker``: the queue's comment marker (``shardgate_queue,storage=segmented,...``,
    :meth:`QueueOptions.to_comment`), put on the catalog the way a queue table carries
    it, so a tablet process finds the segmented queue and its options from the database
    alone (:meth:`QueueService.detect`). Set when the catalog is created (PostgreSQL:
    every time).
    """
    t = _types(names.dialect)
    if marker is not None and ("'" in marker or "*/" in marker):
        raise InvalidArgument(f"segmented queue {names.queue}: bad comment marker {marker!r}")
    comment = names.sql.table_comment(names.catalog, marker) if marker else TableComment()
    inner = f"{comment.inner} " if comment.inner else ""
    return [
        f"CREATE TABLE IF NOT EXISTS {names.catalog} ({inner}n BIGINT NOT NULL PRIMARY KEY, "
        f"state {t['state']} NOT NULL, first_id BIGINT NOT NULL, next_id BIGINT NOT NULL, "
        "job_rows BIGINT NOT NULL DEFAULT 0, job_bytes BIGINT NOT NULL DEFAULT 0, "
        f"created BIGINT NOT NULL, closed BIGINT NULL){t['engine']}{comment.suffix}",
        f"CREATE TABLE IF NOT EXISTS {names.actions} ({t['id']}, job_id BIGINT NOT NULL, "
        f"action {t['state']} NOT NULL, reason {t['text']} NULL, at BIGINT NOT NULL)"
        f"{t['engine']}",
        *comment.after,
    ]


def dataset_ddl(names: SegmentedNames, n: int) -> list[str]:
    """The jobs and status tables of dataset ``n`` (idempotent)."""
    t = _types(names.dialect)
    jobs = (
        f"CREATE TABLE IF NOT EXISTS {names.jobs(n)} (job_id BIGINT NOT NULL PRIMARY KEY, "
        f"job_key {t['key']} NOT NULL, payload {t['text']} NULL, created BIGINT NOT NULL)"
        f"{t['engine']}"
    )
    status = [f"CREATE TABLE IF NOT EXISTS {names.status(n)} (job_id BIGINT NOT NULL, "
              f"attempt INT NOT NULL, seq INT NOT NULL, state {t['state']} NOT NULL, "
              f"reason {t['text']} NULL, at BIGINT NOT NULL){t['engine']}"]
    return [jobs, *status]


def drop_dataset_ddl(names: SegmentedNames, n: int) -> list[str]:
    """Drop dataset ``n``'s tables (idempotent). On PostgreSQL ``CASCADE`` also drops the
    view when it still names them; the caller rebuilds the view afterwards."""
    cascade = names.sql.drop_cascade
    return [f"DROP TABLE IF EXISTS {names.status(n)}{cascade}",
            f"DROP TABLE IF EXISTS {names.jobs(n)}{cascade}"]


def view_ddl(names: SegmentedNames, datasets: Sequence[int]) -> list[str]:
    """Statements that (re)create the ``<queue>_job_state`` view over ``datasets``.

    Each job's row carries its dataset, key, latest attempt, state (``pending``
    without status rows), reason and time of the latest status.
    """
    parts = []
    for n in sorted(datasets):
        j, s = names.jobs(n), names.status(n)
        parts.append(
            f"SELECT {int(n)} AS dataset, j.job_id, j.job_key, COALESCE(s.attempt, 0) AS attempt, "
            f"COALESCE(s.state, 'pending') AS state, s.reason, COALESCE(s.at, j.created) AS at "
            f"FROM {j} j LEFT JOIN (SELECT x.job_id, x.attempt, x.state, x.reason, x.at "
            f"FROM {s} x JOIN (SELECT job_id, MAX(seq) AS seq FROM {s} GROUP BY job_id) m "
            "ON m.job_id = x.job_id AND m.seq = x.seq) s ON s.job_id = j.job_id"
        )
    if not parts:  # no dataset yet: an empty view of the same shape
        parts.append(
            "SELECT n AS dataset, first_id AS job_id, state AS job_key, 0 AS attempt, "
            f"state, state AS reason, created AS at FROM {names.catalog} WHERE 1 = 0"
        )
    # PostgreSQL's CREATE OR REPLACE cannot drop columns or change types: DROP +
    # CREATE in the caller's transaction is atomic for readers.
    return names.sql.replace_view(names.view, " UNION ALL ".join(parts))
