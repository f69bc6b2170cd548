#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for bench/gpu-check.sh on a device machine, which reaches no network: the launcher,
# router and MKL library built here, a `decision-server` that runs the shard from this checkout with that machine's
# python3, the grpc stubs, grpcio and protobuf wheels of our stubs' versions for its Python 3.12, the Qwen3
# tokenizer, the three fixtures' configs (their weights are made there: the Qwen3-8B shape's only when the check has time)
# and the commit. About 45 MB. Run after `make install fixtures`.
set -euo pipefail
cd "$(dirname "$0")/.."
G=.gpu
MODELS=${MODELS:-$HOME/.cache/decision-inference/models}
rm -rf "$G" && mkdir -p "$G/wheels" "$G/tok" "$G/configs/tiny-qwen3" "$G/configs/qwen3-0.6b" "$G/configs/qwen3-8b"
install -m 755 .venv/bin/decision-launcher .venv/bin/decision-router .venv/bin/libdecision_mkl_dispatch.so "$G/"
strip "$G/decision-launcher" "$G/decision-router" 2>/dev/null || true
printf '#!/bin/sh\nexec python3 -m decision_server.cli "$@"\n' > "$G/decision-server" && chmod 755 "$G/decision-server"
cp server/decision_server/pb/*_pb2*.py "$G/"
versions=$(.venv/bin/python -c 'import grpc, google.protobuf; print(f"grpcio=={grpc.__version__} protobuf=={google.protobuf.__version__}")')
# shellcheck disable=SC2086
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$G/wheels" $versions
for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do cp "$MODELS/tiny-qwen3/$f" "$G/tok/"; done
cp "$MODELS/tiny-qwen3/config.json" "$G/configs/tiny-qwen3/"
cp "$MODELS/qwen3-0.6b-random/config.json" "$G/configs/qwen3-0.6b/"
cp bench/configs/qwen3-8b/config.json "$G/configs/qwen3-8b/"
git rev-parse --short HEAD > "$G/commit"  # the device's copy of the tree has no .git
du -sh "$G"
