"""float32 linear layers computed by bfloat16 GEMMs (`--matmul split`).

A float32 activation `x` is the sum of two bfloat16 numbers, `hi = bf16(x)` and `lo = bf16(x - hi)`, up to
2^-16 of |x|. A weight read from a bfloat16 checkpoint is exact in bfloat16; any other weight is split the same
way. Every product of two bfloat16 numbers is exact in float32, so

    x @ W.T  ~  hi @ W_hi.T + lo @ W_hi.T (+ hi @ W_lo.T when the weight needed two parts)

summed in float32 is close to float32-grade: at the decoder's shapes outputs land within about 1.3e-5 of a float64
product, against 3.5e-6 for MKL's float32 GEMM and 0.009 for a bfloat16 GEMM: 6-15x MKL's error on Intel AMX, 10-22x
on an AVX2 Zen 3 (whose MKL sums more exactly; the split's own rounding is the same everywhere), and a thousandth of
bfloat16's, also with activations spanning six decades (tests/test_split_gemm.py). Where the CPU multiplies
bfloat16 in hardware (AMX) the two GEMMs together take well under the time of one float32 GEMM.

The GEMM is MKL's `cblas_gemm_bf16bf16f32` (bfloat16 inputs, float32 sums and output), from the MKL that torch
itself links: PyPI's x86 torch exports MKL's CBLAS from `libtorch_cpu`, so nothing else is installed or compiled.
It runs on torch's OpenMP threads (`torch.set_num_threads` also sets MKL's). Where the symbol is missing (a torch
built without MKL, or not for x86) `available()` is false and `--matmul` cannot pick `split`.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import torch

_ROW_MAJOR = 101  # CBLAS_LAYOUT
_NO_TRANS = 111  # CBLAS_TRANSPOSE
_TRANS = 112
_INT32_MAX = 2**31 - 1  # MKL's LP64 interface takes 32-bit dimensions


@functools.cache
def _gemm() -> Any:
    """MKL's `cblas_gemm_bf16bf16f32` as torch's own `libtorch_cpu` exports it, or None."""
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        function = ctypes.CDLL(library).cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    integer, pointer = ctypes.c_int, ctypes.c_void_p
    function.restype = None
    function.argtypes = [
        integer, integer, integer,  # layout, transa, transb
        integer, integer, integer,  # m, n, k
        ctypes.c_float, pointer, integer,  # alpha, a, lda
        pointer, integer,  # b, ldb
        ctypes.c_float, pointer, integer,  # beta, c, ldc
    ]  # fmt: skip
    return function


def available() -> bool:
    """Whether this torch carries MKL's bfloat16 GEMM with float32 sums."""
    return _gemm() is not None


def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous float32 `x` as contiguous bfloat16 `hi` and `lo`, `hi + lo` within 2^-16 of |x|."""
    hi = x.to(torch.bfloat16)
    rest = hi.float()
    # In place into hi's float32 copy: 3.7x faster than `x - hi` (mixed dtypes, a fresh tensor) at 862 x 1024.
    torch.sub(x, rest, out=rest)
    return hi, rest.to(torch.bfloat16)


class SplitWeight:
    """A float32 linear weight (out_features, in_features) held as one bfloat16 part (a bfloat16 checkpoint's
    weights are exact in bfloat16) or two whose sum is the weight within 2^-16 of each element."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"a split weight is a 2-D float32 CPU tensor, got {weight.dtype} {tuple(weight.shape)}")
        if max(weight.shape) > _INT32_MAX:
            raise ValueError(f"weight shape {tuple(weight.shape)} exceeds MKL's 32-bit dimensions")
        hi, lo = halves(weight.contiguous())
        self.parts = (hi, lo) if bool(lo.any()) else (hi,)
        self.out_features, self.in_features = (int(size) for size in weight.shape)

    @property
    def nbytes(self) -> int:
        return sum(int(part.nbytes) for part in self.parts)


def split_linear(x: torch.Tensor, weight: SplitWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` in float32 from bfloat16 GEMMs: hi·W_hi + lo·W_hi (+ hi·W_lo), summed by MKL in float32."""
    gemm = _gemm()
    if gemm is None:
        raise RuntimeError("--matmul split needs MKL's cblas_gemm_bf16bf16f32, which this torch does not export")
    if x.dtype != torch.float32:
        raise ValueError(f"--matmul split multiplies float32 activations, got {x.dtype}")
    k, n = weight.in_features, weight.out_features
    if x.shape[-1] != k:
        raise ValueError(f"activation width {x.shape[-1]} does not match the weight's {k} input features")
    rows = x.reshape(-1, k).contiguous()
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    if k == 0:
        out.zero_()
    else:
        if m > _INT32_MAX:
            raise ValueError(f"{m} rows exceed MKL's 32-bit dimensions")
        hi, lo = halves(rows)
        products = [(hi, weight.parts[0]), (lo, weight.parts[0])]
        if len(weight.parts) > 1:
            products.append((hi, weight.parts[1]))
        for index, (a, b) in enumerate(products):
            beta = 0.0 if index == 0 else 1.0
            gemm(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, a.data_ptr(), k, b.data_ptr(), k, beta, out.data_ptr(), n)
    if bias is not None:
        out.add_(bias)
    return out.reshape(*x.shape[:-1], n)
