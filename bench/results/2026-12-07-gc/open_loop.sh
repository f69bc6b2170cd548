#!/usr/bin/env bash
# Open-loop tail A/B: 1 question over distinct 300-token states arriving at RATE per second (Poisson), A = the
# shard's code at BASE_SERVER through PYTHONPATH, B = this checkout; same router and launcher. Run from the root.
set -euo pipefail
A=${BASE_SERVER:?the server/ folder of the code before}
O=${OUT:-bench/results/2026-12-07-gc}
Q=${MODEL:-$HOME/.cache/decision-inference/models/tiny-qwen3}
W=$(mktemp -d)
serve() {  # serve PYTHONPATH PORT NAME
  (PYTHONPATH=$1 setsid .venv/bin/decision-launcher --model-id "$Q" --port "$2" --hostname 127.0.0.1 \
    --uds-path "$W/$3" --request-timeout-secs 1800 > "$W/$3.log" 2>&1 &)
  for _ in $(seq 200); do curl -sf "127.0.0.1:$2/health" >/dev/null && return; sleep 3; done
  echo "$3 did not come up"; exit 1
}
trap 'pkill -f "port 3946[12]" || true' EXIT
serve "$A" 39461 before
serve "" 39462 after
# --rate runs one server at a time: A and B alternate, ROUNDS times each, on the same seeded arrivals.
for round in $(seq "${ROUNDS:-3}"); do
  for side in A:39461 B:39462; do
    json="$O/open-loop-1x300-r${RATE:-150}-${side%%:*}$round.json"
    .venv/bin/decision-bench --url "http://127.0.0.1:${side##*:}" --tokenizer "$Q" --options 4 --seed 20703 \
      --label "${side%%:*} (A = shard at $A, B = $(git rev-parse --short HEAD)) round $round" --state-tokens 300 \
      --questions 1 --rate "${RATE:-150}" --duration "${DURATION:-30}" --warmup 20 --pause 2 --timeout 600 \
      --json "$json" > /dev/null 2>&1
    python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["servers"]["A"]; l = s["latency_ms"]
print(sys.argv[2], "ok", s["requests_ok"], "of", s["requests_total"], "p50", l["p50"], "p99", l["p99"], "max", l["max"], "q/s", round(s["questions_per_s"], 1))' "$json" "${side%%:*}$round"
  done
done
