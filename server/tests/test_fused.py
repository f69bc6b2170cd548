"""The half-precision elementwise chains fused by torch.compile (`fused`): when they run, that they compute what
the eager chains compute up to bfloat16 rounding (and no further from float32 math), that a failure to compile
falls back to eager, and that a model reading through them keeps its labels."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from decision_server import fused
from decision_server.decoder import _gated, _half_norm, _rotate, _rotate_form
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def eager_after() -> Iterator[None]:
    yield
    fused.disable()


def test_cli_compile_modes_are_the_module_ones() -> None:
    from decision_server.cli import build_parser

    parser = build_parser()
    (serve,) = [action for action in parser._subparsers._group_actions if action.dest == "command"]  # type: ignore[union-attr]
    option = next(a for a in serve.choices["serve"]._actions if a.dest == "compile")  # type: ignore[index]
    assert tuple(option.choices) == fused.COMPILE_MODES
    assert option.default == "auto"
    with pytest.raises(ValueError, match="compile mode must be one of auto, off"):
        fused.enable("on", torch.bfloat16, CPU)


def test_only_half_precision_on_cpu_is_compiled() -> None:
    assert not fused.enable("off", torch.bfloat16, CPU)
    assert not fused.enable("auto", torch.float32, CPU)
    assert not fused.enabled()
    assert fused.enable("auto", torch.bfloat16, CPU)
    assert fused.enabled()
    x = torch.randn(8, 64)
    calls: list[int] = []

    def spy(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.shape[0])
        return t * 2

    # float32 and single rows never reach torch.compile: the eager function runs (and sees the call).
    assert torch.equal(fused.call(spy, x), x * 2)
    assert torch.equal(fused.call(spy, x[:1].bfloat16()), (x[:1] * 2).bfloat16())
    assert calls == [8, 1]


def test_a_machine_that_cannot_compile_runs_the_chains_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("Compiler: g++ not found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    with caplog.at_level(logging.WARNING, logger="decision_server.fused"):
        assert not fused.enable("auto", torch.bfloat16, CPU)
    assert not fused.enabled()
    # Only the shard's own record: a process's first compile also logs torch's trace records at DEBUG.
    (record,) = [r for r in caplog.records if r.name == "decision_server.fused"]
    assert "inductor cannot build kernels here" in record.getMessage()
    assert "g++ not found" in record.fields["error"]  # type: ignore[attr-defined]


def test_a_chain_that_fails_at_a_read_falls_back_to_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert fused.enable("auto", torch.bfloat16, CPU)

    def broken(*_args: object) -> torch.Tensor:
        raise RuntimeError("BackendCompilerFailed")

    monkeypatch.setitem(fused._twins, _half_norm, broken)
    x, weight = torch.randn(6, 32).bfloat16(), torch.rand(32).bfloat16()
    with caplog.at_level(logging.WARNING, logger="decision_server.fused"):
        out = fused.call(_half_norm, x, weight, 1e-6)
    assert torch.equal(out, _half_norm(x, weight, 1e-6))
    assert not fused.enabled()
    # Only the shard's own record: a process's first compile also logs torch's trace records at DEBUG.
    (record,) = [r for r in caplog.records if r.name == "decision_server.fused"]
    assert record.fields == {"chain": "_half_norm", "error": "RuntimeError: BackendCompilerFailed"}  # type: ignore[attr-defined]


def _ulps(out: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest distance of `out` from `exact`, in units of bfloat16's spacing at each element's `scale` (the
    magnitude of the terms it sums: a difference of two close products is judged by the products' size)."""
    return float(((out.double() - exact) / (scale.clamp_min(1e-30) * 2.0**-8)).abs().max())


Chain = tuple[object, tuple[object, ...], torch.Tensor, torch.Tensor, object]


def _chains(tokens: int) -> dict[str, Chain]:
    """Each chain's function, bfloat16 arguments, its float64 value on those arguments with the scale of each
    element (`_ulps`), and its compiled form."""
    generator = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, 256, generator=generator).bfloat16()
    weight = (torch.rand(256, generator=generator) + 0.5).bfloat16()
    wide = hidden.double()
    norm = weight.double() * wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)
    # Rotary on a strided (tokens, heads, head_dim) view of a packed projection, as attention calls it.
    packed = torch.randn(tokens, 4 * 64 + 64, generator=generator).bfloat16()
    heads = packed[:, : 4 * 64].view(tokens, 4, 64)
    angles = torch.rand(tokens, 32, generator=generator, dtype=torch.float64) * 6
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1), torch.cat((angles.sin(), angles.sin()), -1)
    first, second = heads.double()[..., :32], heads.double()[..., 32:]
    c, s = cos[:, None, :32], sin[:, None, :32]
    rotated = torch.cat((first * c - second * s, second * c + first * s), -1)
    rotated_scale = torch.cat(((first * c).abs() + (second * s).abs(), (second * c).abs() + (first * s).abs()), -1)
    gate_up = torch.randn(tokens, 2 * 128, generator=generator).bfloat16()
    gate, up = gate_up.double().chunk(2, -1)
    gated = F.silu(gate) * up
    return {
        "norm": (_half_norm, (hidden, weight, 1e-6), norm, norm.abs(), None),
        "rotary": (_rotate, (heads, cos.bfloat16(), sin.bfloat16()), rotated, rotated_scale, _rotate_form),
        "gated": (_gated, (gate_up, F.silu), gated, gated.abs(), None),
    }


@pytest.mark.parametrize("tokens", [2, 37, 300])
@pytest.mark.parametrize("chain", ["norm", "rotary", "gated"])
def test_compiled_chains_equal_eager_up_to_bfloat16_rounding(tokens: int, chain: str) -> None:
    """Within two bfloat16 spacings of eager everywhere, and no further from the float64 value than eager."""
    fn, args, exact, scale, form = _chains(tokens)[chain]
    eager = fn(*args)  # type: ignore[operator]
    if form is not None:
        assert torch.equal(form(*args), eager)  # type: ignore[operator]  (the compiler's form is the same math)
    assert fused.enable("auto", torch.bfloat16, CPU)
    compiled = fused.call(fn, *args, form=form)  # type: ignore[arg-type]
    assert fused.enabled(), "the compiled chain failed and fell back to eager"
    assert compiled.dtype == eager.dtype == torch.bfloat16 and compiled.shape == eager.shape
    assert _ulps(compiled, eager.double(), scale) <= 2.0
    assert _ulps(compiled, exact, scale) <= _ulps(eager, exact, scale) + 1e-9


@pytest.fixture(scope="module")
def tiny_bfloat16(tiny_qwen3_dir: Path) -> object:
    return load_model(tiny_qwen3_dir, LoadOptions(dtype="bfloat16", threads=2))


def test_a_model_reads_through_the_compiled_chains_without_recompiling(tiny_bfloat16: object) -> None:
    """Tree reads of other lengths after the first reuse the compiled kernels (a recompile would cost a read
    seconds), and their labels stay within bfloat16 rounding of the eager read's."""
    from torch._dynamo.utils import counters

    from decision_server.engines.types import ReadSpec

    model = tiny_bfloat16
    engine = TreeEngine(model)  # type: ignore[arg-type]

    def reads(state: int, questions: int) -> list[ReadSpec]:
        prompt = tuple(range(3, 3 + state))
        return [ReadSpec(id=i, prompt=(*prompt, 40 + i, 41), labels=((7,), (8, 9), (10,))) for i in range(questions)]

    eager = [engine.run(reads(state, 4)).outcomes for state in (60, 130)]
    assert fused.enable("auto", torch.bfloat16, CPU)
    before = counters["stats"]["unique_graphs"]
    engine.run(reads(20, 2))  # compiles every chain
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > before, "the model's chains did not go through torch.compile"
    batches = [engine.run(reads(state, 4)) for state in (60, 130)]
    # A state of 60+ tokens and its questions are one pass on the decoder (`TreeAfterPast.lead`), not two.
    assert [batch.forward_passes for batch in batches] == [1, 1]
    compiled = [batch.outcomes for batch in batches]
    assert counters["stats"]["unique_graphs"] == graphs, "a read of another length compiled again"
    assert fused.enabled()
    for before, after in zip(eager, compiled, strict=True):
        for a, b in zip(before, after, strict=True):
            assert a.label_logprobs == pytest.approx(b.label_logprobs, abs=0.05)


def test_the_shard_info_says_whether_the_chains_run_compiled(
    tiny_bfloat16: object, shard: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GET /info`'s `compiled_chains` comes from the shard's Info, read live: eager, compiled, then eager again
    after a chain failed at a read."""
    from decision_server.pb import decision_pb2

    def compiled(stub: Any) -> bool:
        return bool(stub.Info(decision_pb2.InfoRequest(), timeout=30).compiled_chains)

    with shard(tiny_bfloat16, "tree") as stub:
        assert not compiled(stub)  # loaded with the library default, --compile off
        assert fused.enable("auto", torch.bfloat16, CPU)
        assert compiled(stub)

        def broken(*_args: object) -> torch.Tensor:
            raise RuntimeError("BackendCompilerFailed")

        monkeypatch.setitem(fused._twins, _half_norm, broken)
        fused.call(_half_norm, torch.randn(6, 32).bfloat16(), torch.rand(32).bfloat16(), 1e-6)
        assert not compiled(stub)
