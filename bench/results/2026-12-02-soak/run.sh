#!/usr/bin/env bash
# 30-minute soak per docs/operations.md, with the defaults (prefix cache auto) and half the states repeated.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p "${OUT:-/tmp/soak}"
.venv/bin/decision-launcher --dtype float32 --hostname 127.0.0.1 --port 3300 --uds-path ${OUT:-/tmp/soak}/sock > ${OUT:-/tmp/soak}/launcher.log 2>&1 &
LAUNCHER=$!
for i in $(seq 1 300); do curl -sf localhost:3300/health >/dev/null && break; sleep 2; done
curl -s localhost:3300/info > ${OUT:-/tmp/soak}/info.json
ROUTER=$(pgrep -f "decision-router.*3300" | head -1); SHARD=$(pgrep -f 'decision.server serve.*soak' | head -1)
echo "router $ROUTER shard $SHARD" > ${OUT:-/tmp/soak}/pids
grep -E "VmRSS|VmHWM" /proc/$ROUTER/status /proc/$SHARD/status > ${OUT:-/tmp/soak}/rss-start.txt
.venv/bin/decision-bench --url http://127.0.0.1:3300 --state-tokens 128 --questions 4 --concurrency 64 \
  --duration 1800 --bad-fraction 0.02 --repeat-state-fraction 0.5 --hot-states 16 --warmup 8 --timeout 300 \
  --watch-pid $ROUTER --watch-pid $SHARD --rss-interval 5 --rss-settle 300 \
  --tokenizer ~/.cache/decision-inference/models/SmolLM2-135M-Instruct --json ${OUT:-/tmp/soak}/soak.json > ${OUT:-/tmp/soak}/bench.log 2>&1
grep -E "VmRSS|VmHWM" /proc/$ROUTER/status /proc/$SHARD/status > ${OUT:-/tmp/soak}/rss-end.txt
curl -s localhost:3300/metrics | grep -E "^decision_(prefix|cached|tokens)" > ${OUT:-/tmp/soak}/metrics-end.txt
kill -TERM $LAUNCHER; wait $LAUNCHER; echo "launcher exit $?" >> ${OUT:-/tmp/soak}/bench.log
