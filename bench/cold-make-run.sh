#!/usr/bin/env bash
# A cold `make run` (issue 47), timed to its first answer: a fresh clone of /work/main (pass another repo as $1) with an empty project cache (uv's and cargo's download caches stay warm).
set -u
D=$(mktemp -d /tmp/cold.XXXX)
git clone -q "${1:-/work/main}" $D/c
cd $D/c
unset CARGO_TARGET_DIR
export CACHE_DIR=$D/cache
start=$(date +%s)
setsid make run PORT=3999 > $D/run.log 2>&1 &
for i in $(seq 1 240); do
  sleep 5
  if curl -sf -o /dev/null http://127.0.0.1:3999/health; then break; fi
done
healthy=$(( $(date +%s) - start ))
body='{"state":{"ticket":"I was charged twice"},"questions":{"team":{"type":"choice","instructions":"Which team?","criteria":{"billing":"payments","tech":null}}}}'
curl -s -X POST http://127.0.0.1:3999/v1/systemone -H 'Content-Type: application/json' -d "$body" | head -c 300; echo
answered=$(( $(date +%s) - start ))
echo "cold make run: healthy after ${healthy} s, first answer after ${answered} s ($D)"
pkill -f "decision-launcher.*--port 3999" ; pkill -f "make run PORT=3999"
