"""Tensor-parallel building blocks: column- and row-parallel linear layers, a vocabulary-parallel embedding and
LM head, and label log-probabilities over the full vocabulary computed without ever gathering the logits.
At world size 1 each layer is the plain layer and each collective a no-op."""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from decision_server import choices, split_gemm
from decision_server.checkpoint import Checkpoint
from decision_server.distributed import ShardGroup

# Set to 1 to keep bfloat16 weights in torch's plain layout on CPU (F.linear), e.g. to compare the two paths.
PLAIN_MATMUL_ENV = "DECISION_PLAIN_MATMUL"
# How float32 linear layers multiply on CPU (`--matmul`), from the most exact to the least: "exact" sums like
# transformers' own forward (MKL's float32 GEMM), "fast" runs oneDNN's prepacked float32 GEMM (the kernel vLLM's
# CPU backend uses), "split" runs two bfloat16 GEMMs on each activation's high and low bfloat16 parts with float32
# sums (`split_gemm`); "auto" times them on this CPU at load (`resolve_matmul`).
MATMUL_MODES = choices.MATMUL_MODES
# How bfloat16 and float16 linear layers multiply on CPU: "exact" runs oneDNN's prepacked half-precision GEMM (the
# kernel vLLM's CPU backend runs), "widen" holds the weights widened to float32 (exactly: every half-precision value
# is a float32 value) and runs MKL's float32 GEMM on the activations widened the same way, rounding its output to the
# model's dtype. Both multiply the same half-precision values and sum in float32; only the order of the sums differs.
# Where bfloat16 has no faster multiplier than float32 (an Intel Xeon without AMX: oneDNN's AVX512-BF16 kernel ran
# 170 GFLOP/s against float32's 305; an AVX2-only CPU, where F.linear converts the weight on every call) widening
# is the faster GEMM, at twice the weights' memory.
HALF_MATMUL_MODES = choices.HALF_MATMUL_MODES
MATMUL_CHOICES = choices.MATMUL_CHOICES
# `--matmul auto` widens half-precision weights only when the float32 copies' extra bytes are at most this share of
# the memory free at load, so a large model never trades its prefix cache (or the machine) for a faster GEMM.
WIDEN_MEMORY_SHARE = 0.5
# `--matmul auto` on a CPU leaves a mode for a less exact one only when that is faster by this factor on
# `probe_matmul`: a near tie keeps the more exact sums. It narrows, but cannot close, the band where the probe picks
# differently between loads: on an AVX2 Zen 3 where oneDNN ran about 1.07x MKL, loads picked `fast` 14 times in 20
# (ratios 0.99-1.20), and timing 15 rounds instead of 5 did not settle it (9 in 15 one run, 15 in 15 another), so
# the noise is the load's, not the rounds' (bench/results/2026-12-03-zen3-ci/). Both modes keep the decisions;
# `--matmul exact` pins the sums.
FAST_MARGIN = 1.05
# The probe's GEMM: this many rows (a typical pass) of the model's widest linear, its weight capped at this many
# elements (out_features shrinks first) so a large model's probe stays under a second.
PROBE_ROWS = 512
PROBE_MAX_WEIGHT = 1 << 23
PROBE_MAX_FEATURES = 4096
# oneDNN builds (JIT-compiles) a GEMM kernel for every row count it meets and caches it. With AMX (half-precision
# weights on an Intel Xeon with AMX tiles, whose tiles hold 16 rows) the first call at a new count took 6-16 ms more
# per decoder shape, and a bfloat16 tree read at a new token count 1.045x one at a count seen before; every served
# request packs a new count. There passes run their GEMMs at a multiple of this many rows (`gemm_rows`): at a new count
# a read took 1,513 ms against 1,600 without (1.058x, bench/results/2026-12-05-amx/). With AVX-512 kernels (Zen 4) a
# new count cost 0.2-1.3 ms per shape and the padding rows more than that (0.990x, bench/results/2026-12-05-zen4/), so
# only AMX passes are bucketed (`amx_row_buckets`).
ROW_BUCKET = 16

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MatmulProbe:
    """Seconds of one GEMM on this CPU's threads in each `--matmul` mode that can run here for the model's dtype (the
    fastest of a few rounds; `exact` always), the shape timed and the dtype."""

    seconds: dict[str, float]
    shape: tuple[int, int, int]  # rows, in_features, out_features
    dtype: str = "float32"

    @property
    def choice(self) -> str:
        """The fastest mode, where each step away from `exact` (`MATMUL_MODES`' order in float32) buys at least
        FAST_MARGIN."""
        best = "exact"
        for mode in (*MATMUL_MODES[1:], *HALF_MATMUL_MODES[1:]):
            if mode in self.seconds and self.seconds[mode] * FAST_MARGIN < self.seconds[best]:
                best = mode
        return best

    def kept_with(self, record: Path | None) -> tuple[MatmulProbe, int]:
        """This probe with each mode's fastest time among it and the earlier probes of the same GEMM on this machine
        that `record` (a JSON file) keeps, and how many probes that is; `record` is updated. Noise only ever adds
        time, so the fastest time seen is the fairest, and a shard loading beside busy neighbours cannot pick by
        their noise once a quiet load was timed: on an AMX machine a load beside three others timed exact 80, fast
        64 and split 88 ms where a quiet one timed 14.5, 15.2 and 7.1, and ran `fast` at 0.73x `split`'s speed
        (bench/results/2026-12-03-amx-fused/). The key is the CPU (model and flags), torch's version, the thread
        count and the shape, so another CPU, build or thread count times afresh. An unreadable record is started
        anew; one that cannot be written is left as it was."""
        if record is None:
            return self, 1
        key = _probe_key(self)
        try:
            kept = json.loads(record.read_text())
            if not isinstance(kept, dict):
                kept = {}
        except (OSError, ValueError):
            kept = {}
        earlier = kept.get(key) if isinstance(kept.get(key), dict) else {}
        seconds = dict(self.seconds)
        for mode, value in (earlier.get("seconds") or {}).items():
            if mode in seconds and isinstance(value, (int, float)) and value > 0:
                seconds[mode] = min(seconds[mode], float(value))
        probes = int(earlier.get("probes") or 0) + 1
        updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kept[key] = {"seconds": seconds, "probes": probes, "updated": updated}
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            partial = record.with_name(f"{record.name}.{os.getpid()}.tmp")
            partial.write_text(json.dumps(kept, indent=1, sort_keys=True))
            os.replace(partial, record)
        except OSError as error:
            logger.warning("matmul auto: cannot keep the probe's times in %s: %s", record, error)
        return MatmulProbe(seconds, self.shape, self.dtype), probes


def mkl_kernels() -> str:
    """Which kernels Intel MKL (torch's float32 GEMMs and the products inside its CPU attention) runs in this process:
    "instruction sets" where it chooses by the CPU's instruction sets (an Intel CPU, or any CPU with the launcher's
    libdecision_mkl_dispatch.so preloaded: `--mkl-dispatch`), "generic" where it takes its path for other vendors
    (about half the speed on an AMD CPU with AVX-512), "none" without MKL.

    MKL asks `mkl_serv_intel_cpu_true`, which torch's libtorch_cpu exports; the process's global symbol scope answers
    with the preloaded definition first, as MKL's own calls do."""
    if not torch.backends.mkl.is_available():
        return "none"
    for library in (None, str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")):
        try:
            question = ctypes.CDLL(library).mkl_serv_intel_cpu_true
        except (AttributeError, OSError):
            continue
        question.restype = ctypes.c_int
        return "instruction sets" if question() else "generic"
    return "none"


def _probe_key(probe: MatmulProbe) -> str:
    """What a probe's times depend on besides the weather: the CPU, torch's build, MKL's kernels, the threads, the
    GEMM's shape."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    cpu = fields.get("model name") or platform.processor() or platform.machine()
    family = f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    flags = hashlib.sha256(fields.get("flags", "").encode()).hexdigest()[:12]
    rows, k, n = probe.shape
    threads = torch.get_num_threads()
    dtype = "" if probe.dtype == "float32" else f" | {probe.dtype}"  # float32 keys as before half probes existed
    return (
        f"{cpu} ({family}, flags {flags}) | torch {torch.__version__} | MKL {mkl_kernels()} | {threads} threads"
        f" | {rows}x{k}x{n}{dtype}"
    )


def probe_matmul(
    in_features: int,
    out_features: int,
    rows: int = PROBE_ROWS,
    rounds: int = 5,
    bfloat16_weights: bool = True,
    dtype: torch.dtype = torch.float32,
) -> MatmulProbe | None:
    """Times MKL's `F.linear` against oneDNN's prepacked GEMM and the bfloat16 split GEMM on random float32 data of
    the given linear's shape (capped: `PROBE_MAX_FEATURES`, `PROBE_MAX_WEIGHT`), or for a bfloat16/float16 `dtype`
    its own GEMM (`exact`) against the widened one (`widen`), the modes taking turns; each
    mode's time is its fastest round, since noise from the rest of the machine only ever adds time (medians of 3
    picked the slower GEMM once in 9 probes on a busy 2-core VM; minima of 5 never did,
    bench/results/2026-12-02-zen4/). `bfloat16_weights`: the checkpoint's weights are exact in bfloat16, so a split
    weight is one part (else two, and a third GEMM). None where neither oneDNN nor MKL's bfloat16 GEMM is available
    (or `DECISION_PLAIN_MATMUL=1` keeps weights plain), so only `exact` can run."""
    if os.environ.get(PLAIN_MATMUL_ENV) == "1":
        return None
    onednn, split = torch.backends.mkldnn.is_available(), split_gemm.available()
    if dtype == torch.float32 and not (onednn or split):
        return None
    k = min(in_features, PROBE_MAX_FEATURES)
    n = max(1, min(out_features, PROBE_MAX_FEATURES, PROBE_MAX_WEIGHT // k))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=generator)
    weight = torch.randn(n, k, generator=generator) * k**-0.5
    if bfloat16_weights:
        weight = weight.to(torch.bfloat16).float()
    runs: dict[str, Callable[[], torch.Tensor]] = {}
    if dtype != torch.float32:
        x, weight = x.to(dtype), weight.to(dtype)
        held = {mode: pack_for_matmul(weight, mode) for mode in HALF_MATMUL_MODES}
        for mode in HALF_MATMUL_MODES:
            runs[mode] = lambda mode=mode: matmul(x, held[mode])
    else:
        runs["exact"] = lambda: F.linear(x, weight)
        if onednn:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            runs["fast"] = lambda: matmul(x, packed)
        if split:
            parts = split_gemm.SplitWeight(weight)
            runs["split"] = lambda: split_gemm.split_linear(x, parts)
    seconds: dict[str, list[float]] = {mode: [] for mode in runs}
    with torch.inference_mode():
        for run in runs.values():
            run()  # first calls allocate and pick kernels
        for round_index in range(rounds):
            for mode in runs if round_index % 2 == 0 else reversed(runs):
                started = time.perf_counter()
                runs[mode]()
                seconds[mode].append(time.perf_counter() - started)
    fastest = {mode: min(times) for mode, times in seconds.items()}
    return MatmulProbe(fastest, (rows, k, n), str(dtype).removeprefix("torch."))


def check_matmul(mode: str) -> None:
    """Raises `ValueError` unless `mode` is a `--matmul` choice."""
    if mode not in MATMUL_CHOICES:
        raise ValueError(f"matmul mode must be one of {', '.join(MATMUL_CHOICES)}, got {mode!r}")


def resolve_matmul(
    mode: str,
    device_type: str = "cpu",
    dtype: torch.dtype = torch.float32,
    shape: tuple[int, int] = (PROBE_MAX_FEATURES, PROBE_MAX_FEATURES),
    group: ShardGroup | None = None,
    bfloat16_weights: bool = True,
    record: Path | None = None,
    widen_fits: bool = True,
) -> str:
    """`auto` → the fastest GEMM measured on this CPU for `dtype` (`probe_matmul` at the model's widest linear
    `shape`, (in_features, out_features); `bfloat16_weights`: the checkpoint stores its linears in bfloat16), else
    `mode` unchanged. In bfloat16 or float16, auto compares the dtype's own GEMM with the widened one, and widens only
    where `widen_fits` (`widen_fits_memory`).

    Which is fastest depends on the CPU, not its vendor alone: oneDNN's prepacked GEMM ran 1.1-1.75x MKL's on AMD
    CPUs (Zen 3, Zen 4) but 0.92-1.19x by shape on another AVX2-only Zen 3, about 1.16x on an Intel Xeon with AMX,
    and 0.97-1.0x on an Intel Xeon without AMX; the bfloat16 split GEMM 1.8-3.1x MKL's on an Intel Xeon with AMX
    and a loss wherever bfloat16 is not at least twice float32 (bench/results/JOURNAL.md, docs/benchmarks.md), so
    it is measured at load. Every mode keeps the decisions (docs/benchmarks.md, "Defaults that win"); `exact` sums
    like transformers. Off the CPU, and for other dtypes (bfloat16 linears are always prepacked), the mode changes
    nothing and auto is `exact` without a probe. The ranks of a `group` each time their own share and then run
    one mode: the most exact of the modes they chose. `record`: a file that keeps each mode's fastest time across
    loads (`MatmulProbe.kept_with`), so that a load beside busy neighbours decides by the quiet times seen before.
    `widen` on a float32 model is a `ValueError`: there is nothing to widen.
    """
    check_matmul(mode)
    half = dtype in (torch.bfloat16, torch.float16)
    if mode == "widen" and not half:
        raise ValueError(
            f"--matmul widen applies to bfloat16 and float16 models (their weights widened to float32); this model "
            f"runs in {str(dtype).removeprefix('torch.')}: use --matmul auto, exact, fast or split"
        )
    if mode != "auto":
        return mode
    if device_type != "cpu" or not (half or dtype == torch.float32) or (half and not widen_fits):
        return "exact"
    modes = HALF_MATMUL_MODES if half else MATMUL_MODES
    timed = probe_matmul(*shape, bfloat16_weights=bfloat16_weights, dtype=dtype)
    probe, probes = (None, 0) if timed is None else timed.kept_with(record)
    choice = "exact" if probe is None else probe.choice
    if group is not None and group.world_size > 1:
        vote = torch.tensor([modes.index(choice)], dtype=torch.int64)
        choice = modes[int(group.all_reduce_min(vote).item())]
    if probe is None or timed is None:
        return choice
    logger.info(
        f"matmul auto: timed the {probe.dtype} GEMMs on this CPU",
        extra={
            "fields": {
                **{f"{name}_ms": round(seconds * 1e3, 2) for name, seconds in probe.seconds.items()},
                "this_load_ms": {name: round(seconds * 1e3, 2) for name, seconds in timed.seconds.items()},
                "probes": probes,
                "record": None if record is None else str(record),
                "shape": list(probe.shape),
                "dtype": probe.dtype,
                "bfloat16_weights": bfloat16_weights,
                "margin": FAST_MARGIN,
                "measured_fastest": probe.choice,
                "matmul": choice,
            }
        },
    )
    return choice


def widen_fits_memory(extra_bytes: int, free_bytes: int) -> bool:
    """Whether `--matmul auto` may widen half-precision weights whose float32 copies take `extra_bytes` more than the
    weights do, with `free_bytes` free at load (`WIDEN_MEMORY_SHARE`)."""
    return extra_bytes <= WIDEN_MEMORY_SHARE * free_bytes


@dataclass(frozen=True)
class WideWeight:
    """A bfloat16 or float16 linear weight held widened to float32 for `--matmul widen` (exactly: every
    half-precision value is a float32 value); `dtype`, the model's, is what the GEMM's output is rounded to."""

    weight: torch.Tensor
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes)


HeldWeight = torch.Tensor | split_gemm.SplitWeight | WideWeight


def pack_for_matmul(weight: torch.Tensor, mode: str = "exact") -> HeldWeight:
    """`weight` (out, in) in oneDNN's blocked layout, or as bfloat16 parts for "split", or widened to float32 for
    "widen" (bfloat16 and float16 weights), where that pays and keeps the promised numbers, else unchanged.

    bfloat16 is always packed: the prepacked GEMM gives the same numbers as F.linear (which also runs oneDNN,
    repacking the weight on every call) and is faster: 388-418 GFLOP/s against 298-417 for the decoder's shapes
    on 2 Zen 4 cores, most at few rows. float32 is packed only in "fast" mode and split only in "split" mode.
    F.linear (MKL) sums like transformers' own float32 forward (labels within 2e-6 of it); oneDNN's float32 GEMM
    is 1.1-1.75x faster on the decoder's shapes but sums in another order: its labels land 3.2e-5 from a float64
    forward against 2.0e-5 for F.linear's; the split GEMM's outputs land 6-22x further from float64 than MKL's
    (`split_gemm`). So exactness is the default and speed the choice.
    """
    if mode not in MATMUL_CHOICES[1:]:
        raise ValueError(f"matmul mode must be one of {', '.join(MATMUL_CHOICES[1:])}, got {mode!r}")
    if weight.device.type != "cpu" or os.environ.get(PLAIN_MATMUL_ENV) == "1":
        return weight
    if mode == "widen" and weight.dtype in (torch.bfloat16, torch.float16):
        return WideWeight(weight.float(), weight.dtype)
    if mode == "split" and weight.dtype == torch.float32:
        if not split_gemm.available():
            raise RuntimeError("--matmul split needs MKL's bfloat16 GEMM, which this torch build does not export")
        return split_gemm.SplitWeight(weight)
    if not torch.backends.mkldnn.is_available():
        return weight
    if weight.dtype == torch.bfloat16:
        # oneDNN packs bfloat16 only where the CPU converts it natively (AVX-512 BW/VL/DQ or AVX-NE-CONVERT); an
        # AVX2-only CPU keeps F.linear, which runs bfloat16 there (slowly) instead of failing to load.
        packable = bfloat16_packs()
    else:
        packable = weight.dtype == torch.float32 and mode == "fast"
    if not packable:
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def bfloat16_packs() -> bool:
    """Whether this CPU's oneDNN can pack bfloat16 weights."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def half_gemm_is_slow(dtype: torch.dtype) -> bool:
    """Whether `dtype`'s CPU GEMMs are a slow path on this CPU: bfloat16 or float16 where oneDNN has no kernel
    for it (an AVX2-only CPU such as Zen 3: no AVX-512, no AMX). There F.linear converts the weight on every call;
    bfloat16 ran 17-21 GFLOP/s against float32's 104-146 at the decoder's shapes on 2 Zen 3 cores
    (bench/results/2026-12-03-zen3/)."""
    if dtype == torch.bfloat16:
        return not bfloat16_packs()
    if dtype == torch.float16:
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def matmul(x: torch.Tensor, weight: HeldWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for a plain or a `pack_for_matmul` weight."""
    if isinstance(weight, WideWeight):
        wide_bias = None if bias is None else bias.float()
        return F.linear(x.float(), weight.weight, wide_bias).to(weight.dtype)
    if isinstance(weight, split_gemm.SplitWeight):
        return split_gemm.split_linear(x, weight, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _hold(module: nn.Module, weight: torch.Tensor, mode: str) -> None:
    """Stores a linear layer's weight, packed when that pays: a packed tensor or split weight is no parameter (it
    has no storage torch can alias), so it is kept as a plain attribute."""
    packed = pack_for_matmul(weight, mode)
    if _is_packed(packed):
        module.weight = packed
    else:
        module.weight = nn.Parameter(weight, requires_grad=False)


def linear_weight_bytes(module: nn.Module) -> int:
    """Bytes of the packed linear weights under `module` (parameters are counted by their own walk)."""
    return sum(
        int(m.weight.nbytes)
        for m in module.modules()
        if isinstance(m, ColumnParallelLinear | RowParallelLinear) and _is_packed(m.weight)
    )


def amx_row_buckets(module: nn.Module) -> bool:
    """Whether passes over `module` should run their GEMMs at `gemm_rows` rows: where oneDNN multiplies its packed
    half-precision weights in AMX tiles (see ROW_BUCKET)."""
    return torch.cpu._is_amx_tile_supported() and any(
        isinstance(m, ColumnParallelLinear | RowParallelLinear)
        and isinstance(m.weight, torch.Tensor)
        and m.weight.is_mkldnn
        and m.weight.dtype in (torch.bfloat16, torch.float16)
        for m in module.modules()
    )


def gemm_rows(rows: int) -> int:
    """The row count a pass of `rows` tokens runs its oneDNN GEMMs at: `rows` up to ROW_BUCKET (few counts, each
    cached once), else `rows` rounded up to a multiple of ROW_BUCKET."""
    return rows if rows <= ROW_BUCKET else -(-rows // ROW_BUCKET) * ROW_BUCKET


def _is_packed(weight: HeldWeight) -> bool:
    return isinstance(weight, split_gemm.SplitWeight | WideWeight) or weight.is_mkldnn


class ColumnParallelLinear(nn.Module):
    """`x @ W.T + b` for this rank's output features only: the result stays split across ranks.

    Several checkpoint tensors can be fused into one (q/k/v, gate/up): this rank's rows of each, concatenated,
    so one matmul computes all of them.
    """

    weight: HeldWeight

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, matmul: str = "exact") -> None:
        super().__init__()
        self.features = int(weight.shape[0])
        _hold(self, weight, matmul)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def load(
        cls,
        checkpoint: Checkpoint,
        names: Sequence[str],
        ranges: Sequence[tuple[int, int]],
        dtype: torch.dtype,
        device: torch.device,
        bias: bool = False,
        matmul: str = "exact",
    ) -> ColumnParallelLinear:
        """Rows `ranges[i]` of tensor `names[i]` (a `.weight` name), concatenated in order."""
        weights = [
            checkpoint.read(name, dtype, device, dim=0, start=start, end=end)
            for name, (start, end) in zip(names, ranges, strict=True)
        ]
        biases = None
        if bias:
            biases = torch.cat(
                [
                    checkpoint.read(_bias_name(name), dtype, device, dim=0, start=start, end=end)
                    for name, (start, end) in zip(names, ranges, strict=True)
                ]
            )
        return cls(torch.cat(weights) if len(weights) > 1 else weights[0], biases, matmul)

    @property
    def out_features(self) -> int:
        return self.features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """`x @ W.T + b` where this rank holds the input features [start, end) of `x` and the matching columns of
    `W`: the partial products are summed across ranks, then the (whole) bias is added once."""

    weight: HeldWeight

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, group: ShardGroup, matmul: str = "exact"
    ) -> None:
        super().__init__()
        _hold(self, weight, matmul)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.group = group

    @classmethod
    def load(
        cls,
        checkpoint: Checkpoint,
        name: str,
        columns: tuple[int, int],
        group: ShardGroup,
        dtype: torch.dtype,
        device: torch.device,
        bias: bool = False,
        matmul: str = "exact",
    ) -> RowParallelLinear:
        weight = checkpoint.read(name, dtype, device, dim=1, start=columns[0], end=columns[1])
        whole_bias = checkpoint.read(_bias_name(name), dtype, device) if bias else None
        return cls(weight, whole_bias, group, matmul)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = matmul(x, self.weight)
        total = self.group.all_reduce_sum(partial)
        return total + self.bias if self.bias is not None else total


class VocabParallelEmbedding(nn.Module):
    """This rank's rows [start, end) of the embedding table. Each token's vector comes from the one rank that
    owns its row; the others contribute zeros, and a sum across ranks assembles the whole lookup."""

    def __init__(self, weight: torch.Tensor, start: int, rows: int, group: ShardGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start = start
        self.rows = rows  # of the whole table, across ranks
        self.group = group

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.group.world_size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.start
        owned = (local >= 0) & (local < self.weight.shape[0])
        vectors = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        vectors = vectors.masked_fill(~owned.unsqueeze(-1), 0.0)
        return self.group.all_reduce_sum(vectors)


class ParallelLMHead(nn.Module):
    """This rank's vocabulary rows [start, end) of the output projection; logits stay split by vocabulary.

    With tied embeddings the weight is the embedding's own tensor (same rows), so nothing is stored twice.
    """

    def __init__(self, weight: torch.Tensor | nn.Parameter, start: int, rows: int, group: ShardGroup) -> None:
        super().__init__()
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.start = start
        self.rows = rows
        self.group = group

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, end - start) logits of this rank's vocabulary slice, in float32."""
        return F.linear(hidden, self.weight).float()


def vocab_parallel_scores(
    local_logits: torch.Tensor,
    vocab_start: int,
    group: ShardGroup,
    label_rows: Sequence[int],
    label_tokens: Sequence[int],
    greedy_rows: Sequence[int],
) -> tuple[list[float], list[int]]:
    """log_softmax(logits)[label_rows[k], label_tokens[k]] for every k, and argmax(logits[r]) for r in greedy_rows,
    where `logits` (rows, vocab) is split by vocabulary across ranks and this rank holds columns
    [vocab_start, vocab_start + local_logits.shape[1]): `vocab_parallel_score_tensors` copied to the host."""
    device = local_logits.device
    label_logprobs, greedy = vocab_parallel_score_tensors(
        local_logits,
        vocab_start,
        group,
        torch.tensor(list(label_rows), dtype=torch.long, device=device),
        torch.tensor(list(label_tokens), dtype=torch.long, device=device),
        torch.tensor(list(greedy_rows), dtype=torch.long, device=device),
    )
    values: list[float] = label_logprobs.double().tolist()
    tokens: list[int] = greedy.tolist()
    return values, tokens


def vocab_parallel_score_tensors(
    local_logits: torch.Tensor,
    vocab_start: int,
    group: ShardGroup,
    label_rows: torch.Tensor,
    label_tokens: torch.Tensor,
    greedy_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`vocab_parallel_scores` on the device: (labels,) float32 log-probabilities and (greedy rows,) int64 tokens,
    from index tensors already on the logits' device, so nothing here waits for the device (`DecoderModel.launch`).

    Nothing of size vocab crosses ranks: per row, the maximum and the sum of exponentials are all-reduced (so
    each rank knows log Z), each label logit comes from its owner (others add 0), and the greedy token is the
    smallest index holding the global maximum (torch.argmax's tie rule), all-reduced as a minimum.
    """
    logits = local_logits.float()
    width = logits.shape[1]
    rows = logits.shape[0]
    local_max, local_argmax = logits.max(dim=-1)
    global_max = group.all_reduce_max(local_max.clone())
    # A row whose every logit is -inf would give nan here, exactly as log_softmax would.
    sum_exp = torch.exp(logits - global_max.unsqueeze(-1)).sum(dim=-1)
    column = label_tokens - vocab_start
    owned = (column >= 0) & (column < width)
    picked = logits[label_rows, column.clamp(0, width - 1)].masked_fill(~owned, 0.0)
    # One all-reduce carries both sums: the per-row exponentials, then each label's logit.
    totals = group.all_reduce_sum(torch.cat([sum_exp, picked]))
    log_normaliser = global_max + torch.log(totals[:rows])
    label_logprobs = totals[rows:] - log_normaliser[label_rows]

    never = torch.iinfo(torch.int64).max
    candidates = torch.where(
        local_max[greedy_rows] == global_max[greedy_rows],
        local_argmax[greedy_rows] + vocab_start,
        torch.full_like(local_argmax[greedy_rows], never),
    )
    return label_logprobs, group.all_reduce_min(candidates)


def _bias_name(weight_name: str) -> str:
    return weight_name.removesuffix(".weight") + ".bias"
