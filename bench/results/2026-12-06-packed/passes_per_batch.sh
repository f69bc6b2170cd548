#!/usr/bin/env bash
# Forward passes per batch at concurrency 32 on CPU, from the shard's own debug lines ("read batch": reads,
# forward_passes), so it reads the same on code before and after the counter existed. Usage, from a checkout after
# `make install` and `make fixtures`: bench/results/2026-12-06-packed/passes_per_batch.sh [PORT]
# Load: 32 closed-loop clients x 3 requests of 8 questions over distinct ~512-token states, tiny Qwen3, float32
# (the load of integration-tests/test_batching.py).
set -euo pipefail
PORT=${1:-39311}
W=$(mktemp -d)
M=$HOME/.cache/decision-inference/models/tiny-qwen3
setsid .venv/bin/decision-launcher --model-id "$M" --dtype float32 --hostname 127.0.0.1 --port "$PORT" \
  --uds-path "$W/s" --shard-log-level debug > "$W/log" 2>&1 &
trap 'pkill -f "port $PORT" || true; rm -rf "$W"' EXIT
for _ in $(seq 100); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 2; done
PYTHONPATH="$(cd "$(dirname "$0")/../../.." && pwd)/integration-tests" .venv/bin/python - "$PORT" <<'PY'
import random, sys, threading
import httpx2
from test_batching import CONCURRENCY, REQUESTS_EACH, request_body
url = f"http://127.0.0.1:{sys.argv[1]}"
def client(seed):
    rng = random.Random(seed)
    with httpx2.Client(timeout=600.0) as http:
        for _ in range(REQUESTS_EACH):
            assert http.post(f"{url}/v1/systemone", json=request_body(rng)).status_code == 200
threads = [threading.Thread(target=client, args=(s,)) for s in range(CONCURRENCY)]
[t.start() for t in threads]; [t.join() for t in threads]
PY
.venv/bin/python - "$W/log" <<'PY'
import re, sys
batches = []
for line in open(sys.argv[1], errors="replace"):
    if " read batch " in line:
        fields = dict(re.findall(r"(\w+)=([0-9.]+)", line))
        batches.append((int(fields["reads"]), int(fields["forward_passes"])))
reads = sum(r for r, _ in batches); passes = sum(p for _, p in batches)
print(f"batches={len(batches)} reads/batch={reads / len(batches):.1f} requests/batch={reads / 8 / len(batches):.2f} "
      f"passes={passes} passes/batch={passes / len(batches):.3f}")
PY
