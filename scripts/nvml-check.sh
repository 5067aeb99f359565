#!/usr/bin/env bash
# The one check to run on a GPU host, well under ten minutes, changing no GPU
# setting (no MIG mode switch, no reset, no clock or compute-mode change):
#
#   1. inventory, samples and the event loop of the node-agent's NVML
#      backend (the nvml-check example);
#   2. MIG: one instance of the smallest profile created and destroyed, only
#      on a GPU that is already in MIG mode (SKIP otherwise);
#   3. MPS: two clients, one under a daemon limited to 2 GiB, then one under
#      a daemon limited to 6 GiB, each allocating 3 GiB: the first must be
#      refused, the second must get it. The daemon runs as the agent runs it
#      (ADR 016): its own pipe directory, the GPU named by UUID, its limit
#      set through the control pipe before the client starts. Limits only go
#      down while a daemon runs, so each client gets a daemon of its own.
#      The client is python3 with PyTorch, else CuPy (SKIP without either).
#
#   scripts/nvml-check.sh [SECONDS] [--bin-dir DIR] [--backend sim]
#                         [--fleet-file F] [--node-id N]
#
# SECONDS (default 5, at most 120) is how long the event loop listens.
# --bin-dir DIR (or BIN_DIR=DIR) runs DIR/nvml-check, built elsewhere: a GPU
# host needs no Rust toolchain. Without it the example is built with cargo.
# --backend sim plays a node of the fleet file instead of NVML: steps 1 run,
# MIG and MPS are skipped. Other options go to the example.
#
# Prints one PASS, FAIL or SKIP line per check and a summary. Exit status: 0
# when every check that ran passed, 1 when one failed, 2 (with one line
# saying so) when there is no NVIDIA driver here and no --backend sim, 64 on
# bad usage.
set -uo pipefail
export NO_COLOR=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Bounds, in seconds, of each step; the sum stays well under ten minutes.
MAX_LISTEN_SECS=120
SAMPLES=3
INVENTORY_SLACK_SECS=60
MIG_CHECK_SECS=120
MPS_CONTROL_SECS=10
MPS_CLIENT_SECS=60
CUDA_PROBE_SECS=30
MPS_SETTLE_SECS=2
BUILD_SECS=900
# What the MPS check asks: a client may allocate this much ...
MPS_ALLOC_GIB=3
# ... under the first daemon's limit (must be refused) and the second's (must fit).
MPS_SMALL_LIMIT_GIB=2
MPS_LARGE_LIMIT_GIB=6

usage() { echo "usage: scripts/nvml-check.sh [SECONDS] [--bin-dir DIR] [--backend nvml|sim] [--fleet-file F] [--node-id N]" >&2; exit 64; }

listen_secs=5
bin_dir=${BIN_DIR:-}
backend=nvml
example_args=()
if [ $# -gt 0 ] && [[ $1 != -* ]]; then listen_secs=$1; shift; fi
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) [ $# -ge 2 ] || usage; bin_dir=$2; shift 2 ;;
        --backend) [ $# -ge 2 ] || usage; backend=$2; example_args+=(--backend "$2"); shift 2 ;;
        --seconds) [ $# -ge 2 ] || usage; listen_secs=$2; shift 2 ;;
        -h | --help) usage ;;
        *) example_args+=("$1"); shift ;;
    esac
done
case "$listen_secs" in
    '' | *[!0-9]*) echo "nvml-check: SECONDS must be a whole number, got '$listen_secs'" >&2; exit 64 ;;
esac
if [ "$listen_secs" -gt "$MAX_LISTEN_SECS" ]; then
    echo "nvml-check: SECONDS must be at most $MAX_LISTEN_SECS, got $listen_secs" >&2; exit 64
fi
case "$backend" in nvml | sim) ;; *) echo "nvml-check: --backend must be nvml or sim, got '$backend'" >&2; exit 64 ;; esac

if [ -n "$bin_dir" ]; then
    bin_dir=$(cd "$bin_dir" 2>/dev/null && pwd) || { echo "nvml-check: no directory $bin_dir" >&2; exit 64; }
fi
# The example's default fleet file, and any relative one, is the tree's.
cd "$ROOT" || exit 64
if [ -n "$bin_dir" ]; then
    example="$bin_dir/nvml-check"
    [ -x "$example" ] || { echo "nvml-check: no executable nvml-check in $bin_dir" >&2; exit 64; }
    # An older build would fail on the new options with clap's exit 2,
    # which reads as "no GPU here".
    if ! timeout 10 "$example" --help 2>/dev/null | grep -q -- --mig-check; then
        echo "nvml-check: $example has no --mig-check: rebuild it from this tree" >&2; exit 64
    fi
else
    timeout "$BUILD_SECS" cargo build --quiet -p lh-node-agent --example nvml-check || exit 1
    example="${CARGO_TARGET_DIR:-$ROOT/target}/debug/examples/nvml-check"
fi

WORK=$(mktemp -d)
# Pipe directories of MPS daemons started and not yet quit.
mps_daemons=()
cleanup() {
    for pipe in "${mps_daemons[@]}"; do
        # An empty one would reach the host's own daemon in /tmp/nvidia-mps.
        [ -n "$pipe" ] || continue
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout "$MPS_CONTROL_SECS" nvidia-cuda-mps-control >/dev/null 2>&1
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

passed=0 failed=0 skipped=0
result() { # RESULT CHECK DETAIL
    printf '%-4s %-10s %s\n' "$1" "$2" "$3"
    case "$1" in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; esac
}
detail() { printf '       %s\n' "$*"; }

# ---- 1. inventory, samples, events
out=$WORK/nvml-check.out
timeout $((listen_secs + SAMPLES + INVENTORY_SLACK_SECS)) \
    "$example" --seconds "$listen_secs" --samples "$SAMPLES" "${example_args[@]}" >"$out" 2>"$WORK/nvml-check.err"
rc=$?
if [ "$rc" = 2 ] && [ "$backend" = sim ]; then
    echo "nvml-check: the simulated node did not start: $(head -1 "$WORK/nvml-check.err")" >&2
    exit 2
elif [ "$rc" = 2 ]; then
    echo "nvml-check: no NVIDIA GPU here: $(head -1 "$WORK/nvml-check.err"); --backend sim runs the same steps on a simulated node" >&2
    exit 2
fi
echo "=== ${backend} backend: $(head -1 "$out")"
gpus=$(grep -c '"vram_mib"' "$out")
first_uuid=$(grep -m1 -o '"uuid": "GPU-[^"]*"' "$out" | cut -d'"' -f4)
first_model=$(grep -m1 '"model"' "$out" | cut -d'"' -f4)
first_mig=$(grep -m1 -o '"mig_enabled": [a-z]*' "$out" | awk '{print $2}')
if [ "$gpus" -ge 1 ] && [ -n "$first_uuid" ]; then
    result PASS inventory "$gpus GPU(s); GPU 0: $first_model $first_uuid, MIG mode ${first_mig:-?}"
else
    result FAIL inventory "no GPU listed (exit $rc): $(tail -1 "$WORK/nvml-check.err")"
fi
samples=$(grep -c '"sample": \[' "$out")
readings=$(grep -c '"temperature_c"' "$out")
if [ "$samples" = "$SAMPLES" ] && [ "$readings" -ge "$SAMPLES" ]; then
    # GPU 0 in the last sample: from its last `"sample": [` to its first `}`.
    last=$(grep -n '"sample": \[' "$out" | tail -1 | cut -d: -f1)
    gpu0=$(tail -n +"$last" "$out" | sed '/}/q' | grep -E '"(utilization_pct|memory_used_mib|temperature_c|power_w)"' | tr -d ' ",' | paste -sd' ')
    result PASS samples "$samples samples a second apart, $readings GPU readings; GPU 0 last: $gpu0"
else
    result FAIL samples "$samples of $SAMPLES samples, $readings GPU readings (exit $rc)"
fi
done_line=$(grep -m1 '^{"done"' "$out")
if [ "$rc" = 0 ] && [ -n "$done_line" ]; then
    result PASS events "listened $listen_secs s: $done_line"
    grep '^{"event"' "$out" | head -20 | while read -r line; do detail "$line"; done
else
    result FAIL events "the event loop did not finish (exit $rc): $(tail -1 "$WORK/nvml-check.err")"
fi

# ---- 2. MIG instance create and destroy, on a GPU already in MIG mode
if [ "$backend" = sim ]; then
    result SKIP mig "simulated backend: the MIG check is for a real GPU"
else
    mig_out=$(timeout "$MIG_CHECK_SECS" "$example" --seconds 0 --mig-check 2>"$WORK/mig.err" | grep '^{"mig_check"')
    rc=$?
    mig_result=$(printf '%s' "$mig_out" | grep -o '"result":"[a-z]*"' | cut -d'"' -f4)
    mig_detail=$(printf '%s' "$mig_out" | grep -o '"detail":"[^"]*"' | cut -d'"' -f4)
    case "$mig_result" in
        pass) result PASS mig "$mig_detail" ;;
        skip) result SKIP mig "$mig_detail" ;;
        fail) result FAIL mig "$mig_detail" ;;
        *) result FAIL mig "no answer within $MIG_CHECK_SECS s (exit $rc): $(tail -1 "$WORK/mig.err")" ;;
    esac
fi

# ---- 3. MPS memory limits on two clients
# A CUDA client: reads what it may allocate, then allocates GiB; one line
# `runtime=… free_mib=… alloc=ok|refused …`. Exit 0 allocated, 3 refused,
# 4 no CUDA runtime, 1 anything else.
CUDA_CLIENT=$WORK/cuda_client.py
cat >"$CUDA_CLIENT" <<'EOF'
import sys
gib = int(sys.argv[1]) if len(sys.argv) > 1 else 0
def report(rt, free, total, alloc, why=""):
    print(f"runtime={rt} free_mib={free >> 20} total_mib={total >> 20} alloc={alloc} {why}".rstrip(), flush=True)
try:
    import torch
    if not torch.cuda.is_available():
        raise ImportError("torch without CUDA")
    if not gib:
        print("torch", torch.__version__); sys.exit(0)
    free, total = torch.cuda.mem_get_info()
    try:
        held = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        report("torch", free, total, "ok"); sys.exit(0)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
        if "out of memory" not in str(e).lower():
            raise
        report("torch", free, total, "refused", type(e).__name__); sys.exit(3)
except ImportError:
    pass
try:
    import cupy
    cupy.cuda.runtime.getDeviceCount()
    if not gib:
        print("cupy", cupy.__version__); sys.exit(0)
    free, total = cupy.cuda.runtime.memGetInfo()
    try:
        held = cupy.empty((gib << 30,), dtype=cupy.uint8)
        cupy.cuda.runtime.deviceSynchronize()
        report("cupy", free, total, "ok"); sys.exit(0)
    except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as e:
        if "memory" not in str(e).lower():
            raise
        report("cupy", free, total, "refused", type(e).__name__); sys.exit(3)
except ImportError:
    pass
except Exception as e:  # CuPy without a usable CUDA
    if not gib:
        sys.exit(4)
    raise
sys.exit(4)
EOF

control() { # PIPE_DIR COMMAND...
    local pipe=$1; shift
    echo "$*" | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout "$MPS_CONTROL_SECS" nvidia-cuda-mps-control
}

# One daemon limited to LIMIT_GIB, one client allocating MPS_ALLOC_GIB under
# it, the daemon quit. Sets client_rc and client_line.
mps_round() { # LIMIT_GIB
    local limit=$1 dir=$WORK/mps-$1g answer
    client_rc=1 client_line=""
    mkdir -p "$dir/pipe" "$dir/log"
    # Listed before it starts: one that starts but answers late is quit too.
    mps_daemons+=("$dir/pipe")
    if ! CUDA_VISIBLE_DEVICES=$first_uuid CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log \
        timeout "$MPS_CONTROL_SECS" nvidia-cuda-mps-control -d; then
        client_line="the daemon did not start: $(tail -3 "$dir/log/control.log" 2>/dev/null | tr '\n' ' ')"
        return
    fi
    if ! control "$dir/pipe" set_default_device_pinned_mem_limit 0 "${limit}G" >/dev/null; then
        client_line="set_default_device_pinned_mem_limit 0 ${limit}G was refused"
    else
        answer=$(control "$dir/pipe" get_default_device_pinned_mem_limit 0)
        detail "daemon limited to ${limit}G (it answers: ${answer:-nothing})"
        client_line=$(CUDA_VISIBLE_DEVICES=$first_uuid CUDA_MPS_PIPE_DIRECTORY=$dir/pipe \
            timeout "$MPS_CLIENT_SECS" python3 "$CUDA_CLIENT" "$MPS_ALLOC_GIB" 2>"$dir/client.err")
        client_rc=$?
        [ -n "$client_line" ] || client_line="no answer: $(tail -1 "$dir/client.err")"
    fi
    if control "$dir/pipe" quit >/dev/null; then
        local still=() p
        for p in "${mps_daemons[@]}"; do [ "$p" = "$dir/pipe" ] || still+=("$p"); done
        mps_daemons=("${still[@]}")
    fi
    sleep "$MPS_SETTLE_SECS"
}

free_mib() { printf '%s' "$1" | grep -o 'free_mib=[0-9]*' | cut -d= -f2; }

runtime=""
if [ "$backend" = sim ]; then
    result SKIP mps "simulated backend: the MPS check is for a real GPU"
elif ! command -v nvidia-cuda-mps-control >/dev/null; then
    result SKIP mps "nvidia-cuda-mps-control is not on PATH"
elif [ "$first_mig" = true ]; then
    result SKIP mps "GPU 0 is in MIG mode: this check runs MPS on a whole GPU"
elif ! command -v python3 >/dev/null || ! runtime=$(timeout "$CUDA_PROBE_SECS" python3 "$CUDA_CLIENT" 2>/dev/null); then
    result SKIP mps "no CUDA runtime for a client (python3 with PyTorch or CuPy)"
else
    detail "MPS clients: python3 with $runtime, on $first_uuid"
    mps_round "$MPS_SMALL_LIMIT_GIB"
    small_rc=$client_rc small_line=$client_line
    detail "${MPS_SMALL_LIMIT_GIB}G client, ${MPS_ALLOC_GIB} GiB: $small_line (exit $small_rc)"
    mps_round "$MPS_LARGE_LIMIT_GIB"
    large_rc=$client_rc large_line=$client_line
    detail "${MPS_LARGE_LIMIT_GIB}G client, ${MPS_ALLOC_GIB} GiB: $large_line (exit $large_rc)"
    # What the client could allocate proves the limit reached it: a client
    # outside MPS would see the whole GPU free.
    small_free=$(free_mib "$small_line") large_free=$(free_mib "$large_line")
    why=()
    [ "$small_rc" = 3 ] || why+=("the ${MPS_SMALL_LIMIT_GIB}G client was not refused")
    [ -n "$small_free" ] && [ "$small_free" -le $((MPS_SMALL_LIMIT_GIB * 1024)) ] ||
        why+=("the ${MPS_SMALL_LIMIT_GIB}G client saw ${small_free:-?} MiB free")
    [ "$large_rc" = 0 ] || why+=("the ${MPS_LARGE_LIMIT_GIB}G client did not get ${MPS_ALLOC_GIB} GiB")
    [ -n "$large_free" ] && [ "$large_free" -le $((MPS_LARGE_LIMIT_GIB * 1024)) ] ||
        why+=("the ${MPS_LARGE_LIMIT_GIB}G client saw ${large_free:-?} MiB free")
    if [ ${#why[@]} = 0 ]; then
        result PASS mps "${MPS_ALLOC_GIB} GiB refused under ${MPS_SMALL_LIMIT_GIB}G (${small_free} MiB free), allocated under ${MPS_LARGE_LIMIT_GIB}G (${large_free} MiB free)"
    else
        result FAIL mps "$(printf '%s; ' "${why[@]}" | sed 's/; $//')"
    fi
fi

echo "SUMMARY: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
