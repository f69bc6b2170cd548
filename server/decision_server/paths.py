"""Where the shard keeps converted models and fixtures on disk.
One place resolves the cache directory so the CLI, the tests and the launcher agree on it."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "DECISION_CACHE_DIR"
# Where torch.compile (inductor) keeps its kernels; the shard points it into the cache directory (`fused`).
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

# Folder name of the embedded default model once converted; the launcher looks for it here too.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """The per-user cache root: $DECISION_CACHE_DIR, else ~/.cache/decision-inference."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "decision-inference"


def models_dir() -> Path:
    return cache_dir() / "models"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def fixture_dir(name: str, seed: int) -> Path:
    # The seed is part of the name so fixtures built with different seeds never overwrite each other.
    return models_dir() / "fixtures" / f"{name}-seed{seed}"


# Where `--matmul auto` keeps its probes' times, when not in the cache directory (the image: on the /data volume,
# which its user can write and a restart keeps).
MATMUL_RECORD_ENV = "DECISION_MATMUL_RECORD"


def matmul_record() -> Path:
    """Where `--matmul auto` keeps the fastest time of each float32 GEMM it timed on this machine
    (`layers.MatmulProbe.kept_with`): $DECISION_MATMUL_RECORD, else matmul-probes.json in the cache directory.
    Deleting it makes the next load time afresh."""
    configured = os.environ.get(MATMUL_RECORD_ENV)
    if configured:
        return Path(configured).expanduser()
    return cache_dir() / "matmul-probes.json"


def keep_compiled_kernels() -> None:
    """Points inductor's kernel cache into the cache directory unless $TORCHINDUCTOR_CACHE_DIR is set, so a restart
    reuses what the last start compiled. Call it before torch is imported: inductor fixes its default on import."""
    os.environ.setdefault(INDUCTOR_CACHE_ENV, str(cache_dir() / "inductor"))
