#!/usr/bin/env bash
# `make image`: builds the offline base image (once per machine) and then decision-inference:latest from the
# root Dockerfile. No registry is needed: the base is made by mmdebstrap from this host's own apt sources, so
# no mirror name is written into the repo. On a machine that can pull, `docker build .` alone also works.
#
#   scripts/image.sh             # base (if missing) + image
#   BASE_IMAGE=debian:bookworm-slim scripts/image.sh   # skip the local base, use a pulled one
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-local/debian:bookworm}
IMAGE=${IMAGE:-decision-inference:latest}

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

free_gb=$(df -Pk /var/lib/docker 2>/dev/null | awk 'NR==2 {print int($4 / 1048576)}')
if [[ -n ${free_gb:-} ]] && (( free_gb < 15 )); then
    log "warning: only ${free_gb} GB free under /var/lib/docker; a cold build holds about 11 GB of layers"
fi

make_base
copy_build_cas
start=$SECONDS
docker build --build-arg "BASE=$BASE_IMAGE" --label org.opencontainers.image.source=decision-inference -t "$IMAGE" .
size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
log "$IMAGE built in $((SECONDS - start)) s, $((size / 1048576)) MiB"
