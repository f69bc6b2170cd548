"""The GPU check's summary: decision-bench reports named `<workload>-c<C>.json` (or `<workload>.json` for an open
loop) become one row each in summary.json, with model FLOPs utilization, and a markdown table on stdout.

MFU = prompt tokens computed x 2 x non-embedding parameters / seconds / the card's dense bfloat16 peak: the forward
FLOPs of the tokens the shard computed (the router's decision_computed_tokens_total, else the answers' usage), over
what the card could do. Attention's own FLOPs and the few label logits are left out, so it is a floor."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

# Dense bfloat16 tensor-core peaks (no sparsity), FLOP/s, by a name nvidia-smi or torch reports.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12}
WORKLOADS = ("8x512", "1x300-open", "32x2048", "8x2048-8b")
_NAME = re.compile(r"^(?P<workload>.+?)(?:-c(?P<concurrency>\d+))?$")


def non_embedding_parameters(config: dict[str, Any]) -> int:
    """Parameters of a Qwen3 or Llama decoder without its token embedding and output head (they cost no matmul FLOPs
    per prompt token: the embedding is a lookup, the head runs only on the few label rows)."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    intermediate = config["intermediate_size"]
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    if config.get("attention_bias"):
        attention += heads * head_dim + kv_heads * head_dim * 2 + hidden
    if config["model_type"] in ("qwen3",):
        attention += head_dim * 2  # q_norm, k_norm
    layer = attention + 3 * hidden * intermediate + 2 * hidden  # gate, up, down; two RMSNorms
    return int(config["num_hidden_layers"] * layer + hidden)  # + the final norm


def peak_flops(device: str) -> float | None:
    for name, peak in PEAK_BF16_FLOPS.items():
        if name in device.upper():
            return peak
    return None


def computed_tokens(server: dict[str, Any]) -> int | None:
    deltas = (server.get("server_metrics") or {}).get("deltas") or {}
    if "decision_computed_tokens_total" in deltas:
        return int(deltas["decision_computed_tokens_total"])
    tokens = server.get("tokens") or {}
    if tokens.get("server_input_tokens") is None:
        return None
    return int(tokens["server_input_tokens"] - (tokens.get("server_cached_tokens") or 0))


def row(name: str, report: dict[str, Any], parameters: int | None, device: str, commit: str) -> dict[str, Any]:
    match = _NAME.match(name)
    assert match is not None
    server = report["servers"]["A"]
    workload = report["workload"]
    # An open loop has no concurrency of its own: its row gives the bound on requests in flight.
    concurrency = workload.get("max_outstanding") if workload.get("rate") else workload["concurrency"]
    seconds = server["seconds"]
    tokens = computed_tokens(server)
    tokens_per_s = tokens / seconds if tokens is not None and seconds else None
    peak = peak_flops(device)
    mfu = tokens_per_s * 2 * parameters / peak if tokens_per_s is not None and parameters and peak else None
    latency = server["latency_ms"]
    return {
        "workload": match["workload"],
        "concurrency": concurrency,
        "questions_per_s": server["questions_per_s"],
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "prompt_tokens_per_s": round(tokens_per_s, 1) if tokens_per_s is not None else None,
        "mfu": round(mfu, 5) if mfu is not None else None,
        # The share of the run the shard's model thread sat idle between batches (decision_shard_idle_seconds).
        "device_idle_fraction": (server.get("server_metrics") or {}).get("shard_idle_fraction"),
        "device": device,
        "commit": commit,
    }


def summarize(
    folder: Path, configs: dict[str, Path], default_config: Path | None, device: str, commit: str
) -> list[dict[str, Any]]:
    """One row per decision-bench report in `folder`, in WORKLOADS order; `configs` maps a workload to its model."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        if not isinstance(report, dict) or not str(report.get("tool", "")).startswith("decision-bench"):
            continue
        match = _NAME.match(path.stem)
        assert match is not None
        config = configs.get(match["workload"], default_config)
        parameters = non_embedding_parameters(_read_config(config)) if config is not None else None
        rows.append(row(path.stem, report, parameters, device, commit))
    order = {name: number for number, name in enumerate(WORKLOADS)}
    rows.sort(key=lambda r: (order.get(r["workload"], len(order)), r["workload"], r["concurrency"] or 0))
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| workload | C | questions/s | p50 ms | p99 ms | prompt tokens/s | MFU | device idle | device | commit |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        mfu = f"{r['mfu'] * 100:.2f} %" if r["mfu"] is not None else "n/a"
        cells = [r["workload"], r["concurrency"], r["questions_per_s"], r["p50_ms"], r["p99_ms"]]
        idle = f"{r['device_idle_fraction'] * 100:.1f} %" if r.get("device_idle_fraction") is not None else None
        cells += [r["prompt_tokens_per_s"], mfu, idle, r["device"], r["commit"]]
        lines.append("| " + " | ".join("n/a" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def _read_config(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-summary", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("folder", type=Path, help="Where the decision-bench reports are; summary.json goes there")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="[WORKLOAD=]PATH",
        help="The model (folder or config.json) of every workload, or of one (8x2048-8b=PATH); repeatable",
    )
    parser.add_argument("--device", default="", help="The card as nvidia-smi names it (default: torch's, else cpu)")
    parser.add_argument("--commit", default="unknown", help="The commit the run measured")
    args = parser.parse_args(argv)
    configs: dict[str, Path] = {}
    default: Path | None = None
    for item in args.config:
        name, _, path = item.rpartition("=")
        if name:
            configs[name] = Path(path)
        else:
            default = Path(path)
    rows = summarize(args.folder, configs, default, args.device or _torch_device(), args.commit)
    (args.folder / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(markdown(rows))
    return 0


def _torch_device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return "cpu"


if __name__ == "__main__":
    sys.exit(main())
