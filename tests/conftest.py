"""Fixtures shared by the whole suite.

Real servers. Integration and acceptance tests run against the PostgreSQL,
MariaDB and Redis servers on this machine (``scripts/setup-servers.sh``
brings them up and configures them). A server that cannot be reached is a
*skip* with the reason on a laptop, and a *failure* in CI (environment
``CI=true``), so CI can never go green by skipping everything (the rule
dramatiq's and procrastinate's suites follow). Use :func:`require_server`
for that, never a bare ``pytest.skip``.

Where the servers are (override with environment variables)::

    SHARDGATE_TEST_POSTGRES_URL  postgresql://postgres@127.0.0.1:5432/postgres
    SHARDGATE_TEST_MYSQL_URL     mysql://root@127.0.0.1:3306/
    SHARDGATE_TEST_REDIS_URL     redis://127.0.0.1:6379/0

Fixtures:

* ``make_database(kind, name_hint="") -> url``: a brand-new empty database
  (``sqlite``: a file under ``tmp_path``; ``postgres``/``mysql``:
  ``CREATE DATABASE sg_test_<hint>_<random>``), dropped at teardown.
* ``backend_kind``: parametrized over ``sqlite``, ``postgres``, ``mysql``
  (with the ``postgres`` / ``mysql`` marks, so ``-m "not mysql"`` works).
* ``database_url``: ``make_database(backend_kind)``.
* ``backend``: an open :class:`shardgate.backends.Backend` on
  ``database_url``, closed at teardown.

Administrative SQL here uses the drivers directly and synchronously: it runs
in fixture set-up/teardown or in a factory call, never concurrently with the
code under test, so blocking the event loop for it is harmless.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pymysql
import pytest

from shardgate.backends import Backend, open_backend
from shardgate.backends.urls import parse_url, redacted
from shardgate.gate import Gate

POSTGRES_ADMIN_URL = os.environ.get(
    "SHARDGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_ADMIN_URL = os.environ.get("SHARDGATE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
REDIS_URL = os.environ.get("SHARDGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

SERVER_KINDS = ("postgres", "mysql", "redis")
DATABASE_KINDS = ("sqlite", "postgres", "mysql")
PROBE_TIMEOUT_S = 3

# kind -> None (reachable) or the reason it is not; probed once per session.
_probe_cache: dict[str, str | None] = {}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


# --------------------------------------------------------------- connections --


def _postgres_admin(dbname: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
    url = parse_url(POSTGRES_ADMIN_URL)
    return psycopg.connect(
        host=url.host,
        port=url.port or 5432,
        user=url.user,
        password=url.password,
        dbname=dbname or url.database or "postgres",
        autocommit=True,
        connect_timeout=PROBE_TIMEOUT_S,
    )


def _mysql_admin() -> pymysql.connections.Connection:  # type: ignore[type-arg]
    url = parse_url(MYSQL_ADMIN_URL)
    return pymysql.connect(
        host=url.host,
        port=url.port or 3306,
        user=url.user or "root",
        password=url.password or "",
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=PROBE_TIMEOUT_S,
    )


def _with_database(admin_url: str, database: str) -> str:
    """The admin URL pointing at another database (same credentials)."""
    parts = urlsplit(admin_url)
    return parts._replace(path="/" + database).geturl()


# ------------------------------------------------------------------- probing --


def _probe(kind: str) -> str | None:
    try:
        if kind == "postgres":
            with _postgres_admin() as conn:
                conn.execute("SELECT 1")
        elif kind == "mysql":
            conn = _mysql_admin()
            try:
                conn.ping(reconnect=False)
            finally:
                conn.close()
        elif kind == "redis":
            parts = urlsplit(REDIS_URL)
            with socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 6379), timeout=PROBE_TIMEOUT_S
            ) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
            if not reply.startswith(b"+PONG"):
                return f"unexpected reply to PING: {reply!r}"
        else:
            raise ValueError(f"unknown server kind {kind!r}; expected one of {SERVER_KINDS}")
    except ValueError:
        raise
    except Exception as exc:
        return " ".join(f"{type(exc).__name__}: {exc}".split())
    return None


def require_server(kind: str) -> None:
    """Skip the test (or fail it when ``CI=true``) unless server ``kind`` answers.

    ``kind`` is one of ``postgres``, ``mysql``, ``redis``. The probe runs once
    per session and kind; its result is reused.
    """
    if kind not in _probe_cache:
        _probe_cache[kind] = _probe(kind)
    reason = _probe_cache[kind]
    if reason is None:
        return
    where = {"postgres": POSTGRES_ADMIN_URL, "mysql": MYSQL_ADMIN_URL, "redis": REDIS_URL}[kind]
    message = (
        f"{kind} server at {redacted(where)} is not reachable ({reason}); "
        "run scripts/setup-servers.sh as root to start and configure it"
    )
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


# ----------------------------------------------------------------- databases --

MakeDatabase = Callable[..., str]


def _database_name(hint: str) -> str:
    clean = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")[:24]
    suffix = secrets.token_hex(4)
    return f"sg_test_{clean}_{suffix}" if clean else f"sg_test_{suffix}"


def _drop_postgres(name: str) -> None:
    _drop_postgres_slots(name)
    with _postgres_admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _drop_postgres_slots(name: str) -> None:
    """Drop database ``name``'s logical replication slots (they block DROP DATABASE, and
    each holds one of the server's ``max_replication_slots`` and its WAL)."""
    with _postgres_admin() as conn:
        # Logical replication slots (change streams) of the database block DROP DATABASE.
        # A slot stays active until the server notices its reader is gone (a tablet
        # process just killed): end the reader's backend, then wait for the slot to be
        # released (pg_terminate_backend only signals), bounded.
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE database = %s AND active",
            (name,),
        )
        deadline = time.monotonic() + 30
        while True:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE database = %s AND NOT active",
                (name,),
            )
            row = conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchone()
            if not row or not row[0] or time.monotonic() > deadline:
                break
            time.sleep(0.05)


def _drop_mysql(name: str) -> None:
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            # Sessions a test left open would hold metadata locks and block DROP.
            cur.execute(
                "SELECT id FROM information_schema.processlist"
                " WHERE db = %s AND id <> CONNECTION_ID()",
                (name,),
            )
            for (session_id,) in cur.fetchall():
                with contextlib.suppress(pymysql.err.OperationalError):  # already gone
                    cur.execute(f"KILL {int(session_id)}")
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


class _Dropper:
    """Drops finished tests' server databases in background threads of this process.

    A PostgreSQL ``DROP DATABASE`` waits for a forced checkpoint: seconds while other
    tests write (2.2 s each, measured under load), which every PostgreSQL test's
    teardown spent waiting, one database after the other (the teardowns were 36% of
    ``tests/integration/sql``'s time). Checkpoints requested together are one
    checkpoint: six drops at once took 2.0 s where six in a row took 13 s. So the
    drops run :attr:`THREADS` at a time, while the next tests run. What must not wait
    is done before a database is handed over: its replication slots are dropped in
    the teardown (each holds one of the server's ``max_replication_slots``).

    Invariants: at most :attr:`MAX_PENDING` databases wait to be dropped (a teardown
    that would exceed it waits for a free place); a failed drop is reported by the
    next :func:`make_database` teardown in this process, naming the test that made
    the database; the session's end (:func:`pytest_sessionfinish`) waits for every
    drop and reports what failed.
    """

    THREADS = 6
    MAX_PENDING = 12

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, str, str]] = queue.Queue()
        self._places = threading.BoundedSemaphore(self.MAX_PENDING)
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._threads: list[threading.Thread] = []

    def drop(self, kind: str, name: str, owner: str) -> None:
        """Drop database ``name`` of ``kind`` (``postgres``/``mysql``) soon; ``owner``
        names the test that made it, for the report."""
        if not self._threads:
            self._threads = [threading.Thread(target=self._run, name=f"drop-databases-{i}",
                                              daemon=True) for i in range(self.THREADS)]
            for thread in self._threads:
                thread.start()
        self._places.acquire()
        self._queue.put((kind, name, owner))

    def _run(self) -> None:
        while True:
            kind, name, owner = self._queue.get()
            try:
                if kind == "postgres":
                    _drop_postgres(name)
                else:
                    _drop_mysql(name)
            except Exception as exc:  # reported by the next teardown or the session's end
                with self._lock:
                    self._errors.append(f"{kind} {name} (made by {owner}): {exc}")
            finally:
                self._places.release()
                self._queue.task_done()

    def errors(self) -> list[str]:
        """The drops that failed since the last call."""
        with self._lock:
            found, self._errors = self._errors, []
        return found

    def wait(self, timeout: float = 300) -> None:
        """Until every database handed over is dropped; after ``timeout`` seconds the
        drops still running are reported as errors (a hung drop must not hang the run)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._queue.unfinished_tasks:
            with self._lock:
                self._errors.append(
                    f"{self._queue.unfinished_tasks} drops still running after {timeout:.0f}s")


_dropper = _Dropper()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Wait for the test databases' drops; a failed one fails the run."""
    _dropper.wait()
    errors = _dropper.errors()
    if errors:
        sys.stderr.write("could not drop test databases:\n" + "\n".join(errors) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def create_database(kind: str, hint: str, sqlite_dir: Path) -> tuple[str, str | None]:
    """A new empty database of ``kind``: its URL, and its name on the server (None for a
    SQLite file in ``sqlite_dir``: nothing to drop). The caller drops it (``_dropper``)."""
    if kind not in DATABASE_KINDS:
        raise ValueError(f"unknown database kind {kind!r}; expected one of {DATABASE_KINDS}")
    name = _database_name(hint)
    if kind == "sqlite":
        return f"sqlite:///{sqlite_dir / name}.db", None
    require_server(kind)
    if kind == "postgres":
        with _postgres_admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return _with_database(POSTGRES_ADMIN_URL, name), name
    conn = _mysql_admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
    finally:
        conn.close()
    return _with_database(MYSQL_ADMIN_URL, name), name


@pytest.fixture
def make_database(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MakeDatabase]:
    """Factory: ``make_database(kind, name_hint="")`` -> URL of a new empty database.

    Server databases are dropped after the test by :class:`_Dropper`, in the background.
    """
    created: list[tuple[str, str]] = []

    def make(kind: str, name_hint: str = "") -> str:
        url, name = create_database(kind, name_hint, tmp_path / "db")
        if name is not None:
            created.append((kind, name))
        return url

    yield make

    errors: list[str] = []
    for kind, name in reversed(created):
        try:
            if kind == "postgres":
                _drop_postgres_slots(name)
        except Exception as exc:  # keep handing the others over; report at the end
            errors.append(f"{kind} {name}: {exc}")
        _dropper.drop(kind, name, request.node.nodeid)
    errors += _dropper.errors()
    if errors:
        pytest.fail("could not drop test databases: " + "; ".join(errors), pytrace=False)


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Each database kind in turn; skips/fails (see ``require_server``) if its server is down."""
    kind: str = request.param
    if kind != "sqlite":
        require_server(kind)
    return kind


@pytest.fixture
def database_url(backend_kind: str, make_database: MakeDatabase) -> str:
    """URL of a new empty database of ``backend_kind``."""
    return make_database(backend_kind)


@pytest.fixture
async def backend(database_url: str) -> AsyncIterator[Backend]:
    """An open backend on ``database_url`` (pool of 4), closed at teardown."""
    be = open_backend(database_url, pool_size=4)
    try:
        yield be
    finally:
        await be.close()


def console_cluster(tmp_path: Path) -> Path:
    """A cluster file for console tests: keyspace ``ks`` (2 SQLite shards, table ``t``
    by ``hash``) and an unsharded ``lookup``."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "default_keyspace: ks\n"
        "keyspaces:\n"
        "  ks:\n"
        "    shards: {'-80': sqlite:///ks-80.db, '80-': 'sqlite:///ks80-.db'}\n"
        "    vschema:\n"
        "      sharded: true\n"
        "      vindexes: {hash: {type: hash}}\n"
        "      tables: {t: {column_vindexes: [{column: id, name: hash}]}}\n"
        "  lookup:\n"
        "    shards: {'0': sqlite:///lookup.db}\n"
        "    vschema: {sharded: false, tables: {}}\n"
    )
    return path


@pytest.fixture
async def console_site(tmp_path: Path) -> AsyncIterator[tuple[Gate, str]]:
    """A gate over :func:`console_cluster`'s store with its HTTP server; (gate, base URL)."""
    from shardgate.api.http import HttpServer
    from shardgate.topo.local import open_topo

    gate = await Gate.from_topo(await open_topo(console_cluster(tmp_path)))
    server = HttpServer(gate, "127.0.0.1", 0)
    port = await server.start()
    try:
        yield gate, f"http://127.0.0.1:{port}"
    finally:
        await server.stop()
        await gate.close()


# ----------------------------------------------------------------- durations --

#: how many test files the end-of-run summary lists (``--durations`` lists tests)
FILE_DURATIONS_SHOWN = 25

#: test file -> seconds of set-up, call and teardown; xdist worker -> seconds busy
_file_seconds: dict[str, float] = {}
_worker_seconds: dict[str, float] = {}
_file_worker: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration to its file's total (and, under xdist, its worker's)."""
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    node = getattr(report, "node", None)  # set by xdist on the reports a worker sends
    worker = getattr(getattr(node, "gateway", None), "id", None)
    if isinstance(worker, str):
        _worker_seconds[worker] = _worker_seconds.get(worker, 0.0) + report.duration
        _file_worker[path] = worker


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The slowest test files (with ``--dist loadfile`` the longest file bounds a worker)
    and each worker's busy time, printed at the end of the run for CI's log."""
    if not _file_seconds or len(_file_seconds) < 2:
        return
    tr = terminalreporter
    tr.section("slowest test files (set-up + call + teardown)")
    ranked = sorted(_file_seconds.items(), key=lambda kv: -kv[1])
    for path, seconds in ranked[:FILE_DURATIONS_SHOWN]:
        worker = _file_worker.get(path, "")
        tr.write_line(f"{seconds:8.1f}s {worker:>4} {path}")
    tr.write_line(f"{sum(_file_seconds.values()):8.1f}s in all, {len(ranked)} files")
    if _worker_seconds:
        tr.write_line("busy: " + ", ".join(
            f"{w} {s:.0f}s" for w, s in sorted(_worker_seconds.items())))
