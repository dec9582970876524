"""``shardgate doctor``: is this machine ready, and what to fix if not.

::

    shardgate doctor [--cluster FILE | --data-dir DIR]
                     [--postgres URL] [--mysql URL] [--redis URL]

Checks the Python version, which extras are installed, Java (for Spark), and
the database servers: those of the cluster's shards when a cluster is given,
else the local defaults when they answer. A server the cluster uses that is
down or misconfigured is a failure (exit 1); an optional part that is missing
is a warning (exit 0). Every line that is not ``ok`` says what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardgate.backends.urls import DatabaseURL, parse_url, redacted
from shardgate.errors import ShardgateError

if TYPE_CHECKING:  # the drivers load when a check runs (``doctor --help`` loads none)
    from shardgate.topo import Topology

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_MYSQL = "mysql://root@127.0.0.1:3306/mysql"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
MIN_PYTHON = (3, 11)
MIN_JAVA = 17
SETUP_HINT = "or run `sudo bash scripts/setup-servers.sh` from the source tree"

#: extra -> (modules it brings, what it is for)
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "spark": (("pyspark", "pyarrow", "pandas", "adbc_driver_postgresql", "deltalake"),
              "`shardgate spark` jobs and the Spark data sources"),
    "dev": (("pytest", "mypy", "ruff"), "running the tests and linters"),
}

#: server setting -> (wanted value as the server prints it, why)
POSTGRES_SETTINGS: dict[str, tuple[str, str]] = {
    "wal_level": ("logical", "change streams read logical decoding"),
    "max_prepared_transactions": (">0", "two-phase commit prepares transactions"),
    "max_replication_slots": (">=8", "one slot per shard database plus one per reader"),
}
POSTGRES_FIX = {"wal_level": "logical", "max_prepared_transactions": "64",
                "max_replication_slots": "32"}
MYSQL_FIX = {"log_bin": "mysql-bin", "binlog_format": "ROW", "binlog_row_image": "FULL",
             "binlog_row_metadata": "FULL"}
MYSQL_SETTINGS: dict[str, tuple[str, str]] = {
    "log_bin": ("1", "change streams read the binary log"),
    "binlog_format": ("ROW", "change streams need row images"),
    "binlog_row_image": ("FULL", "change streams need whole before/after images"),
    "binlog_row_metadata": ("FULL", "change streams need column names"),
}


@dataclass(frozen=True)
class Check:
    """One finding: ``status`` is ``ok``, ``warn`` or ``FAIL``; ``fix`` what to do."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<5} {self.name}: {self.detail}"
        return f"{text}\n      fix: {self.fix}" if self.fix else text


def add_parsers(commands: Any) -> None:
    """Add ``doctor`` to the ``shardgate`` parser."""
    doctor = commands.add_parser(
        "doctor", help="check Python, extras, Java and the database servers; say what to fix"
    )
    where = doctor.add_mutually_exclusive_group()
    where.add_argument("--cluster", help="check the servers of this cluster file")
    where.add_argument("--data-dir", help="check the cluster of `shardgate up --data-dir DIR`")
    doctor.add_argument("--postgres", help=f"PostgreSQL server to check ({DEFAULT_POSTGRES})")
    doctor.add_argument("--mysql", help=f"MariaDB/MySQL server to check ({DEFAULT_MYSQL})")
    doctor.add_argument("--redis", help=f"Redis server to check ({DEFAULT_REDIS})")


def run(args: argparse.Namespace, topology: Topology | None) -> int:
    """Print every check; 1 if any failed."""
    checks = [check_python(), *check_extras(), check_java()]
    checks += asyncio.run(check_servers(args, topology))
    for c in checks:
        print(c.line())
    failed = sum(c.status == "FAIL" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    print(f"{len(checks)} checks: {failed} failed, {warned} warnings")
    return 1 if failed else 0


def check_python(version: Sequence[int] = sys.version_info[:3]) -> Check:
    shown = ".".join(map(str, version))
    if tuple(version[:2]) >= MIN_PYTHON:
        return Check("python", "ok", shown)
    want = ".".join(map(str, MIN_PYTHON))
    return Check("python", "FAIL", f"{shown} is older than {want}",
                 f"install Python >= {want} and recreate the virtual environment")


def check_extras(find: Callable[[str], object] = importlib.util.find_spec) -> list[Check]:
    out = []
    for extra, (modules, purpose) in EXTRAS.items():
        missing = [m for m in modules if find(m) is None]
        if not missing:
            out.append(Check(f"extra [{extra}]", "ok", "installed"))
        else:
            out.append(Check(
                f"extra [{extra}]", "warn",
                f"not installed (missing {', '.join(missing)}); needed only for {purpose}",
                f"pip install -e '.[{extra}]' (or `make test`, which installs it)",
            ))
    return out


def check_java(which: Callable[[str], str | None] = shutil.which) -> Check:
    fix = f"apt-get install -y openjdk-{MIN_JAVA}-jre-headless (needed only for Spark)"
    java = which("java")
    if java is None:
        return Check("java", "warn", "not found on PATH", fix)
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("java", "warn", f"{java} does not run: {exc}", fix)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    major = 0 if m is None else (int(m.group(2) or 0) if m.group(1) == "1" else int(m.group(1)))
    if major >= MIN_JAVA:
        return Check("java", "ok", f"{java} (Java {major})")
    return Check("java", "warn", f"{java} is Java {major or '?'}, Spark needs >= {MIN_JAVA}", fix)


async def check_servers(args: argparse.Namespace, topology: Topology | None) -> list[Check]:
    """The servers of the cluster (required), or the local defaults (optional)."""
    wanted: dict[str, tuple[DatabaseURL, bool]] = {}  # server -> (url, required)
    if topology is not None:
        for ks in topology.keyspaces.values():
            for shard in ks.shards:
                url = parse_url(shard.url)
                if url.kind != "sqlite":
                    wanted.setdefault(f"{url.kind}://{url.host}:{url.port}", (url, True))
    for given, default in ((args.postgres, DEFAULT_POSTGRES), (args.mysql, DEFAULT_MYSQL)):
        url = parse_url(given or default)
        key = f"{url.kind}://{url.host}:{url.port}"
        if topology is None or given:
            wanted.setdefault(key, (url, given is not None))
    out = [await _check_database(url, required) for url, required in wanted.values()]
    out.append(await _check_redis(args.redis or DEFAULT_REDIS, args.redis is not None))
    return out


async def _check_database(url: DatabaseURL, required: bool) -> Check:
    from shardgate.backends import open_backend

    name = f"{'postgresql' if url.kind == 'postgresql' else 'mariadb'} {url.host}:{url.port}"
    backend = open_backend(url.raw, pool_size=1)
    try:
        settings = POSTGRES_SETTINGS if url.kind == "postgresql" else MYSQL_SETTINGS
        sql = _settings_sql(url.kind, settings)
        have = {str(k): str(v) for k, v in (await backend.execute(sql, [])).rows}
    except ShardgateError as exc:
        if not required:
            return Check(name, "warn", f"not reachable ({exc.code.value}); needed only for "
                         "shards on this server and its tests",
                         f"start the server or pass --{_flag(url)} URL")
        return Check(name, "FAIL", f"not reachable: {exc.message}",
                     f"start the server, check the URL in the cluster file, {SETUP_HINT}")
    finally:
        await backend.close()
    wrong = [f"{k}={have.get(k, '?')} (want {want}: {why})"
             for k, (want, why) in settings.items() if not _satisfies(have.get(k), want)]
    if not wrong:
        return Check(name, "ok", ", ".join(f"{k}={v}" for k, v in sorted(have.items())))
    return Check(name, "FAIL" if required else "warn", "; ".join(wrong),
                 _fix(url.kind, [w.split("=", 1)[0] for w in wrong]))


def _settings_sql(kind: str, settings: Mapping[str, object]) -> str:
    """A query of ``(name, value)`` rows for the server settings named in ``settings``."""
    if kind == "postgresql":
        names = ", ".join(f"'{n}'" for n in settings)
        return f"SELECT name, setting FROM pg_settings WHERE name IN ({names})"
    return " UNION ALL ".join(f"SELECT '{n}', @@{n}" for n in settings)


def _flag(url: DatabaseURL) -> str:
    return "postgres" if url.kind == "postgresql" else "mysql"


def _satisfies(have: str | None, want: str) -> bool:
    if have is None:
        return False
    if want.startswith(">="):
        return have.isdigit() and int(have) >= int(want[2:])
    if want.startswith(">"):
        return have.isdigit() and int(have) > int(want[1:])
    return have.upper() == want.upper()


def _fix(kind: str, names: list[str]) -> str:
    if kind == "postgresql":
        sets = "; ".join(f"ALTER SYSTEM SET {n} = '{POSTGRES_FIX[n]}'" for n in names)
        return f"as superuser: {sets}; then restart PostgreSQL, {SETUP_HINT}"
    lines = ", ".join(f"{n} = {MYSQL_FIX[n]}" for n in names)
    return f"in the server's [mysqld] configuration: {lines}; then restart it, {SETUP_HINT}"


async def _check_redis(url: str, required: bool) -> Check:
    import redis.asyncio as aioredis

    name = f"redis {redacted(url)}"
    client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        await client.ping()
    except (OSError, aioredis.RedisError) as exc:
        status = "FAIL" if required else "warn"
        return Check(name, status, f"not reachable ({exc}); needed only for cache invalidation",
                     "start redis-server or pass --redis URL")
    finally:
        await client.aclose()
    return Check(name, "ok", "answers PING")
