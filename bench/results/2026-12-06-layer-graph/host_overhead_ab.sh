#!/usr/bin/env bash
# The host-overhead proxy before and after the compiled layers, interleaved, three rounds: BASE is a checkout of main
# before them (c51abd6, with its own .venv; its proxy loads the model eagerly), this checkout at the serving defaults
# (--matmul auto --compile auto) and with --compile off. Output: host_overhead_ab.txt.
set -euo pipefail
BASE=${BASE:?a checkout of the code before, with its own .venv}
HERE=$PWD
for round in 1 2 3; do
  (cd "$BASE" && .venv/bin/python bench/host_overhead.py --runs 20 2>/dev/null | tail -1 | sed "s/^/before r$round /")
  (cd "$HERE" && .venv/bin/python bench/host_overhead.py --runs 20 2>/dev/null | tail -1 | sed "s/^/after r$round /")
  (cd "$HERE" && .venv/bin/python bench/host_overhead.py --runs 20 --compile off 2>/dev/null | tail -1 \
    | sed "s/^/after-off r$round /")
done
