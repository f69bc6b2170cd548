#!/usr/bin/env bash
# bench/host_batch.py (64 x 8 x 512, thread CPU time, tcmalloc as the launcher runs shards), A = BASE's shard (a git
# worktree first on PYTHONPATH, with its own host_batch.py), B = this checkout, PAIRS interleaved pairs.
#   git worktree add /tmp/wt-base f9dbbd3 && cp server/decision_server/pb/decision_pb2*.py /tmp/wt-base/server/decision_server/pb/
set -euo pipefail
BASE=${BASE:-/tmp/wt-base}
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
for _ in $(seq "${PAIRS:-5}"); do
  echo "A $(PYTHONPATH=$BASE/server .venv/bin/python "$BASE/bench/host_batch.py" --runs 5 2>/dev/null | tail -1)"
  echo "B $(.venv/bin/python bench/host_batch.py --runs 5 2>/dev/null | tail -1)"
done
