#!/usr/bin/env bash
# Exercises the node-agent's NVML backend on a real NVIDIA GPU: prints the
# inventory (JSON), one sample, then every XID / double-bit ECC / lost-GPU
# event for SECONDS seconds (default 5), one JSON line each.
#
#   scripts/nvml-check.sh [SECONDS]
#
# Without the NVIDIA driver it prints one line saying so and exits 2.
# Extra arguments go to the example, e.g. `--backend sim` to run the same
# path on the simulated node-a of dev/fleet.toml.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECONDS_TO_LISTEN=${1:-5}
shift || true

case "$SECONDS_TO_LISTEN" in
    '' | *[!0-9]*) echo "nvml-check: SECONDS must be a whole number, got '$SECONDS_TO_LISTEN'" >&2; exit 64 ;;
esac

cargo build --quiet -p lh-node-agent --example nvml-check
exec cargo run --quiet -p lh-node-agent --example nvml-check -- --seconds "$SECONDS_TO_LISTEN" "$@"
