#!/usr/bin/env bash
# The SmolLM2 tree-vs-naive cells of bench/results/JOURNAL.md, run against two servers that are already up:
#   A (naive) on $NAIVE_URL, B (tree) on $TREE_URL, both `--dtype float32 --threads 2` (see bench/results/JOURNAL.md).
# Usage: bench/scripts/smollm2-tree-vs-naive.sh OUT_DIR [CELL...]   (no CELL: all of them, about 35 minutes)
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR [CELL...]}; shift
NAIVE_URL=${NAIVE_URL:-http://127.0.0.1:39102}
TREE_URL=${TREE_URL:-http://127.0.0.1:39101}
MODEL=${MODEL:-$HOME/.cache/decision-inference/models/SmolLM2-135M-Instruct}
BENCH=${BENCH:-decision-bench}
mkdir -p "$OUT"

ab() {  # ab NAME ARGS...: naive as A, tree as B
  local name=$1; shift
  "$BENCH" --url "$NAIVE_URL" --url-b "$TREE_URL" --tokenizer "$MODEL" --options 4 \
    --label "A=naive B=tree SmolLM2-135M-Instruct float32 threads=2" --json "$OUT/$name.json" "$@" >/dev/null
}
tree_only() {
  local name=$1; shift
  "$BENCH" --url "$TREE_URL" --tokenizer "$MODEL" --options 4 \
    --label "tree only SmolLM2-135M-Instruct float32 threads=2" --json "$OUT/$name.json" "$@" >/dev/null
}

run() {
  case $1 in
    c1-64x1)    ab "$1" --state-tokens 64 --questions 1 --concurrency 1 --duration 50 --rounds 5 ;;
    c1-64x8)    ab "$1" --state-tokens 64 --questions 8 --concurrency 1 --duration 60 --rounds 5 ;;
    c1-64x32)   ab "$1" --state-tokens 64 --questions 32 --concurrency 1 --duration 600 --requests 3 --rounds 3 ;;
    c1-512x1)   ab "$1" --state-tokens 512 --questions 1 --concurrency 1 --duration 60 --rounds 5 ;;
    c1-512x8)   ab "$1" --state-tokens 512 --questions 8 --concurrency 1 --duration 600 --requests 5 --rounds 5 ;;
    c1-512x32)  ab "$1" --state-tokens 512 --questions 32 --concurrency 1 --duration 600 --requests 2 --rounds 2 --warmup 0 ;;
    c1-2048x1)  ab "$1" --state-tokens 2048 --questions 1 --concurrency 1 --duration 600 --requests 4 --rounds 4 ;;
    c1-2048x8)  ab "$1" --state-tokens 2048 --questions 8 --concurrency 1 --duration 600 --requests 2 --rounds 2 --warmup 0 ;;
    c1-2048x32-tree) tree_only "$1" --state-tokens 2048 --questions 32 --concurrency 1 --duration 600 --requests 3 --rounds 3 --warmup 1 ;;
    c16-64x1)   ab "$1" --state-tokens 64 --questions 1 --concurrency 16 --duration 60 --rounds 3 ;;
    c16-64x8)   ab "$1" --state-tokens 64 --questions 8 --concurrency 16 --duration 600 --requests 32 --rounds 2 --warmup 0 ;;
    c16-512x1)  ab "$1" --state-tokens 512 --questions 1 --concurrency 16 --duration 600 --requests 32 --rounds 2 --warmup 0 ;;
    c16-512x8-tree) tree_only "$1" --state-tokens 512 --questions 8 --concurrency 16 --duration 600 --requests 32 --rounds 2 --warmup 0 ;;
    *) echo "unknown cell $1" >&2; return 2 ;;
  esac
}

cells=("$@")
[ ${#cells[@]} -gt 0 ] || cells=(c1-512x8 c1-64x1 c1-64x8 c1-64x32 c1-512x1 c1-512x32 c1-2048x1 c1-2048x8 c1-2048x32-tree
  c16-64x1 c16-64x8 c16-512x1 c16-512x8-tree)
for cell in "${cells[@]}"; do
  echo "== $cell $(date -u +%H:%M:%S)" >&2
  run "$cell"
done
