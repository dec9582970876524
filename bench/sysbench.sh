#!/usr/bin/env bash
# sysbench (the client Vitess's own benchmarks use) through shardgate's MySQL listener,
# beside the same run straight to one MariaDB database.
#
#   bash bench/sysbench.sh [--smoke] [--seconds S] [--table-size N] [--threads T]
#                          [--ps-mode auto|disable] [--production] [--workers N]
#                          [--gate-cpus LIST] [--client-cpus LIST] [--workloads W,W]
#
# Through the gate: `shardgate up --cluster` over a keyspace `sbtest` of 4 MariaDB shards
# (-40, 40-80, 80-c0, c0-: four databases of the local server) and an unsharded keyspace
# `sbseq`. The keyspace's VSchema has `auto_shard: {vindex: hash, sequence_keyspace: sbseq}`
# and no tables: sysbench's own `CREATE TABLE sbtest1 (id INTEGER NOT NULL AUTO_INCREMENT,
# ... PRIMARY KEY (id))` adds sbtest1 to it with a `hash` vindex on `id`, and makes `id` a
# Vitess sequence (the table sbtest1_seq in sbseq), so sysbench runs unchanged: its
# prepare inserts rows without ids (--auto_inc=on, the default) and the gate draws them
# from the sequence; `cleanup` (DROP TABLE) takes sbtest1 and its sequence out again.
# With --production the same keyspace is served in production mode instead: `shardgate
# cluster up` (a `shardgate gate` process and one `shardgate tablet` process per shard,
# docs/production.md), and the CPU of the gate and of the tablets is printed apart.
# With --workers N the sysbench runs go to a `shardgate gate --workers N` on the same
# topo store instead (started beside the cluster's own gate, which stays idle), and the
# gate CPU column sums its supervisor and its N workers. --gate-cpus and --client-cpus
# pin that gate and sysbench with `taskset -c LIST` (e.g. 0 and 1: the gate on core 0,
# the client on core 1), so 1 worker against 2 shows what a second core gives
# (docs/production.md, "Using every core").
# Straight: the same sysbench commands against one MariaDB database.
#
# Each of oltp_point_select, oltp_read_only and oltp_read_write runs on both, one after
# the other (prepared statements over COM_STMT_PREPARE: --db-ps-mode=auto, sysbench's
# default). Printed per workload: transactions/s and p95 latency (ms) of each, the ratio
# gate/direct of transactions/s, the CPU of the `shardgate up` process (the gate with its
# in-process tablets) per transaction, read from /proc/<pid>/stat over the run, and the
# errors sysbench retried (direct/gate). The machine should be otherwise idle: the two
# paths run one after the other.
#
# One client thread by default, and then any error fails the run. With more threads,
# oltp_read_write's transactions deadlock across shards now and then (a row locked on
# shard A waits for shard B, the other client's the other way round); no shard sees the
# cycle, so the statement waits until the gate's query timeout cancels it with error
# 3024, where one MariaDB answers 1213 at once. So with --threads > 1 (and
# oltp_read_write among the workloads: the others take no locks) the gate runs with
# --query-timeout 1 (30 s by default), sysbench is told to retry 3024 as it retries
# 1213 and 1205 (--mysql-ignore-errors), and the errors column counts them
# (docs/clients.md, "sysbench").
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
HOST="${SHARDGATE_BENCH_MYSQL_HOST:-127.0.0.1}"
PORT="${SHARDGATE_BENCH_MYSQL_PORT:-3306}"
SECONDS_EACH=10
TABLE_SIZE=10000
THREADS=1
PS_MODE=auto
PRODUCTION=0
WORKERS=0
GATE_CPUS=""
CLIENT_CPUS=""
WORKLOADS=oltp_point_select,oltp_read_only,oltp_read_write
VIA_TABLETS=()
while (($#)); do
    case "$1" in
        --smoke) SECONDS_EACH=2; TABLE_SIZE=1000 ;;
        --seconds) SECONDS_EACH="$2"; shift ;;
        --table-size) TABLE_SIZE="$2"; shift ;;
        --threads) THREADS="$2"; shift ;;
        --ps-mode) PS_MODE="$2"; shift ;;
        --production) PRODUCTION=1 ;;
        --workers) WORKERS="$2"; PRODUCTION=1; shift ;;
        --gate-cpus) GATE_CPUS="$2"; shift ;;
        --client-cpus) CLIENT_CPUS="$2"; shift ;;
        --workloads) WORKLOADS="$2"; shift ;;
        --via-tablets) VIA_TABLETS=(--via-tablets) ;;  # the --workers gate sends all to tablets
        *) echo "usage: $0 [--smoke] [--seconds S] [--table-size N] [--threads T]" \
                "[--ps-mode auto|disable] [--production] [--workers N] [--gate-cpus LIST]" \
                "[--client-cpus LIST] [--workloads W,W] [--via-tablets]" >&2; exit 2 ;;
    esac
    shift
done
if ((PRODUCTION && !WORKERS && THREADS > 1)); then
    echo "--production takes one thread (cluster up sets no query timeout);" \
         "--workers N takes more" >&2; exit 2
fi
GATE_TASKSET=()
CLIENT_TASKSET=()
[[ -z "$GATE_CPUS" ]] || GATE_TASKSET=(taskset -c "$GATE_CPUS")
[[ -z "$CLIENT_CPUS" ]] || CLIENT_TASKSET=(taskset -c "$CLIENT_CPUS")
if [[ -n "$GATE_CPUS" ]] && ((!WORKERS)); then
    echo "--gate-cpus pins the gate of --workers N" >&2; exit 2
fi
command -v sysbench >/dev/null || { echo "sysbench is missing: run make servers" \
    "(scripts/install-system-deps.sh installs it)" >&2; exit 1; }

# per process, so two runs at once do not drop each other's databases
PREFIX="sg_sysbench_$$"
SHARDS=(s1 s2 s3 s4)
WORK="$(mktemp -d)"
GATE_PID=""
WORKERS_PID=""
TABLET_PIDS=()
LOG="$WORK/gate.log"

admin() { mariadb -h "$HOST" -P "$PORT" -u root --skip-ssl -N -e "$1"; }

cleanup() {
    if [[ -n "$WORKERS_PID" ]] && kill -0 "$WORKERS_PID" 2>/dev/null; then
        kill "$WORKERS_PID"; wait "$WORKERS_PID" 2>/dev/null || true
    fi
    if ((PRODUCTION)) && [[ -e "$WORK/cluster/cluster-state.json" ]]; then
        "$PY" -m shardgate.cli cluster down --dir "$WORK/cluster" >/dev/null 2>&1 || true
    elif [[ -n "$GATE_PID" ]] && kill -0 "$GATE_PID" 2>/dev/null; then
        kill "$GATE_PID"; wait "$GATE_PID" 2>/dev/null || true
    fi
    for db in "${SHARDS[@]}" seq direct; do admin "DROP DATABASE IF EXISTS \`${PREFIX}_$db\`"; done
    rm -rf "$WORK"
}
trap cleanup EXIT

for db in "${SHARDS[@]}" seq direct; do
    admin "CREATE DATABASE \`${PREFIX}_$db\` CHARACTER SET utf8mb4"
done

url() { echo "mysql://root@$HOST:$PORT/${PREFIX}_$1"; }
cat >"$WORK/cluster.yaml" <<EOF
default_keyspace: sbtest
keyspaces:
  sbtest:
    shards:
      "-40": $(url s1)
      "40-80": $(url s2)
      "80-c0": $(url s3)
      "c0-": $(url s4)
    vschema:
      sharded: true
      vindexes: {hash: {type: hash}}
      auto_shard: {vindex: hash, sequence_keyspace: sbseq}
      tables: {}
  sbseq:
    shards: {"0": $(url seq)}
    vschema: {sharded: false, tables: {}}
EOF

GATE_ARGS=()
IGNORE=()
if ((THREADS > 1)) && [[ ",$WORKLOADS," == *,oltp_read_write,* ]]; then
    GATE_ARGS=(--query-timeout 1)
    IGNORE=(--mysql-ignore-errors=1213,1020,1205,3024)
fi
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
GRPC_PORT="$(free_port)"
MYSQL_PORT="$(free_port)"
if ((PRODUCTION)); then
    LOG="$WORK/cluster/logs/gate.log"
    "$PY" -m shardgate.cli cluster up --cluster "$WORK/cluster.yaml" --dir "$WORK/cluster" \
        --tablets-per-shard 1 --port "$GRPC_PORT" --mysql-port "$MYSQL_PORT" --http-port 0 \
        >"$WORK/cluster-up.log" 2>&1 || { cat "$WORK/cluster-up.log" "$LOG" >&2; exit 1; }
    GATE_PID="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pids"]["gate"])' \
        "$WORK/cluster/cluster-state.json")"
    read -r -a TABLET_PIDS <<<"$("$PY" -c 'import json, sys
print(" ".join(str(p) for n, p in json.load(open(sys.argv[1]))["pids"].items() if n != "gate"))' \
        "$WORK/cluster/cluster-state.json")"
    if ((WORKERS)); then  # the gate sysbench talks to: N workers on the same topo store
        TOPO="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["topo"])' \
            "$WORK/cluster/cluster-state.json")"
        MYSQL_PORT="$(free_port)"
        LOG="$WORK/workers.log"
        : >"$LOG"
        "${GATE_TASKSET[@]}" "$PY" -m shardgate.cli gate --topo "$TOPO" --no-auth \
            --port "$(free_port)" --mysql-port "$MYSQL_PORT" --http-port 0 \
            --workers "$WORKERS" "${GATE_ARGS[@]}" "${VIA_TABLETS[@]}" >"$LOG" 2>&1 &
        WORKERS_PID=$!
        GATE_PID="$WORKERS_PID"
        READY="MySQL listener on"  # one worker: the gate itself; more: its supervisor
        ((WORKERS == 1)) || READY="workers (pids .*) serving"
        for _ in $(seq 600); do  # 60 s at most
            if ! kill -0 "$WORKERS_PID" 2>/dev/null; then cat "$LOG" >&2; exit 1; fi
            if grep -q "$READY" "$LOG"; then break; fi
            sleep 0.1
        done
        grep -q "$READY" "$LOG" || { cat "$LOG" >&2; exit 1; }
    fi
else
    "$PY" -m shardgate.cli up --cluster "$WORK/cluster.yaml" --port "$GRPC_PORT" \
        --mysql-port "$MYSQL_PORT" --http-port 0 "${GATE_ARGS[@]}" >"$LOG" 2>&1 &
    GATE_PID=$!
    for _ in $(seq 600); do  # until it says it serves MySQL (60 s at most)
        if ! kill -0 "$GATE_PID" 2>/dev/null; then cat "$LOG" >&2; exit 1; fi
        if grep -q "MySQL listener on" "$LOG"; then break; fi
        sleep 0.1
    done
    grep -q "MySQL listener on" "$LOG" || { cat "$LOG" >&2; exit 1; }
fi

# the gate / the direct database, as sysbench options
GATE=(--mysql-host=127.0.0.1 --mysql-port="$MYSQL_PORT" --mysql-user=root --mysql-db=sbtest)
DIRECT=(--mysql-host="$HOST" --mysql-port="$PORT" --mysql-user=root --mysql-db="${PREFIX}_direct")
COMMON=(--db-driver=mysql --tables=1 --table-size="$TABLE_SIZE")

sb() {  # sb WORKLOAD COMMAND TARGET-OPTIONS...: sysbench's output; fails on any error
    local workload="$1" command="$2"; shift 2
    local out
    if ! out="$("${CLIENT_TASKSET[@]}" sysbench "$workload" "${COMMON[@]}" "$@" "$command" 2>&1)" \
        || grep -q FATAL <<<"$out"; then
        echo "sysbench $workload $command failed:" >&2
        echo "$out" >&2
        echo "the gate's log:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    echo "$out"
}

sb oltp_read_write prepare "${GATE[@]}" >/dev/null
sb oltp_read_write prepare "${DIRECT[@]}" >/dev/null

cpu_ticks() {  # utime + stime of the processes named, in clock ticks
    local sum=0 pid
    for pid in "$@"; do sum=$((sum + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
    echo "$sum"
}
gate_ticks() {  # the gate's: with --workers, its supervisor's and every worker's
    if ((WORKERS)); then
        # shellcheck disable=SC2046
        cpu_ticks "$GATE_PID" $(pgrep -P "$GATE_PID")
    else
        cpu_ticks "$GATE_PID"
    fi
}
TICK="$(getconf CLK_TCK)"

tps() { awk '/transactions:/ {gsub(/\(/, "", $3); print $3}' <<<"$1"; }
p95() { awk '/95th percentile:/ {print $3}' <<<"$1"; }
txns() { awk '/transactions:/ {print $2}' <<<"$1"; }
errors() { awk '/ignored errors:/ {print $3}' <<<"$1"; }
check_clean() {  # no reconnects; with one thread no error either
    local errors reconnects
    errors="$(errors "$2")"
    reconnects="$(awk '/reconnects:/ {print $2}' <<<"$2")"
    if [[ "$reconnects" != 0 ]] || ((THREADS == 1 && errors != 0)); then
        echo "$1: $errors ignored errors, $reconnects reconnects" >&2
        echo "$2" >&2
        exit 1
    fi
}

RUN=(--time="$SECONDS_EACH" --threads="$THREADS" --db-ps-mode="$PS_MODE" --report-interval=0
     "${IGNORE[@]}")
echo "sysbench $(sysbench --version | awk '{print $2}'): ${SECONDS_EACH} s per workload and" \
     "path, $TABLE_SIZE rows, $THREADS thread(s), --db-ps-mode=$PS_MODE"
if ((WORKERS)); then
    echo "gate: shardgate gate --workers $WORKERS${GATE_CPUS:+ on cpus $GATE_CPUS} (tablet" \
         "processes of shardgate cluster up), keyspace of 4 MariaDB shards;" \
         "sysbench${CLIENT_CPUS:+ on cpus $CLIENT_CPUS}; direct: one MariaDB database"
elif ((PRODUCTION)); then
    echo "gate: shardgate cluster up (gate process, one tablet process per shard), keyspace" \
         "of 4 MariaDB shards; direct: one MariaDB database"
else
    echo "gate: shardgate up, keyspace of 4 MariaDB shards; direct: one MariaDB database"
fi
printf '%-18s %10s %9s %10s %9s %7s %14s %16s %7s\n' workload "direct/s" "p95 ms" "gate/s" \
    "p95 ms" ratio "gate CPU us/tx" "tablets us/tx" errors
for workload in ${WORKLOADS//,/ }; do
    direct="$(sb "$workload" run "${DIRECT[@]}" "${RUN[@]}")"
    check_clean "$workload direct" "$direct"
    before="$(gate_ticks)"
    tablets_before="$(cpu_ticks "${TABLET_PIDS[@]}")"
    gate="$(sb "$workload" run "${GATE[@]}" "${RUN[@]}")"
    after="$(gate_ticks)"
    tablets="$(($(cpu_ticks "${TABLET_PIDS[@]}") - tablets_before))"
    check_clean "$workload gate" "$gate"
    awk -v w="$workload" -v dt="$(tps "$direct")" -v dp="$(p95 "$direct")" \
        -v gt="$(tps "$gate")" -v gp="$(p95 "$gate")" -v n="$(txns "$gate")" \
        -v cpu="$((after - before))" -v tcpu="$tablets" -v prod="$PRODUCTION" \
        -v tick="$TICK" -v e="$(errors "$direct")/$(errors "$gate")" 'BEGIN {
            t = prod ? sprintf("%.0f", 1e6 * tcpu / tick / n) : "(in the gate)"
            printf "%-18s %10.1f %9.2f %10.1f %9.2f %7.3f %14.0f %16s %7s\n",
                   w, dt, dp, gt, gp, gt / dt, 1e6 * cpu / tick / n, t, e }'
done
# the table is whole after the writes: sysbench's DELETE + INSERT pairs keep the count
rows="$(mariadb -h 127.0.0.1 -P "$MYSQL_PORT" -u root --skip-ssl -N sbtest \
    -e "SELECT COUNT(*) FROM sbtest1")"
if [[ "$rows" != "$TABLE_SIZE" ]]; then
    echo "sbtest1 through the gate has $rows rows, expected $TABLE_SIZE" >&2
    exit 1
fi
sb oltp_read_write cleanup "${GATE[@]}" >/dev/null
