#!/usr/bin/env bash
# SQLAlchemy's dialect compliance suite (sqlalchemy.testing.suite) with the stock
# mysql+pymysql dialect against a shardgate gate's MySQL listener, over two unsharded
# keyspaces (`test` and the suite's `test_schema`) on MariaDB databases of the local
# server. Not part of `make test` (it takes about 3 minutes); docs/clients.md has the
# last counts. Usage: bash scripts/sqla_suite/run.sh [pytest args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
work="$(mktemp -d)"
dbs=(sg_sqla_suite sg_sqla_suite_schema)
for db in "${dbs[@]}"; do
  mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db CHARACTER SET utf8mb4"
done
PYTHONPATH="$root" "$py" - "$work/cluster.yaml" <<'PY'
import sys
from shardgate.topo import Topology, write_cluster_file
shard = "mysql://root@127.0.0.1:3306/{}"
write_cluster_file(Topology.from_dict({"default_keyspace": "test", "keyspaces": {
    "test": {"shards": {"0": shard.format("sg_sqla_suite")},
             "vschema": {"sharded": False, "tables": {}}},
    "test_schema": {"shards": {"0": shard.format("sg_sqla_suite_schema")},
                    "vschema": {"sharded": False, "tables": {}}}}}), sys.argv[1])
PY
port=15399
PYTHONPATH="$root" "$py" -m shardgate.cli gate --cluster "$work/cluster.yaml" --port 15398 \
  --mysql-port "$port" --mysql-no-auth >"$work/gate.log" 2>&1 &
gate=$!
cleanup() {
  kill "$gate" 2>/dev/null || true
  wait "$gate" 2>/dev/null || true
  for db in "${dbs[@]}"; do mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS $db"; done
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do
  (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.2
done
cd "$here"
"$py" -m pytest -q --dburi "mysql+pymysql://root@127.0.0.1:$port/test" test_suite.py \
  --maxfail=100000 "$@"
