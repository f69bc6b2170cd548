#!/usr/bin/env bash
# The GPU check of "Faster per token": one short run on a lent CUDA machine (the device tool), in five steps.
#   0. the shard's wire libraries: grpcio and protobuf wheels of the versions our stubs were generated with, installed
#      into .gpu/site (the machine's own are older, and the stubs refuse an older runtime);
#   1. the environment: torch sees the GPU, which attention kernels are there (flash-attn, FlexAttention);
#   2. the fixtures, made there from their configs and the Qwen3 tokenizer (random weights, seed 0: the tiny Qwen3
#      and the Qwen3-0.6B shape, bfloat16; their weights are too big to carry);
#   3. equality on CUDA: our shard's reads (tree and naive, float32 and bfloat16) against transformers' own forward
#      on the tiny fixture, the tolerance per dtype as on CPU;
#   4. decision-bench through the whole stack (launcher, router, one shard: `--num-shard 1`), Qwen3-0.6B shape,
#      bfloat16, at 8 q x 512 and 32 q x 2,048, concurrency 1 and 64; reports under $OUT (or bench/results/gpu-<date>/);
#   5. `nvidia-smi` before and after, so the report says which GPU and how much memory the shard held.
# The device machine reaches no network: prepare .gpu here, then run this there with .gpu carried:
#   bench/gpu-prepare.sh    # after `make install fixtures`
#   device run: carry [".gpu"], command "bash bench/gpu-check.sh", timeout_s 560
# Its python3 (3.12) holds torch, transformers, safetensors, tokenizers, numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu-$(date +%F)}
mkdir -p "$OUT"
G=${GPU_ARTEFACTS:-$PWD/.gpu}
LOG="$OUT/gpu-check.log"
python3 -m pip install -q --no-deps --no-index --target "$G/site" "$G"/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH="$G/site:$PWD/server:$PWD/bench:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PATH="$G:$PATH"
cp "$G"/*_pb2*.py server/decision_server/pb/

echo "== 1. environment" | tee "$LOG"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee -a "$LOG"
python3 - <<'EOF' | tee -a "$LOG"
import importlib.util, torch, grpc, google.protobuf, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("transformers", transformers.__version__, "grpcio", grpc.__version__, "protobuf", google.protobuf.__version__)
print("flash_attn", importlib.util.find_spec("flash_attn") is not None)
print("flex_attention", importlib.util.find_spec("torch.nn.attention.flex_attention") is not None)
EOF
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$LOG"

echo "== 2. fixtures" | tee -a "$LOG"
MODELS=/tmp/gpu-models G="$G" python3 bench/gpu_fixtures.py 2>&1 | grep -v "Writing model" | tee -a "$LOG"

echo "== 3. equality on CUDA (ours vs transformers)" | tee -a "$LOG"
FIXTURE=/tmp/gpu-models/tiny-qwen3 python3 - <<'EOF' | tee -a "$LOG"
import os, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from decision_server.model import load_model
from decision_server.engines import make_engine
from decision_server.engines.types import ReadSpec

folder = Path(os.environ["FIXTURE"])
prompts = [[1, 5, 9, 13, 17, 21, 25], [1, 5, 9, 13, 40, 41], [1, 5, 9, 13, 17, 21, 25, 30]]
labels = ((3,), (4,), (7, 8))
for dtype, tol, compile_mode in (("float32", 1e-4, "off"), ("bfloat16", 5e-2, "off"), ("bfloat16", 5e-2, "auto")):
    # --compile auto: the layers between attentions as compiled graphs (layer_graph), the serving default.
    model = load_model(folder, dtype=dtype, compile_mode=compile_mode)
    assert model.device_name.startswith("cuda"), model.device_name
    print(f"{dtype} compile {compile_mode}: compiled layers {model.compiled_layers}")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to("cuda").eval()
    for mode in ("tree", "naive"):
        engine = make_engine(mode, model)
        specs = [ReadSpec(id=i, prompt=tuple(p), labels=labels) for i, p in enumerate(prompts)]
        outcomes = engine.run(specs).outcomes
        worst = 0.0
        for spec, outcome in zip(specs, outcomes):
            for label, got in zip(spec.labels, outcome.label_logprobs):
                ids = torch.tensor([[*spec.prompt, *label[:-1]]], device="cuda")
                with torch.inference_mode():
                    lp = torch.log_softmax(reference(ids).logits[0].float(), -1)
                start = len(spec.prompt) - 1
                want = sum(float(lp[start + k, t]) for k, t in enumerate(label))
                worst = max(worst, abs(got - want))
        print(f"{dtype} {compile_mode} {mode}: max |dlogprob| {worst:.2e} (tolerance {tol})", "ok" if worst < tol else "FAILED")
EOF

echo "== 4. decision-bench, --num-shard 1, bfloat16, Qwen3-0.6B shape" | tee -a "$LOG"
FIXTURE=/tmp/gpu-models/qwen3-0.6b
if [[ -n ${PROFILE_ONLY:-} ]]; then python3 bench/gpu-profile.py 2>&1 | tee "$OUT/profile.txt"; exit 0; fi
"$G/decision-launcher" --model-id "$FIXTURE" --dtype bfloat16 --num-shard 1 --port 39301 --hostname 127.0.0.1 \
  --uds-path /tmp/gpu-check-sock > "$OUT/launcher.log" 2>&1 &
LAUNCHER=$!
trap 'kill $LAUNCHER 2>/dev/null || true' EXIT
for _ in $(seq 180); do curl -sf http://127.0.0.1:39301/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:39301/info | tee -a "$LOG"; echo
for cell in "8 512 1" "8 512 64" "32 2048 1" "32 2048 64"; do
  set -- $cell
  python3 -m decision_bench.cli --url http://127.0.0.1:39301 --tokenizer "$FIXTURE" --questions "$1" --state-tokens "$2" \
    --concurrency "$3" --requests "$(( $3 > 1 ? $3 * 2 : 16 ))" --rounds 1 --warmup 2 --duration 90 --timeout 120 \
    --json "$OUT/${1}x${2}-c${3}.json" 2>&1 | tail -4 | tee -a "$LOG"
done
curl -s http://127.0.0.1:39301/metrics | grep -E "^decision_(shard_forward_seconds|batch_duration_seconds)_(sum|count)|^decision_computed_tokens_total" | tee -a "$LOG"
echo "== 5. after" | tee -a "$LOG"
nvidia-smi --query-gpu=name,memory.used --format=csv | tee -a "$LOG"
