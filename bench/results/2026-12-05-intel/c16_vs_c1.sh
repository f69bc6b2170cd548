#!/usr/bin/env bash
# Lab script (2026-12-05, Intel Xeon without AMX): our C 16 against our C 1 at defaults, the server alone on the
# machine, rounds taking turns (C 1, C 16, C 1, C 16, ...), each round its own seed so that no state is cached.
# Run from the repository root after `make install` and the Qwen3-0.6B-shaped fixture.
set -euo pipefail
O=${OUT:-bench/results/2026-12-05-intel/c16-vs-c1}
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
mkdir -p "$O" /tmp/c16-vs-c1
setsid .venv/bin/decision-launcher --model-id "$Q" --port 39203 --hostname 127.0.0.1 --uds-path /tmp/c16-vs-c1/ours \
  --request-timeout-secs 1800 > /tmp/c16-vs-c1/ours.log 2>&1 &
trap 'pkill -f "port 39203" || true' EXIT
for _ in $(seq 100); do curl -sf 127.0.0.1:39203/health >/dev/null && break; sleep 3; done
bench() {  # bench NAME ARGS...
  .venv/bin/decision-bench --url http://127.0.0.1:39203 --tokenizer "$Q" --options 4 --duration 1800 --timeout 1800 \
    --state-tokens 512 --questions 8 --rounds 1 --pause 3 --json "$O/$1.json" "${@:2}" 2>&1 | grep -o 'ok in .*'
}
bench warm --seed 15000 --requests 2 --warmup 1
for round in ${ROUNDS:-1 2 3}; do
  echo "round $round C1  $(bench c1-$round --seed $((15100 + round)) --requests 8 --warmup 0)"
  echo "round $round C16 $(bench c16-$round --seed $((15200 + round)) --requests 32 --concurrency 16 --warmup 0)"
done
