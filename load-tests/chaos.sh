#!/usr/bin/env bash
# The chaos harness's long run against the platform `make up` started: lease
# traffic from several tenants while every service, nats-server and
# PostgreSQL are killed with SIGKILL in turn and brought back by
# scripts/up.sh; then the checks. Prints one line
#
#   chaos: kills=K accepted=A lost=0 duplicated=0 overcommitted=0 charge_mismatch=0 dead=0
#
# and exits non-zero when any count but the first two is not zero.
#
#   load-tests/chaos.sh [SECONDS]        (default 300)
#
# The short version runs in `make test` (tests/system/tests/chaos.rs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_TO_RUN=${1:-300}
GATEWAY=${LH_GATEWAY_URL:-http://${LH_GATEWAY_ADDR:-127.0.0.1:8080}}
curl -fsS -o /dev/null "$GATEWAY/readyz" || { echo "chaos: error: no gateway at $GATEWAY: run 'make up' first" >&2; exit 1; }
cd "$ROOT"
cargo build --release -q -p lh-load-tests --bin chaos
# It reads the log as the auditor does (make up's NATS refuses strangers).
export LH_NATS_USER=${LH_NATS_USER:-auditor}
export LH_NATS_NKEY_SEED_FILE=${LH_NATS_NKEY_SEED_FILE:-$ROOT/.data/nats/auth/keys/auditor.nk}
exec target/release/chaos --duration-secs "$SECONDS_TO_RUN" --gateway "$GATEWAY" --root "$ROOT"
