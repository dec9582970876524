#!/usr/bin/env bash
# Debian packages the tests and benchmarks need, installed only when missing
# (idempotent; run by `make servers`, so a fresh machine gets them).
#   chromium                  browser tests (Playwright drives /usr/bin/chromium)
#   libpostgresql-jdbc-java   Spark JDBC references (benchmarks)
#   sysbench                  bench/sysbench.sh and tests/integration/doors/test_sysbench.py
#   etcd-server               the etcd topo store's tests (each test run starts its own etcd
#                             on free ports, shardgate.topo.etcd_local; not the distro service)
#   iproute2, openssl         tests/integration/production/test_hosts.py: hosts simulated with
#                             network namespaces (ip netns, as root), TLS certificates
#                             (scripts/make-test-ca.sh); it runs its own PostgreSQL cluster with
#                             the server's initdb/pg_ctl from /usr/lib/postgresql/N/bin
set -euo pipefail

want=()
command -v chromium >/dev/null || want+=(chromium)
test -e /usr/share/java/postgresql.jar || want+=(libpostgresql-jdbc-java)
command -v sysbench >/dev/null || want+=(sysbench)
command -v etcd >/dev/null || want+=(etcd-server)
command -v ip >/dev/null || want+=(iproute2)
command -v openssl >/dev/null || want+=(openssl)

if ((${#want[@]})); then
    echo "install-system-deps: installing ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
fi
echo "install-system-deps: ok"
