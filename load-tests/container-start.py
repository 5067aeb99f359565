#!/usr/bin/env python3
"""Request to running: real containers beside leases that run nothing.

    load-tests/container-start.py [LEASES] [CONCURRENCY]    (200, 4)

Against `make up` with podman (its banner says `workloads: podman`): makes a
tenant, then LEASES leases of one A100-40GB whose workload is a container of
localhost/leasehold/base, and LEASES leases without a workload (nothing
runs: the simulated runtime's path), interleaved, CONCURRENCY at a time.

Three times per lease, all from clocks of this machine:
  created   the gateway's `created_at` (the request was accepted)
  running   the agent's `started_at` (the engine runs the container; the
            lease is `running`, and billed, from then)
  executing the container's first command: it prints /proc/uptime, which a
            container shares with the host, turned into wall time here

Prints p50, p99 and max of created->running for both kinds, and of
created->executing for the containers. Each container lease runs
`sleep 1` after printing and ends on its own; each empty lease is stopped
once running. Env: LH_GATEWAY_URL (http://127.0.0.1:8080), LH_ADMIN_TOKEN
(or .data/admin-token).
"""

import concurrent.futures
import datetime
import json
import os
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GATEWAY = os.environ.get("LH_GATEWAY_URL", "http://127.0.0.1:8080").rstrip("/")
PATIENCE_S = 120


def admin_token():
    token = os.environ.get("LH_ADMIN_TOKEN")
    if token:
        return token
    with open(os.path.join(ROOT, ".data", "admin-token")) as f:
        return f.read().strip()


def call(method, path, key, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(GATEWAY + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for attempt in range(50):
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            # Full for a moment (another lease still ending): try again.
            if e.code in (409, 429, 503) and attempt < 49:
                time.sleep(0.2)
                continue
            raise RuntimeError(f"{method} {path}: {e.code} {e.read()[:300]!r}") from e


def ts(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def uptime():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


# Wall time = BASE_WALL + (uptime - BASE_UPTIME).
BASE_WALL, BASE_UPTIME = time.time(), uptime()


def one(key, container):
    body = {"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic"}
    if container:
        body["workload"] = {
            "image": "localhost/leasehold/base",
            "command": ["sh", "-c", "cat /proc/uptime; sleep 1"],
        }
    lease = call("POST", "/v1/leases", key, body)
    lid = lease["id"]
    deadline = time.time() + PATIENCE_S
    while True:
        view = call("GET", f"/v1/leases/{lid}", key)
        if view.get("started_at"):
            break
        if view["state"] in ("ended", "rejected") or time.time() > deadline:
            raise RuntimeError(f"lease {lid} never ran: {view['state']}")
        time.sleep(0.05)
    created, running = ts(view["created_at"]), ts(view["started_at"])
    executing = None
    if container:
        while executing is None:
            logs = call("GET", f"/v1/leases/{lid}/logs", key)
            line = (logs or {}).get("data", "").strip().splitlines()
            if line:
                executing = BASE_WALL + (float(line[0].split()[0]) - BASE_UPTIME)
            elif time.time() > deadline:
                raise RuntimeError(f"lease {lid}: no output")
            else:
                time.sleep(0.05)
        while call("GET", f"/v1/leases/{lid}", key)["state"] != "ended":
            time.sleep(0.2)
    else:
        call("POST", f"/v1/leases/{lid}/stop", key, {})
        while call("GET", f"/v1/leases/{lid}", key)["state"] != "ended":
            time.sleep(0.2)
    return container, running - created, None if executing is None else executing - created


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    leases = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    admin = admin_token()
    tenant = call("POST", "/v1/tenants", admin,
                  {"name": f"bench-{int(time.time())}", "email": "bench@example.com",
                   "quota": {"max_gpus": 64}})
    key = tenant["api_key"]
    kinds = [i % 2 == 0 for i in range(2 * leases)]
    started = time.time()
    results = []
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for done, result in enumerate(pool.map(lambda c: one(key, c), kinds), 1):
            results.append(result)
            if done % 50 == 0:
                print(f"container-start: {done}/{len(kinds)} leases", file=sys.stderr)
    took = time.time() - started
    ms = lambda s: f"{s * 1000:.0f}"
    for container, label in ((True, "container"), (False, "nothing runs")):
        run = [r[1] for r in results if r[0] == container]
        print(f"{label:>12}: created->running  p50 {ms(pct(run, 50))} ms  p99 {ms(pct(run, 99))} ms"
              f"  max {ms(max(run))} ms  (n={len(run)})")
    execs = [r[2] for r in results if r[0]]
    print(f"{'container':>12}: created->executing p50 {ms(pct(execs, 50))} ms  p99 {ms(pct(execs, 99))} ms"
          f"  max {ms(max(execs))} ms")
    print(f"container-start: {len(results)} leases in {took:.1f} s, concurrency {concurrency}")


if __name__ == "__main__":
    main()
