# syntax=docker/dockerfile:1
#
# One image recipe for every Leasehold binary. The builder stage compiles
# the whole workspace once; the runtime stage copies all binaries and runs
# the one named by the BIN build argument:
#
#   docker build --build-arg BIN=lh-scheduler -t leasehold/lh-scheduler .
#
# BIN is one of lh-gateway, lh-scheduler, lh-node-agent, lh-pricing,
# lh-spot-broker, lh-audit (services) or lh (the CLI). docker-compose.yml and
# k8s/ use one image per binary built this way.
#
# Where no registry is reachable (scripts/images.sh services, for compose
# under podman), the same recipe builds on a locally made Debian base from
# binaries compiled on the host, given as the named build context
# `host-binaries` (the eight binaries at its top):
#
#   podman build --build-arg BIN=lh-gateway --build-arg BINARIES=prebuilt \
#     --build-arg RUNTIME_BASE=localhost/leasehold/debian \
#     --build-context host-binaries=DIR -t leasehold/lh-gateway:dev .
#
# Only the stages the runtime stage needs are built (BuildKit, and buildah's
# --skip-unused-stages, on by default), so that build never pulls the rust
# image, and the default build never reads host-binaries.

ARG RUST_VERSION=1.95
# builder: compile in the rust image; prebuilt: take host-binaries.
ARG BINARIES=builder
# Debian bookworm with or without ca-certificates and curl; without them,
# apt-get installs them (which needs Debian's archive, not a registry).
ARG RUNTIME_BASE=debian:bookworm-slim

FROM rust:${RUST_VERSION} AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out \
    && for bin in lh-gateway lh-scheduler lh-node-agent lh-pricing lh-spot-broker lh-audit lh lh-nats-auth; do \
         cp "target/release/$bin" /out/; \
       done

# Binaries compiled outside the image, on the same Debian release as the
# runtime base (glibc): the binaries `cargo build --release --bins` made.
FROM scratch AS prebuilt
COPY --from=host-binaries lh-gateway lh-scheduler lh-node-agent lh-pricing lh-spot-broker lh-audit lh lh-nats-auth /out/

# COPY --from takes no build argument; FROM does, so this stage picks one.
# Its one step makes it an image of its own: buildah 1.28 (podman 4.3),
# building without its layer cache, otherwise removes the stage it names
# twice and fails after tagging the image.
FROM ${BINARIES} AS binaries
WORKDIR /out

FROM ${RUNTIME_BASE} AS runtime
# curl: container health checks call /healthz and /readyz. A base that
# already has it and the CA certificates (the local Debian base) skips apt.
RUN if ! command -v curl >/dev/null || ! [ -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates curl \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --system --uid 10001 --home-dir /var/lib/leasehold --create-home \
         --shell /usr/sbin/nologin leasehold \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/leasehold/ssh
COPY --from=binaries /out/ /usr/local/bin/
# The simulated fleet, for node-agents run without real GPUs.
COPY dev/fleet.toml /etc/leasehold/fleet.toml

ARG BIN=lh-gateway
ENV LH_BIN=${BIN} \
    LH_LOG_FORMAT=json \
    LH_FLEET_FILE=/etc/leasehold/fleet.toml
USER 10001:10001
WORKDIR /var/lib/leasehold
# exec: the binary is PID 1 and receives SIGTERM for graceful shutdown.
ENTRYPOINT ["/bin/sh", "-c", "exec \"/usr/local/bin/$LH_BIN\" \"$@\"", "--"]
