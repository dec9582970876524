#!/usr/bin/env bash
# Bring up and configure the database servers shardgate's tests and CI use:
# PostgreSQL 15 (logical decoding, prepared transactions), MariaDB 10.11
# (row-based binary log with full metadata) and Redis; checks that etcd is installed.
#
# Idempotent: run it as often as you like. A server is started only if it does
# not answer, and restarted only if a setting that needs a restart differs from
# the running value. Run as root, no stdin. Prints one line per check; exits
# non-zero with a message saying what failed.
#
# Environment (defaults suit the CI machines):
#   PG_CLUSTER=15/main   PGHOST=127.0.0.1  PGPORT=5432  PGUSER=postgres
#   MYSQL_HOST=127.0.0.1 MYSQL_PORT=3306   MYSQL_CONF_DIR=/etc/mysql/mariadb.conf.d
#   REDIS_PORT=6379      WAIT_SECONDS=60
set -euo pipefail

PG_CLUSTER=${PG_CLUSTER:-15/main}
PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
PGUSER=${PGUSER:-postgres}
MYSQL_HOST=${MYSQL_HOST:-127.0.0.1}
MYSQL_PORT=${MYSQL_PORT:-3306}
MYSQL_CONF_DIR=${MYSQL_CONF_DIR:-/etc/mysql/mariadb.conf.d}
MYSQL_MAIN_CNF=${MYSQL_MAIN_CNF:-/etc/mysql/my.cnf}
MYSQL_DROPIN="$MYSQL_CONF_DIR/60-shardgate.cnf"
REDIS_PORT=${REDIS_PORT:-6379}
WAIT_SECONDS=${WAIT_SECONDS:-60}
export PGHOST PGPORT PGUSER

die() {
    echo "setup-servers: ERROR: $*" >&2
    exit 1
}

# wait_until <what> <command...>: retry the command every 0.5 s, bounded.
wait_until() {
    local what=$1
    shift
    local deadline=$((SECONDS + WAIT_SECONDS))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            die "$what did not answer within ${WAIT_SECONDS}s"
        fi
        sleep 0.5
    done
}

# ---------------------------------------------------------------- PostgreSQL --

pg_answers() { pg_isready -q -h "$PGHOST" -p "$PGPORT"; }
psql_q() { psql -X -q -v ON_ERROR_STOP=1 -At -d postgres -c "$1"; }

pg_ctl_cluster() {
    local version=${PG_CLUSTER%%/*} name=${PG_CLUSTER#*/}
    pg_ctlcluster --skip-systemctl-redirect "$version" "$name" "$1" ||
        die "pg_ctlcluster $PG_CLUSTER $1 failed; see /var/log/postgresql/"
}

setup_postgres() {
    command -v pg_isready >/dev/null || die "PostgreSQL client tools (pg_isready, psql) are not installed"
    if pg_answers; then
        echo "postgres: running ok"
    else
        echo "postgres: not answering, starting cluster $PG_CLUSTER"
        pg_ctl_cluster start
        wait_until "postgres on $PGHOST:$PGPORT" pg_answers
        echo "postgres: started ok"
    fi

    # name=value; values as SHOW prints them, so a plain string comparison works.
    local wanted=(
        wal_level=logical
        max_replication_slots=64
        max_wal_senders=64
        max_slot_wal_keep_size=1GB
        max_prepared_transactions=64
        max_connections=300
    )
    local item name want have context changed=0 restart=()
    for item in "${wanted[@]}"; do
        name=${item%%=*}
        want=${item#*=}
        have=$(psql_q "SHOW $name") || die "postgres: cannot read $name (is $PGUSER a superuser?)"
        if [[ $have == "$want" ]]; then
            echo "postgres: $name=$want ok"
            continue
        fi
        psql_q "ALTER SYSTEM SET $name = '$want'" || die "postgres: ALTER SYSTEM SET $name failed"
        changed=1
        context=$(psql_q "SELECT context FROM pg_settings WHERE name = '$name'")
        if [[ $context == postmaster ]]; then
            restart+=("$name")
            echo "postgres: $name=$have -> $want changed, needs a restart"
        else
            echo "postgres: $name=$have -> $want changed, reloading"
        fi
    done
    if ((changed)); then
        psql_q "SELECT pg_reload_conf()" >/dev/null
    fi
    if ((${#restart[@]})); then
        echo "postgres: restarting to apply ${restart[*]}"
        pg_ctl_cluster restart
        wait_until "postgres on $PGHOST:$PGPORT after restart" pg_answers
    fi
    if ((changed)); then
        sleep 0.2 # let a reload reach the postmaster before verifying
        for item in "${wanted[@]}"; do
            name=${item%%=*}
            want=${item#*=}
            have=$(psql_q "SHOW $name")
            [[ $have == "$want" ]] || die "postgres: $name is still $have after applying $want"
        done
        echo "postgres: settings verified ok"
    fi
}

# ------------------------------------------------------------------- MariaDB --

mysql_q() { mariadb -uroot -h "$MYSQL_HOST" -P "$MYSQL_PORT" --protocol=tcp -N -B -e "$1"; }
mysql_answers() { mariadb-admin -uroot -h "$MYSQL_HOST" -P "$MYSQL_PORT" --protocol=tcp ping; }
mysql_pid() { pgrep -x mariadbd || true; }

mysql_start() {
    install -d -o mysql -g mysql /run/mysqld
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd ||
        die "mariadb: start-stop-daemon failed; see /var/log/mysql/error.log"
    wait_until "mariadb on $MYSQL_HOST:$MYSQL_PORT (see /var/log/mysql/error.log)" mysql_answers
}

mysql_restart() {
    mariadb-admin -uroot -h "$MYSQL_HOST" -P "$MYSQL_PORT" --protocol=tcp shutdown ||
        die "mariadb: clean shutdown failed"
    local deadline=$((SECONDS + WAIT_SECONDS))
    while [[ -n $(mysql_pid) ]]; do
        ((SECONDS < deadline)) || die "mariadb: still running ${WAIT_SECONDS}s after shutdown"
        sleep 0.5
    done
    mysql_start
}

setup_mysql() {
    command -v mariadb >/dev/null || die "the MariaDB client (mariadb) is not installed"
    # The drop-in file. Debian's stock my.cnf includes $MYSQL_CONF_DIR; a
    # trimmed one may not, so add the include line if it is missing.
    install -d -m 0755 "$MYSQL_CONF_DIR"
    if ! grep -Eq "^[[:space:]]*!includedir[[:space:]]+${MYSQL_CONF_DIR%/}/?[[:space:]]*$" "$MYSQL_MAIN_CNF"; then
        printf '\n!includedir %s/\n' "${MYSQL_CONF_DIR%/}" >>"$MYSQL_MAIN_CNF"
        echo "mariadb: added !includedir $MYSQL_CONF_DIR/ to $MYSQL_MAIN_CNF"
    fi
    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<'EOF'
# Written by shardgate's scripts/setup-servers.sh; edits are overwritten.
# Change streams read the binary log in ROW format with full before/after
# images and column metadata (names and types in every table map event).
[mysqld]
server_id            = 1
log_bin              = mysql-bin
binlog_format        = ROW
binlog_row_image     = FULL
binlog_row_metadata  = FULL
max_connections      = 500
# Small files expiring after an hour: a stream started from a timestamp finds
# its file by bisection, then reads that file; a day of test runs in one 1 GB
# file made such a start read hundreds of MB (48 s instead of 4 s).
max_binlog_size      = 67108864
binlog_expire_logs_seconds = 3600
EOF
    if cmp -s "$tmp" "$MYSQL_DROPIN"; then
        rm -f "$tmp"
        echo "mariadb: $MYSQL_DROPIN ok"
    else
        install -m 0644 "$tmp" "$MYSQL_DROPIN"
        rm -f "$tmp"
        echo "mariadb: $MYSQL_DROPIN written"
    fi
    local defaults
    defaults=$(/usr/sbin/mariadbd --print-defaults 2>/dev/null || true)
    [[ $defaults == *--binlog_row_metadata=FULL* ]] ||
        die "mariadb: $MYSQL_DROPIN is not read by mariadbd (check the includes in $MYSQL_MAIN_CNF)"

    # Started only now, with the drop-in in place: a fresh start needs no restart.
    if mysql_answers >/dev/null 2>&1; then
        echo "mariadb: running ok"
    else
        echo "mariadb: not answering, starting"
        mysql_start
        echo "mariadb: started ok"
    fi

    local datadir basename_want
    datadir=$(mysql_q "SELECT @@datadir")
    basename_want="${datadir%/}/mysql-bin"

    # log_bin and its basename are fixed at start-up: a difference means a restart.
    local have_log_bin have_basename restart=0
    have_log_bin=$(mysql_q "SELECT @@log_bin")
    have_basename=$(mysql_q "SELECT IFNULL(@@log_bin_basename, '')")
    if [[ $have_log_bin == 1 ]]; then
        echo "mariadb: log_bin=ON ok"
    else
        echo "mariadb: log_bin=OFF -> ON changed, needs a restart"
        restart=1
    fi
    if [[ $have_basename == "$basename_want" ]]; then
        echo "mariadb: log_bin_basename=$basename_want ok"
    else
        echo "mariadb: log_bin_basename=${have_basename:-none} -> $basename_want changed, needs a restart"
        restart=1
    fi

    # The others are dynamic: fix the running value in place, no restart.
    local item name want have value
    local dynamic=(
        server_id=1
        binlog_format=ROW
        binlog_row_image=FULL
        binlog_row_metadata=FULL
        max_connections=500
        max_binlog_size=67108864
        binlog_expire_logs_seconds=3600
    )
    for item in "${dynamic[@]}"; do
        name=${item%%=*}
        want=${item#*=}
        have=$(mysql_q "SELECT @@GLOBAL.$name")
        if [[ $have == "$want" ]]; then
            echo "mariadb: $name=$want ok"
        elif ((restart)); then
            echo "mariadb: $name=$have -> $want changed, applied by the restart"
        else
            if [[ $want =~ ^[0-9]+$ ]]; then value=$want; else value="'$want'"; fi
            mysql_q "SET GLOBAL $name = $value" || die "mariadb: SET GLOBAL $name failed"
            echo "mariadb: $name=$have -> $want changed, set at run time (no restart needed)"
        fi
    done

    if ((restart)); then
        echo "mariadb: restarting"
        mysql_restart
        for item in log_bin=1 "log_bin_basename=$basename_want" "${dynamic[@]}"; do
            name=${item%%=*}
            want=${item#*=}
            have=$(mysql_q "SELECT @@GLOBAL.$name")
            [[ $have == "$want" ]] || die "mariadb: $name is $have after the restart, expected $want"
        done
        echo "mariadb: settings verified ok"
    fi
}

# --------------------------------------------------------------------- Redis --

redis_answers() { [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]; }

setup_redis() {
    command -v redis-server >/dev/null || die "redis-server is not installed"
    if redis_answers; then
        echo "redis: running ok"
        return
    fi
    echo "redis: not answering, starting"
    install -d /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
        --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log ||
        die "redis: redis-server failed to start; see /var/log/redis/ci.log"
    wait_until "redis on 127.0.0.1:$REDIS_PORT (see /var/log/redis/ci.log)" redis_answers
    echo "redis: started ok"
}

# ---------------------------------------------------------------------- etcd --
# Not started here: the topo tests start their own etcd on free ports in a temp dir.

setup_etcd() {
    command -v etcd >/dev/null ||
        die "etcd is not installed; scripts/install-system-deps.sh installs etcd-server"
    echo "etcd: $(etcd --version | head -1) ok (tests start their own)"
}

[[ $(id -u) == 0 ]] || die "run as root (it starts services and writes their configuration)"
setup_postgres
setup_mysql
setup_redis
setup_etcd
echo "setup-servers: all servers ready"
