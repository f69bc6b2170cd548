#!/usr/bin/env bash
# Clef cells: questions/s at 16 questions over a 512-token state, and the head's share of the shard's forward time
# (`metrics.head_share_of_forward`, from decision_shard_head_seconds / decision_shard_forward_seconds).
# Starts our launcher on each fixture (float32, --threads 2), runs decision-bench, stops it.
# Usage: bench/scripts/clef.sh OUT_DIR [FIXTURE...]   (default: tiny-clef-flash tiny-clef-omni)
# CONCURRENCY (default 1), REQUESTS (20) and WARMUP (2) set decision-bench's load.
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR [FIXTURE...]}; shift
FIXTURES=("${@:-tiny-clef-flash tiny-clef-omni}")
MODELS=${MODELS:-$HOME/.cache/decision-inference/models}
BIN=${BIN:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin}
PORT=${PORT:-39301}
CONCURRENCY=${CONCURRENCY:-1}
REQUESTS=${REQUESTS:-20}
WARMUP=${WARMUP:-2}
mkdir -p "$OUT"
for fixture in ${FIXTURES[@]}; do
  "$BIN/decision-launcher" --model-id "$MODELS/$fixture" --dtype float32 --threads 2 --hostname 127.0.0.1 \
    --port "$PORT" --uds-path "/tmp/clef-bench-$$.sock" > "$OUT/$fixture.server.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
  "$BIN/decision-bench" --url "http://127.0.0.1:$PORT" --tokenizer "$MODELS/$fixture" --state-tokens 512 \
    --questions 16 --options 4 --levels 5 --concurrency "$CONCURRENCY" --duration 120 \
    --requests "$REQUESTS" --warmup "$WARMUP" \
    --label "$fixture float32 threads=2 16 questions x 512-token state, concurrency $CONCURRENCY" \
    --json "$OUT/$fixture-512x16.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
