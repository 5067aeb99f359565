#!/usr/bin/env bash
# The red-team harness's long run: every principal (four nodes, each
# service, a tenant, the auditor, a stranger) sends what its credentials
# let it at leases it does not hold, ROUNDS times over, against a whole
# platform the harness starts itself (a real nats-server and PostgreSQL
# from `make deps`). Prints one line
#
#   red-team: principals=N attempts=N obeyed=0 overcommitted=0 misbilled=0 dead=0
#
# and exits non-zero when any count but the first two is not zero.
#
#   load-tests/red-team.sh [ROUNDS]        (default 20)
#
# The short version runs in `make test` (tests/system/tests/red_team.rs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-20}
case "$ROUNDS" in ''|*[!0-9]*) echo "red-team: error: ROUNDS must be a number" >&2; exit 2 ;; esac
cd "$ROOT"
cargo build --release -q -p lh-load-tests --bin red-team
exec target/release/red-team --rounds "$ROUNDS"
