#!/usr/bin/env bash
# The GPU check of "Faster per token": one short run on a lent CUDA machine (the device tool), in five steps.
#   0. the shard's wire libraries: grpcio and protobuf wheels of the versions our stubs were generated with, installed
#      into .gpu/site (the machine's own are older, and the stubs refuse an older runtime);
#   1. the environment: torch sees the GPU, which attention kernels are there (flash-attn, FlexAttention);
#   2. the fixtures, made there from their configs and the Qwen3 tokenizer (random weights, seed 0: the tiny Qwen3
#      and the Qwen3-0.6B shape, bfloat16; their weights are too big to carry);
#   3. equality on CUDA: our shard's reads (tree and naive, float32 and bfloat16, eager, compiled, and compiled with
#      CUDA graphs) against transformers' own forward on the tiny fixture, the tolerance per dtype as on CPU; then
#      the host-work proxy (bench/host_overhead.py) with CUDA graphs and without, and the host work per batch around
#      the forward (bench/host_batch.py: what overlaps the pass in flight, and whether anything in it waits);
#   4. decision-bench through the whole stack (bench/gpu-workloads.sh: launcher, router, one shard), Qwen3-0.6B shape,
#      bfloat16: 8 q x 512 at C 1 and C 64, 1 q x 300 in an open loop at 1,000 requests/s, 32 q x 2,048 at C 64; then,
#      when under 300 s have gone, 8 q x 2,048 at C 64 on a Qwen3-8B-shaped random model; reports, summary.json (rows
#      with MFU) and summary.md under $OUT (or bench/results/gpu-<date>/); the whole check within 8 minutes;
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
from decision_server.model import LoadOptions, load_model
from decision_server.engines import make_engine
from decision_server.engines.types import ReadSpec

folder = Path(os.environ["FIXTURE"])
prompts = [[1, 5, 9, 13, 17, 21, 25], [1, 5, 9, 13, 40, 41], [1, 5, 9, 13, 17, 21, 25, 30]]
# Four more requests with distinct 150-token states, two questions each: one packed pass of many segments.
g = torch.Generator().manual_seed(0)
for _ in range(4):
    state = [1, *torch.randint(10, 400, (150,), generator=g).tolist()]
    prompts += [state + [60, 61], state + [62, 63, 64]]
labels = ((3,), (4,), (7, 8))
cases = (("float32", 1e-4, "off", "off"), ("float32", 1e-4, "auto", "auto"), ("bfloat16", 5e-2, "off", "off"),
         ("bfloat16", 5e-2, "auto", "off"), ("bfloat16", 5e-2, "auto", "auto"))
for dtype, tol, compile_mode, graphs in cases:
    # --compile auto: the layers between attentions as compiled graphs (layer_graph), the serving default;
    # --cuda-graphs auto: those replayed as CUDA graphs per token-count bucket (step_graphs), the serving default.
    model = load_model(folder, LoadOptions(dtype=dtype, compile_mode=compile_mode, cuda_graphs=graphs))
    assert model.device_name.startswith("cuda"), model.device_name
    print(f"{dtype} compile {compile_mode} cuda graphs {graphs}: compiled layers {model.compiled_layers}, "
          f"segment attention {model.segment_attention}, graph buckets {list(model.cuda_graph_buckets)}")
    compile_mode = f"{compile_mode}/graphs-{graphs}"
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to("cuda").eval()
    # tree with the kernel chosen at load (flex where its probe passed), tree with SDPA per segment, and naive.
    chosen = model.segment_attention
    for mode, kernel in (("tree", chosen), ("tree", "sdpa"), ("naive", chosen)):
        model.segment_kernel = kernel
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
        print(f"{dtype} {compile_mode} {mode} {kernel}: max |dlogprob| {worst:.2e} (tolerance {tol})", "ok" if worst < tol else "FAILED")
    model.segment_kernel = chosen
EOF

echo "== 3b. host work per forward (bench/host_overhead.py: 28 layers, hidden 64, 512 tokens), graphs on and off" | tee -a "$LOG"
for graphs in auto off; do
  timeout 120 python3 bench/host_overhead.py --dtype bfloat16 --runs 20 --cuda-graphs $graphs 2>&1 | tail -1 | tee -a "$LOG" \
    || echo "host_overhead --cuda-graphs $graphs failed" | tee -a "$LOG"
done

# in_flight_ms: the host work that runs while the pass is on the device; launch_syncs and in_flight_syncs: waits for
# the device inside a launch and while a pass is in flight (both should be 0).
echo "== 3c. the shard's host work per batch around its forward (bench/host_batch.py: 64 x 8 x 512, on this GPU)" | tee -a "$LOG"
timeout 120 python3 bench/host_batch.py --runs 3 2>&1 | tail -1 | tee -a "$LOG" || echo "host_batch failed" | tee -a "$LOG"
echo "== 4. decision-bench, --num-shard 1, bfloat16, Qwen3-0.6B shape (bench/gpu-workloads.sh)" | tee -a "$LOG"
FIXTURE=/tmp/gpu-models/qwen3-0.6b
if [[ -n ${PROFILE_ONLY:-} ]]; then python3 bench/gpu-profile.py 2>&1 | tee "$OUT/profile.txt"; exit 0; fi
export OUT GPU_ARTEFACTS="$G" LAUNCHER="$G/decision-launcher"
CONFIGS="--config $FIXTURE --config 8x2048-8b=$G/configs/qwen3-8b" FIXTURE=$FIXTURE bash bench/gpu-workloads.sh
# The Qwen3-8B shape only when time allows: its fixture (16 GB, made here) and its cell take about 2.5 minutes, and the
# whole check must stay within 8 minutes of device time.
if (( SECONDS < ${BIG_MODEL_BEFORE_S:-300} )); then
  echo "== 4b. Qwen3-8B shape at ${SECONDS} s" | tee -a "$LOG"
  MODELS=/tmp/gpu-models G="$G" FIXTURES=qwen3-8b python3 bench/gpu_fixtures.py 2>&1 | grep -v "Writing model" | tee -a "$LOG"
  CONFIGS="--config $FIXTURE --config 8x2048-8b=/tmp/gpu-models/qwen3-8b" FIXTURE=/tmp/gpu-models/qwen3-8b \
    CELLS=8x2048-8b-c64 bash bench/gpu-workloads.sh || echo "== 4b. the Qwen3-8B shape failed (above)" | tee -a "$LOG"
else
  echo "== 4b. Qwen3-8B shape skipped: ${SECONDS} s gone, over ${BIG_MODEL_BEFORE_S:-300}" | tee -a "$LOG"
fi
echo "== 5. after" | tee -a "$LOG"
nvidia-smi --query-gpu=name,memory.used --format=csv | tee -a "$LOG"
