"""The GPU check's fixtures, made on the device machine from .gpu/configs and .gpu/tok (random weights, seed 0):
the tiny Qwen3 and the Qwen3-0.6B shape. MODELS: where they go; G: the .gpu folder."""

# ruff: noqa  (run on the device machine by bench/gpu-check.sh)

import json, os, shutil, time
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
g, root = Path(os.environ["G"]), Path(os.environ["MODELS"])
for name in ("tiny-qwen3", "qwen3-0.6b"):
    started = time.perf_counter()
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    for item in (g / "tok").iterdir():
        shutil.copy(item, out / item.name)
    config = AutoConfig.from_pretrained(g / "configs" / name)
    torch.manual_seed(0)
    dtype = getattr(torch, json.loads((g / "configs" / name / "config.json").read_text()).get("dtype", "bfloat16"))
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    print(name, dtype, sum(p.numel() for p in model.parameters()), "parameters", f"{time.perf_counter() - started:.1f} s")
