#!/usr/bin/env bash
# scripts/nats-node-creds.sh NODE_ID: the NATS credential of one node agent.
#
# Generates an nkey for the node (once; kept when it exists) under
# $LH_NATS_AUTH_DIR/keys (default .data/nats/auth, what `make up` uses),
# writes users.conf again with the node's account (its own events,
# heartbeat, usage and view of the log only, its connections and storage
# capped; see docs/security.md "## NATS"), and reloads
# every nats-server `make up` started (SIGHUP) so that the node can connect
# at once. Prints the environment the node agent needs; the seed itself is
# never printed. Revoking a node: delete its .nk file and run this script
# for any node (or `lh-nats-auth init DIR`) to write users.conf again.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA="$ROOT/.data"
AUTH=${LH_NATS_AUTH_DIR:-$DATA/nats/auth}
NODE_ID=${1:-}

die() { echo "nats-node-creds: error: $*" >&2; exit 1; }

[ -n "$NODE_ID" ] || die "usage: $0 NODE_ID"
[[ $NODE_ID =~ ^[A-Za-z0-9_-]{1,58}$ ]] \
    || die "a node id is 1 to 58 letters, digits, '-' or '_' (it becomes a subject token): '$NODE_ID'"

AUTH_BIN=""
for candidate in "${LH_NATS_AUTH_BIN:-}" "$ROOT/target/up/lh-nats-auth" "$ROOT/target/release/lh-nats-auth" "$ROOT/target/debug/lh-nats-auth"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then AUTH_BIN=$candidate; break; fi
done
[ -n "$AUTH_BIN" ] || die "lh-nats-auth is not built: cargo build --release -p lh-bus --bin lh-nats-auth"

mkdir -p "$AUTH"
chmod 700 "$AUTH"
# The fixed users first, so that users.conf always holds the services too.
"$AUTH_BIN" init "$AUTH"
seed=$("$AUTH_BIN" node "$AUTH" "$NODE_ID")

# The server reads the node's account (docs/adr/028) on a reload.
for pidfile in "$DATA"/pids/nats*.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        log="$DATA/logs/$(basename "$pidfile" .pid).log"
        "$ROOT/scripts/nats-reload.sh" "$pid" "$log"
        echo "nats-node-creds: reloaded $(basename "$pidfile" .pid) (pid $pid)"
    fi
done

cat <<INFO
nats-node-creds: node $NODE_ID may now connect as NATS user node-$NODE_ID
  LH_NODE_ID=$NODE_ID
  LH_NATS_USER=node-$NODE_ID
  LH_NATS_NKEY_SEED_FILE=$seed
INFO
