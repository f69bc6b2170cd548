#!/usr/bin/env bash
# Lab script (README.md beside it); run from the repository root after `make install`.
# Ours alone, 8 questions over 512-token states, concurrency 1 then 16 (then 1 and 16 again), with the router's
# and shard's Prometheus counters read before and after each round: where a C 16 request's time goes
# (shard forward, queue wait, router) and the shard's own tokens per forward-second at each concurrency.
set -euo pipefail
O=${OUT:-bench/results/2026-12-02-c16}
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
mkdir -p /tmp/c16
setsid .venv/bin/decision-launcher --model-id "$Q" --port 39303 --hostname 127.0.0.1 --uds-path /tmp/c16/ours \
  --request-timeout-secs 1800 > /tmp/c16/ours.log 2>&1 &
trap 'pkill -f "port 39303" || true' EXIT
for _ in $(seq 200); do curl -sf 127.0.0.1:39303/health >/dev/null && break; sleep 3; done
round() {  # round NAME CONCURRENCY REQUESTS SEED
  curl -s 127.0.0.1:39303/metrics > "$O/$1.before.prom"
  .venv/bin/decision-bench --url http://127.0.0.1:39303 --tokenizer "$Q" --options 4 --state-tokens 512 --questions 8 \
    --concurrency "$2" --requests "$3" --rounds 1 --warmup 1 --seed "$4" --duration 3600 --timeout 1800 \
    --json "$O/$1.json" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$1.json" | sed -n 3p
  curl -s 127.0.0.1:39303/metrics > "$O/$1.after.prom"
  .venv/bin/python "$(dirname "$0")/metrics_delta.py" "$O/$1.before.prom" "$O/$1.after.prom" | sed "s/^/$1 /"
}
round c1-a 1 12 21001
round c16-a 16 32 21002
round c1-b 1 12 21003
round c16-b 16 32 21004
