#!/usr/bin/env bash
# Meets a real NVIDIA host with prebuilt binaries, as one short run:
#   1. what the driver says (nvidia-smi), and whether MIG and MPS are there;
#   2. the nvml-check example, idle, then again while a CUDA load holds
#      memory and keeps the GPU busy (so the sample has something to show);
#   3. the node-agent on the NVML backend beside a scheduler and a
#      nats-server, with a short self-test whose load is a CUDA burn: the
#      events it appends are printed (subject and payload, cut to 600 bytes),
#      and its DCGM series.
#
#   scripts/gpu-host-check.sh BIN_DIR [AGENT_SECONDS]
#
# BIN_DIR holds nats-server, lh-scheduler, lh-node-agent and nvml-check
# (built elsewhere: the host needs no toolchain). The CUDA load is python3
# with torch; without it the load steps are skipped and said so. Off a GPU
# host, NODE_ID=node-a AGENT_EXTRA=--sim-fallback plays a simulated node.
# The short check with PASS/FAIL lines (MIG and MPS included) is
# scripts/nvml-check.sh --bin-dir BIN_DIR; this one is the longer look.
set -uo pipefail
export NO_COLOR=1

BIN=${1:?usage: gpu-host-check.sh BIN_DIR [AGENT_SECONDS]}
AGENT_SECONDS=${2:-25}
BIN=$(cd "$BIN" && pwd)
WORK=$(mktemp -d)
NATS_PORT=14222
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

step() { printf '\n===== %s =====\n' "$*"; }

step "driver"
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,mig.mode.current,compute_mode,persistence_mode,temperature.gpu,power.draw --format=csv
nvidia-smi mig -lgip 2>&1 | head -30
for t in nvidia-cuda-mps-control nvidia-cuda-mps-server; do
    printf '%s: %s\n' "$t" "$(command -v "$t" || echo missing)"
done
uname -r

# A CUDA load for N seconds: 16 GiB held and matrix products.
load() {
    python3 - "$1" <<'EOF'
import sys, time, torch
secs = float(sys.argv[1])
hold = torch.empty(16 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + secs
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
print("load done", flush=True)
EOF
}
has_torch=0
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && has_torch=1
echo "torch with CUDA: $has_torch"

step "nvml-check, idle, 3 s of events"
"$BIN/nvml-check" --seconds 3
echo "exit $?"

if [ "$has_torch" = 1 ]; then
    step "nvml-check under a CUDA load"
    load 12 & lp=$!
    sleep 6
    "$BIN/nvml-check" --seconds 1
    echo "exit $?"
    wait "$lp"
fi

step "node-agent on NVML, scheduler, nats-server for ${AGENT_SECONDS} s"
"$BIN/nats-server" -js -p "$NATS_PORT" -sd "$WORK/js" >"$WORK/nats.log" 2>&1 & pids+=($!)
sleep 1
python3 - "$NATS_PORT" "$AGENT_SECONDS" >"$WORK/tap.log" 2>&1 <<'EOF' & pids+=($!)
# A plain NATS subscriber: every message on the event and telemetry subjects.
import socket, sys, time
port, secs = int(sys.argv[1]), float(sys.argv[2]) + 5
s = socket.create_connection(("127.0.0.1", port)); f = s.makefile("rb")
f.readline()
s.sendall(b'CONNECT {"verbose":false,"headers":true}\r\nSUB lh.evt.> 1\r\nSUB lh.tel.> 2\r\nPING\r\n')
while not f.readline().startswith(b"PONG"):
    pass
print("tap: subscribed", flush=True)
# Blocking reads: heartbeats arrive every second, and the script kills this
# process at its end. (A socket timeout would leave the file unreadable.)
end = time.time() + secs
while time.time() < end:
    line = f.readline()
    if not line:
        break
    parts = line.split()
    if parts[:1] == [b"PING"]:
        s.sendall(b"PONG\r\n"); continue
    if parts[:1] in ([b"MSG"], [b"HMSG"]):
        total = int(parts[-1]); data = f.read(total + 2)[:total]
        body = data[int(parts[-2]):] if parts[0] == b"HMSG" else data
        print(parts[1].decode(), body[:600].decode(errors="replace"), flush=True)
EOF
for _ in $(seq 50); do grep -q "tap: subscribed" "$WORK/tap.log" && break; sleep 0.1; done
export LH_NATS_URL="nats://127.0.0.1:$NATS_PORT"
"$BIN/lh-scheduler" --http-addr 127.0.0.1:19102 >"$WORK/scheduler.log" 2>&1 & pids+=($!)
selftest=()
if [ "$has_torch" = 1 ]; then
    # python3 -c with the load's body: the agent runs the command with sh -c.
    selftest=(--self-test-every-secs 8 --self-test-secs 6
        --self-test-command "python3 -c 'import torch,time;a=torch.randn(8192,8192,device=\"cuda\");e=time.time()+5
while time.time()<e: a@a
torch.cuda.synchronize()'")
fi
# AGENT_EXTRA is split on purpose: it may hold several options.
# shellcheck disable=SC2086
"$BIN/lh-node-agent" --gpu-backend nvml --zone device-check --node-id "${NODE_ID:-gpu-host-1}" \
    --http-addr 127.0.0.1:19104 --runtime process "${selftest[@]}" ${AGENT_EXTRA:-} \
    >"$WORK/agent.log" 2>&1 & agent=$!; pids+=("$agent")
sleep "$AGENT_SECONDS"
echo "--- agent /readyz: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:19104/readyz)"
echo "--- agent DCGM series"
curl -s http://127.0.0.1:19104/metrics | grep '^DCGM' | head -20
kill -0 "$agent" 2>/dev/null && echo "agent still running" || echo "agent EXITED"
sleep 5
echo "--- events and telemetry seen on the bus (heartbeats: count only)"
grep -v '\.heartbeat' "$WORK/tap.log" | head -40
echo "heartbeats: $(grep -c '\.heartbeat' "$WORK/tap.log")"
echo "--- agent log (last 40 lines)"
tail -40 "$WORK/agent.log"
echo "--- scheduler log (last 15 lines)"
tail -15 "$WORK/scheduler.log"
