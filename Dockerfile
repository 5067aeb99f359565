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

ARG RUST_VERSION=1.95

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

FROM debian:bookworm-slim AS runtime
# curl: container health checks call /healthz and /readyz.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/leasehold --create-home \
         --shell /usr/sbin/nologin leasehold
COPY --from=builder /out/ /usr/local/bin/
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
