"""The one mapping from exceptions raised while serving to gRPC status codes.
Every handler goes through it, so no exception leaves an RPC hanging or turns bad input into INTERNAL."""

from __future__ import annotations

import grpc
import torch

from decision_server.distributed import CollectiveError
from decision_server.engines.types import InvalidReadError
from decision_server.media import MediaError


def grpc_status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, InvalidReadError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, MediaError):
        # The client's medium, not the router's read: the router answers 400 naming `exc.name`.
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, CollectiveError):
        # A peer rank died or stopped following: this shard cannot compute any more reads.
        return grpc.StatusCode.UNAVAILABLE, f"tensor-parallel group failed: {exc}"
    if isinstance(exc, torch.OutOfMemoryError):
        # The batch was too large for the device; a smaller one can succeed, so the shard stays up.
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"out of device memory: {exc}"
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


def is_fatal(exc: BaseException) -> bool:
    """Device faults leave the CUDA context unusable, and a failed collective leaves the tensor-parallel group
    unusable; the shard must stop so the launcher can report and exit."""
    if isinstance(exc, CollectiveError):
        return True
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and "CUDA error" in str(exc)
