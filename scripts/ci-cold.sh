#!/usr/bin/env bash
# Measures what CI costs on a machine that has nothing: a fresh clone, an empty HOME (no Python, uv, pip, cargo
# or model caches) and, with --no-images, no Docker images or build cache either. Prints the time of `.ci/run`.
#   scripts/ci-cold.sh [--no-images] [COMMIT]
# Destructive with --no-images: removes every image and the build cache of this Docker engine.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
no_images=0
if [[ ${1:-} == --no-images ]]; then no_images=1; shift; fi
commit=${1:-HEAD}
work=$(mktemp -d /tmp/ci-cold.XXXX)
git clone -q "$repo" "$work/clone"
git -C "$work/clone" checkout -q "$commit"
if (( no_images )); then
    docker ps -aq | xargs -r docker rm -f >/dev/null
    docker system prune -af >/dev/null
fi
mkdir -p "$work/home"
# The toolchain stays where rustup put it; everything it would download or cache starts empty.
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
export PATH="$HOME/.cargo/bin:$PATH"
export HOME="$work/home" CARGO_HOME="$work/home/.cargo" XDG_CACHE_HOME="$work/home/.cache"
start=$SECONDS
status=0
(cd "$work/clone" && .ci/run) > "$work/ci.log" 2>&1 || status=$?
echo "ci-cold: .ci/run exited $status after $((SECONDS - start)) s; log: $work/ci.log"
exit $status
