#!/usr/bin/env bash
# A/B of the router's batches at the shard: A one call at a time (--max-batches-at-shard 1, the behaviour before),
# B two (--max-batches-at-shard 2, the GPU default), same build, one launcher each, decision-bench in interleaved rounds.
# MODEL (default the tiny Qwen3 fixture, host-bound as a GPU is), OUT gets one JSON per row. From the repository root.
set -euo pipefail
O=${OUT:-bench/results/2026-12-07-pipeline}
Q=${MODEL:-$HOME/.cache/decision-inference/models/tiny-qwen3}
NAME=${NAME:-$(basename "$Q")}
W=$(mktemp -d)
serve() {  # serve PORT NAME FLAGS...
  (setsid .venv/bin/decision-launcher --model-id "$Q" --port "$1" --hostname 127.0.0.1 \
    --uds-path "$W/$2" --request-timeout-secs 1800 --shard-log-level debug --json-output "${@:3}" > "$W/$2.log" 2>&1 &)
  for _ in $(seq 200); do curl -sf "127.0.0.1:$1/health" >/dev/null && return; sleep 3; done
  echo "$2 did not come up"; cat "$W/$2.log"; exit 1
}
trap 'pkill -f "port 3943[12]" || true' EXIT
serve 39431 one --max-batches-at-shard 1
serve 39432 two --max-batches-at-shard 2
curl -s 127.0.0.1:39432/info | grep -o '"max_batches_at_shard":[0-9]*'
row() {  # row NAME ARGS...
  .venv/bin/decision-bench --url http://127.0.0.1:39431 --url-b http://127.0.0.1:39432 --tokenizer "$Q" --options 4 \
    --label "A=--max-batches-at-shard 1 B=--max-batches-at-shard 2 ($(git rev-parse --short HEAD))" \
    --duration 1800 --timeout 1800 --json "$O/$NAME-$1.json" "${@:2}" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$NAME-$1.json" | sed -n 3p
}
row 8x512-c32 --seed 20711 --state-tokens 512 --questions 8 --concurrency 32 --requests ${REQUESTS:-192} --rounds ${ROUNDS:-6} --warmup 32 --pause 2
[[ -n ${C1:-} ]] && row 8x512-c1 --seed 20712 --state-tokens 512 --questions 8 --requests ${C1_REQUESTS:-24} --rounds ${C1_ROUNDS:-6} --warmup 2 --pause 2
# The model thread's idle time before each batch, from the shards' batch lines (gaps over 500 ms are the pauses
# between rounds and the other server's turn, not the router).
for n in one two; do
  grep '"read batch' "$W/$n.log" > "$O/$NAME-$n.batches.jsonl" || true
  .venv/bin/python bench/results/2026-12-07-pipeline/idle.py "$n" "$O/$NAME-$n.batches.jsonl"
done
