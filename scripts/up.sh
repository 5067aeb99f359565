#!/usr/bin/env bash
# `make up`: the whole platform on this machine, on the simulated fleet of
# dev/fleet.toml. Everything it writes lives under .data/:
#
#   .data/nats/    nats.conf and the JetStream store (sync_interval: always);
#                  auth/ holds an nkey seed per service, operator, auditor
#                  and node agent (0600) and the users.conf they make;
#                  with LH_NATS_CLUSTER=3, n1.conf..n3.conf and n1/..n3/
#   .data/s3/      the object store's data (SeaweedFS `weed mini`, S3 on
#                  127.0.0.1:8333); .data/s3-admin-key-id and
#                  .data/s3-admin-secret (0600), its admin identity, made once;
#                  .data/s3-identities.json (0600), made from them each run
#   .data/pg/      a local PostgreSQL cluster (skipped when DATABASE_URL is set)
#   .data/pg-roles/ each service's role password and DATABASE_URL (0600)
#   .data/gateway/master.keys  the master key wrapping tenants' data keys (0600)
#   .data/logs/    one log per process
#   .data/pids/    one pid file per process (scripts/down.sh reads them)
#   .data/admin-token, .data/audit/signing.key (its public half is pinned),
#   .data/audit/verify.token (bearer token of audit's GET /v1/verify)
#
# Environment knobs: LH_NATS_CLUSTER (1: one nats-server; 3: a local
# three-node JetStream cluster on client ports LH_NATS_PORT..+2, route ports
# LH_NATS_ROUTE_PORT (6222)..+2, monitoring LH_NATS_HTTP_PORT..+2, and the
# streams with 3 replicas; unset: what .data/nats was made with, else 1),
# LH_NATS_PORT (4222), LH_NATS_HTTP_PORT (8222),
# LH_PG_PORT (5432), DATABASE_URL (use an existing database instead; then
# LH_GATEWAY_DATABASE_URL, LH_PRICING_DATABASE_URL, LH_AUDIT_DATABASE_URL give
# the services their own roles, made with scripts/pg-roles.sh),
# LH_MASTER_KEY_FILE (instead of the generated one),
# LH_ADMIN_TOKEN (instead of the generated one), LH_GATEWAY_ADDR
# (127.0.0.1:8080), LH_SSH_ADDR (127.0.0.1:2222; off: no SSH endpoint),
# LH_LEASE_WEB_ADDR (127.0.0.1:8090, leases' web pages at
# http://<lease>-<port>.localhost:8090; off: none),
# LH_SESSION_LANE_ADDR (127.0.0.1:7443, where node agents dial the gateway
# for sessions' bytes; off: they keep to the bus), LH_LOG_FORMAT (pretty|json), LH_UP_TIMEOUT_SECS (60),
# LH_UP_NO_BUILD=1 (skip cargo build), LH_RUNTIME (auto: leases' images
# run in podman where it works, else simulated; sim; podman), LH_PODMAN_ARGS
# (podman's global flags; see "the workloads' runtime" below), LH_UP_PROFILE (up: the Cargo profile
# that builds in least time and runs the simulated fleet well; release for
# benchmarks, see docs/benchmarks.md; a run without a build takes the
# binaries of the profile the last build used, kept in .data/up-profile).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DATA="$ROOT/.data"
LOGS="$DATA/logs"
PIDS="$DATA/pids"
PROFILE_FILE="$DATA/up-profile"
if [ -z "${LH_UP_PROFILE:-}" ] && [ "${LH_UP_NO_BUILD:-0}" = 1 ] && [ -s "$PROFILE_FILE" ]; then
    PROFILE=$(cat "$PROFILE_FILE")
else
    PROFILE=${LH_UP_PROFILE:-up}
fi
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE"
# The packages whose binaries this script runs (the services, lh-nats-auth)
# and the lh CLI the README and `make demo` use: nothing else is built.
UP_PACKAGES=(lh-gateway lh-scheduler lh-pricing lh-spot-broker lh-audit lh-node-agent lh-bus lh-cli)
STARTED_AT=$SECONDS

NATS_PORT=${LH_NATS_PORT:-4222}
NATS_HTTP_PORT=${LH_NATS_HTTP_PORT:-8222}
PG_PORT=${LH_PG_PORT:-5432}
GATEWAY_ADDR=${LH_GATEWAY_ADDR:-127.0.0.1:8080}
# The gateway's SSH endpoint into leases (docs/adr/030).
SSH_ADDR=${LH_SSH_ADDR:-127.0.0.1:2222}
# Leases' web pages, each port at a name of its own under localhost
# (docs/adr/035); browsers take any *.localhost for loopback.
LEASE_WEB_ADDR=${LH_LEASE_WEB_ADDR:-127.0.0.1:8090}
# Where node agents dial the gateway for a session's frames (docs/adr/030,
# "The lane"): every agent here is on this host.
SESSION_LANE_ADDR=${LH_SESSION_LANE_ADDR:-127.0.0.1:7443}
LOG_FORMAT=${LH_LOG_FORMAT:-pretty}
TIMEOUT_SECS=${LH_UP_TIMEOUT_SECS:-60}
NATS_ROUTE_PORT=${LH_NATS_ROUTE_PORT:-6222}
NATS_SERVER="$DATA/venv/bin/nats-server"
# How long nats-server (each cluster member) may take to become healthy.
NATS_READY_TIMEOUT_SECS=30
WEED="$DATA/venv/bin/weed"
# The object store's ports, each an HTTP port and its gRPC one, fixed so
# that the store keeps its state across runs (its master's directory is
# named by its port). Off the ports of SeaweedFS's defaults, of this
# script, and of compose's stack beside it (LH_COMPOSE_PORT_PREFIX 1: S3 on
# 18333, hence S3's gRPC on 18334). Only S3's is ever a tenant's or a
# node's: the others answer without credentials.
S3_PORT=8333
S3_GRPC_PORT=18334
WEED_MASTER_PORTS=(9334 19334)
WEED_VOLUME_PORTS=(8081 18081)
WEED_FILER_PORTS=(8889 18889)
WEED_ADMIN_PORTS=(23647 33647)
S3_ENDPOINT="http://127.0.0.1:$S3_PORT"
S3_ADMIN_KEY_ID_FILE="$DATA/s3-admin-key-id"
S3_ADMIN_SECRET_FILE="$DATA/s3-admin-secret"
# Under a second here; as long as nats-server's on a busy machine.
WEED_READY_TIMEOUT_SECS=30
# The store's heap: without a limit it keeps what its largest transfer
# took (hundreds of MiB).
WEED_MEMORY_LIMIT_MIB=256
# Largest volume file: each bucket, so each tenant, has volumes of its own.
WEED_VOLUME_SIZE_LIMIT_MB=64

# name | binary | HTTP address (health, readiness, metrics)
SERVICES=(
    "gateway|lh-gateway|$GATEWAY_ADDR"
    "scheduler|lh-scheduler|127.0.0.1:9101"
    "pricing|lh-pricing|127.0.0.1:9103"
    "spot-broker|lh-spot-broker|127.0.0.1:9104"
    "audit|lh-audit|127.0.0.1:9105"
    "node-agent-a|lh-node-agent|127.0.0.1:9110"
    "node-agent-b|lh-node-agent|127.0.0.1:9111"
    "node-agent-c|lh-node-agent|127.0.0.1:9112"
    "node-agent-d|lh-node-agent|127.0.0.1:9113"
    "node-agent-e|lh-node-agent|127.0.0.1:9114"
    "node-agent-f|lh-node-agent|127.0.0.1:9115"
)

say() { echo "up: $*"; }
die() { echo "up: error: $*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
as_postgres() { if is_root; then runuser -u postgres -- "$@"; else "$@"; fi; }
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
tail_log() { echo "--- last lines of $1 ---" >&2; tail -n 40 "$1" >&2 2>/dev/null || true; }

"$ROOT/scripts/deps.sh" up
mkdir -p "$LOGS" "$PIDS" "$DATA/nats" "$DATA/audit" "$DATA/node-agents"

if [ "${LH_UP_NO_BUILD:-0}" != 1 ]; then
    build=(cargo build --profile "$PROFILE" --bins)
    for package in "${UP_PACKAGES[@]}"; do build+=(-p "$package"); done
    say "${build[*]}"
    "${build[@]}"
    echo "$PROFILE" >"$PROFILE_FILE"
fi
for entry in "${SERVICES[@]}"; do
    IFS='|' read -r _ binary _ <<<"$entry"
    [ -x "$BIN/$binary" ] || die "$BIN/$binary was not built"
done
[ -x "$BIN/lh-nats-auth" ] || die "$BIN/lh-nats-auth was not built"

# --- NATS credentials ---
# One nkey per service, the operator, the auditor and each node agent,
# generated once into .data/nats/auth (seeds 0600, kept across runs);
# users.conf and permissions.conf beside them are written again each run,
# so a clone and an existing .data both come up with auth on. nats-server
# refuses clients without a key (docs/security.md "## NATS").
AUTH="$DATA/nats/auth"
mkdir -p "$AUTH"
chmod 700 "$AUTH"
"$BIN/lh-nats-auth" init "$AUTH"
for entry in "${SERVICES[@]}"; do
    IFS='|' read -r name _ _ <<<"$entry"
    case $name in
        node-agent-*) "$BIN/lh-nats-auth" node "$AUTH" "node-${name#node-agent-}" >/dev/null ;;
    esac
done
# The NATS user a service connects as.
nats_user() {
    case $1 in
        node-agent-*) echo "node-node-${1#node-agent-}" ;;
        *) echo "$1" ;;
    esac
}

# --- NATS ---
# A store made by one server cannot be read by a cluster nor the other way
# round, and the projections in PostgreSQL follow that one log: the mode is
# recorded with the store and switching it needs `make clean-data`.
MODE_FILE="$DATA/nats/mode"
RECORDED_MEMBERS=$(cat "$MODE_FILE" 2>/dev/null || true)
# A store from before the mode was recorded is a single server's.
if [ -z "$RECORDED_MEMBERS" ] && [ -d "$DATA/nats/store/jetstream" ]; then RECORDED_MEMBERS=1; fi
NATS_MEMBERS=${LH_NATS_CLUSTER:-${RECORDED_MEMBERS:-1}}
case $NATS_MEMBERS in
    1 | 3) ;;
    *) die "LH_NATS_CLUSTER must be 1 or 3, not '$NATS_MEMBERS'" ;;
esac
if [ -n "$RECORDED_MEMBERS" ] && [ "$RECORDED_MEMBERS" != "$NATS_MEMBERS" ]; then
    die ".data/nats holds the event log of LH_NATS_CLUSTER=$RECORDED_MEMBERS; 'make clean-data' to switch to $NATS_MEMBERS"
fi
echo "$NATS_MEMBERS" >"$MODE_FILE"

# Writes the config of one server; the cluster block only for a member.
# write_nats_conf FILE NAME CLIENT_PORT HTTP_PORT STORE [ROUTE_PORT]
write_nats_conf() {
    local file=$1 name=$2 port=$3 http=$4 store=$5 route=${6:-} i
    cat >"$file" <<EOF
# Generated by scripts/up.sh. sync_interval: always fsyncs every JetStream
# write before it is acknowledged (see dev/nats.conf).
server_name: "$name"
listen: "127.0.0.1:$port"
http: "127.0.0.1:$http"
max_payload: 1048576
# Per connection: one credential's client cannot hold the server's
# memory with subscriptions (each service needs a few dozen).
max_subscriptions: 1024
# Every service, agent and operator of the largest fleet, with room.
max_connections: 16384
jetstream {
  store_dir: "$store"
  sync_interval: always
}
# Users and permissions (lh-nats-auth); no anonymous clients.
include "auth/users.conf"
EOF
    [ -n "$route" ] || return 0
    {
        echo "cluster {"
        echo "  name: \"lh\""
        echo "  listen: \"127.0.0.1:$route\""
        echo "  routes: ["
        for i in $(seq 0 $((NATS_MEMBERS - 1))); do
            echo "    \"nats-route://127.0.0.1:$((NATS_ROUTE_PORT + i))\""
        done
        echo "  ]"
        echo "}"
    } >>"$file"
}

# name | client port | monitoring port | config | store | route port
NATS_NODES=()
if [ "$NATS_MEMBERS" = 1 ]; then
    NATS_NODES=("nats|$NATS_PORT|$NATS_HTTP_PORT|$DATA/nats/nats.conf|$DATA/nats/store|")
else
    for i in $(seq 1 "$NATS_MEMBERS"); do
        NATS_NODES+=("nats-n$i|$((NATS_PORT + i - 1))|$((NATS_HTTP_PORT + i - 1))|$DATA/nats/n$i.conf|$DATA/nats/n$i|$((NATS_ROUTE_PORT + i - 1))")
    done
fi
NATS_URLS=()
for node in "${NATS_NODES[@]}"; do
    IFS='|' read -r name port http conf store route <<<"$node"
    NATS_URLS+=("nats://127.0.0.1:$port")
    if [ -z "$route" ]; then
        write_nats_conf "$conf" "lh-dev" "$port" "$http" "$store"
    else
        write_nats_conf "$conf" "lh-dev-${name#nats-}" "$port" "$http" "$store" "$route"
    fi
    # A store from before accounts (docs/adr/028) holds the log in the
    # server's global account; the services are in account LH now. A
    # single server's log moves with its directory; a cluster's meta layer
    # names the account, so it moves by backup and restore
    # (docs/operations.md "Moving the log into its account").
    if [ -d "$store/jetstream/\$G" ] && ! [ -d "$store/jetstream/LH" ]; then
        running "$PIDS/$name.pid" \
            && die "$name runs with the log in its global account (from before accounts); 'make down' first, then 'make up' moves it"
        [ -z "$route" ] \
            || die "$store holds a cluster's log in the global account (from before accounts); move it as docs/operations.md says, or 'make clean-data'"
        say "moving the event log into account LH (from before accounts)"
        mv "$store/jetstream/\$G" "$store/jetstream/LH"
    fi
    if running "$PIDS/$name.pid"; then
        # A server started before it had users reloads them now.
        say "$name already running (pid $(cat "$PIDS/$name.pid")); reloading its config"
        "$ROOT/scripts/nats-reload.sh" "$(cat "$PIDS/$name.pid")" "$LOGS/$name.log"
        continue
    fi
    port_busy "$port" && die "port $port is taken (another nats-server?); set LH_NATS_PORT"
    mkdir -p "$store"
    say "starting $name on nats://127.0.0.1:$port"
    nohup "$NATS_SERVER" -c "$conf" >>"$LOGS/$name.log" 2>&1 &
    echo $! >"$PIDS/$name.pid"
done
NATS_URL=$(IFS=,; echo "${NATS_URLS[*]}")
# A single server is healthy once JetStream is on; a cluster member's plain
# /healthz answers 200 only once it follows an elected JetStream meta
# leader, before which no stream can be created.
if [ "$NATS_MEMBERS" = 1 ]; then HEALTH="healthz?js-enabled-only=true"; else HEALTH="healthz"; fi
nats_deadline=$((SECONDS + NATS_READY_TIMEOUT_SECS))
for node in "${NATS_NODES[@]}"; do
    IFS='|' read -r name _ http _ _ _ <<<"$node"
    until curl -fsS "http://127.0.0.1:$http/$HEALTH" >/dev/null 2>&1; do
        running "$PIDS/$name.pid" || { tail_log "$LOGS/$name.log"; die "$name exited"; }
        [ "$SECONDS" -lt "$nats_deadline" ] \
            || { tail_log "$LOGS/$name.log"; die "$name not healthy after $NATS_READY_TIMEOUT_SECS s"; }
        sleep 0.1
    done
done
if [ "$NATS_MEMBERS" != 1 ]; then
    meta_leader=$(curl -fsS "http://127.0.0.1:$NATS_HTTP_PORT/jsz" | grep -m1 -o '"leader": *"[^"]*"' | cut -d'"' -f4 || true)
    say "NATS cluster of $NATS_MEMBERS up; JetStream meta leader: ${meta_leader:-?}"
fi

# --- the object store (SeaweedFS, docs/adr/031) ---
# The admin identity, made once and kept with the data it owns: the
# gateway makes tenants' buckets and identities with it.
if ! [ -s "$S3_ADMIN_KEY_ID_FILE" ] || ! [ -s "$S3_ADMIN_SECRET_FILE" ]; then
    (umask 077 \
        && printf 'LHADMIN%s\n' "$(od -An -tx1 -N7 /dev/urandom | tr -d ' \n' | tr a-f A-F | cut -c1-13)" >"$S3_ADMIN_KEY_ID_FILE" \
        && od -An -tx1 -N20 /dev/urandom | tr -d ' \n' >"$S3_ADMIN_SECRET_FILE" && echo >>"$S3_ADMIN_SECRET_FILE")
fi
chmod 600 "$S3_ADMIN_KEY_ID_FILE" "$S3_ADMIN_SECRET_FILE"
S3_ADMIN_KEY_ID=$(tr -d ' \n' <"$S3_ADMIN_KEY_ID_FILE")
# The store's only static identity; with one in place it refuses anonymous
# requests. Hex and letters only: no JSON escaping needed.
(umask 077 && printf '{"identities":[{"name":"admin","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
    "$S3_ADMIN_KEY_ID" "$(tr -d ' \n' <"$S3_ADMIN_SECRET_FILE")" >"$DATA/s3-identities.json")
chmod 600 "$DATA/s3-identities.json"
WEED_PORTS=("$S3_PORT" "$S3_GRPC_PORT" "${WEED_MASTER_PORTS[@]}" "${WEED_VOLUME_PORTS[@]}"
    "${WEED_FILER_PORTS[@]}" "${WEED_ADMIN_PORTS[@]}")
if running "$PIDS/weed.pid"; then
    say "SeaweedFS already running (pid $(cat "$PIDS/weed.pid"))"
else
    [ -x "$WEED" ] || die "no $WEED: run 'scripts/deps.sh up'"
    for port in "${WEED_PORTS[@]}"; do
        port_busy "$port" && die "port $port is taken (another weed?), which the object store needs: stop what holds it"
    done
    mkdir -p "$DATA/s3"
    # `weed mini` saves its first start's flags there and takes them again
    # for any flag a later start leaves out: without the file, what this
    # script passes is the whole of its configuration.
    rm -f "$DATA/s3/mini.options"
    say "starting SeaweedFS (S3 on $S3_ENDPOINT)"
    # AWS_* would add a second admin identity, unseen; -logtostderr keeps
    # its logs in its log file, not in files of its own in /tmp; the IAM
    # API on the S3 port is how the gateway makes tenants' identities.
    nohup env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN GOMEMLIMIT="${WEED_MEMORY_LIMIT_MIB}MiB" \
        "$WEED" -logtostderr mini -dir="$DATA/s3" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -s3.port="$S3_PORT" -s3.port.grpc="$S3_GRPC_PORT" \
        -master.port="${WEED_MASTER_PORTS[0]}" -master.port.grpc="${WEED_MASTER_PORTS[1]}" \
        -volume.port="${WEED_VOLUME_PORTS[0]}" -volume.port.grpc="${WEED_VOLUME_PORTS[1]}" \
        -filer.port="${WEED_FILER_PORTS[0]}" -filer.port.grpc="${WEED_FILER_PORTS[1]}" \
        -admin.port="${WEED_ADMIN_PORTS[0]}" -admin.port.grpc="${WEED_ADMIN_PORTS[1]}" \
        -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 -webdav=false \
        -s3.localSocket="$DATA/s3/s3.sock" -filer.localSocket="$DATA/s3/filer.sock" \
        -master.telemetry=false -master.volumeSizeLimitMB="$WEED_VOLUME_SIZE_LIMIT_MB" \
        -s3.config="$DATA/s3-identities.json" -s3.iam.readOnly=false \
        >>"$LOGS/weed.log" 2>&1 &
    echo $! >"$PIDS/weed.pid"
    # It makes gRPC sockets in /tmp named by their ports whatever its
    # flags, and leaves some after a clean stop: scripts/down.sh removes
    # the ones named here.
    printf '/tmp/seaweedfs-%s.sock\n' "master-grpc-${WEED_MASTER_PORTS[1]}" "volume-grpc-${WEED_VOLUME_PORTS[1]}" \
        "filer-grpc-${WEED_FILER_PORTS[1]}" "s3-grpc-$S3_GRPC_PORT" "admin-grpc-${WEED_ADMIN_PORTS[1]}" >"$DATA/s3/tmp-sockets"
fi
# S3 answers its health check before the master has heard of the volumes
# already on disk, and reads of what they hold fail (500) until it has
# (measured: up to 4 s after a restart), so ready is both.
weed_ready() {
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$S3_ENDPOINT/healthz")" = 200 ] || return 1
    local on_disk known
    on_disk=$(find "$DATA/s3" -maxdepth 1 -name '*.dat' | wc -l)
    known=$(curl -s "http://127.0.0.1:${WEED_MASTER_PORTS[0]}/dir/status" \
        | grep -o '"Volumes":[0-9]*' | awk -F: '{ n += $2 } END { print n + 0 }')
    [ "$known" -ge "$on_disk" ]
}
weed_deadline=$((SECONDS + WEED_READY_TIMEOUT_SECS))
until weed_ready; do
    running "$PIDS/weed.pid" || { tail_log "$LOGS/weed.log"; die "SeaweedFS exited (log: $LOGS/weed.log)"; }
    [ "$SECONDS" -lt "$weed_deadline" ] \
        || { tail_log "$LOGS/weed.log"; die "SeaweedFS not ready ($S3_ENDPOINT/healthz, and the volumes on disk known to its master) after $WEED_READY_TIMEOUT_SECS s"; }
    sleep 0.1
done

# --- PostgreSQL ---
if [ -z "${DATABASE_URL:-}" ]; then
    PG_BIN=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || printf '%s\n' /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")")
    PGDATA="$DATA/pg/data"
    PGSOCK="$DATA/pg/sock"
    mkdir -p "$DATA/pg" "$PGSOCK"
    if is_root; then
        chown -R postgres:postgres "$DATA/pg"
        as_postgres test -x "$DATA/pg" \
            || die "user postgres cannot reach $DATA/pg (a parent directory is not world-searchable); set DATABASE_URL instead"
    fi
    if ! [ -f "$PGDATA/PG_VERSION" ]; then
        say "initdb $PGDATA"
        as_postgres env LC_ALL=C TZ=UTC "$PG_BIN/initdb" -D "$PGDATA" -A trust -U postgres -E UTF8 --no-locale >"$LOGS/initdb.log" 2>&1 \
            || { tail_log "$LOGS/initdb.log"; die "initdb failed"; }
    fi
    if as_postgres "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
        say "PostgreSQL already running"
    else
        port_busy "$PG_PORT" && die "port $PG_PORT is taken (another PostgreSQL?); set LH_PG_PORT or DATABASE_URL"
        say "starting PostgreSQL on 127.0.0.1:$PG_PORT"
        touch "$LOGS/postgres.log"
        is_root && chown postgres:postgres "$LOGS/postgres.log"
        as_postgres "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$LOGS/postgres.log" -w -t 60 \
            -o "-p $PG_PORT -k $PGSOCK -c listen_addresses=127.0.0.1" start >/dev/null \
            || { tail_log "$LOGS/postgres.log"; die "PostgreSQL did not start"; }
    fi
    PSQL=("$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc)
    if [ "$("${PSQL[@]}" "SELECT 1 FROM pg_database WHERE datname = 'leasehold'")" != 1 ]; then
        "${PSQL[@]}" "CREATE DATABASE leasehold" >/dev/null
    fi
    DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/leasehold"
    # Each service under its own role, owning its schema and nothing else.
    PSQL="$PG_BIN/psql" "$ROOT/scripts/pg-roles.sh" "$DATABASE_URL" "$DATA/pg-roles" >"$LOGS/pg-roles.log" 2>&1 \
        || { tail_log "$LOGS/pg-roles.log"; die "giving the services their PostgreSQL roles failed"; }
    for svc in gateway pricing audit; do
        printf -v "PG_URL_$svc" '%s' "$(cat "$DATA/pg-roles/$svc.url")"
    done
fi
# With DATABASE_URL given, every service uses it unless its own is set.
GATEWAY_DATABASE_URL=${LH_GATEWAY_DATABASE_URL:-${PG_URL_gateway:-$DATABASE_URL}}
PRICING_DATABASE_URL=${LH_PRICING_DATABASE_URL:-${PG_URL_pricing:-$DATABASE_URL}}
AUDIT_DATABASE_URL=${LH_AUDIT_DATABASE_URL:-${PG_URL_audit:-$DATABASE_URL}}

# --- the gateway's master key (wraps tenants' data keys; never in the database) ---
MASTER_KEY_FILE=${LH_MASTER_KEY_FILE:-$DATA/gateway/master.keys}
if ! [ -s "$MASTER_KEY_FILE" ]; then
    (umask 077 && mkdir -p "$(dirname "$MASTER_KEY_FILE")" \
        && printf 'dev-%s %s\n' "$(date -u +%Y%m%d)" "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$MASTER_KEY_FILE")
fi

# --- admin token ---
if [ -z "${LH_ADMIN_TOKEN:-}" ]; then
    # 64 random hex digits, readable by this user only: the gateway
    # refuses short or placeholder tokens.
    if ! [ -s "$DATA/admin-token" ]; then
        (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$DATA/admin-token")
    fi
    chmod 600 "$DATA/admin-token"
    LH_ADMIN_TOKEN=$(cat "$DATA/admin-token")
fi

# --- audit: its signing key, the pinned public half, the verify token ---
AUDIT_KEY_FILE="$DATA/audit/signing.key"
if ! [ -s "$AUDIT_KEY_FILE" ]; then
    # The format lh-audit writes itself: the ed25519 seed as 64 hex digits.
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$AUDIT_KEY_FILE" && echo >>"$AUDIT_KEY_FILE")
fi
chmod 600 "$AUDIT_KEY_FILE"
# Pinning the key is what makes the service's verification mean something;
# without openssl the service falls back to trusting its own key and says so.
ed25519_public_hex() {
    local seed der
    seed=$(tr -d ' \n' <"$1")
    # PKCS#8 wrapping of a raw ed25519 seed (RFC 8410), as openssl reads it.
    der="302e020100300506032b657004220420$seed"
    # shellcheck disable=SC2059
    printf "$(printf '%s' "$der" | sed 's/../\\x&/g')" \
        | openssl pkey -inform DER -pubout -outform DER 2>/dev/null \
        | tail -c 32 | od -An -tx1 | tr -d ' \n'
}
AUDIT_PUBLIC_KEY=$(ed25519_public_hex "$AUDIT_KEY_FILE" || true)
[ ${#AUDIT_PUBLIC_KEY} -eq 64 ] || { AUDIT_PUBLIC_KEY=""; say "openssl could not derive the audit public key: not pinning it"; }
AUDIT_VERIFY_TOKEN_FILE="$DATA/audit/verify.token"
if ! [ -s "$AUDIT_VERIFY_TOKEN_FILE" ]; then
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$AUDIT_VERIFY_TOKEN_FILE")
fi
chmod 600 "$AUDIT_VERIFY_TOKEN_FILE"

# --- the workloads' runtime ---
# Leases run their images in real containers (podman; the GPUs stay
# simulated, each a stand-in device) wherever podman works here, and the
# simulated runtime (nothing runs) otherwise, saying why. LH_RUNTIME=sim
# chooses the simulated one; LH_RUNTIME=podman fails instead of falling
# back. LH_PODMAN_ARGS: podman's global flags (runc, as crun refuses
# hybrid cgroups; cgroupfs where systemd does not run).
RUNTIME_FILE="$DATA/up-runtime"
if [ -z "${LH_PODMAN_ARGS+x}" ]; then
    LH_PODMAN_ARGS="--runtime runc"
    [ -d /run/systemd/system ] || LH_PODMAN_ARGS="--cgroup-manager cgroupfs $LH_PODMAN_ARGS"
fi
read -r -a PODMAN_ARGS <<<"$LH_PODMAN_ARGS"
podman_why_not() {
    command -v podman >/dev/null || { echo "podman is not installed ('make deps' installs it, as root)"; return; }
    [ "$(id -u)" -eq 0 ] || { echo "containers need root here (a user namespace and cgroup limits per lease)"; return; }
    "$ROOT/scripts/images.sh" base >/dev/null 2>"$LOGS/images.log" || { echo "cannot make the base image ($LOGS/images.log)"; return; }
    local out
    if ! out=$(podman "${PODMAN_ARGS[@]}" run --rm --pull never --network none --userns auto:size=65536 \
        --ulimit nofile=1024:1024 --ulimit nproc=64:64 localhost/leasehold/base true 2>&1); then
        echo "podman cannot run a container: $(tail -n 1 <<<"$out")"
    fi
}
case ${LH_RUNTIME:-auto} in
    sim) RUNTIME=sim; RUNTIME_WHY="LH_RUNTIME=sim" ;;
    auto | podman)
        why=$(podman_why_not)
        if [ -z "$why" ]; then
            RUNTIME=podman; RUNTIME_WHY="podman works here"
        elif [ "${LH_RUNTIME:-auto}" = podman ]; then
            die "LH_RUNTIME=podman, but $why"
        else
            RUNTIME=sim; RUNTIME_WHY="$why"
            say "workloads are simulated, not run: $why"
        fi
        ;;
    *) die "LH_RUNTIME=${LH_RUNTIME}: sim or podman" ;;
esac
echo "$RUNTIME" >"$RUNTIME_FILE"

# --- services ---
start_service() {
    local name=$1 binary=$2 addr=$3
    if running "$PIDS/$name.pid"; then
        say "$name already running (pid $(cat "$PIDS/$name.pid"))"
        return
    fi
    local user
    user=$(nats_user "$name")
    local -a env=(LH_NATS_URL="$NATS_URL" LH_STREAM_REPLICAS="$NATS_MEMBERS" LH_LOG_FORMAT="$LOG_FORMAT"
        LH_NATS_USER="$user" LH_NATS_NKEY_SEED_FILE="$AUTH/keys/$user.nk")
    case $name in
        gateway) env+=(LH_GATEWAY_ADDR="$addr" DATABASE_URL="$GATEWAY_DATABASE_URL" LH_ADMIN_TOKEN="$LH_ADMIN_TOKEN"
                       LH_MASTER_KEY_FILE="$MASTER_KEY_FILE"
                       LH_SSH_ADDR="$SSH_ADDR" LH_SSH_HOST_KEY_FILE="$DATA/ssh/ssh_host_ed25519_key"
                       LH_SESSION_LANE_ADDR="$SESSION_LANE_ADDR"
                       LH_STORAGE_ENDPOINT="$S3_ENDPOINT" LH_STORAGE_ADMIN_ACCESS_KEY_ID="$S3_ADMIN_KEY_ID"
                       LH_STORAGE_ADMIN_SECRET_KEY_FILE="$S3_ADMIN_SECRET_FILE")
                 if [ "$LEASE_WEB_ADDR" != off ]; then
                     env+=(LH_LEASE_WEB_ADDR="$LEASE_WEB_ADDR" LH_LEASE_WEB_BASE="http://localhost:${LEASE_WEB_ADDR##*:}")
                 fi ;;
        pricing) env+=(LH_HTTP_ADDR="$addr" DATABASE_URL="$PRICING_DATABASE_URL") ;;
        audit) env+=(LH_HTTP_ADDR="$addr" DATABASE_URL="$AUDIT_DATABASE_URL" LH_AUDIT_KEY_FILE="$AUDIT_KEY_FILE"
                     LH_AUDIT_VERIFY_TOKEN_FILE="$AUDIT_VERIFY_TOKEN_FILE")
               if [ -n "$AUDIT_PUBLIC_KEY" ]; then env+=(LH_AUDIT_TRUSTED_PUBLIC_KEYS="$AUDIT_PUBLIC_KEY"); fi ;;
        node-agent-*) env+=(LH_HTTP_ADDR="$addr" LH_FLEET_FILE="$ROOT/dev/fleet.toml" LH_NODE_ID="node-${name#node-agent-}"
                            LH_RUNTIME="$RUNTIME" LH_CONTAINER_CLI_ARGS="$LH_PODMAN_ARGS"
                            LH_DEFAULT_IMAGE=localhost/leasehold/base
                            LH_NODE_STATE_DIR="$DATA/node-agents/${name#node-agent-}") ;;
        *) env+=(LH_HTTP_ADDR="$addr") ;;
    esac
    say "starting $name on http://$addr"
    nohup env "${env[@]}" "$BIN/$binary" >>"$LOGS/$name.log" 2>&1 &
    echo $! >"$PIDS/$name.pid"
}
for entry in "${SERVICES[@]}"; do
    IFS='|' read -r name binary addr <<<"$entry"
    start_service "$name" "$binary" "$addr"
done

# --- enrollment ---
# A node no operator enrolled is in no fleet, whatever it says of itself
# (docs/security.md, "Authority by state"): each node of the fleet file is
# enrolled for what it declares, as an operator does with `lh node enroll`.
# A node agent that registered before its enrollment registers again.
enroll_fleet() {
    local id zone count model isolation sharing args s
    while IFS='|' read -r id zone count model isolation sharing; do
        args=(node enroll "$id" --zone "$zone" --max-gpus "$count" --gpu-model "$model"
            --max-isolation "$isolation")
        for s in $sharing; do args+=(--gpu-sharing "$s"); done
        LH_GATEWAY_URL="http://$GATEWAY_ADDR" LH_API_KEY_FILE="$DATA/admin-token" \
            "$BIN/lh" "${args[@]}" >/dev/null || die "cannot enroll node $id"
    done < <(python3 - "$ROOT/dev/fleet.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    fleet = tomllib.load(f)
for n in fleet["node"]:
    sharing = []
    if n.get("mig_gpus"):
        sharing.append("mig")
    if n.get("gpu_sharing", "none") not in ("none", *sharing):
        sharing.append(n["gpu_sharing"])
    print("|".join([n["id"], n["zone"], str(n["gpu_count"]), n["gpu_model"],
                    n.get("isolation", "none"), " ".join(sharing)]))
PY
)
    say "enrolled the fleet's nodes (dev/fleet.toml)"
}

# --- readiness ---
deadline=$((SECONDS + TIMEOUT_SECS))
for entry in "${SERVICES[@]}"; do
    IFS='|' read -r name _ addr <<<"$entry"
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")" = 200 ]; do
        if ! running "$PIDS/$name.pid"; then
            tail_log "$LOGS/$name.log"
            die "$name exited (log: $LOGS/$name.log)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail_log "$LOGS/$name.log"
            die "$name not ready (http://$addr/readyz) after ${TIMEOUT_SECS} s; 'make down' stops the rest"
        fi
        sleep 0.5
    done
    if [ "$name" = gateway ]; then
        enroll_fleet
    fi
done

cat <<EOF

Leasehold is up on the simulated fleet (dev/fleet.toml).
  workloads:    $RUNTIME ($RUNTIME_WHY)
  gateway:      http://$GATEWAY_ADDR
  console:      http://$GATEWAY_ADDR/console/ (sign in with a tenant's API key or the admin token)
  lease pages:  $([ "$LEASE_WEB_ADDR" = off ] && echo "off (LH_LEASE_WEB_ADDR=off)" || echo "http://<lease>-<port>.localhost:${LEASE_WEB_ADDR##*:} (opened from a lease's page in the console)")
  ssh:          $([ "$SSH_ADDR" = off ] && echo "off (LH_SSH_ADDR=off)" || echo "ssh -p ${SSH_ADDR##*:} <lease-id>@${SSH_ADDR%:*} (after lh ssh-key add)")
  admin token:  $LH_ADMIN_TOKEN
  NATS:         $NATS_URL (monitoring http://127.0.0.1:$NATS_HTTP_PORT, streams R$NATS_MEMBERS)
  database:     $DATABASE_URL (services: roles lh_gateway, lh_pricing, lh_audit where up.sh runs it)
  object store: $S3_ENDPOINT (SeaweedFS; admin key id in $S3_ADMIN_KEY_ID_FILE, secret in $S3_ADMIN_SECRET_FILE)
  logs:         $LOGS/
  audit verify: curl -H "Authorization: Bearer \$(cat $AUDIT_VERIFY_TOKEN_FILE)" http://127.0.0.1:9105/v1/verify

Use the CLI:
  export LH_GATEWAY_URL=http://$GATEWAY_ADDR LH_API_KEY=$LH_ADMIN_TOKEN
  (or LH_API_KEY_FILE=$DATA/admin-token; the CLI never takes a key on its command line)
  $BIN/lh tenant create --name acme --email ops@acme.example --max-gpus 16

Or run the whole story: make demo.  Stop everything: make down.
EOF
elapsed=$((SECONDS - STARTED_AT))
say "ready in $((elapsed / 60)) min $((elapsed % 60)) s"
