#!/usr/bin/env bash
# The gateway's read path against its own /healthz, side by side in one
# run (wrk, 32 connections): prints req/s, p99 and each read's ratio. With
# --post: POST /v1/leases against JetStream's own guarded append rate at
# the same concurrency, measured on the same nats-server in the same run,
# then checks every accepted lease is on the log and answers a GET.
#
#   load-tests/api-rate.sh [SECONDS] [--post] [--perf-dir DIR]   (default 10 s per route)
#
# It starts its own platform in one process (nats-server with
# sync_interval: always and PostgreSQL in temporary directories), so it
# needs no `make up` and never touches .data/. Needs wrk, which
# `make deps` installs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
command -v wrk >/dev/null || scripts/deps.sh
command -v wrk >/dev/null || { echo "api-rate: error: wrk is not installed; run make deps" >&2; exit 1; }
cargo build --release -q -p lh-load-tests --bin api-rate
exec "${CARGO_TARGET_DIR:-target}/release/api-rate" --duration-secs "${1:-10}" "${@:2}"
