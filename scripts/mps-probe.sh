#!/usr/bin/env bash
# What CUDA MPS enforces on this host, measured rather than read: starts an
# MPS control daemon with a default per-client memory limit and thread
# percentage, then runs CUDA clients (python3 + torch) that try to allocate
# past it: one with no limit of its own, one that asks for a higher limit
# in its environment, one that asks for a lower one, and one as another
# Linux user. Prints one line per allocation and the daemon's answers, then
# stops the daemon.
#
#   scripts/mps-probe.sh [BIN_DIR]     # BIN_DIR with nvml-check: a sample
#                                      # while a client holds memory
#   scripts/mps-probe.sh --design      # the checks ADR 016's design rests on
#                                      # (one daemon per GPU, limits lowered
#                                      # for a smaller share), then stops
#
# --design with MPS_PROBE_COMPUTE_MODE=1 also puts the GPU in
# EXCLUSIVE_PROCESS compute mode and back to DEFAULT at the end: run that
# only where the operator allows changing the GPU's settings.
#
# Needs root (a second user), nvidia-cuda-mps-control on PATH and torch.
set -uo pipefail
export NO_COLOR=1
DESIGN=
if [ "${1:-}" = "--design" ]; then DESIGN=1; shift; fi
BIN=${1:-}
W=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
chmod 0777 "$W" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
LIMIT_GIB=4

control() { echo "$*" | timeout 10 nvidia-cuda-mps-control; echo "  [$* -> exit $?]"; }
stop() { control quit; sleep 1; }
trap stop EXIT

# A client: allocate each size in GiB in turn, keep what succeeded.
client() {
    local label=$1; shift
    timeout 60 env "$@" python3 - "$label" <<'EOF'
import sys, time, torch
label = sys.argv[1]
held = []
for gib in (2, 3, 6, 12):
    try:
        held.append(torch.empty(gib << 30, dtype=torch.uint8, device="cuda"))
        print(f"{label}: +{gib} GiB ok (holding {sum(t.numel() for t in held) >> 30} GiB)", flush=True)
    except Exception as e:
        print(f"{label}: +{gib} GiB refused: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
import os
free, total = torch.cuda.mem_get_info()
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"{label}: mem_get_info free={free >> 20} MiB total={total >> 20} MiB, {sms} SMs", flush=True)
late = float(os.environ.get("LATE_S", "0"))
if late:
    time.sleep(late)
    try:
        held.append(torch.empty(3 << 30, dtype=torch.uint8, device="cuda"))
        print(f"{label}: {late:.0f} s later +3 GiB ok", flush=True)
    except Exception as e:
        print(f"{label}: {late:.0f} s later +3 GiB refused: {type(e).__name__}", flush=True)
time.sleep(float(os.environ.get("HOLD_S", "0")))
EOF
    echo "  [$label exit $?]"
}

if [ -n "$DESIGN" ]; then
    # As the agent runs it: the GPU alone visible to its daemon, a pipe
    # directory of its own, clients naming the GPU by UUID.
    UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
    export CUDA_VISIBLE_DEVICES=$UUID
    echo "===== design 1: a daemon for $UUID alone; a client naming it by UUID"
    timeout 10 nvidia-cuda-mps-control -d; echo "  [daemon start exit $?]"
    control set_default_device_pinned_mem_limit 0 8G
    control set_default_active_thread_percentage 50
    client by-uuid
    echo "===== design 3: lowering for a smaller share reaches later clients only"
    HOLD_S=25 LATE_S=14 client share-a-first &
    sleep 6
    server=$(echo get_server_list | timeout 10 nvidia-cuda-mps-control | head -1)
    echo "server $server"
    control set_default_device_pinned_mem_limit 0 4G
    control set_default_active_thread_percentage 25
    control set_device_pinned_mem_limit "$server" 0 4G
    control set_active_thread_percentage "$server" 25
    control get_client_list "$server"
    client share-b          # expect: 4 GiB at most, about a quarter of the SMs
    client share-a-second   # A's later process: 4 GiB too, not 8
    echo "===== design 4: past its limit a client gets an out-of-memory error"
    timeout 60 python3 -c '
import sys, torch
try:
    torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
    print("over-limit: 6 GiB ok (NOT enforced)", flush=True)
except torch.cuda.OutOfMemoryError as e:
    print("over-limit: OutOfMemoryError", flush=True); sys.exit(3)'
    echo "  [over-limit exit $? (3: refused)]"
    wait
    echo "===== design 5: control commands from another user through the same pipe directory"
    for cmd in "set_default_device_pinned_mem_limit 0 64G" "set_default_active_thread_percentage 100" "get_server_list"; do
        echo "$cmd" | timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \
            env CUDA_MPS_PIPE_DIRECTORY="$CUDA_MPS_PIPE_DIRECTORY" nvidia-cuda-mps-control
        echo "  [nobody: $cmd -> exit $?]"
    done
    control get_default_device_pinned_mem_limit 0
    if [ "${MPS_PROBE_COMPUTE_MODE:-}" = 1 ]; then
        echo "===== design 2: EXCLUSIVE_PROCESS: a process without the pipe directory gets no context"
        control quit
        nvidia-smi -i "$UUID" -c EXCLUSIVE_PROCESS; echo "  [exclusive exit $?]"
        trap 'stop; nvidia-smi -i "$UUID" -c DEFAULT' EXIT
        timeout 10 nvidia-cuda-mps-control -d; echo "  [daemon start exit $?]"
        control set_default_device_pinned_mem_limit 0 4G
        control start_server -uid "$(id -u)"   # as the agent does, before any client
        sleep 2
        control get_server_list
        no_mps() {
            timeout 30 env -u CUDA_MPS_PIPE_DIRECTORY python3 -c '
import torch
torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print("no-mps: 1 GiB ok (the GPU was NOT exclusive to MPS)", flush=True)'
            echo "  [no-mps $1 exit $? (non-zero: no context, as designed)]"
        }
        no_mps "before any client"
        HOLD_S=15 client mps-one &
        HOLD_S=15 client mps-two &   # both at once
        sleep 6
        no_mps "beside two clients"
        echo "===== design 6: quit with clients connected"
        control quit
        wait
    fi
    echo "===== daemon log (last 20 lines)"
    tail -20 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null
    exit 0
fi

echo "===== MPS daemon, default limit ${LIMIT_GIB}G per client, 25 % threads"
timeout 10 nvidia-cuda-mps-control -d; echo "  [daemon start exit $?]"
control set_default_device_pinned_mem_limit 0 ${LIMIT_GIB}G
control set_default_active_thread_percentage 25
control get_default_device_pinned_mem_limit 0
control get_default_active_thread_percentage

echo "===== client with no limit of its own"
client plain
control get_server_list
echo "===== client asking for more in its environment (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G)"
client asks-more CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G
echo "===== client asking for less (0=1G)"
client asks-less CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G
echo "===== client asking for 100 % of threads (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100)"
timeout 60 env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 python3 -c '
import torch
p = torch.cuda.get_device_properties(0)
print("threads-100: multiprocessors visible:", p.multi_processor_count, flush=True)'
timeout 60 python3 -c '
import torch
p = torch.cuda.get_device_properties(0)
print("threads-default: multiprocessors visible:", p.multi_processor_count, flush=True)'

if [ -n "$BIN" ]; then
    echo "===== NVML sample while an MPS client holds memory"
    HOLD_S=8 client holder &
    sleep 7
    "$BIN/nvml-check" --seconds 0 | grep -A30 '"sample"' | head -30
    wait
fi

echo "===== limits the daemon sets on the running server between two clients"
LATE_S=12 client first &
sleep 6
server=$(echo get_server_list | timeout 10 nvidia-cuda-mps-control | head -1)
echo "server $server"
control set_device_pinned_mem_limit "$server" 0 8G
control set_active_thread_percentage "$server" 50
control get_device_pinned_mem_limit "$server" 0
client second
wait

echo "===== a client as another Linux user (nobody) while root's server runs"
HOLD_S=15 client root-holder &
sleep 4
timeout 20 setpriv --reuid=65534 --regid=65534 --clear-groups env CUDA_MPS_PIPE_DIRECTORY="$CUDA_MPS_PIPE_DIRECTORY" HOME=/tmp python3 -c '
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print("nobody: 1 GiB ok", flush=True)'
echo "  [nobody exit $? (124: timed out waiting)]"
wait
control get_server_list
echo "===== daemon log (last 20 lines)"
tail -20 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null
