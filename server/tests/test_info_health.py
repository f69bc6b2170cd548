"""Info reports the loaded model's facts; Health runs a real op on its weights."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from decision_server.batch_budget import CPU_TOKENS
from decision_server.checkpoint import Checkpoint
from decision_server.pb import decision_pb2

EXPECTED_INFO = {
    "smollm2": ("LlamaForCausalLM", 49152, 8192),
    "tiny_qwen3": ("Qwen3ForCausalLM", 151936, 4096),
}


@pytest.mark.parametrize("mode", ["tree", "fork", "naive"])
@pytest.mark.parametrize("name", sorted(EXPECTED_INFO))
def test_info_and_health(request: pytest.FixtureRequest, shard: Any, name: str, mode: str) -> None:
    model = request.getfixturevalue(name)
    architecture, vocab, positions = EXPECTED_INFO[name]
    with shard(model, mode) as stub:
        info = stub.Info(decision_pb2.InfoRequest(), timeout=30)
        health = stub.Health(decision_pb2.HealthRequest(), timeout=30)
    assert info.architecture == architecture
    assert info.vocab_size == vocab
    assert info.max_position_embeddings == positions
    assert info.dtype == "float32"
    assert info.device == "cpu"
    assert (info.world_size, info.rank) == (1, 0)
    assert info.engine == mode
    assert info.read_kind == "next_token"
    assert info.implementation == "decoder"
    # Every engine reports the batch budget; on CPU without a flag, the CPU default.
    cpu_default = (CPU_TOKENS, f"auto on cpu: {CPU_TOKENS} tokens, the CPU default")
    assert (info.batch_token_budget, info.batch_budget_rule) == cpu_default
    assert math.isfinite(health.probe)
    # The probe is computed from the weights: it equals the same op done here, and is not a constant.
    with Checkpoint(model.path) as checkpoint:
        weight = checkpoint.read("model.embed_tokens.weight", torch.float32, torch.device("cpu"), dim=0, end=8)[:, :64]
    assert health.probe == pytest.approx(float((weight @ weight.T).sum()), rel=1e-6)
    assert health.probe != 0.0
