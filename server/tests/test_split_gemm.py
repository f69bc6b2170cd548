"""`--matmul split`: float32 linears from bfloat16 GEMMs on each activation's high and low parts, against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from decision_server import split_gemm
from decision_server.distributed import ShardGroup
from decision_server.layers import ColumnParallelLinear, RowParallelLinear, linear_weight_bytes, pack_for_matmul
from decision_server.split_gemm import SplitWeight, halves, split_linear

CPU = torch.device("cpu")
BF16_UNIT = 2.0**-8  # bfloat16's rounding error, relative (8 significant bits)
F32_UNIT = 2.0**-24


def _data(rows: int, k: int, n: int, seed: int, bfloat16_weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator) * torch.logspace(-3, 3, k)  # every scale a layer sees
    weight = torch.randn(n, k, generator=generator) * k**-0.5
    return x, (weight.to(torch.bfloat16).float() if bfloat16_weight else weight)


def _bound(x: torch.Tensor, weight: torch.Tensor, residual: float) -> torch.Tensor:
    """Elementwise error bound of a product whose inputs were rounded by `residual` (relative), summed in float32."""
    magnitude = x.abs().double() @ weight.abs().double().T
    return magnitude * (residual + x.shape[-1] * F32_UNIT)


def test_mkl_bfloat16_gemm_ships_with_this_torch() -> None:
    # PyPI's x86 torch exports MKL's CBLAS from libtorch_cpu; were that to change, `--matmul split` would silently
    # drop out of what auto can pick, so a torch upgrade that loses it must fail here first.
    assert split_gemm.available()


def test_halves_sum_to_the_float32_value_within_two_bfloat16_roundings() -> None:
    x, _ = _data(64, 512, 1, seed=0, bfloat16_weight=True)
    hi, lo = halves(x)
    assert hi.dtype == lo.dtype == torch.bfloat16 and hi.is_contiguous() and lo.is_contiguous()
    assert torch.equal(hi, x.to(torch.bfloat16))  # the high part is the bfloat16 rounding itself
    residual = (x.double() - hi.double() - lo.double()).abs()
    assert bool((residual <= BF16_UNIT**2 * x.abs().double()).all())
    assert residual.max() > 0  # float32 has 24 bits: two bfloat16 parts hold 16 of them
    exact = x.to(torch.bfloat16).float()
    assert not bool(halves(exact)[1].float().any())  # a bfloat16 value has nothing left over


@pytest.mark.parametrize("bfloat16_weight", [True, False])
def test_split_linear_is_float32_grade_against_float64(bfloat16_weight: bool) -> None:
    x, weight = _data(97, 1024, 384, seed=1, bfloat16_weight=bfloat16_weight)
    bias = torch.randn(384, generator=torch.Generator().manual_seed(2))
    split = SplitWeight(weight)
    # A bfloat16 checkpoint's weight is one part (two GEMMs); any other weight is two (three GEMMs).
    assert len(split.parts) == (1 if bfloat16_weight else 2)
    assert split.nbytes == len(split.parts) * weight.numel() * 2
    reference = x.double() @ weight.double().T + bias.double()
    ours = split_linear(x, split, bias)
    assert ours.dtype == torch.float32 and ours.shape == (97, 384)
    # Activations (and a float32 weight) rounded to 2^-16, products exact in float32, sums in float32.
    residual = BF16_UNIT**2 * (1 if bfloat16_weight else 3)
    error = (ours.double() - reference).abs()
    assert bool((error <= _bound(x, weight, residual) + 1e-6 * bias.abs().double()).all())
    # The bound has teeth: one bfloat16 GEMM breaks it by far.
    plain_bfloat16 = F.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16()).double()
    assert not bool(((plain_bfloat16 - reference).abs() <= _bound(x, weight, residual)).all())
    # Measured, not just bounded. Two errors add up. The split's own rounding (2^-16 of each input) is the same on
    # every CPU: the parts' products summed in float64 show it. The GEMMs' float32 summation is MKL's and varies by
    # CPU, so it is compared with MKL's own float32 GEMM on this CPU: about as far (0.6-0.8x on an AVX2 Zen 3; a
    # GEMM that rounded or summed in bfloat16 would be thousands of times further).
    # Together 6-15x MKL's error on Intel AMX and 10-22x on the Zen 3 (its MKL sums more exactly there), and about
    # a thousandth of a bfloat16 GEMM's (it once asserted 20x MKL's, which failed on the Zen 3 at 22x).
    hi, lo = halves(x)
    products = [(hi, split.parts[0]), (lo, split.parts[0])] + ([(hi, split.parts[1])] if len(split.parts) > 1 else [])
    rounded = sum(a.double() @ b.double().T for a, b in products) + bias.double()
    mkl = (F.linear(x, weight, bias).double() - reference).abs().max()
    assert (ours.double() - rounded).abs().max() <= 4 * mkl
    assert error.max() * 300 <= (plain_bfloat16 - reference).abs().max()


def test_split_linear_keeps_the_leading_shape_and_refuses_what_it_cannot_multiply() -> None:
    x, weight = _data(12, 64, 40, seed=3, bfloat16_weight=True)
    split = SplitWeight(weight)
    batched = split_linear(x.reshape(3, 4, 64), split)
    assert batched.shape == (3, 4, 40)
    assert torch.equal(batched.reshape(12, 40), split_linear(x, split))
    # A transposed (non-contiguous) activation multiplies as its values, not its memory.
    assert torch.equal(split_linear(x.T.contiguous().T, split), split_linear(x, split))
    assert split_linear(x[:0], split).shape == (0, 40)
    with pytest.raises(ValueError, match="float32 activations"):
        split_linear(x.bfloat16(), split)
    with pytest.raises(ValueError, match="does not match"):
        split_linear(x[:, :32], split)
    with pytest.raises(ValueError, match="2-D float32 CPU tensor"):
        SplitWeight(weight.bfloat16())
    with pytest.raises(ValueError, match="2-D float32 CPU tensor"):
        SplitWeight(weight[0])


def test_split_mode_holds_linear_weights_as_bfloat16_parts() -> None:
    _, weight = _data(9, 64, 96, seed=4, bfloat16_weight=True)
    generator = torch.Generator().manual_seed(5)
    x, bias = torch.randn(9, 64, generator=generator), torch.randn(96, generator=generator)
    column = ColumnParallelLinear(weight, bias, matmul="split")
    row = RowParallelLinear(weight, bias, ShardGroup.single(CPU), matmul="split")
    assert isinstance(column.weight, SplitWeight) and isinstance(row.weight, SplitWeight)
    torch.testing.assert_close(column(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(row(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-5)
    # Counted as the shard's weight bytes: one bfloat16 part each, half of float32.
    assert linear_weight_bytes(column) == weight.numel() * 2
    # Only float32 linears split; bfloat16 ones keep their own (prepacked) GEMM.
    assert not isinstance(pack_for_matmul(weight.bfloat16(), "split"), SplitWeight)


def test_split_mode_needs_mkl_bfloat16_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_gemm, "available", lambda: False)
    with pytest.raises(RuntimeError, match="MKL's bfloat16 GEMM"):
        pack_for_matmul(torch.randn(8, 4), "split")
