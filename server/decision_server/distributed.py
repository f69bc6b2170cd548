"""The tensor-parallel process group of one shard: rank, world size, and the few collectives the model uses.
At world size 1 every collective is a no-op, so the same model code serves one rank or many."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0
DEFAULT_STARTUP_TIMEOUT_S = 600.0


class CollectiveError(RuntimeError):
    """A collective failed or timed out: a peer rank died or stopped following. The group is unusable,
    so the shard must stop (the launcher then reports which rank failed and stops the others)."""


@dataclass(frozen=True)
class ParallelConfig:
    """How this shard joins its tensor-parallel group; every value comes from an explicit CLI flag."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    # A read's collectives give up after this long, so a dead or stuck peer becomes an error, never a hang.
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    # Joining the group and the first forward pass wait this long for the slowest rank to load its weights.
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"--world-size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"--rank must be in [0, {self.world_size}), got {self.rank}")
        if self.world_size > 1 and self.master_port is None:
            raise ValueError("--master-port is required when --world-size is above 1")
        if self.collective_timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError("collective timeouts must be positive")


def partition(total: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of `rank`'s share when `total` items split as evenly as possible, earlier ranks taking
    the remainder (9 heads over 2 ranks: 5 and 4). Every rank computes every other rank's share the same way."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def pick_device(config: ParallelConfig) -> torch.device:
    """cuda:rank when CUDA is available (one GPU per rank), else the CPU."""
    if torch.cuda.is_available():
        if config.rank >= torch.cuda.device_count():
            raise ValueError(f"rank {config.rank} has no GPU: only {torch.cuda.device_count()} visible")
        return torch.device(f"cuda:{config.rank}")
    return torch.device("cpu")


class ShardGroup:
    """This rank's view of the group. Collectives raise `CollectiveError` on any failure or timeout."""

    def __init__(self, rank: int, world_size: int, device: torch.device, group: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._group = group  # the read-time process group (short timeout); None at world size 1

    @classmethod
    def single(cls, device: torch.device) -> ShardGroup:
        return cls(0, 1, device)

    @property
    def backend(self) -> str:
        if self.world_size == 1:
            return "none"
        return "nccl" if self.device.type == "cuda" else "gloo"

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor, "sum")

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor, "max")

    def all_reduce_min(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor, "min")

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape on all), in rank order."""
        if self.world_size == 1:
            return [tensor]
        import torch.distributed as dist

        pieces = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._run("all_gather", lambda: dist.all_gather(pieces, tensor.contiguous(), group=self._group))
        return pieces

    def check_same(self, what: str, values: list[int]) -> None:
        """Raises `CollectiveError` unless every rank passes the same `values`: ranks that were sent different
        batches, or whose caches diverged, would otherwise compute silently wrong results together."""
        if self.world_size == 1:
            return
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        gathered = [piece.tolist() for piece in self.all_gather(mine)]
        if any(other != gathered[0] for other in gathered):
            raise CollectiveError(f"ranks disagree on {what}: {gathered} (rank {self.rank} here)")

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduces `tensor` in place across ranks and returns it."""
        if self.world_size == 1:
            return tensor
        import torch.distributed as dist

        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        self._run(f"all_reduce({op})", lambda: dist.all_reduce(tensor, op=reduce_op, group=self._group))
        return tensor

    def _run(self, name: str, collective: Callable[[], T]) -> T:
        try:
            return collective()
        except Exception as exc:
            raise CollectiveError(
                f"{name} across {self.world_size} ranks failed on rank {self.rank} (a peer rank died, or did not "
                f"take part within the collective timeout): {exc}"
            ) from exc

    def startup_barrier(self) -> None:
        """Waits, up to the startup timeout, until every rank gets here: once, after the weights are loaded."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        # The world group, not the read group: a slow rank's load must not count against the read timeout.
        self._run("startup barrier", lambda: dist.barrier())

    def close(self) -> None:
        if self.world_size == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a broken group cannot always be torn down; the process is exiting anyway
                logger.warning("cannot destroy the process group", extra={"fields": {"error": str(exc)}})


def join_group(config: ParallelConfig, device: torch.device) -> ShardGroup:
    """Joins the group over TCP rendezvous at master_addr:master_port (gloo on CPU, NCCL on CUDA).

    The world group waits up to `startup_timeout_s` for every rank (ranks load at different speeds); reads use
    a second group over the same ranks whose collectives give up after `collective_timeout_s`.
    """
    if config.world_size == 1:
        return ShardGroup.single(device)
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    logger.info(
        "joining the tensor-parallel group",
        extra={
            "fields": {
                "rank": config.rank,
                "world_size": config.world_size,
                "backend": backend,
                "master": f"{config.master_addr}:{config.master_port}",
            }
        },
    )
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{config.master_addr}:{config.master_port}",
            rank=config.rank,
            world_size=config.world_size,
            timeout=timedelta(seconds=config.startup_timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
        reads = dist.new_group(
            list(range(config.world_size)), timeout=timedelta(seconds=config.collective_timeout_s), backend=backend
        )
    except Exception as exc:
        raise CollectiveError(
            f"rank {config.rank} could not join the group of {config.world_size} at "
            f"{config.master_addr}:{config.master_port}: {exc}"
        ) from exc
    return ShardGroup(config.rank, config.world_size, device, reads)
