#!/usr/bin/env bash
# One A/B run per cell of the benchmark grid (questions × state tokens × concurrency), against two servers that
# are already up. Every cell gets its own seed (so a server's prefix cache never holds an earlier cell's states)
# and a run length that fits its size: a few requests per round at concurrency 1, one wave of 16 at concurrency 16.
# Usage: bench/scripts/grid.sh OUT_DIR A_URL B_URL MODEL_DIR LABEL CELL...
#   CELL is QxS (concurrency 1) or QxS-c16, e.g. 8x512 32x2048 1x64-c16; a cell's report is OUT_DIR/CELL.json.
#   SEED_BASE (default 1000) + the cell's position gives its seed; BENCH overrides the decision-bench command;
#   WAVES (default 1) is how many A,B pairs of waves a concurrency > 1 cell runs; TIMEOUT (default 1800) is the
#   per-request limit in seconds (a naive wave of 16 large requests can take longer).
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR A_URL B_URL MODEL_DIR LABEL CELL...}
A=${2:?A_URL}; B=${3:?B_URL}; MODEL=${4:?MODEL_DIR}; LABEL=${5:?LABEL}; shift 5
BENCH=${BENCH:-decision-bench}
SEED=${SEED_BASE:-1000}
mkdir -p "$OUT"

for cell in "$@"; do
  SEED=$((SEED + 1))
  if [[ ! $cell =~ ^([0-9]+)x([0-9]+)(-c([0-9]+))?$ ]]; then
    echo "bad cell $cell (want QxS or QxS-cC)" >&2
    exit 2
  fi
  questions=${BASH_REMATCH[1]} state=${BASH_REMATCH[2]} concurrency=${BASH_REMATCH[4]:-1}
  if ((concurrency > 1)); then
    # WAVES waves of `concurrency` requests per server, alternating A, B, A, B, …
    waves=${WAVES:-1}
    shape=(--requests $((concurrency * waves)) --rounds "$waves" --warmup 0 --duration $((3600 * waves)))
  elif ((questions * state <= 1024)); then
    shape=(--requests 5 --rounds 5 --warmup 1 --duration 1800)  # small: five A,B pairs
  else
    shape=(--requests 3 --rounds 3 --warmup 1 --duration 1800)  # large: three A,B pairs
  fi
  echo "== $cell seed $SEED $(date -u +%H:%M:%S)" >&2
  "$BENCH" --url "$A" --url-b "$B" --tokenizer "$MODEL" --options 4 --label "$LABEL" --seed "$SEED" \
    --state-tokens "$state" --questions "$questions" --concurrency "$concurrency" --timeout "${TIMEOUT:-1800}" "${shape[@]}" \
    --json "$OUT/$cell.json" >/dev/null
done
