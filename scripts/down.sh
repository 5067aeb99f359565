#!/usr/bin/env bash
# `make down`: stops what scripts/up.sh started — the services, then
# the object store (SeaweedFS) and nats-server or the members of the local
# NATS cluster (pid files in .data/pids/), then the local PostgreSQL
# cluster (.data/pg, pg_ctl stop). Data stays; `make clean-data` removes it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA="$ROOT/.data"
PIDS="$DATA/pids"
STOP_TIMEOUT_SECS=15

say() { echo "down: $*"; }
is_root() { [ "$(id -u)" -eq 0 ]; }

stop_pidfile() {
    local file=$1 name pid
    name=$(basename "$file" .pid)
    pid=$(cat "$file" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq $((STOP_TIMEOUT_SECS * 10))); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$name did not stop in ${STOP_TIMEOUT_SECS} s; SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$file"
}

# Services first (they hold connections to NATS, the object store and
# PostgreSQL), then the servers.
shopt -s nullglob
for file in "$PIDS"/*.pid; do
    case $(basename "$file") in
        nats.pid | nats-n*.pid | weed.pid) ;;
        *) stop_pidfile "$file" ;;
    esac
done
for file in "$PIDS"/weed.pid "$PIDS"/nats.pid "$PIDS"/nats-n*.pid; do
    if [ -f "$file" ]; then stop_pidfile "$file"; fi
done
# The gRPC sockets the store leaves in /tmp, which up.sh named; only those.
if [ -f "$DATA/s3/tmp-sockets" ]; then
    while read -r socket; do
        case $socket in
            /tmp/seaweedfs-*-grpc-*.sock) rm -f "$socket" ;;
        esac
    done <"$DATA/s3/tmp-sockets"
fi

PGDATA="$DATA/pg/data"
if [ -f "$PGDATA/postmaster.pid" ]; then
    initdb=$(command -v initdb 2>/dev/null || printf '%s\n' /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)
    pg_ctl="$(dirname "$(readlink -f "$initdb")")/pg_ctl"
    say "stopping PostgreSQL ($PGDATA)"
    if is_root; then
        runuser -u postgres -- "$pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null || true
    else
        "$pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null || true
    fi
fi
say "stopped"
