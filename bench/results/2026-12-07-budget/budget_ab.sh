#!/usr/bin/env bash
# The CPU batch budget (issue 42 item 2: "on CPU what is measured best there"): decision-bench A/B in one run, A = the
# CPU default (--max-batch-prefill-tokens 8192), B = another budget, same checkout, Qwen3-0.6B-shaped random
# weights, float32 defaults, 8 questions over 512-token states at concurrency 16 (closed loop, alternating rounds).
# Run from the repository root on a quiet machine: BUDGETS="2048 32768" bash bench/results/2026-12-07-budget/budget_ab.sh
set -euo pipefail
O=${OUT:-bench/results/2026-12-07-budget}
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
W=$(mktemp -d)
serve() {  # serve PORT NAME BUDGET
  (setsid .venv/bin/decision-launcher --model-id "$Q" --port "$1" --hostname 127.0.0.1 --uds-path "$W/$2" \
    --max-batch-prefill-tokens "$3" --request-timeout-secs 1800 > "$W/$2.log" 2>&1 &)
  for _ in $(seq 200); do curl -sf "127.0.0.1:$1/ready" >/dev/null && return; sleep 3; done
  echo "$2 did not come up"; tail -5 "$W/$2.log"; exit 1
}
stop() { pkill -f "port 3943[12]" || true; sleep 3; }
trap stop EXIT
for B in ${BUDGETS:-2048 32768}; do
  serve 39431 a8192 8192
  serve 39432 "b$B" "$B"
  .venv/bin/decision-bench --url http://127.0.0.1:39431 --url-b http://127.0.0.1:39432 --tokenizer "$Q" --options 4 \
    --label "A=--max-batch-prefill-tokens 8192 B=$B ($(git rev-parse --short HEAD))" --seed 4201 --state-tokens 512 \
    --questions 8 --concurrency "${C:-16}" --requests "${REQUESTS:-64}" --rounds "${ROUNDS:-4}" --warmup 16 --pause 3 \
    --duration 1800 --timeout 1800 --json "$O/8x512-c${C:-16}-8192-vs-$B.json" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/8x512-c${C:-16}-8192-vs-$B.json" | sed -n 3p
  stop
done
