#!/usr/bin/env bash
# `make images`: the container images a lease can name, made on this
# machine without a registry.
#
#   scripts/images.sh [base|python|all]
#
#   localhost/leasehold/base    a shell and the core tools (busybox), from
#                               Debian's busybox-static: made in under a second
#   localhost/leasehold/python  Debian bookworm with Python 3 and PyTorch
#                               (CPU), made by debootstrap from Debian's
#                               packages (minutes: see docs/workloads.md)
#
# An image already there is left alone (LH_IMAGES_REBUILD=1 makes it anew).
# Two runs at once wait for each other (a lock), so tests may call it.
# Environment: LH_PODMAN (podman), LH_DEBIAN_MIRROR (the first deb.debian.org
# style URI of apt's sources, else http://deb.debian.org/debian).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PODMAN=${LH_PODMAN:-podman}
WHICH=${1:-all}
REBUILD=${LH_IMAGES_REBUILD:-0}
LOCK=${TMPDIR:-/tmp}/leasehold-images.lock

say() { echo "images: $*" >&2; }

case $WHICH in
    base | python | all) ;;
    *) echo "usage: $0 [base|python|all]" >&2; exit 2 ;;
esac

command -v "$PODMAN" >/dev/null || { say "no $PODMAN: run 'make deps'"; exit 1; }

exec 9>"$LOCK"
flock 9

has_image() { [ "$REBUILD" != 1 ] && "$PODMAN" image exists "$1"; }

base() {
    local image=localhost/leasehold/base
    has_image "$image" && return 0
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
    trap 'rm -rf "$root"' RETURN
    mkdir -p "$root"/{bin,etc,proc,sys,dev,tmp,run,var/tmp,scratch,root}
    chmod 1777 "$root/tmp" "$root/var/tmp"
    cp "$busybox" "$root/bin/busybox"
    local applet
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    tar -C "$root" -c . | "$PODMAN" import --quiet \
        --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' \
        --message 'leasehold base: busybox' - "$image" >/dev/null
    say "$image made in $((SECONDS - started)) s"
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
    trap 'rm -rf "$root"' RETURN
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

case $WHICH in
    base) base ;;
    python) python ;;
    all) base; python ;;
esac
