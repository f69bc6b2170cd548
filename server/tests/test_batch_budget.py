"""The batch budget: the operator's value, the CPU default, and on CUDA the rule from the memory free after the
weights and the prefix cache; Info reports it, and every read reports its forward passes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import grouped_read

from decision_server import batch_budget
from decision_server.batch_budget import (
    CPU_TOKENS,
    MAX_TOKENS,
    MIN_TOKENS,
    BatchBudget,
    activation_bytes_per_token,
    logit_bytes,
    plan_batch_budget,
)
from decision_server.engines import TreeEngine, make_engine
from decision_server.model_base import LoadedModel
from decision_server.pb import decision_pb2
from decision_server.prefix_cache import CachePlan
from decision_server.read_kinds.next_token import read_specs

GIB = 1 << 30
# Qwen3-0.6B's text config: the model of the GPU check (docs/benchmarks.md).
QWEN3_06B = SimpleNamespace(
    hidden_size=1024,
    intermediate_size=3072,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    num_hidden_layers=28,
)


class FakeModel:
    """What the rule reads of a loaded model; `agree_min` stands for the other ranks of a group."""

    def __init__(self, device: str, others: int | None = None, kv_heads_share: tuple[int, int] = (1, 1)) -> None:
        self.device = torch.device(device)
        self.dtype = torch.bfloat16
        self.text_config = QWEN3_06B
        self.vocab_size = 151936
        self.kv_heads_share = kv_heads_share
        self.others = others
        self.agreed: list[int] = []

    def agree_min(self, value: int) -> int:
        self.agreed.append(value)
        return value if self.others is None else min(value, self.others)


def plan(model: FakeModel, cache: CachePlan, requested: int | None = None) -> BatchBudget:
    fake: Any = model
    loaded: LoadedModel = fake
    return plan_batch_budget(loaded, cache, requested, logit_rows=512)


@pytest.fixture
def free_bytes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Sets what `free_memory_bytes` answers for a CUDA device (this machine has none)."""
    box = {"free": 0}

    def fake_free(device: torch.device) -> int:
        assert device.type == "cuda"
        return box["free"]

    monkeypatch.setattr(batch_budget, "free_memory_bytes", fake_free)
    return box


def test_activation_bytes_follow_the_config() -> None:
    # bfloat16: one layer's widest tensors (4 x 1024 hidden, 48 heads' worth of 128, 3 x 3072 MLP) at 2 bytes, plus
    # 28 layers' keys and values of 8 heads x 128 at 2 bytes.
    assert activation_bytes_per_token(QWEN3_06B, torch.bfloat16) == (4096 + 6144 + 9216) * 2 + 28 * 2 * 8 * 128 * 2
    # An MoE MLP counts the experts a token is routed to when they are wider than the dense size.
    moe = SimpleNamespace(**vars(QWEN3_06B), num_experts_per_tok=8, moe_intermediate_size=768)
    assert (
        activation_bytes_per_token(moe, torch.float32) - activation_bytes_per_token(QWEN3_06B, torch.float32)
        == 3 * (8 * 768 - 3072) * 4
    )
    assert logit_bytes(151936, 512, torch.bfloat16) == 512 * 151936 * 6


def test_the_cuda_budget_comes_from_the_memory_left_and_beats_the_cpu_default(free_bytes: Any) -> None:
    # A 24 GB card with 20 GiB free after the weights and a 6 GiB prefix cache: half of the 14 GiB left, less the
    # logit rows, at 153,600 bytes per packed token.
    free_bytes["free"] = 20 * GIB
    cuda = FakeModel("cuda")
    budget = plan(cuda, CachePlan(6 * GIB, "auto: test"))
    fitted = (7 * GIB - 512 * 151936 * 6) // 153_600
    assert fitted == 45_894
    assert budget.tokens == 45_056, "rounded down to a multiple of 1024"
    assert budget.tokens > plan(FakeModel("cpu"), CachePlan.off("off")).tokens == CPU_TOKENS
    assert budget.rule == (
        "auto on cuda: 45056 tokens (45894 fit in 50% of what the 6144 MiB prefix cache leaves of the 20480 MiB "
        "free after loading, less 445 MiB for 512 logit rows, at 150 KiB per packed token; clamped to "
        "[8192, 131072], rounded down to 1024)"
    )
    assert cuda.agreed == [45_056], "every rank of a group takes part"
    # An 80 GB card (78 GiB free) with Qwen3-0.6B and the auto prefix cache's 30 %: more fits than one forward
    # should hold, so the budget is the ceiling.
    free_bytes["free"] = 78 * GIB
    roomy = plan(FakeModel("cuda"), CachePlan(int(0.3 * 78 * GIB), "auto: test"))
    assert roomy.tokens == MAX_TOKENS
    fitted_80 = int(roomy.rule.split("(")[1].split(" ")[0])
    assert fitted_80 > MAX_TOKENS, roomy.rule


def test_the_cuda_budget_is_clamped_and_agreed_by_every_rank(free_bytes: Any) -> None:
    # Nearly nothing free, or a cache that takes it all: the floor.
    free_bytes["free"] = GIB
    assert plan(FakeModel("cuda"), CachePlan.off("off")).tokens == MIN_TOKENS
    free_bytes["free"] = 40 * GIB
    assert plan(FakeModel("cuda"), CachePlan(50 * GIB, "auto: test")).tokens == MIN_TOKENS
    # A rank holding half the heads holds half of the cache's whole-model budget.
    half = plan(FakeModel("cuda", kv_heads_share=(1, 2)), CachePlan(30 * GIB, "auto: test"))
    whole = plan(FakeModel("cuda"), CachePlan(30 * GIB, "auto: test"))
    assert half.tokens > whole.tokens
    # Another rank with less memory: every rank takes the smallest, and the rule says so.
    grouped = FakeModel("cuda", others=20_480)
    budget = plan(grouped, CachePlan.off("off"))
    assert budget.tokens == 20_480
    assert grouped.agreed[0] > 20_480
    kept = f"; {grouped.agreed[0]} on this rank, the smallest of the tensor-parallel ranks is kept"
    assert budget.rule.endswith(kept), budget.rule


def test_the_operator_value_wins_on_every_device(free_bytes: Any) -> None:
    free_bytes["free"] = 78 * GIB
    for device in ("cuda", "cpu"):
        model = FakeModel(device)
        assert plan(model, CachePlan.off("off"), 3000) == BatchBudget(3000, "--max-batch-prefill-tokens 3000")
        assert model.agreed == [], "every rank got the same flag: nothing to agree on"
    with pytest.raises(ValueError, match="at least 1"):
        plan(FakeModel("cpu"), CachePlan.off("off"), 0)


def test_every_engine_carries_its_budget_and_the_tree_packs_to_it(tiny_qwen3: LoadedModel) -> None:
    auto = make_engine("tree", tiny_qwen3, prefix_cache_mb=0)
    assert isinstance(auto, TreeEngine)
    assert auto.batch_budget == BatchBudget(CPU_TOKENS, f"auto on cpu: {CPU_TOKENS} tokens, the CPU default")
    assert auto.max_packed_tokens == CPU_TOKENS
    given = make_engine("tree", tiny_qwen3, prefix_cache_mb=0, max_batch_tokens=2048)
    assert isinstance(given, TreeEngine) and given.max_packed_tokens == 2048
    for mode in ("fork", "naive"):
        assert make_engine(mode, tiny_qwen3, max_batch_tokens=4096).batch_budget.tokens == 4096


def test_info_reports_the_budget_and_reads_their_forward_passes(tiny_qwen3: LoadedModel, shard: Any) -> None:
    engine = make_engine("tree", tiny_qwen3, prefix_cache_mb=0, max_batch_tokens=4096)
    question = [[[5]], [[6]]]
    reads = [grouped_read(index, prompt, question) for index, prompt in enumerate([[1, 2, 3, 4], [9, 8, 7]])]
    request = decision_pb2.ReadRequest(reads=reads)
    with shard(tiny_qwen3, engine) as stub:
        info = stub.Info(decision_pb2.InfoRequest(), timeout=30)
        response = stub.Read(request, timeout=60)
    assert (info.batch_token_budget, info.batch_budget_rule) == (4096, "--max-batch-prefill-tokens 4096")
    assert len(response.results) == 2
    # The engine's own count for the same batch (a fresh engine: no cache, so the same plan), whatever plan it made.
    fresh = make_engine("tree", tiny_qwen3, prefix_cache_mb=0, max_batch_tokens=4096)
    assert isinstance(fresh, TreeEngine)
    assert response.forward_passes == fresh.run(read_specs(request)).forward_passes > 0
