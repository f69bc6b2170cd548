#!/usr/bin/env bash
# A/B of the shard's Python at BASE_SERVER (A: its `server/` folder on PYTHONPATH, e.g. a worktree of main before
# the change with its generated pb/ copied in) against this checkout (B), same router and launcher, one server at a
# time coming up, then decision-bench in interleaved rounds. MODEL (default the tiny Qwen3 fixture), OUT gets one
# JSON per row. Run from the repository root.
set -euo pipefail
A=${BASE_SERVER:?the server/ folder of the code before}
O=${OUT:-bench/results/2026-12-07-gc}
Q=${MODEL:-$HOME/.cache/decision-inference/models/tiny-qwen3}
NAME=${NAME:-$(basename "$Q")}
W=$(mktemp -d)
serve() {  # serve PYTHONPATH PORT NAME
  (PYTHONPATH=$1 setsid .venv/bin/decision-launcher --model-id "$Q" --port "$2" --hostname 127.0.0.1 \
    --uds-path "$W/$3" --request-timeout-secs 1800 > "$W/$3.log" 2>&1 &)
  for _ in $(seq 200); do curl -sf "127.0.0.1:$2/health" >/dev/null && return; sleep 3; done
  echo "$3 did not come up"; cat "$W/$3.log"; exit 1
}
trap 'pkill -f "port 3943[12]" || true' EXIT
serve "$A" 39431 before
serve "" 39432 after
grep -ho "frozen_objects=[0-9]*" "$W"/*.log || echo "no frozen_objects in the logs"
row() {  # row NAME ARGS...
  .venv/bin/decision-bench --url http://127.0.0.1:39431 --url-b http://127.0.0.1:39432 --tokenizer "$Q" --options 4 \
    --label "A=shard at $A B=this checkout ($(git rev-parse --short HEAD))" \
    --duration 1800 --timeout 1800 --json "$O/$NAME-$1.json" "${@:2}" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$NAME-$1.json" | sed -n 3p
}
row 8x512-c32 --seed 20701 --state-tokens 512 --questions 8 --concurrency 32 --requests ${REQUESTS:-192} --rounds ${ROUNDS:-6} --warmup 32 --pause 2
[[ -n ${C1:-} ]] && row 8x512-c1 --seed 20702 --state-tokens 512 --questions 8 --requests ${C1_REQUESTS:-12} --rounds ${C1_ROUNDS:-6} --warmup 2 --pause 2
true
