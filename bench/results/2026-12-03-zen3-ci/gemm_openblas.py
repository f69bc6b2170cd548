# MKL, oneDNN and numpy's bundled OpenBLAS float32 GEMMs at the decoder's shapes.
# Run: .venv/bin/python gemm_openblas.py
import ctypes
import glob
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "2026-12-02-per-token"))
from rates import median_seconds  # two warm-up calls, then the median

torch.set_num_threads(2)
lib = ctypes.CDLL(
    glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas64_*.so"))[0]
)
lib.scipy_openblas_set_num_threads64_(ctypes.c_int(2))
lib.scipy_openblas_get_corename64_.restype = ctypes.c_char_p
lib.scipy_openblas_get_config64_.restype = ctypes.c_char_p
print(lib.scipy_openblas_get_corename64_(), lib.scipy_openblas_get_config64_())
g = lib.scipy_cblas_sgemm64_
L = ctypes.c_int64
g.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    L,
    L,
    L,
    ctypes.c_float,
    ctypes.c_void_p,
    L,
    ctypes.c_void_p,
    L,
    ctypes.c_float,
    ctypes.c_void_p,
    L,
]


def ob(x, w, out):
    m, k = x.shape
    n = w.shape[0]
    g(101, 111, 112, m, n, k, 1.0, x.data_ptr(), k, w.data_ptr(), k, 0.0, out.data_ptr(), n)
    return out


shapes = [
    (862, 1024, 2048),
    (862, 1024, 1024),
    (862, 2048, 1024),
    (862, 1024, 3072),
    (862, 3072, 1024),
    (862, 1024, 6144),
    (100, 1024, 6144),
]


def med(f):
    return median_seconds(f, runs=9)


with torch.inference_mode():
    for m, k, n in shapes:
        x = torch.randn(m, k)
        w = torch.randn(n, k) * k**-0.5
        out = torch.empty(m, n)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        fl = 2 * m * k * n / 1e9
        a = med(lambda x=x, w=w: torch.nn.functional.linear(x, w))
        c = med(lambda x=x, packed=packed: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
        b = med(lambda x=x, w=w, out=out: ob(x, w, out))
        ref = x.double() @ w.double().T
        e1 = (torch.nn.functional.linear(x, w).double() - ref).abs().max().item()
        e2 = (ob(x, w, out).double() - ref).abs().max().item()
        print(
            f"{m}x{k}x{n}: mkl {fl / a:6.1f}  onednn {fl / c:6.1f}  openblas {fl / b:6.1f} GF/s  "
            f"ob/mkl {a / b:.2f}  err mkl {e1:.1e} ob {e2:.1e}"
        )
