"""Change capture on each backend: exactly the committed changes, in order, resumable.

Concurrent writers (inserts, updates, deletes, rollbacks, multi-row
transactions) each own a disjoint id range and record what they committed;
the stream must hold exactly that, grouped by transaction, in commit order,
with correct before/after images, while the shared log reader is killed and
restarted in the middle of the burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.backends.changes import (
    DELETE,
    INSERT,
    UPDATE,
    ChangeLog,
    Heartbeat,
    Transaction,
)
from shardgate.backends.changes.open import open_change_log
from shardgate.errors import Code, ShardgateError
from shardgate.event_token import position_key
from shardgate.tablet import Tablet
from tests.conftest import require_server

SHARD = "ks/-"
WRITERS = 4
TXS_PER_WRITER = 30

Expected = list[list[tuple[str, tuple[Any, ...], Any, Any]]]  # per tx: (op, pk, before, after)


async def _writer(tablet: Tablet, w: int, expected: Expected, rng: random.Random) -> None:
    ph = tablet.placeholder
    rows: dict[int, tuple[str, int]] = {}
    base = w * 100_000
    next_id = base

    def img(i: int) -> dict[str, Any]:
        v, n = rows[i]
        return {"id": i, "v": v, "n": n}

    for k in range(TXS_PER_WRITER):
        kind = rng.choice(["insert", "multi", "update", "delete", "rollback"])
        if kind in ("update", "delete") and not rows:
            kind = "insert"
        if kind == "insert":
            rows[next_id] = (f"w{w}-{k}", k)
            await tablet.execute(
                f"INSERT INTO t (id, v, n) VALUES ({ph}, {ph}, {ph})", [next_id, *rows[next_id]]
            )
            expected.append([(INSERT, (next_id,), None, img(next_id))])
            next_id += 1
        elif kind == "update":
            i = rng.choice(sorted(rows))
            before = img(i)
            rows[i] = (f"u{w}-{k}", rows[i][1] + 1)
            await tablet.execute(
                f"UPDATE t SET v = {ph}, n = n + 1 WHERE id = {ph}", [rows[i][0], i]
            )
            expected.append([(UPDATE, (i,), before, img(i))])
        elif kind == "delete":
            i = rng.choice(sorted(rows))
            before = img(i)
            del rows[i]
            await tablet.execute(f"DELETE FROM t WHERE id = {ph}", [i])
            expected.append([(DELETE, (i,), before, None)])
        elif kind == "multi":
            tid = await tablet.begin()
            tx: list[tuple[str, tuple[Any, ...], Any, Any]] = []
            for j in range(3):
                rows[next_id] = (f"m{w}-{k}-{j}", j)
                await tablet.execute(
                    f"INSERT INTO t (id, v, n) VALUES ({ph}, {ph}, {ph})",
                    [next_id, *rows[next_id]], tid,
                )
                tx.append((INSERT, (next_id,), None, img(next_id)))
                next_id += 1
            i = rng.choice(sorted(rows))
            before = img(i)
            rows[i] = (rows[i][0] + "!", rows[i][1] * 2)
            await tablet.execute(
                f"UPDATE t SET v = {ph}, n = {ph} WHERE id = {ph}", [*rows[i], i], tid
            )
            tx.append((UPDATE, (i,), before, img(i)))
            await tablet.commit(tid)
            expected.append(tx)
        else:  # rolled back: must never show up
            tid = await tablet.begin()
            await tablet.execute(
                f"INSERT INTO t (id, v, n) VALUES ({ph}, 'ROLLBACK', 0)", [base + 99_999], tid
            )
            if rows:
                await tablet.execute(
                    f"UPDATE t SET v = 'ROLLBACK' WHERE id = {ph}", [sorted(rows)[0]], tid
                )
            await tablet.rollback(tid)
        await asyncio.sleep(0)


def _norm(change: Any) -> tuple[str, tuple[Any, ...], Any, Any]:
    def im(d: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if d is None else {k: (int(v) if k != "v" else v) for k, v in d.items()}

    return (change.op, tuple(int(x) for x in change.pk), im(change.before), im(change.after))


async def _collect_until(
    items: AsyncIterator[Any], target: str, out: list[Transaction], timeout: float = 60
) -> None:
    """Append transactions until the stream has passed position ``target``."""
    key = position_key(target)
    deadline = time.monotonic() + timeout

    async def run() -> None:
        async for item in items:
            if isinstance(item, Transaction):
                out.append(item)
                pos = item.token.position
            else:
                assert isinstance(item, Heartbeat)
                if item.position is None:
                    continue
                pos = item.position
            if position_key(pos) >= key:
                return

    await asyncio.wait_for(run(), max(1.0, deadline - time.monotonic()))


async def _setup(kind: str, make_database: Callable[..., str]) -> Tablet:
    url = make_database(kind, "cs")
    tablet = Tablet.open("ks", "-", url)
    bigint = "BIGINT"
    await tablet.execute(f"CREATE TABLE t (id {bigint} PRIMARY KEY, v VARCHAR(64), n {bigint})", [])
    return tablet


@contextlib.asynccontextmanager
async def _tablet(kind: str, make_database: Callable[..., str]) -> AsyncIterator[Tablet]:
    tablet = await _setup(kind, make_database)
    try:
        yield tablet
    finally:
        stream = tablet._changes
        await tablet.close()
        if stream is not None:
            log = open_change_log(stream.log.url, SHARD)
            try:
                await log.drop()
            finally:
                await log.close()


async def _read_log(log: ChangeLog, start: str | None, until: str) -> list[Transaction]:
    out: list[Transaction] = []
    items = log.read(start, heartbeat_s=0.2)
    try:
        await _collect_until(items, until, out)
    finally:
        await items.aclose()  # type: ignore[attr-defined]
    return out


async def test_stream_holds_exactly_the_committed_changes(
    backend_kind: str, make_database: Callable[..., str]
) -> None:
    async with _tablet(backend_kind, make_database) as tablet:
        stream = await tablet.change_stream()
        items = stream.subscribe(heartbeat_s=0.2)
        got: list[Transaction] = []
        expected: list[Expected] = [[] for _ in range(WRITERS)]

        async def restarts() -> None:  # kill the shared reader mid-burst, three times
            for _ in range(3):
                await asyncio.sleep(0.15)
                await stream.restart_reader()

        # The subscription starts at the log end as of now.
        first = asyncio.ensure_future(items.__anext__())
        await asyncio.sleep(0.05)
        writers = [
            _writer(tablet, w, expected[w], random.Random(1000 + w)) for w in range(WRITERS)
        ]
        await asyncio.gather(*writers, restarts())
        end = await stream.log.current_position()
        item = await asyncio.wait_for(first, 30)
        if isinstance(item, Transaction):
            got.append(item)
        try:
            await _collect_until(items, end, got)
        finally:
            await items.aclose()  # type: ignore[attr-defined]

        # Exactly the committed transactions, grouped, each writer's in its order.
        per_writer: list[Expected] = [[] for _ in range(WRITERS)]
        for tx in got:
            if not tx.changes:
                continue
            owners = {int(c.pk[0]) // 100_000 for c in tx.changes}
            assert len(owners) == 1, f"a transaction mixes writers: {tx}"
            per_writer[owners.pop()].append([_norm(c) for c in tx.changes])
            for c in tx.changes:
                for image in (c.before, c.after):
                    assert image is None or image["v"] != "ROLLBACK"
        for w in range(WRITERS):
            assert per_writer[w] == expected[w], f"writer {w}"
        keys = [position_key(tx.token.position) for tx in got]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        stamps = [tx.token.timestamp for tx in got]
        assert stamps == sorted(stamps)
        assert all(tx.token.shard == SHARD for tx in got)

        # Resume from any saved token: exactly the rest, through a private reader
        # (a log of its own) and through the tablet's window.
        for i in (0, len(got) // 3, len(got) - 2):
            resumed = await _read_log(stream.log, got[i].token.position, end)
            assert [t.token for t in resumed] == [t.token for t in got[i + 1 :]]
            sub = stream.subscribe(position=got[i].token.position, heartbeat_s=0.2)
            window: list[Transaction] = []
            try:
                await _collect_until(sub, end, window)
            finally:
                await sub.aclose()  # type: ignore[attr-defined]
            assert [t.token for t in window] == [t.token for t in got[i + 1 :]]


# it purges MariaDB's binlog, server-wide: a concurrent test's stream could lose its start
@pytest.mark.server_wide
async def test_start_from_timestamp_and_too_old(
    backend_kind: str, make_database: Callable[..., str]
) -> None:
    async with _tablet(backend_kind, make_database) as tablet:
        stream = await tablet.change_stream()
        ph = tablet.placeholder
        # this test's changes are read from here, not from the log's oldest position:
        # MariaDB's binlog is server-wide, every earlier test's commits are in it
        begin = await stream.log.current_position()
        for i in range(3):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'a', 0)", [i])
        await asyncio.sleep(1.1)  # MariaDB commit times have 1-second resolution
        for i in range(3, 6):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'b', 0)", [i])
        end = await stream.log.current_position()
        all_txs = await _read_log(stream.log, begin, end)
        all_txs = [t for t in all_txs if t.changes]
        assert [int(t.changes[0].pk[0]) for t in all_txs] == list(range(6))
        cut = all_txs[3].token.timestamp
        assert cut > all_txs[2].token.timestamp

        # From the tablet (its time map knows these seconds) and from a fresh
        # stream whose map is empty (it scans the log from its oldest position).
        from shardgate.tablet.stream import TabletStream

        fresh = TabletStream(open_change_log(stream.log.url, SHARD))
        try:
            for s in (stream, fresh):
                sub = s.subscribe(timestamp=cut, heartbeat_s=0.2)
                got: list[Transaction] = []
                try:
                    await _collect_until(sub, end, got)
                finally:
                    await sub.aclose()  # type: ignore[attr-defined]
                got = [t for t in got if t.changes]
                assert [int(t.changes[0].pk[0]) for t in got] == [3, 4, 5]
        finally:
            await fresh.close()

        # Too old: after purging the log up to (at least) its end, starting before
        # that is refused, never silently moved forward; the new start still works.
        await stream.log.purge(end)
        await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'spacer', 0)", [99])
        await asyncio.sleep(1.1)  # MariaDB: the purge point is known to the second only
        for i in range(6, 8):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'c', 0)", [i])
        end2 = await stream.log.current_position()
        log = open_change_log(stream.log.url, SHARD)
        try:
            with pytest.raises(ShardgateError) as err:
                await _read_log(log, all_txs[1].token.position, end2)
            assert err.value.code is Code.OUT_OF_RANGE
            rest = [t for t in await _read_log(log, await log.oldest_position(), end2)
                    if t.changes]
            assert [int(t.changes[0].pk[0]) for t in rest] == [99, 6, 7]
        finally:
            await log.close()

        # A timestamp start older than the retained log is refused too (a fresh
        # stream: no time map), never started at the oldest change still held;
        # a start after the purge point still works.
        fresh = TabletStream(open_change_log(stream.log.url, SHARD))
        try:
            with pytest.raises(ShardgateError) as err:
                sub = fresh.subscribe(timestamp=cut, heartbeat_s=0.2)
                await anext(sub)
            assert err.value.code is Code.OUT_OF_RANGE
            assert "purged" in str(err.value)
            sub = fresh.subscribe(timestamp=rest[1].token.timestamp, heartbeat_s=0.2)
            got = []
            try:
                await _collect_until(sub, end2, got)
            finally:
                await sub.aclose()  # type: ignore[attr-defined]
            assert [int(t.changes[0].pk[0]) for t in got if t.changes] == [6, 7]
        finally:
            await fresh.close()


async def test_retention_purges_old_changes(
    backend_kind: str, make_database: Callable[..., str]
) -> None:
    async with _tablet(backend_kind, make_database) as tablet:
        stream = await tablet.change_stream()
        ph = tablet.placeholder
        begin = await stream.log.current_position()  # not the oldest: see above
        for i in range(3):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'old', 0)", [i])
        await asyncio.sleep(1.1)  # the next commits fall in a later second
        for i in range(3, 6):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'new', 0)", [i])
        end = await stream.log.current_position()
        assert await stream.wait_for(end, 10)
        txs = [t for t in await _read_log(stream.log, begin, end) if t.changes]
        young = txs[3].token.timestamp
        assert young > txs[2].token.timestamp

        # "now" is exactly one retention after the young commits: the old ones go.
        cut = await stream.enforce_retention(now=young + stream.retention_s)
        if backend_kind == "mysql":
            assert cut is None  # the server-wide binlog follows the server's expiry
            return
        assert cut is not None
        assert position_key(cut) >= position_key(txs[2].token.position)
        with pytest.raises(ShardgateError) as err:
            await _read_log(stream.log, txs[0].token.position, end)
        assert err.value.code is Code.OUT_OF_RANGE
        kept = await _read_log(stream.log, cut, end)
        assert [int(t.changes[0].pk[0]) for t in kept if t.changes] == [3, 4, 5]


@pytest.mark.mysql
async def test_mariadb_timestamp_start_bisects_the_binlog_files(
    make_database: Callable[..., str],
) -> None:
    async with _tablet("mysql", make_database) as tablet:
        stream = await tablet.change_stream()
        ph = tablet.placeholder
        flush = "FLUSH BINARY LOGS"
        before_a = await stream.log.current_position()
        await tablet.execute(flush, [])
        for i in range(2):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'a', 0)", [i])
        await tablet.execute(flush, [])
        await asyncio.sleep(2.1)  # more than the binlog's 1-second resolution
        for i in range(2, 4):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'b', 0)", [i])
        await tablet.execute(flush, [])
        await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'c', 0)", [4])
        end = await stream.log.current_position()
        txs = [t for t in await _read_log(stream.log, before_a, end)
               if t.changes and t.changes[0].table == "t"]
        b_time = txs[2].token.timestamp

        # Whole files only: the bisection lands at the start of the 'a' file (the
        # 'b' file starts too late), not at the oldest position of the binlog. The
        # binlog is server-wide: if another database committed during the sleep,
        # that commit opens the 'b' file more than a second before b, and the 'b'
        # file's start is the (tighter) right answer; nothing else is.
        start = await stream.log.position_at(b_time)
        assert start is not None
        assert position_key(before_a) <= position_key(start)
        if position_key(start) >= position_key(txs[0].token.position):
            assert position_key(txs[1].token.position) <= position_key(start)
            assert position_key(start) < position_key(txs[2].token.position)
        # A stream with an empty time map starts there and delivers exactly b, b, c.
        from shardgate.tablet.stream import TabletStream

        fresh = TabletStream(open_change_log(stream.log.url, SHARD))
        try:
            sub = fresh.subscribe(timestamp=b_time, heartbeat_s=0.2)
            got: list[Transaction] = []
            try:
                await _collect_until(sub, end, got)
            finally:
                await sub.aclose()  # type: ignore[attr-defined]
            got = [t for t in got if t.changes and t.changes[0].table == "t"]
            assert [int(t.changes[0].pk[0]) for t in got] == [2, 3, 4]
        finally:
            await fresh.close()


@pytest.mark.mysql
async def test_mariadb_timestamp_start_bisects_the_transactions_of_a_file(
    make_database: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside one binlog file the start is bisected on GTIDs, not left at the file's
    start: a file holds up to 64 MB of the whole server's transactions, which a reader
    started there decodes one by one (a gate stream test took 10 s a range, and timed
    out under load, once the suite had written 40,000 small transactions)."""
    from shardgate.backends.changes import mysql as binlog

    assert binlog._one_gtid("0-1-7") == (0, 1, 7)
    assert binlog._one_gtid("0-1-7,1-1-3") is None
    monkeypatch.setattr(binlog, "REFINE_SLACK_S", 1.0)  # the test's sleep, not 5 s
    async with _tablet("mysql", make_database) as tablet:
        stream = await tablet.change_stream()
        ph = tablet.placeholder
        before_a = await stream.log.current_position()  # not the oldest: see above
        await tablet.execute("FLUSH BINARY LOGS", [])
        for i in range(2):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'a', 0)", [i])
        await asyncio.sleep(2.1)  # more than the binlog's 1-second resolution
        for i in range(2, 4):
            await tablet.execute(f"INSERT INTO t (id, v, n) VALUES ({ph}, 'b', 0)", [i])
        end = await stream.log.current_position()
        txs = [t for t in await _read_log(stream.log, before_a, end)
               if t.changes and t.changes[0].table == "t"]
        assert [int(t.changes[0].pk[0]) for t in txs] == [0, 1, 2, 3]
        b_time = txs[2].token.timestamp

        # After the first 'a' (the file starts before it), before b: no file boundary
        # separates a from b, so only the bisection inside the file gets here. (Not
        # always after the second 'a': another database's commit in the second before
        # b makes the start before it the last one whose next commit is old enough.)
        start = await stream.log.position_at(b_time)
        assert start is not None
        assert position_key(txs[0].token.position) <= position_key(start)
        assert position_key(start) < position_key(txs[2].token.position)
        from shardgate.tablet.stream import TabletStream

        fresh = TabletStream(open_change_log(stream.log.url, SHARD))
        try:
            sub = fresh.subscribe(timestamp=b_time, heartbeat_s=0.2)
            got: list[Transaction] = []
            try:
                await _collect_until(sub, end, got)
            finally:
                await sub.aclose()  # type: ignore[attr-defined]
            got = [t for t in got if t.changes and t.changes[0].table == "t"]
            assert [int(t.changes[0].pk[0]) for t in got] == [2, 3]
        finally:
            await fresh.close()


async def test_sqlite_capture_is_set_up_once_not_by_every_reader(
    make_database: Callable[..., str],
) -> None:
    import sqlite3
    from pathlib import Path

    from shardgate.backends.urls import parse_url

    url = make_database("sqlite", "cap")
    path = Path(parse_url(url).database)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    db.commit()
    first = open_change_log(url, SHARD)
    try:
        await first.prepare()
        version = db.execute("PRAGMA schema_version").fetchone()[0]
        for _ in range(3):  # more readers of the same file change nothing
            other = open_change_log(url, SHARD)
            try:
                await other.prepare()
                await other.current_position()
            finally:
                await other.close()
        assert db.execute("PRAGMA schema_version").fetchone()[0] == version
        # A schema change is picked up: the new column is in the next images.
        db.execute("ALTER TABLE t ADD COLUMN n INTEGER")
        db.commit()
        start = await first.current_position()
        again = open_change_log(url, SHARD)
        try:
            await again.prepare()
            assert db.execute("PRAGMA schema_version").fetchone()[0] != version
            await _backend_write(url, "INSERT INTO t (id, v, n) VALUES (1, 'a', 7)")
            end = await again.current_position()
            txs = [t for t in await _read_log(again, start, end) if t.changes]
            assert txs[-1].changes[0].after == {"id": 1, "v": "a", "n": 7}
        finally:
            await again.close()
    finally:
        await first.close()
        db.close()


async def _backend_write(url: str, sql: str) -> None:
    """One write through shardgate's SQLite backend (its connections mark transactions)."""
    from shardgate.backends import open_backend

    backend = open_backend(url)
    try:
        await backend.execute(sql, [])
    finally:
        await backend.close()


@pytest.mark.postgres
@pytest.mark.server_wide  # counts the transactions open on the whole server
async def test_postgres_capture_names_the_transactions_it_waits_for(
    make_database: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """A logical slot is created only after every transaction holding an xid on the
    server ended (the cause of a stream that seemed to hang at its start): the
    change log says which ones it waits for, and goes on once they end."""
    import psycopg

    require_server("postgres")
    url = make_database("postgres", "blk")
    other = make_database("postgres", "other")
    holder = psycopg.connect(other)
    holder.execute("CREATE TABLE held (x INT)")
    holder.commit()
    holder.execute("INSERT INTO held VALUES (1)")  # an open write transaction elsewhere
    pid = holder.info.backend_pid
    await asyncio.sleep(1.2)  # open for over a second: worth naming
    loop = asyncio.get_running_loop()
    loop.call_later(1.0, holder.rollback)
    log = open_change_log(url, SHARD)
    began = time.monotonic()
    try:
        with caplog.at_level("WARNING", logger="shardgate.backends.changes.postgres"):
            await log.prepare()
    finally:
        await log.drop()
        await log.close()
        holder.close()
    waited = time.monotonic() - began
    assert waited >= 0.8, "the slot did not wait for the open transaction"
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "waits for 1 transaction(s)" in text and f"{pid} (database " in text
