"""Two-phase commit for multi-shard transactions (``transaction_mode = 'twopc'``).

A session in ``twopc`` mode commits a transaction that wrote to more than one
shard atomically: every shard commits, or none does, even if the gate dies
half-way. The databases do the heavy lifting (PostgreSQL ``PREPARE
TRANSACTION``, MariaDB XA); this module is the coordinator, after the design
of Vitess's atomic distributed transactions (``go/vt/vtgate/tx_conn.go``, the
metadata manager's ``dt_state`` / ``dt_participant`` tables), simplified: one
decision record per transaction, every participant prepared.

Names
-----
* **dtid**: ``sg2pc:<coordinator>:<16 hex>``, unique, chosen when the first
  shard joins the transaction; ``<coordinator>`` is that shard, ``ks/shard``
  (or ``#`` and a hash of it when the name would not fit in an xid).
* **xid** of a participant: ``<dtid>:<n>``, n = 0, 1, ... in joining order; the
  coordinator shard is participant 0. Each shard's transaction starts with its
  xid (MariaDB's ``XA START`` needs it before the first statement), so the
  prefix ``sg2pc:`` marks every prepared transaction shardgate owns.
* **record**: a row of ``shardgate_dt`` (``dtid``, ``state``, ``participants``
  as JSON, ``created_ms``) in the coordinator shard's database, written in
  autocommit statements of its own, never inside a participant's transaction.
  Those never wait behind the participants: a tablet keeps one pooled
  connection out of reach of transactions (see :mod:`shardgate.tablet.tablet`),
  so concurrent commits holding every transaction slot cannot starve their
  own records.

Protocol (:func:`commit`)
-------------------------
1. One participant, or best-effort mode: an ordinary one-phase commit.
2. A participant that cannot prepare (SQLite) → roll back everything and
   refuse with ``FAILED_PRECONDITION``; there is no silent downgrade.
3. Insert the record with state ``PREPARE``.
4. Prepare every participant, in joining order. A failure → set the record to
   ``ROLLBACK``, roll back the prepared ones and the rest, delete the record,
   re-raise the participant's error (its code, with a note).
5. **The commit point**: ``UPDATE ... SET state = 'COMMIT' WHERE dtid = ? AND
   state = 'PREPARE'``. Exactly one writer wins this compare-and-set: this gate
   (commit) or a resolver that first set ``ROLLBACK`` (abort). If the update's
   outcome is unknown the record is read back; if that fails too the error
   says the transaction is in doubt and ``twopc resolve`` settles it.
6. Commit every prepared participant. One that fails is left prepared for
   :func:`resolve`; the transaction is committed all the same (the decision is
   durable), the gate logs a warning and returns success.
7. Delete the record.

Invariants
----------
* A record exists from before the first participant is prepared until after
  the last one has ended. So a prepared xid whose record is missing belongs to
  a transaction that never decided to commit: rolling it back is always right
  (presumed abort).
* ``COMMIT`` is written only while every participant is prepared, and only
  over ``PREPARE``; ``ROLLBACK`` likewise only over ``PREPARE``. A decision is
  never changed once written.
* A prepared transaction is ended only by ``commit_prepared`` /
  ``rollback_prepared`` following the record: never by a rollback on release,
  a tablet closing or a lost connection (the database keeps it).

Recovery (:func:`resolve`, ``Gate.resolve_transactions``, ``shardgate twopc resolve``)
-----------------------------------------------------------------------------------------
1. Read every record on every PostgreSQL/MariaDB shard, *then* list every
   shard's prepared xids with our prefix (that order matters: a ``COMMIT``
   record read first has all its participants prepared or ended by the time
   of the listing).
2. Per dtid: records younger than the grace period are left alone (their gate
   may still be working). Record ``COMMIT`` → commit its prepared xids;
   ``ROLLBACK`` → roll them back; ``PREPARE`` → compare-and-set it to
   ``ROLLBACK`` first (if the coordinating gate won the race instead, follow
   its decision), then roll back; no record → roll back.
3. List again and delete the records of the dtids with nothing left prepared.
   Already-ended xids (``NOT_FOUND``) count as done, so running it twice, or
   from two processes, is harmless.

Fault injection (tests only)
----------------------------
``SHARDGATE_TWOPC_FAULT=<point>`` in the environment makes the process exit at
once (``os._exit(FAULT_EXIT_CODE)``, like a crash: nothing is cleaned up) when
:func:`commit` reaches that point: ``after_first_prepare``, ``after_prepare``,
``after_decision`` or ``after_first_commit``. It is not a user setting.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from shardgate.auth.identity import Identity
from shardgate.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ShardgateError,
    Unavailable,
    error_for_code,
)
from shardgate.gate.session import Session
from shardgate.keys import ShardId
from shardgate.sql.classify import transaction_mode_of
from shardgate.tablet import TabletClient

log = logging.getLogger(__name__)

BEST_EFFORT = "best_effort"
TWOPC = "twopc"
MODES = (BEST_EFFORT, TWOPC)

#: Prefix of every xid shardgate prepares.
XID_PREFIX = "sg2pc:"
#: The decision table, one per coordinator shard database.
DT_TABLE = "shardgate_dt"
#: Records younger than this are left to their (possibly live) gate by ``resolve``.
DEFAULT_RESOLVE_GRACE_S = 60.0

PREPARE = "PREPARE"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

FAULT_ENV = "SHARDGATE_TWOPC_FAULT"
FAULT_POINTS = ("after_first_prepare", "after_prepare", "after_decision", "after_first_commit")
FAULT_EXIT_CODE = 75

_MAX_XID = 64  # shardgate.backends.base.MAX_XID_LENGTH
_READABLE = re.compile(r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$")
_DT_DDL = (
    f"CREATE TABLE IF NOT EXISTS {DT_TABLE} (dtid VARCHAR(64) NOT NULL PRIMARY KEY, "
    "state VARCHAR(16) NOT NULL, participants TEXT NOT NULL, created_ms BIGINT NOT NULL)"
)

Key = tuple[str, str]


# -- modes -----------------------------------------------------------------------------------


def check_mode(mode: str) -> str:
    """``mode`` normalised, or InvalidArgument naming the valid ones."""
    norm = mode.strip().lower() if isinstance(mode, str) else mode
    if norm not in MODES:
        raise InvalidArgument(
            f"unknown transaction_mode {mode!r}: use {' or '.join(repr(m) for m in MODES)}"
        )
    return str(norm)


def mode_from_set(stmt: exp.Set) -> str | None:
    """The mode of ``SET [SESSION] transaction_mode = 'm'``; None for any other SET."""
    mode = transaction_mode_of(stmt)
    return None if mode is None else check_mode(mode)


# -- names -----------------------------------------------------------------------------------


def coordinator_name(keyspace: str, shard: str) -> str:
    """How a dtid names its coordinator shard: ``ks/shard``, or ``#<hash>`` if too long."""
    name = str(ShardId(keyspace, shard))
    if _READABLE.match(name) and len(XID_PREFIX) + len(name) + 1 + 16 + 5 <= _MAX_XID:
        return name
    return "#" + hashlib.sha256(name.encode()).hexdigest()[:16]


def new_dtid(keyspace: str, shard: str) -> str:
    return f"{XID_PREFIX}{coordinator_name(keyspace, shard)}:{secrets.token_hex(8)}"


def dtid_of(xid: str) -> str:
    return xid.rsplit(":", 1)[0]


def _coordinator_of(dtid: str) -> str:
    return dtid[len(XID_PREFIX) :].rsplit(":", 1)[0]


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


# -- joining a transaction -------------------------------------------------------------------


async def begin_participant(
    session: Session, keyspace: str, shard: str, tablet: TabletClient
) -> int:
    """Start the twopc-mode transaction of ``session`` on one shard; its tablet id.

    The first shard to join names the dtid (it becomes the coordinator). The
    xid is reserved before the first await, so shards joining concurrently get
    distinct numbers. A shard that cannot prepare starts an ordinary
    transaction: fine alone, refused by :func:`commit` beside others.
    """
    key = (keyspace, shard)
    xid = session.xids.get(key)
    if xid is None:
        if session.dtid is None:
            session.dtid = new_dtid(keyspace, shard)
        xid = f"{session.dtid}:{len(session.xids)}"
        session.xids[key] = xid
    caller = transaction_caller(session)
    if not tablet.supports_twopc:
        return await tablet.begin(caller)
    return await tablet.begin_twopc(xid, caller)


def transaction_caller(session: Session) -> str | None:
    """Whom a tablet counts a transaction of ``session`` against (its per-user cap):
    the session's user; None for the gate's own work."""
    if isinstance(session.identity, Identity):
        return session.identity.user
    return session.owner


def take(session: Session) -> tuple[dict[Key, str], str | None]:
    """The twopc state of the session's transaction (xids, dtid), cleared from it."""
    taken = session.xids, session.dtid
    session.xids, session.dtid = {}, None
    return taken


# -- commit ----------------------------------------------------------------------------------


@dataclass
class _Participant:
    key: Key
    tid: int
    xid: str
    tablet: TabletClient


def _fault(point: str) -> None:
    """Crash here if the test hook names this point (see the module docstring)."""
    if os.environ.get(FAULT_ENV) == point:
        os._exit(FAULT_EXIT_CODE)


async def commit(
    tablets: Mapping[Key, TabletClient],
    txs: Sequence[tuple[Key, int]],
    xids: Mapping[Key, str],
    dtid: str | None,
) -> None:
    """Commit a multi-shard transaction with two-phase commit.

    ``txs`` are its (shard, tablet transaction id) in joining order, ``xids`` and
    ``dtid`` what :func:`take` returned; the session has already forgotten them.
    """
    parts = [_Participant(key, tid, xids.get(key, ""), tablets[key]) for key, tid in txs]
    refused = [_name(p.key) for p in parts if not p.tablet.supports_twopc or not p.xid]
    coord = next((p for p in parts if dtid is not None and p.xid == f"{dtid}:0"), None)
    if refused or dtid is None or coord is None:
        await _rollback_open(parts)
        if refused:
            raise FailedPrecondition(
                f"two-phase commit needs every shard of the transaction on PostgreSQL or "
                f"MariaDB, and {refused} cannot prepare transactions; the transaction was "
                "rolled back. Keep it on one shard or use transaction_mode 'best_effort'"
            )
        raise Internal(f"two-phase commit lost its coordinator ({dtid}); rolled back")

    try:
        await _dt_insert(coord.tablet, dtid, parts)
    except ShardgateError as exc:
        await _rollback_open(parts)
        raise Aborted(
            f"could not record two-phase commit {dtid} on {_name(coord.key)}: {exc.message}; "
            "nothing was committed, retry the transaction"
        ) from exc

    prepared: list[_Participant] = []
    for p in parts:
        try:
            await p.tablet.prepare(p.tid, p.xid)
        except ShardgateError as exc:
            await _abort(
                coord, dtid, prepared, [q for q in parts if q not in prepared and q is not p]
            )
            raise error_for_code(
                exc.code,
                f"prepare failed on {_name(p.key)}: {exc.message} "
                "(the transaction was rolled back on every shard)",
            ) from exc
        prepared.append(p)
        if len(prepared) == 1:
            _fault("after_first_prepare")
    _fault("after_prepare")

    if not await _decide_commit(coord, dtid):
        await _abort(coord, dtid, prepared, [])
        raise Aborted(
            f"two-phase commit {dtid} was rolled back by `shardgate twopc resolve` before it "
            "could commit (it outlived the grace period); retry the transaction"
        )
    _fault("after_decision")

    failed: list[str] = []
    for i, p in enumerate(parts):
        try:
            await p.tablet.commit_prepared(p.xid)
        except ShardgateError as exc:
            failed.append(f"{_name(p.key)} ({exc.message})")
        if i == 0:
            _fault("after_first_commit")
    if failed:
        log.warning(
            "two-phase commit %s is committed, but %s did not finish: their rows appear "
            "once `shardgate twopc resolve` runs",
            dtid,
            ", ".join(failed),
        )
        return
    try:
        await _dt_delete(coord.tablet, dtid)
    except ShardgateError as exc:  # harmless: resolve removes finished records
        log.warning("could not remove two-phase commit record %s: %s", dtid, exc.message)


async def _decide_commit(coord: _Participant, dtid: str) -> bool:
    """The commit point: True if COMMIT was recorded, False if the record says ROLLBACK."""
    try:
        return await _dt_set_state(coord.tablet, dtid, COMMIT)
    except ShardgateError as exc:
        first = exc
    # The update may or may not have happened: ask the record.
    try:
        state = await _dt_state(coord.tablet, dtid)
        if state == PREPARE and await _dt_set_state(coord.tablet, dtid, ROLLBACK):
            state = ROLLBACK
        elif state == PREPARE:
            state = await _dt_state(coord.tablet, dtid)
    except ShardgateError:
        raise Unavailable(
            f"two-phase commit {dtid} is in doubt: its decision could not be recorded on "
            f"{_name(coord.key)} ({first.message}); every shard is prepared, and "
            "`shardgate twopc resolve` will commit or roll back all of them"
        ) from first
    return state == COMMIT


async def _abort(
    coord: _Participant, dtid: str, prepared: Sequence[_Participant], open_: Sequence[_Participant]
) -> None:
    """Roll back a transaction that did not commit, as far as the shards let us."""
    clean = True
    with contextlib.suppress(ShardgateError):  # a missing ROLLBACK still means rollback
        await _dt_set_state(coord.tablet, dtid, ROLLBACK)
    for p in prepared:
        try:
            await p.tablet.rollback_prepared(p.xid)
        except NotFound:
            pass
        except ShardgateError as exc:
            clean = False
            log.warning("could not roll back prepared %s on %s: %s", p.xid, _name(p.key), exc)
    await _rollback_open(open_)
    if clean:
        with contextlib.suppress(ShardgateError):  # resolve removes it otherwise
            await _dt_delete(coord.tablet, dtid)


async def _rollback_open(parts: Sequence[_Participant]) -> None:
    for p in parts:
        with contextlib.suppress(ShardgateError):  # a lost shard rolled back on its own
            await p.tablet.rollback(p.tid)


# -- the decision record ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Record:
    dtid: str
    state: str
    created_ms: int


async def _dt_insert(tablet: TabletClient, dtid: str, parts: Sequence[_Participant]) -> None:
    ph = tablet.placeholder
    sql = (
        f"INSERT INTO {DT_TABLE} (dtid, state, participants, created_ms) "
        f"VALUES ({ph}, {ph}, {ph}, {ph})"
    )
    participants = json.dumps([{"shard": _name(p.key), "xid": p.xid} for p in parts])
    args = [dtid, PREPARE, participants, int(time.time() * 1000)]
    try:
        await tablet.execute(sql, args)
    except NotFound:  # first use on this shard: create the table
        with contextlib.suppress(AlreadyExists):
            await tablet.execute(_DT_DDL, [])
        await tablet.execute(sql, args)


async def _dt_set_state(tablet: TabletClient, dtid: str, state: str) -> bool:
    """Compare-and-set ``PREPARE`` → ``state``; True if this call made the change."""
    ph = tablet.placeholder
    result = await tablet.execute(
        f"UPDATE {DT_TABLE} SET state = {ph} WHERE dtid = {ph} AND state = {ph}",
        [state, dtid, PREPARE],
    )
    return result.rows_affected == 1


async def _dt_state(tablet: TabletClient, dtid: str) -> str | None:
    ph = tablet.placeholder
    try:
        result = await tablet.execute(f"SELECT state FROM {DT_TABLE} WHERE dtid = {ph}", [dtid])
    except NotFound:
        return None
    return str(result.rows[0][0]) if result.rows else None


async def _dt_list(tablet: TabletClient) -> list[_Record]:
    try:
        result = await tablet.execute(f"SELECT dtid, state, created_ms FROM {DT_TABLE}", [])
    except NotFound:
        return []
    return [_Record(str(d), str(s), int(c)) for d, s, c in result.rows]


async def _dt_delete(tablet: TabletClient, dtid: str) -> None:
    ph = tablet.placeholder
    await tablet.execute(f"DELETE FROM {DT_TABLE} WHERE dtid = {ph}", [dtid])


# -- recovery --------------------------------------------------------------------------------


@dataclass
class ResolveReport:
    """What :func:`resolve` did; ``str()`` is the CLI's summary."""

    committed: list[str] = field(default_factory=list)  # xids
    rolled_back: list[str] = field(default_factory=list)  # xids
    removed: list[str] = field(default_factory=list)  # dtids whose record was deleted
    skipped: list[str] = field(default_factory=list)  # "dtid: why"
    errors: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"committed {len(self.committed)}, rolled back {len(self.rolled_back)} prepared "
            f"transaction(s); removed {len(self.removed)} record(s)"
        ]
        lines += [f"commit   {x}" for x in self.committed]
        lines += [f"rollback {x}" for x in self.rolled_back]
        lines += [f"skipped  {s}" for s in self.skipped]
        lines += [f"error    {e}" for e in self.errors]
        return "\n".join(lines)


async def resolve(
    tablets: Mapping[Key, TabletClient], *, grace_s: float = DEFAULT_RESOLVE_GRACE_S
) -> ResolveReport:
    """Settle the two-phase commits a gate left behind (see the module docstring)."""
    if grace_s < 0:
        raise InvalidArgument(f"grace_s must be >= 0, not {grace_s}")
    report = ResolveReport()
    capable = {key: t for key, t in tablets.items() if t.supports_twopc}
    coordinators = {coordinator_name(*key): key for key in capable}
    now_ms = int(time.time() * 1000)

    records: dict[str, _Record] = {}
    for key, tablet in capable.items():  # records first, then the prepared xids
        try:
            records.update((r.dtid, r) for r in await _dt_list(tablet))
        except ShardgateError as exc:
            report.errors.append(f"reading {DT_TABLE} on {_name(key)}: {exc.message}")
    prepared = await _list_prepared(capable, report)

    decided: list[tuple[str, Key]] = []
    for dtid in sorted(set(records) | set(prepared)):
        coord_key = coordinators.get(_coordinator_of(dtid))
        if coord_key is None:
            report.skipped.append(f"{dtid}: its coordinator shard is not in this topology")
            continue
        coord = capable[coord_key]
        try:
            record: _Record | None = records.get(dtid)
            state = record.state if record else await _dt_state(coord, dtid)
            if record is None and state is not None:
                # Created after the records were read: a young transaction.
                report.skipped.append(f"{dtid}: started while resolving")
                continue
            if record is not None and now_ms - record.created_ms < grace_s * 1000:
                report.skipped.append(f"{dtid}: younger than the grace period ({grace_s:g}s)")
                continue
            if state == PREPARE:
                if await _dt_set_state(coord, dtid, ROLLBACK):
                    state = ROLLBACK
                else:
                    state = await _dt_state(coord, dtid)
        except ShardgateError as exc:
            report.errors.append(f"{dtid}: reading its record on {_name(coord_key)}: {exc.message}")
            continue
        commit_it = state == COMMIT  # ROLLBACK, or no record: presumed abort
        for xid, key in prepared.get(dtid, []):
            try:
                if commit_it:
                    await capable[key].commit_prepared(xid)
                else:
                    await capable[key].rollback_prepared(xid)
            except NotFound:
                continue  # ended meanwhile (by its gate or another resolver)
            except ShardgateError as exc:
                report.errors.append(f"{xid} on {_name(key)}: {exc.message}")
                continue
            (report.committed if commit_it else report.rolled_back).append(xid)
        if state is not None:
            decided.append((dtid, coord_key))

    if decided:
        left = await _list_prepared(capable, report)
        for dtid, coord_key in decided:
            if dtid in left:
                report.skipped.append(f"{dtid}: still prepared somewhere, record kept")
                continue
            try:
                await _dt_delete(capable[coord_key], dtid)
            except ShardgateError as exc:
                report.errors.append(f"{dtid}: removing its record: {exc.message}")
                continue
            report.removed.append(dtid)
    return report


async def _list_prepared(
    capable: Mapping[Key, TabletClient], report: ResolveReport
) -> dict[str, list[tuple[str, Key]]]:
    """dtid -> [(xid, shard that has it prepared)] over every capable shard."""
    found: dict[str, list[tuple[str, Key]]] = {}
    for key, tablet in capable.items():
        try:
            xids = await tablet.list_prepared(XID_PREFIX)
        except ShardgateError as exc:
            report.errors.append(f"listing prepared transactions on {_name(key)}: {exc.message}")
            continue
        for xid in xids:
            found.setdefault(dtid_of(xid), []).append((xid, key))
    return found
