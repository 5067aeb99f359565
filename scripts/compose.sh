#!/usr/bin/env bash
# docker-compose.yml under podman, on images made on this machine: no
# registry is needed or reached.
#
#   scripts/compose.sh demo   (`make compose-demo`) from a clean tree: what is
#                             missing (scripts/deps.sh compose), release
#                             binaries, the images (scripts/images.sh
#                             compose), a fresh stack, `make demo` against it,
#                             and the stack removed again, volumes and all,
#                             whether the demo passed or not
#   scripts/compose.sh up     (`make compose-up`) the same up to a running
#                             stack, left running (its volumes kept)
#   scripts/compose.sh down   (`make compose-down`) removes its containers
#                             and network; the volumes stay
#   scripts/compose.sh clean  removes the volumes too
#
# The stack is compose project leasehold-compose (containers
# leasehold-compose_<service>_1, volumes leasehold-compose_<volume>, network
# leasehold-compose_default), apart from anything `make up` or the tests
# make. Its ports are docker-compose.yml's with LH_COMPOSE_PORT_PREFIX (1)
# in front, all on 127.0.0.1: the gateway on 18080, NATS on 14222..14224,
# PostgreSQL on 15432, the object store's S3 on 18333, Prometheus on
# 19090; so it runs beside `make up` (8080, 4222, 8222, 8333, 5432). It
# refuses to start when one of them is taken.
#
# What departs from `docker compose up` (docs/adr/029, "Compose and images
# without a registry"):
#   - images: the project's are the Dockerfile's, on a Debian base made by
#     debootstrap, with the binaries compiled here (BINARIES=prebuilt);
#     NATS, PostgreSQL, Prometheus and postgres_exporter are stand-ins made
#     from Debian's packages, SeaweedFS one made from the `weed` of
#     .data/venv (LH_*_IMAGE point compose at them); Grafana,
#     which no Debian package or other source here provides, is not started;
#   - start order: podman-compose creates the containers and
#     scripts/compose-start.py starts them, honouring depends_on conditions
#     that podman-compose skips on podman 4.3 and running the health checks
#     that podman runs only with systemd;
#   - the node agents simulate workloads, as docker-compose.yml has them
#     (no engine inside a container): the demo's container step is skipped.
#
# Environment: LH_ADMIN_TOKEN (else generated into .data/compose/admin-token),
# LH_COMPOSE_PORT_PREFIX (1; empty for compose's own ports),
# LH_COMPOSE_TIMEOUT_SECS (300: to all healthy), LH_COMPOSE_SKIP (grafana:
# services not started), LH_COMPOSE_NO_BUILD=1 (take target/release as it
# is), LH_PODMAN_ARGS (podman's global flags: runc, as crun refuses hybrid
# cgroups; cgroupfs where systemd does not run), LH_COMPOSE_ULIMITS (the
# containers' limits: podman's default open-files limit is refused here).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
WHAT=${1:-demo}
PROJECT=leasehold-compose
DIR="$ROOT/.data/compose"
LOGS="$DIR/logs"
VENV="$ROOT/.data/venv"
COMPOSE_FILE="$ROOT/docker-compose.yml"
TIMEOUT_SECS=${LH_COMPOSE_TIMEOUT_SECS:-300}
SKIP=${LH_COMPOSE_SKIP-grafana}
export LH_COMPOSE_PORT_PREFIX=${LH_COMPOSE_PORT_PREFIX-1}
STARTED_AT=$SECONDS

# The stand-ins scripts/images.sh makes for the third-party images.
export LH_NATS_IMAGE=localhost/leasehold/nats:2.15
export LH_POSTGRES_IMAGE=localhost/leasehold/postgres:15
export LH_SEAWEEDFS_IMAGE=localhost/leasehold/seaweedfs:4.48
export LH_PROMETHEUS_IMAGE=localhost/leasehold/prometheus:2.42
export LH_POSTGRES_EXPORTER_IMAGE=localhost/leasehold/postgres-exporter:0.11

if [ -z "${LH_PODMAN_ARGS+x}" ]; then
    LH_PODMAN_ARGS="--runtime runc"
    [ -d /run/systemd/system ] || LH_PODMAN_ARGS="--cgroup-manager cgroupfs $LH_PODMAN_ARGS"
fi
read -r -a PODMAN_ARGS <<<"$LH_PODMAN_ARGS"
if [ -z "${LH_COMPOSE_ULIMITS:-}" ]; then
    nofile=$(ulimit -Hn)
    [ "$nofile" != unlimited ] || nofile=1048576
    # nproc above 32768 is refused here too (measured; podman build's
    # own default is 32768).
    LH_COMPOSE_ULIMITS="--ulimit nofile=$nofile:$nofile --ulimit nproc=32768:32768"
fi
read -r -a ULIMITS <<<"$LH_COMPOSE_ULIMITS"

say() { echo "compose: $*"; }
die() { echo "compose: error: $*" >&2; exit 1; }
elapsed() { echo "$((SECONDS - $1)) s"; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case $WHAT in
    demo | up | down | clean) ;;
    *) echo "usage: $0 [demo|up|down|clean]" >&2; exit 2 ;;
esac

# podman-compose on this project, with the flags podman needs here.
compose() {
    "$VENV/bin/podman-compose" --project-name "$PROJECT" --file "$COMPOSE_FILE" --in-pod false \
        --podman-args "$LH_PODMAN_ARGS" --podman-run-args "$LH_COMPOSE_ULIMITS" "$@"
}

# Every container, the network and (with --volumes) the volumes of the
# project. podman-compose's own `down` misses a container made by a run
# that failed half-way, so what carries the project's label goes too.
remove_stack() {
    local started=$SECONDS ids
    if [ -x "$VENV/bin/podman-compose" ]; then
        compose down "$@" >>"$LOGS/podman-compose.log" 2>&1 || true
    fi
    ids=$(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT")
    # shellcheck disable=SC2086 # one id a word
    [ -z "$ids" ] || podman "${PODMAN_ARGS[@]}" rm -f -t 10 $ids >/dev/null 2>>"$LOGS/podman-compose.log"
    podman network exists "${PROJECT}_default" && podman network rm "${PROJECT}_default" >/dev/null
    if [ "${1:-}" = --volumes ]; then
        ids=$(podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT")
        # shellcheck disable=SC2086
        [ -z "$ids" ] || podman volume rm -f $ids >/dev/null
    fi
    say "removed project $PROJECT${1:+ and its volumes} in $(elapsed "$started")"
}

mkdir -p "$LOGS"
case $WHAT in
    down | clean)
        # Compose reads the whole file, which requires the token, even to
        # remove the stack.
        export LH_ADMIN_TOKEN=${LH_ADMIN_TOKEN:-$(cat "$DIR/admin-token" 2>/dev/null || echo not-needed-to-remove-the-stack)}
        if [ "$WHAT" = down ]; then remove_stack; else remove_stack --volumes; fi
        exit 0
        ;;
esac

[ "$(id -u)" -eq 0 ] || die "needs root: the images are made by debootstrap and run by rootful podman"

# --- what is needed, the binaries, the images ---
say "[1/6] what is missing (scripts/deps.sh compose)"
"$ROOT/scripts/deps.sh" compose
[ -x "$VENV/bin/podman-compose" ] || die "no podman-compose in $VENV"

if [ "${LH_COMPOSE_NO_BUILD:-0}" != 1 ]; then
    say "[2/6] cargo build --release --bins (minutes on a fresh tree)"
    step=$SECONDS
    cargo build --release --bins
    say "binaries built in $(elapsed "$step")"
fi

say "[3/6] images (scripts/images.sh compose; debootstrap takes minutes the first time)"
step=$SECONDS
LH_IMAGES_BINARIES="${CARGO_TARGET_DIR:-$ROOT/target}/release" "$ROOT/scripts/images.sh" compose
say "images ready in $(elapsed "$step")"

# --- the stack ---
if [ -z "${LH_ADMIN_TOKEN:-}" ]; then
    if ! [ -s "$DIR/admin-token" ]; then
        (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$DIR/admin-token")
    fi
    LH_ADMIN_TOKEN=$(cat "$DIR/admin-token")
fi
export LH_ADMIN_TOKEN

# The services to start (all but LH_COMPOSE_SKIP) and their published
# host ports, from the file as compose reads it (variables resolved).
compose config >"$DIR/config.yml" 2>"$LOGS/podman-compose.log" \
    || { cat "$LOGS/podman-compose.log" >&2; die "podman-compose cannot read $COMPOSE_FILE"; }
read -r -a SERVICES < <("$VENV/bin/python" - "$DIR/config.yml" "$SKIP" <<'PY'
import sys, yaml
services = yaml.safe_load(open(sys.argv[1]))["services"]
skip = set(sys.argv[2].split())
print(" ".join(s for s in services if s not in skip))
PY
)
read -r -a PORTS < <("$VENV/bin/python" - "$DIR/config.yml" "${SERVICES[@]}" <<'PY'
import sys, yaml
services = yaml.safe_load(open(sys.argv[1]))["services"]
ports = []
for name in sys.argv[2:]:
    for port in services[name].get("ports", []):
        if isinstance(port, dict):
            ports.append(str(port["published"]))
        else:
            parts = str(port).split(":")
            ports.append(parts[-2] if len(parts) > 1 else parts[0])
print(" ".join(ports))
PY
)
GATEWAY_URL="http://127.0.0.1:${LH_COMPOSE_PORT_PREFIX}8080"

if [ "$WHAT" = demo ]; then
    # The demo tells one tenant's story from the start: nothing of an
    # earlier run, whatever it left.
    if [ -n "$(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT")" ] \
        || [ -n "$(podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT")" ]; then
        remove_stack --volumes
    fi
    finish() {
        local status=$?
        if [ "$status" -ne 0 ]; then
            local ctr service
            for ctr in $(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT"); do
                service=$(podman inspect --format '{{index .Config.Labels "com.docker.compose.service"}}' "$ctr")
                podman logs "$ctr" >"$LOGS/$service.log" 2>&1 || true
            done
            say "failed; each container's log is in $LOGS/"
        fi
        say "[6/6] removing the stack"
        remove_stack --volumes
        [ "$status" -ne 0 ] || say "compose demo passed in $(elapsed "$STARTED_AT")"
        exit "$status"
    }
    trap finish EXIT
else
    # `up` leaves what it started, also when it fails, for a look at it.
    trap '[ $? -eq 0 ] || say "left as it is: podman ps -a --filter label=io.podman.compose.project=$PROJECT; scripts/compose.sh down removes it"' EXIT
fi

if [ -z "$(podman ps -q --filter "label=io.podman.compose.project=$PROJECT")" ]; then
    for port in "${PORTS[@]}"; do
        if port_busy "$port"; then
            die "port $port on 127.0.0.1 is taken (\`make up\` holds 8080, 4222, 8222, 8333, 5432; another compose stack?); set LH_COMPOSE_PORT_PREFIX to another digit, or stop what holds it"
        fi
    done
fi
podman "${PODMAN_ARGS[@]}" run --rm --pull never --network none "${ULIMITS[@]}" localhost/leasehold/base true \
    >"$LOGS/podman-check.log" 2>&1 \
    || { cat "$LOGS/podman-check.log" >&2; die "podman cannot run a container with LH_PODMAN_ARGS='$LH_PODMAN_ARGS' LH_COMPOSE_ULIMITS='$LH_COMPOSE_ULIMITS'"; }

say "[4/6] podman-compose up: ${#SERVICES[@]} services (not started: ${SKIP:-none})"
step=$SECONDS
# Made, not started: podman-compose would start each container without
# waiting for the health of what it depends on (podman 4.3), and with
# --requires links that start a finished one-shot again whenever a
# dependent starts. --no-deps leaves those links out; the order is kept
# below instead.
compose up --no-build --no-start --no-deps "${SERVICES[@]}" >>"$LOGS/podman-compose.log" 2>&1 \
    || { tail -n 30 "$LOGS/podman-compose.log" >&2; die "podman-compose up failed (log: $LOGS/podman-compose.log)"; }
PODMAN=podman PODMAN_ARGS="$LH_PODMAN_ARGS" "$VENV/bin/python" "$ROOT/scripts/compose-start.py" \
    "$COMPOSE_FILE" "$PROJECT" "$TIMEOUT_SECS" "${SERVICES[@]}"
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$GATEWAY_URL/readyz")" = 200 ]; do
    [ $((SECONDS - step)) -lt "$TIMEOUT_SECS" ] || die "the gateway is not ready at $GATEWAY_URL/readyz after $TIMEOUT_SECS s"
    sleep 0.5
done
say "gateway ready at $GATEWAY_URL, $(elapsed "$step") after podman-compose up"

if [ "$WHAT" = up ]; then
    cat <<EOF

Leasehold runs under podman (compose project $PROJECT, ${#SERVICES[@]} services; not started: ${SKIP:-none}).
  gateway:      $GATEWAY_URL
  admin token:  $LH_ADMIN_TOKEN
  NATS:         nats://127.0.0.1:${LH_COMPOSE_PORT_PREFIX}4222 (monitoring http://127.0.0.1:${LH_COMPOSE_PORT_PREFIX}8222)
  object store: http://127.0.0.1:${LH_COMPOSE_PORT_PREFIX}8333 (SeaweedFS, S3; http://seaweedfs:8333 on the compose network)
  Prometheus:   http://127.0.0.1:${LH_COMPOSE_PORT_PREFIX}9090
  workloads:    simulated (node agents in containers run no engine)
  containers:   podman ps --filter label=io.podman.compose.project=$PROJECT

  LH_GATEWAY_URL=$GATEWAY_URL LH_ADMIN_TOKEN=\$(cat $DIR/admin-token) LH_DEMO_RUNTIME=sim LH_UP_PROFILE=release scripts/demo.sh
Stop it: make compose-down (volumes kept; scripts/compose.sh clean removes them).
EOF
    say "up in $(elapsed "$STARTED_AT")"
    exit 0
fi

say "[5/6] make demo against $GATEWAY_URL"
step=$SECONDS
LH_GATEWAY_URL=$GATEWAY_URL LH_DEMO_RUNTIME=sim LH_UP_PROFILE=release "$ROOT/scripts/demo.sh"
say "demo passed in $(elapsed "$step")"
