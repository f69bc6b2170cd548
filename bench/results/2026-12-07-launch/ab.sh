#!/usr/bin/env bash
# The served A/B of this folder: bench/results/2026-12-07-plan/ab.sh with its output here. A = the shard of BASE
# (default /tmp/wt-base), B = this checkout:
#   git worktree add /tmp/wt-base f9dbbd3 && cp server/decision_server/pb/decision_pb2*.py /tmp/wt-base/server/decision_server/pb/
OUT=${OUT:-bench/results/2026-12-07-launch} exec bash bench/results/2026-12-07-plan/ab.sh "$@"
