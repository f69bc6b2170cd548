#!/usr/bin/env bash
# `make image`: builds the offline base image (once per machine) and then decision-inference:latest from the
# root Dockerfile. No registry is needed: the base is made by mmdebstrap from this host's own apt sources, so
# no mirror name is written into the repo. On a machine that can pull, `docker build .` alone also works.
#
#   scripts/image.sh             # base (if missing) + image
#   BASE_IMAGE=debian:bookworm-slim scripts/image.sh   # skip the local base, use a pulled one
#   IMAGE_RUST=source scripts/image.sh                 # compile the Rust binaries in the image, not on the host
#
# The Rust binaries come from the host's release build of this checkout (cargo brings it up to date: a no-op after
# `make install`) when cargo is here; they are checked to run on the base image, else the image compiles them.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-local/debian:bookworm}
IMAGE=${IMAGE:-decision-inference:latest}
IMAGE_RUST=${IMAGE_RUST:-host}
RUST_BINARIES=(decision-router decision-launcher)
RUST_LIBRARY=libdecision_mkl_dispatch.so  # preloaded into shards on AMD CPUs (mkl-dispatch/src/lib.rs)

log() { printf 'image: %s\n' "$*" >&2; }

host_sources() {
    # deb822 sources first (Debian 12's default), else the one-line list.
    local files=()
    for f in /etc/apt/sources.list.d/*.sources; do [[ -f $f ]] && files+=("$f"); done
    if (( ${#files[@]} == 0 )) && [[ -s /etc/apt/sources.list ]]; then files=(/etc/apt/sources.list); fi
    (( ${#files[@]} > 0 )) || { log "no apt sources on this host (/etc/apt/sources.list.d/*.sources)"; exit 1; }
    printf '%s\n' "${files[@]}"
}

make_base() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        log "base $BASE_IMAGE: present"
        return
    fi
    if [[ $BASE_IMAGE != local/* ]]; then
        log "base $BASE_IMAGE is not local/*: docker build will pull it"
        return
    fi
    if ! command -v mmdebstrap >/dev/null; then
        log "installing mmdebstrap"
        local sudo=(); (( EUID == 0 )) || sudo=(sudo)
        "${sudo[@]}" apt-get install -y -q mmdebstrap >/dev/null
    fi
    local sources
    mapfile -t sources < <(host_sources)
    log "building $BASE_IMAGE from ${sources[*]}"
    local start=$SECONDS
    mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm - "${sources[@]}" \
        | docker import - "$BASE_IMAGE" >/dev/null
    log "base $BASE_IMAGE built in $((SECONDS - start)) s"
}

copy_build_cas() {
    # The host's extra CAs, for build stages that reach PyPI and crates.io through an intercepting proxy.
    find docker/ca-certificates -name '*.crt' -delete
    local crt
    for crt in /usr/local/share/ca-certificates/*.crt /usr/local/share/ca-certificates/*/*.crt; do
        [[ -f $crt ]] && cp "$crt" "docker/ca-certificates/$(basename "$crt")"
    done
    return 0
}

host_rust() {
    # The host's release binaries of this checkout into docker/prebuilt/, or false where the image must compile them.
    rm -f docker/prebuilt/decision-* docker/prebuilt/libdecision_*
    [[ $IMAGE_RUST == host ]] || return 1
    command -v cargo >/dev/null || { log "no cargo on this host: the image compiles the Rust binaries"; return 1; }
    cargo build --release --locked -p decision-router -p decision-launcher -p decision-mkl-dispatch >&2
    local target
    target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    local name
    for name in "${RUST_BINARIES[@]}" "$RUST_LIBRARY"; do cp "$target/release/$name" docker/prebuilt/; done
}

build() {
    # docker build with RUST_PREBUILT=$1.
    docker build --build-arg "BASE=$BASE_IMAGE" --build-arg "RUST_PREBUILT=$1" \
        --label org.opencontainers.image.source=decision-inference -t "$IMAGE" .
}

compiler_runs() {
    # The image's torch.compile builds a kernel as the image's user (`--compile auto` needs g++ and Python.h).
    docker run --rm --entrypoint python3 "$IMAGE" -c 'import torch
from decision_server import fused
assert fused.enable("auto", torch.bfloat16, torch.device("cpu")), "inductor cannot build kernels in the image"' >&2
}

binaries_run() {
    local name
    for name in "${RUST_BINARIES[@]}"; do
        docker run --rm --entrypoint "$name" "$IMAGE" --version >/dev/null || return 1
    done
    docker run --rm --entrypoint python3 "$IMAGE" -c "import ctypes, shutil, os
library = os.path.join(os.path.dirname(shutil.which('decision-launcher')), '$RUST_LIBRARY')
assert ctypes.CDLL(library).mkl_serv_intel_cpu_true() == 1" >/dev/null
}

free_gb=$(df -Pk /var/lib/docker 2>/dev/null | awk 'NR==2 {print int($4 / 1048576)}')
if [[ -n ${free_gb:-} ]] && (( free_gb < 15 )); then
    log "warning: only ${free_gb} GB free under /var/lib/docker; a cold build holds about 11 GB of layers"
fi

make_base
copy_build_cas
start=$SECONDS
if host_rust; then
    log "Rust binaries: this host's release build"
    build 1
    if ! binaries_run; then
        log "the host's Rust binaries do not run on $BASE_IMAGE (a newer glibc?): compiling them in the image"
        rm -f docker/prebuilt/decision-* docker/prebuilt/libdecision_*
        build 0
    fi
else
    build 0
fi
rm -f docker/prebuilt/decision-* docker/prebuilt/libdecision_*
compiler_runs
size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
log "$IMAGE built in $((SECONDS - start)) s, $((size / 1048576)) MiB"
