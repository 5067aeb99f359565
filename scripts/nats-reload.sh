#!/usr/bin/env bash
# scripts/nats-reload.sh PID LOG: has the nats-server PID read its config
# again (SIGHUP) and waits, up to 10 s each time, until LOG says it did.
#
# It reloads twice: a node's account (docs/adr/028) imports from the log's
# account, and nats-server (2.15, measured) wires a new account's imports
# on the reload after the one that made the account.
set -euo pipefail

PID=${1:-}
LOG=${2:-}
RELOAD_WAIT_STEPS=100 # of 0.1 s

die() { echo "nats-reload: error: $*" >&2; exit 1; }
[ -n "$PID" ] && [ -n "$LOG" ] || die "usage: $0 PID LOG"

reloads() { grep -c "Reloaded server configuration" "$LOG" 2>/dev/null || true; }

for _ in 1 2; do
    before=$(reloads)
    kill -HUP "$PID" || die "nats-server $PID is not running"
    waited=0
    until [ "$(reloads)" -gt "${before:-0}" ]; do
        waited=$((waited + 1))
        [ "$waited" -le "$RELOAD_WAIT_STEPS" ] || die "nats-server $PID did not reload within 10 s; see $LOG"
        sleep 0.1
    done
done
