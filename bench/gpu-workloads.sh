#!/usr/bin/env bash
# Step 4 of bench/gpu-check.sh, also runnable alone: the launcher on one model (--num-shard 1), decision-bench's cells
# against it, then bench/decision_bench/gpu_summary.py over every report in $OUT (summary.json and a markdown table).
# Env: FIXTURE (model folder), OUT (reports), CELLS (names below; default all but the 8B one), DTYPE (bfloat16),
# LAUNCHER (default decision-launcher on PATH, which must also hold decision-server), PYTHON (python3), CONFIGS
# (gpu_summary --config arguments; default the fixture), BENCH_SMALL=1 (seconds-long cells at small sizes, for a CPU proof:
#   BENCH_SMALL=1 DTYPE=float32 FIXTURE=~/.cache/decision-inference/models/tiny-qwen3 \
#     LAUNCHER=.venv/bin/decision-launcher PYTHON=.venv/bin/python OUT=/tmp/cpu-sample bash bench/gpu-workloads.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FIXTURE:?the model folder}"
OUT=${OUT:-bench/results/gpu-$(date +%F)}
DTYPE=${DTYPE:-bfloat16}
LAUNCHER=${LAUNCHER:-decision-launcher}
PYTHON=${PYTHON:-python3}
PORT=${PORT:-39301}
CELLS=${CELLS:-8x512-c1 8x512-c64 1x300-open 32x2048-c64}
LOG="$OUT/gpu-check.log"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/bench:${PYTHONPATH:-}"

# name: questions state-tokens concurrency rate(0 = closed loop) seconds timeout; BENCH_SMALL shrinks all of them.
declare -A CELL=(
  [8x512-c1]="8 512 1 0 15 60" [8x512-c64]="8 512 64 0 25 60" [1x300-open]="1 300 0 1000 10 30"
  [32x2048-c64]="32 2048 64 0 30 90" [8x2048-8b-c64]="8 2048 64 0 30 90"
)
if [[ -n ${BENCH_SMALL:-} ]]; then
  CELL=(
    [8x512-c1]="8 64 1 0 3 30" [8x512-c64]="8 64 8 0 3 30" [1x300-open]="1 48 0 20 3 30"
    [32x2048-c64]="32 128 8 0 3 30" [8x2048-8b-c64]="8 128 8 0 3 30"
  )
fi

"$LAUNCHER" --model-id "$FIXTURE" --dtype "$DTYPE" --num-shard 1 --port "$PORT" --hostname 127.0.0.1 \
  --uds-path "/tmp/gpu-workloads-sock-$PORT" > "$OUT/launcher-$(basename "$FIXTURE").log" 2>&1 &
LAUNCHER_PID=$!
trap 'kill $LAUNCHER_PID 2>/dev/null || true; wait $LAUNCHER_PID 2>/dev/null || true' EXIT
healthy=""
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && { healthy=1; break; }
  kill -0 "$LAUNCHER_PID" 2>/dev/null || break
  sleep 1
done
if [[ -z $healthy ]]; then
  echo "launcher on $(basename "$FIXTURE") not healthy; its log ends:" | tee -a "$LOG"
  tail -20 "$OUT/launcher-$(basename "$FIXTURE").log" | tee -a "$LOG"
  exit 1
fi
curl -s "http://127.0.0.1:$PORT/info" | tee -a "$LOG"; echo
for name in $CELLS; do
  read -r questions state concurrency rate seconds timeout <<< "${CELL[$name]}"
  args=(--url "http://127.0.0.1:$PORT" --questions "$questions" --state-tokens "$state" --duration "$seconds"
        --rounds 1 --warmup 2 --timeout "$timeout" --json "$OUT/$name.json")
  if [[ $rate != 0 ]]; then
    # Open loop: bodies are built before the clock, so states are sized by estimate (the tokenizer takes ~3 ms each).
    args+=(--rate "$rate" --max-outstanding 512 --concurrency 2)
  else
    args+=(--concurrency "$concurrency" --tokenizer "$FIXTURE")
  fi
  echo "-- $name ($(basename "$FIXTURE"), $DTYPE)" | tee -a "$LOG"
  timeout $(( seconds + 2 * timeout + 60 )) "$PYTHON" -m decision_bench.cli "${args[@]}" 2>&1 >/dev/null \
    | grep -v "^$" | tail -3 | tee -a "$LOG" || echo "$name: decision-bench failed or ran out of time" | tee -a "$LOG"
done
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^decision_(shard_forward_seconds|shard_idle_seconds|batch_duration_seconds)_(sum|count)|^decision_computed_tokens_total" | tee -a "$LOG"

if command -v nvidia-smi >/dev/null; then device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
else device="CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"; fi
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || cat "${GPU_ARTEFACTS:-.gpu}/commit" 2>/dev/null || echo unknown)}
# shellcheck disable=SC2086
"$PYTHON" -m decision_bench.gpu_summary "$OUT" ${CONFIGS:---config $FIXTURE} --device "$device" --commit "$commit" \
  | tee "$OUT/summary.md"
