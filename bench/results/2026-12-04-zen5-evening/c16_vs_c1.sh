#!/usr/bin/env bash
# Our concurrency 16 against our concurrency 1 on one bfloat16 server (Qwen3-0.6B-shaped random weights, 8 q x 512),
# rows interleaved C1, C16, C1, C16 so machine drift hits both; after each row the shard's counters from /metrics:
# computed tokens, forward seconds, batches. Prints per row: q/s, computed tokens/s of wall time, the share of wall
# time the shard spent in forward passes, and tokens per forward second. (2026-12-04 evening, Zen 5.)
set -euo pipefail
O=${OUT:-bench/results/2026-12-04-zen5-evening}
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
W=/tmp/c16c1; mkdir -p "$W" "$O"
setsid .venv/bin/decision-launcher --model-id "$Q" --port 39204 --hostname 127.0.0.1 --uds-path "$W/ours" \
  --request-timeout-secs 1800 --dtype bfloat16 > "$W/ours.log" 2>&1 &
trap 'pkill -f "port 39204" || true' EXIT
for _ in $(seq 100); do curl -sf 127.0.0.1:39204/health >/dev/null && break; sleep 3; done
counters() {
  curl -s 127.0.0.1:39204/metrics | awk '
    /^decision_computed_tokens_total/ {t=$2} /^decision_shard_forward_seconds_sum/ {f=$2}
    /^decision_shard_forward_seconds_count/ {n=$2} END {print t+0, f+0, n+0}'
}
row() {  # row NAME SEED CONCURRENCY REQUESTS ROUNDS
  read -r t0 f0 n0 < <(counters); local start; start=$(date +%s.%N)
  .venv/bin/decision-bench --url http://127.0.0.1:39204 --tokenizer "$Q" --options 4 --seed "$2" --state-tokens 512 \
    --questions 8 --concurrency "$3" --requests "$4" --rounds "$5" --warmup 1 --pause 3 --duration 1800 --timeout 1800 \
    --json "$O/$1.json" > "$W/$1.out" 2>&1
  read -r t1 f1 n1 < <(counters)
  python3 - "$1" "$O/$1.json" "$t0" "$t1" "$f0" "$f1" "$n0" "$n1" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
t0, t1, f0, f1, n0, n1 = map(float, sys.argv[3:])
report = json.load(open(path))
a = report["servers"]["A"]
rounds = a["rounds"]
wall = sum(r["seconds"] for r in rounds)
qps = [r["questions_per_s"] for r in rounds]
# counters cover the warm-up request and the pauses too: rates per forward second are exact, per wall second not.
print(f"{name}: median round {sorted(qps)[len(qps)//2]:.2f} q/s (rounds {', '.join(f'{q:.2f}' for q in qps)}); "
      f"computed {t1 - t0:.0f} tokens in {f1 - f0:.1f} s of forward over {n1 - n0:.0f} batches: "
      f"{(t1 - t0) / (f1 - f0):.0f} tokens per forward second; rounds' wall {wall:.1f} s")
PY
}
grep -o 'dtype=[a-z0-9]* matmul=[a-z]* mkl_kernels=.* compiled_chains=[a-z]*' "$W/ours.log" | head -1 || true
row c1-a 17001 1 12 3
row c16-a 17002 16 48 2
row c1-b 17003 1 12 3
row c16-b 17004 16 48 2
