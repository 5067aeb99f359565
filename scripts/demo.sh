#!/usr/bin/env bash
# `make demo`: one tenant's story against the stack that `make up` started,
# told with the `lh` CLI — create a tenant, lease 2 GPUs, watch the lease
# run, stop it, run a command in a container and read its output, show the
# month's invoice, verify the audit chain.
#
# Needs: `make up` (or LH_GATEWAY_URL and LH_ADMIN_TOKEN pointing at a
# running gateway, as scripts/compose.sh gives it), python3 (to read the
# CLI's --json output).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROFILE=${LH_UP_PROFILE:-$(cat "$ROOT/.data/up-profile" 2>/dev/null || echo up)}
LH="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE/lh"
export LH_GATEWAY_URL=${LH_GATEWAY_URL:-http://${LH_GATEWAY_ADDR:-127.0.0.1:8080}}
ADMIN_TOKEN=${LH_ADMIN_TOKEN:-$(cat "$ROOT/.data/admin-token" 2>/dev/null || true)}
WAIT_SECS=${LH_DEMO_WAIT_SECS:-60}
# Whether the nodes run leases' images: what `make up` chose (LH_DEMO_RUNTIME
# for a stack it did not start: podman, or sim to skip that step).
RUNTIME=${LH_DEMO_RUNTIME:-$(cat "$ROOT/.data/up-runtime" 2>/dev/null || echo sim)}

[ -x "$LH" ] || { echo "demo: $LH not built: run 'make up' (or 'make build') first" >&2; exit 1; }
[ -n "$ADMIN_TOKEN" ] || { echo "demo: no admin token: run 'make up' first, or set LH_ADMIN_TOKEN" >&2; exit 1; }

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# lh KEY ARGS...: runs the CLI as KEY, echoing the command (without the key).
lh() {
    local key=$1
    shift
    echo "+ lh $*" >&2
    LH_API_KEY=$key "$LH" "$@"
}
# field NAME < json: prints one top-level field of a JSON object.
field() { python3 -c 'import json, sys; v = json.load(sys.stdin).get(sys.argv[1]); print("" if v is None else v)' "$1"; }

# wait_state KEY ID STATE: polls `lh lease get` until the lease is in STATE.
wait_state() {
    local key=$1 id=$2 want=$3 state="" deadline=$((SECONDS + WAIT_SECS))
    while :; do
        state=$(LH_API_KEY=$key "$LH" lease get "$id" --json | field state)
        echo "   lease $id: $state"
        [ "$state" = "$want" ] && return 0
        case $state in
            ended | rejected)
                echo "demo: lease $id is $state, it will not become $want" >&2
                return 1
                ;;
        esac
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "demo: lease $id still $state after ${WAIT_SECS} s (wanted $want)" >&2
            return 1
        fi
        sleep 1
    done
}

step "An admin creates tenant acme"
tenant=$(lh "$ADMIN_TOKEN" tenant create --name acme --email ops@acme.example --max-gpus 16 --json)
echo "$tenant"
TENANT_KEY=$(field api_key <<<"$tenant")
[ -n "$TENANT_KEY" ] || { echo "demo: no api_key in the answer" >&2; exit 1; }

step "acme leases 2 x A100-40GB (tier basic)"
lease=$(lh "$TENANT_KEY" lease create --gpus 2 --gpu-model A100-40GB --tier basic --json)
echo "$lease"
LEASE_ID=$(field id <<<"$lease")
[ -n "$LEASE_ID" ] || { echo "demo: no lease id in the answer" >&2; exit 1; }

step "Waiting for the lease to run"
wait_state "$TENANT_KEY" "$LEASE_ID" running
lh "$TENANT_KEY" lease get "$LEASE_ID"

step "The GPUs work for 5 seconds"
sleep 5

step "acme stops the lease"
lh "$TENANT_KEY" lease stop "$LEASE_ID"
wait_state "$TENANT_KEY" "$LEASE_ID" ended
lh "$TENANT_KEY" lease get "$LEASE_ID"

if [ "$RUNTIME" = podman ]; then
    step "acme runs a command in a container (image localhost/leasehold/base)"
    job=$(lh "$TENANT_KEY" lease create --gpus 1 --gpu-model A100-40GB --tier basic --json \
        --image localhost/leasehold/base -- \
        sh -c 'echo "hello from a container: uid $(id -u), GPUs $CUDA_VISIBLE_DEVICES, $(nproc) CPU"; ls /dev/leasehold-sim/*/')
    JOB_ID=$(field id <<<"$job")
    [ -n "$JOB_ID" ] || { echo "demo: no lease id in the answer" >&2; exit 1; }
    wait_state "$TENANT_KEY" "$JOB_ID" ended
    lh "$TENANT_KEY" lease get "$JOB_ID"
    logs=$(lh "$TENANT_KEY" lease logs "$JOB_ID")
    echo "$logs"
    grep -q "hello from a container" <<<"$logs" || { echo "demo: the container's output is not in its logs" >&2; exit 1; }
else
    if [ -n "${LH_DEMO_RUNTIME:-}" ]; then
        why="LH_DEMO_RUNTIME=$LH_DEMO_RUNTIME"
    else
        why=$(cat "$ROOT/.data/up-runtime" 2>/dev/null || echo "no make up here")
    fi
    step "(skipped: a command in a container; the nodes simulate workloads: $why)"
fi

step "acme's invoice for $(date -u +%Y-%m)"
lh "$TENANT_KEY" invoice show --period "$(date -u +%Y-%m)"

step "The admin verifies the audit chain"
lh "$ADMIN_TOKEN" audit verify

echo
echo "demo: done"
