"""SQLAlchemy's dialect compliance suite against a shardgate gate's MySQL listener.

Runs ``sqlalchemy.testing.suite`` with the stock ``mysql+pymysql`` dialect and
shardgate's :class:`requirements.Requirements` against ``shardgate up`` over
two keyspaces on MariaDB databases of the local server: ``test`` and the
suite's second schema ``test_schema``.

``--sharded`` makes ``test`` a sharded keyspace of two shards whose VSchema has
an ``auto_shard`` rule: a table created through the gate that the VSchema does
not name is added to it, sharded by an ``xxhash`` vindex (integers and strings
alike) on its first primary key column, else its first column, and an
AUTO_INCREMENT key draws from a sequence the gate creates in a third,
unsharded keyspace ``test_seq`` (see docs/clients.md). Without it both keyspaces are unsharded.

Usage: python scripts/sqla_suite/run.py [--sharded] [--port N] [pytest args]
Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SHARD = "mysql://root@127.0.0.1:3306/{}"


def topology(prefix: str, sharded: bool) -> dict[str, object]:
    """The cluster: ``test`` (unsharded, or two shards with auto-sharding) and ``test_schema``."""
    if sharded:
        test: dict[str, object] = {
            "shards": {"-80": SHARD.format(f"{prefix}_x80"), "80-": SHARD.format(f"{prefix}_80x")},
            "vschema": {"sharded": True, "vindexes": {"xxhash": {"type": "xxhash"}},
                        "auto_shard": {"vindex": "xxhash", "sequence_keyspace": "test_seq"},
                        "tables": {}}}
    else:
        test = {"shards": {"0": SHARD.format(prefix)},
                "vschema": {"sharded": False, "tables": {}}}
    keyspaces: dict[str, object] = {
        "test": test,
        "test_schema": {"shards": {"0": SHARD.format(f"{prefix}_schema")},
                        "vschema": {"sharded": False, "tables": {}}}}
    if sharded:  # the sequences of auto-sharded tables with an AUTO_INCREMENT key
        keyspaces["test_seq"] = {"shards": {"0": SHARD.format(f"{prefix}_seq")},
                                 "vschema": {"sharded": False, "tables": {}}}
    return {"default_keyspace": "test", "keyspaces": keyspaces}


def databases(prefix: str, sharded: bool) -> list[str]:
    """The MariaDB databases the shards live in."""
    first = [f"{prefix}_x80", f"{prefix}_80x", f"{prefix}_seq"] if sharded else [prefix]
    return [*first, f"{prefix}_schema"]


def mariadb(*statements: str) -> None:
    """Run ``statements`` on the local MariaDB server as root."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"shardgate up exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the MySQL listener did not open port {port} in {timeout_s} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--prefix", default="sg_sqla_suite")
    args, rest = parser.parse_known_args()
    py = os.environ.get("PYTHON", sys.executable)
    sys.path.insert(0, str(ROOT))
    from shardgate.topo import Topology, write_cluster_file

    names = databases(args.prefix, args.sharded)
    for db in names:
        mariadb(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as work:
        cluster = Path(work) / "cluster.yaml"
        write_cluster_file(Topology.from_dict(topology(args.prefix, args.sharded)), str(cluster))
        port = free_port()
        with open(Path(work) / "gate.log", "wb") as log:
            gate = subprocess.Popen(
                [py, "-m", "shardgate.cli", "up", "--cluster", str(cluster), "--port", "0",
                 "--http-port", "0", "--mysql-port", str(port)], env=env, stdout=log,
                stderr=subprocess.STDOUT)
            try:
                wait_port(port, gate)
                return subprocess.run(
                    [py, "-m", "pytest", "-q", "-p", "no:randomly", "--dburi",
                     f"mysql+pymysql://root@127.0.0.1:{port}/test", "test_suite.py",
                     "--maxfail=100000", *rest], cwd=HERE, env=env).returncode
            finally:
                gate.terminate()
                gate.wait(30)
                for db in names:
                    mariadb(f"DROP DATABASE IF EXISTS {db}")


if __name__ == "__main__":
    sys.exit(main())
