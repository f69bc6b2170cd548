#!/usr/bin/env bash
# A/B of the launch/finish split (the shard only): A the shard code of BASE (a git worktree, default /tmp/wt-base, put first on
# PYTHONPATH), B this checkout; same launcher, router and model (the tiny Qwen3 fixture: host-bound as a GPU is), one
# launcher each, decision-bench in interleaved rounds. From the repository root; OUT gets one JSON per row.
#   git worktree add /tmp/wt-base f9dbbd3 && cp server/decision_server/pb/decision_pb2*.py /tmp/wt-base/server/decision_server/pb/
set -euo pipefail
O=${OUT:-bench/results/2026-12-07-launch}
BASE=${BASE:-/tmp/wt-base}
Q=${MODEL:-$HOME/.cache/decision-inference/models/tiny-qwen3}
NAME=${NAME:-$(basename "$Q")}
W=$(mktemp -d)
serve() {  # serve PORT NAME PYTHONPATH
  (PYTHONPATH=$3 setsid .venv/bin/decision-launcher --model-id "$Q" --port "$1" --hostname 127.0.0.1 \
    --uds-path "$W/$2" --request-timeout-secs 1800 --shard-log-level debug --json-output > "$W/$2.log" 2>&1 &)
  for _ in $(seq 200); do curl -sf "127.0.0.1:$1/health" >/dev/null && return; sleep 3; done
  echo "$2 did not come up"; cat "$W/$2.log"; exit 1
}
trap 'pkill -f "port 3944[12]" || true' EXIT
serve 39441 base "$BASE/server"
serve 39442 this ""
row() {  # row NAME ARGS...
  .venv/bin/decision-bench --url http://127.0.0.1:39441 --url-b http://127.0.0.1:39442 --tokenizer "$Q" --options 4 \
    --label "A=$(git -C "$BASE" rev-parse --short HEAD) B=$(git rev-parse --short HEAD)" \
    --duration 1800 --timeout 1800 --json "$O/$NAME-$1.json" "${@:2}" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$NAME-$1.json" | sed -n 3p
}
row 8x512-c32 --seed 20731 --state-tokens 512 --questions 8 --concurrency 32 --requests ${REQUESTS:-192} --rounds ${ROUNDS:-6} --warmup 32 --pause 2
row 8x512-c16 --seed 20732 --state-tokens 512 --questions 8 --concurrency 16 --requests ${REQUESTS:-192} --rounds ${ROUNDS:-6} --warmup 16 --pause 2
row 8x512-c1 --seed 20733 --state-tokens 512 --questions 8 --requests ${C1_REQUESTS:-36} --rounds ${C1_ROUNDS:-6} --warmup 2 --pause 2
for n in base this; do grep '"read batch' "$W/$n.log" > "$O/$NAME-$n.batches.jsonl" || true; done
