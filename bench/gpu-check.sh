#!/usr/bin/env bash
# The GPU check of "Faster per token": one short run on a lent CUDA machine (the device tool), in four steps.
#   1. the environment: torch sees the GPU, which attention kernels are there (flash-attn, FlexAttention);
#   2. equality on CUDA: our shard's reads (tree and naive, float32 and bfloat16) against transformers' own forward
#      on the tiny Qwen3 fixture, the tolerance per dtype as on CPU;
#   3. decision-bench through the whole stack (launcher, router, one shard: `--num-shard 1`) at 8 q x 512 and
#      32 q x 2,048, concurrency 1 and 64, bfloat16, reports under $OUT (or bench/results/gpu-<date>/);
#   4. `nvidia-smi` before and after, so the report says which GPU and how much memory the shard held.
# The device machine reaches no network: run it from the repository root with what it needs carried:
#   make install fixtures   # here; then copy the artefacts into an ignored folder that travels
#   mkdir -p .gpu && cp -r ~/.cache/decision-inference/models/tiny-qwen3 .gpu/ && \
#     cp .venv/bin/decision-launcher .venv/bin/decision-router .gpu/ && cp server/decision_server/pb/*_pb2*.py .gpu/
#   device run: carry [".gpu"], command "bash bench/gpu-check.sh", timeout_s 540
# Its python3 holds torch, transformers, safetensors, grpcio, tokenizers; grpc stubs come from .gpu/.
# Not run yet: no device machine has been lent to this project (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu-$(date +%F)}
mkdir -p "$OUT"
G=${GPU_ARTEFACTS:-.gpu}
export PYTHONPATH="$PWD/server:$PWD/bench:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cp "$G"/*_pb2*.py server/decision_server/pb/ 2>/dev/null || true
FIXTURE="$G/tiny-qwen3"

echo "== 1. environment" | tee "$OUT/gpu-check.log"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee -a "$OUT/gpu-check.log"
python3 - <<'EOF' | tee -a "$OUT/gpu-check.log"
import importlib.util, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("flash_attn", importlib.util.find_spec("flash_attn") is not None)
print("flex_attention", importlib.util.find_spec("torch.nn.attention.flex_attention") is not None)
EOF

echo "== 2. equality on CUDA (ours vs transformers)" | tee -a "$OUT/gpu-check.log"
FIXTURE="$FIXTURE" python3 - <<'EOF' | tee -a "$OUT/gpu-check.log"
import os, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from decision_server.model import load_model
from decision_server.engines import make_engine
from decision_server.engines.types import ReadSpec

folder = Path(os.environ["FIXTURE"])
prompts = [[1, 5, 9, 13, 17, 21, 25], [1, 5, 9, 13, 40, 41], [1, 5, 9, 13, 17, 21, 25, 30]]
labels = ((3,), (4,), (7, 8))
for dtype, tol in (("float32", 1e-4), ("bfloat16", 5e-2)):
    model = load_model(folder, dtype=dtype)
    device = os.environ.get("CHECK_DEVICE", "cuda")
    assert model.device_name.startswith(device), model.device_name
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
    for mode in ("tree", "naive"):
        engine = make_engine(mode, model)
        specs = [ReadSpec(id=i, prompt=tuple(p), labels=labels) for i, p in enumerate(prompts)]
        outcomes = engine.run(specs).outcomes
        worst = 0.0
        for spec, outcome in zip(specs, outcomes):
            for label, got in zip(spec.labels, outcome.label_logprobs):
                ids = torch.tensor([[*spec.prompt, *label[:-1]]], device=device)
                with torch.inference_mode():
                    lp = torch.log_softmax(reference(ids).logits[0].float(), -1)
                start = len(spec.prompt) - 1
                want = sum(float(lp[start + k, t]) for k, t in enumerate(label))
                worst = max(worst, abs(got - want))
        print(f"{dtype} {mode}: max |dlogprob| {worst:.2e} (tolerance {tol})")
        assert worst < tol, (dtype, mode, worst)
EOF

echo "== 3. decision-bench, --num-shard 1, bfloat16" | tee -a "$OUT/gpu-check.log"
"$G/decision-launcher" --model-id "$FIXTURE" --dtype bfloat16 --num-shard 1 --port 39301 --hostname 127.0.0.1 \
  --uds-path /tmp/gpu-check-sock > "$OUT/launcher.log" 2>&1 &
LAUNCHER=$!
trap 'kill $LAUNCHER 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf http://127.0.0.1:39301/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:39301/info | tee -a "$OUT/gpu-check.log"; echo
for cell in "8 512 1" "8 512 64" "32 2048 1" "32 2048 64"; do
  set -- $cell
  python3 -m decision_bench.cli --url http://127.0.0.1:39301 --tokenizer "$FIXTURE" --questions "$1" --state-tokens "$2" \
    --concurrency "$3" --requests "$(( $3 > 1 ? $3 * 2 : 8 ))" --rounds 1 --warmup 2 --duration 120 --timeout 120 \
    --json "$OUT/${1}x${2}-c${3}.json" | tail -3 | tee -a "$OUT/gpu-check.log"
done
echo "== 4. after" | tee -a "$OUT/gpu-check.log"
nvidia-smi --query-gpu=name,memory.used --format=csv | tee -a "$OUT/gpu-check.log"
