#!/usr/bin/env bash
# CPU A/B of the tidy (issue 44) and this stop against main before the tidy (83016e5): decision-bench with A = the checkout in $BASE (main before
# the change, built with `make install`), B = this checkout, both at their defaults (float32, --matmul auto),
# Qwen3-0.6B-shaped random weights, 8 questions over 512-token states at concurrency 1 and 16. Run from the
# repository root; OUT (default bench/results/2026-12-07-tidy) gets one JSON per row; LABEL names B in them.
set -euo pipefail
BASE=${BASE:?the checkout of the code before, with its own .venv}
O=${OUT:-bench/results/2026-12-07-tidy}
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
W=$(mktemp -d)
serve() {  # serve CHECKOUT PORT NAME: one at a time, so --matmul auto's probe runs on a quiet machine
  (cd "$1" && setsid .venv/bin/decision-launcher --model-id "$Q" --port "$2" --hostname 127.0.0.1 --uds-path "$W/$3" \
    --request-timeout-secs 1800 > "$W/$3.log" 2>&1 &)
  for _ in $(seq 200); do curl -sf "127.0.0.1:$2/health" >/dev/null && return; sleep 3; done
  echo "$3 did not come up"; exit 1
}
trap 'pkill -f "port 3942[12]" || true' EXIT
serve "$BASE" 39421 before
serve . 39422 after
for p in 39421 39422; do curl -s "127.0.0.1:$p/info" | python3 -c 'import json,sys; i=json.load(sys.stdin); print(sys.argv[1], i["dtype"], i["matmul"])' "$p"; done
row() {  # row NAME ARGS...
  .venv/bin/decision-bench --url http://127.0.0.1:39421 --url-b http://127.0.0.1:39422 --tokenizer "$Q" --options 4 \
    --label "A=before ($(git -C "$BASE" rev-parse --short HEAD)) B=${LABEL:-one-pass batches} ($(git rev-parse --short HEAD))" \
    --duration 1800 --timeout 1800 --json "$O/$1.json" "${@:2}" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$1.json" | sed -n 3p
}
[[ -n ${ONLY_LAST:-} ]] || row 8x512-c1 --seed 16101 --state-tokens 512 --questions 8 --requests 6 --rounds 3 --warmup 1 --pause 3
[[ -n ${ONLY_LAST:-} ]] || row 8x512-c16 --seed 16102 --state-tokens 512 --questions 8 --concurrency 16 --requests 32 --rounds 2 --warmup 16 --pause 3
# C 16 again with more rounds: two rounds swung 1.04 / 0.95 on their own.
row 8x512-c16-r6 --seed 16103 --state-tokens 512 --questions 8 --concurrency 16 --requests 96 --rounds 6 --warmup 16 --pause 3
