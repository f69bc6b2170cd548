#!/usr/bin/env bash
# Issue 45's cost bound: `--debias rotate` (K = 4 rotations of each 4-option choice) against plain reads, over a
# 512-token state, in interleaved A/B rounds of decision-bench on the same seeded requests (A plain, B rotate).
# Starts two launchers on the embedded SmolLM2 (float32), runs the rounds, stops them. The report's
# `ratios.median_round_questions_per_s` is B/A: questions answered per second with rotate over plain.
# Usage: bench/scripts/debias-cost.sh OUT_DIR   (ROUNDS (default 10), REQUESTS (40), QUESTIONS (8), CONCURRENCY (1))
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR}
MODELS=${MODELS:-$HOME/.cache/decision-inference/models}
MODEL=${MODEL:-$MODELS/SmolLM2-135M-Instruct}
BIN=${BIN:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin}
PORT_A=${PORT_A:-39411}
PORT_B=${PORT_B:-39412}
ROUNDS=${ROUNDS:-10}
REQUESTS=${REQUESTS:-40}
QUESTIONS=${QUESTIONS:-8}
CONCURRENCY=${CONCURRENCY:-1}
mkdir -p "$OUT"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
start() { # PORT NAME EXTRA...
  local port=$1 name=$2; shift 2
  "$BIN/decision-launcher" --model-id "$MODEL" --dtype float32 --hostname 127.0.0.1 --port "$port" \
    --uds-path "/tmp/debias-bench-$name-$$.sock" "$@" > "$OUT/$name.server.log" 2>&1 &
  pids+=($!)
}
start "$PORT_A" plain
start "$PORT_B" rotate --debias rotate
for port in "$PORT_A" "$PORT_B"; do
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
done
"$BIN/decision-bench" --url "http://127.0.0.1:$PORT_A" --url-b "http://127.0.0.1:$PORT_B" --tokenizer "$MODEL" \
  --state-tokens 512 --questions "$QUESTIONS" --mix choice --options 4 --concurrency "$CONCURRENCY" \
  --rounds "$ROUNDS" --requests "$REQUESTS" --duration 600 --warmup 2 \
  --label "A plain, B --debias rotate (K=4): SmolLM2-135M float32, $QUESTIONS 4-option choices x 512-token state, concurrency $CONCURRENCY" \
  --json "$OUT/debias-cost.json" > /dev/null
python3 - "$OUT/debias-cost.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
servers = report["servers"]
print(json.dumps({"ratios_b_over_a": report.get("ratios_b_over_a"),
                  "a_median_round_questions_per_s": servers["A"]["median_of_rounds"]["questions_per_s"],
                  "b_median_round_questions_per_s": servers["B"]["median_of_rounds"]["questions_per_s"],
                  "tokens": {k: servers[k].get("tokens") for k in ("A", "B")}}, indent=1))
PY
