"""`--dtype auto`: float32 on CPU (the only dtype whose decisions keep the 99.9 % agreement a CPU default must keep),
and off CPU the checkpoint's own half precision, as vLLM and SGLang serve a checkpoint."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen3Config

from decision_server.model_base import resolve_dtype

CUDA = torch.device("cuda")  # a device object only: resolving a dtype touches no GPU


def config_in(dtype: Any) -> Qwen3Config:
    config = Qwen3Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    config.dtype = dtype
    return config


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        ("float16", torch.float16),  # a config read from disk names it as text
        (torch.float32, torch.bfloat16),
        (None, torch.bfloat16),
    ],
)
def test_auto_on_a_gpu_is_the_checkpoints_half_precision(checkpoint: Any, expected: torch.dtype) -> None:
    assert resolve_dtype("auto", CUDA, config_in(checkpoint)) == expected


@pytest.mark.parametrize("checkpoint", [torch.bfloat16, torch.float16, torch.float32, None])
def test_auto_on_cpu_is_float32_whatever_the_checkpoint(checkpoint: Any) -> None:
    assert resolve_dtype("auto", torch.device("cpu"), config_in(checkpoint)) == torch.float32


def test_a_named_dtype_is_taken_as_named_and_an_unknown_one_refused() -> None:
    assert resolve_dtype("float32", CUDA, config_in(torch.bfloat16)) == torch.float32
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        resolve_dtype("int8", CUDA)


def test_a_multimodal_checkpoint_is_read_from_its_text_config() -> None:
    class Outer:
        dtype = None

        def get_text_config(self) -> Qwen3Config:
            return config_in(torch.float16)

    assert resolve_dtype("auto", CUDA, Outer()) == torch.float16
