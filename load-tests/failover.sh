#!/usr/bin/env bash
# Failover time against the stack that `make up` started: lease GPUs, kill
# the node-agent that runs them with SIGKILL, and time until every one of
# those leases runs on another node. Prints `failover_seconds=<seconds>`.
#
#   load-tests/failover.sh [LEASES]        (default 4 leases of 1 x A100-40GB)
#
# The scheduler declares a node lost after LH_NODE_LOST_AFTER_MS (3 s) of
# silence; dev/fleet.toml has two A100 nodes (node-a, node-d), so the leases
# of the killed one have somewhere to go. The killed agent is restarted at
# the end (`make up` starts what is not running) and must not take its old
# leases back. Needs: curl, python3.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LEASES=${1:-4}
GATEWAY=${LH_GATEWAY_URL:-http://${LH_GATEWAY_ADDR:-127.0.0.1:8080}}
ADMIN_TOKEN=${LH_ADMIN_TOKEN:-$(cat "$ROOT/.data/admin-token" 2>/dev/null || true)}
PIDS="$ROOT/.data/pids"
TIMEOUT_SECS=${LH_FAILOVER_TIMEOUT_SECS:-60}

die() { echo "failover: error: $*" >&2; exit 1; }
[ -n "$ADMIN_TOKEN" ] || die "no admin token: run 'make up' first"
curl -fsS -o /dev/null "$GATEWAY/readyz" || die "no gateway at $GATEWAY: run 'make up' first"

api() { # api METHOD PATH KEY [BODY]
    local method=$1 path=$2 key=$3 body=${4:-}
    if [ -n "$body" ]; then
        curl -fsS -X "$method" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
            -d "$body" "$GATEWAY$path"
    else
        curl -fsS -X "$method" -H "Authorization: Bearer $key" "$GATEWAY$path"
    fi
}
json() { python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }
now() { date +%s.%N; }

tenant=$(api POST /v1/tenants "$ADMIN_TOKEN" \
    "{\"name\": \"failover-$(date +%s)\", \"email\": \"ops@failover.example\", \"quota\": {\"max_gpus\": $LEASES}}")
KEY=$(echo "$tenant" | json 'd["api_key"]')

ids=()
# The leases of this run end with it, even when it fails, so that a rerun
# finds the fleet as it was.
cleanup() {
    for id in "${ids[@]}"; do
        api POST "/v1/leases/$id/stop" "$KEY" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT
for _ in $(seq "$LEASES"); do
    ids+=("$(api POST /v1/leases "$KEY" '{"gpus": 1, "gpu_model": "A100-40GB"}' | json 'd["id"]')")
done
echo "failover: $LEASES leases requested; waiting until they run"

# Prints "id node state" per lease.
states() {
    api GET "/v1/leases?limit=500" "$KEY" |
        json '"\n".join(" ".join(str(l[k]) for k in ("id", "node_id", "state")) for l in d["items"])'
}
deadline=$((SECONDS + TIMEOUT_SECS))
until [ "$(states | grep -c ' running$' || true)" -eq "$LEASES" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "leases not running after ${TIMEOUT_SECS} s"
    sleep 0.2
done
victim=$(states | awk '{print $2}' | sort | uniq -c | sort -rn | awk 'NR == 1 {print $2}')
moved=$(states | awk -v n="$victim" '$2 == n {print $1}')
count=$(echo "$moved" | wc -l)
agent="node-agent-${victim#node-}"
[ -f "$PIDS/$agent.pid" ] || die "no pid file for $agent (was it started by 'make up'?)"
echo "failover: $count lease(s) run on $victim; kill -9 $agent (pid $(cat "$PIDS/$agent.pid"))"

t0=$(now)
kill -9 "$(cat "$PIDS/$agent.pid")"
deadline=$((SECONDS + TIMEOUT_SECS))
while :; do
    snapshot=$(states)
    done_count=0
    for id in $moved; do
        if echo "$snapshot" | grep -q "^$id [^ ]* running$" && ! echo "$snapshot" | grep -q "^$id $victim "; then
            done_count=$((done_count + 1))
        fi
    done
    [ "$done_count" -eq "$count" ] && break
    [ "$SECONDS" -lt "$deadline" ] || die "only $done_count of $count leases moved after ${TIMEOUT_SECS} s"
    sleep 0.05
done
t1=$(now)
failover=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
echo "failover: every lease of $victim runs elsewhere:"
states | sed 's/^/  /'

echo "failover: restarting $agent; it must not take its old leases back"
LH_UP_NO_BUILD=1 "$ROOT/scripts/up.sh" >/dev/null
sleep 3
if states | grep -q " $victim "; then
    die "a lease is back on $victim after it rejoined"
fi
echo "failover_seconds=$failover"
